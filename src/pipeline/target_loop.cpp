// The target role: a flat loop of prefetch → forward with taps → pack → send. The wire is bf16: CUDA ranks'
// activations are bf16 already and go out as they are; CPU ranks' are f32 and are rounded when packed.
#include <chrono>

#include "core/log.h"
#include "data/prefetcher.h"
#include "dist/feature_channel.h"
#include "dist/watchdog.h"
#include "model/target.h"
#include "ops/ops_factory.h"
#include "pipeline/loops.h"

namespace df {

void target_loop(const TrainPlan& plan, const DistContext& ctx) {
  const DrafterConfig& dc = plan.drafter;
  const int H = plan.target.hidden, k = dc.num_taps();
  int last = 0;
  for (int l : dc.target_layer_ids) last = std::max(last, l);
  const int num_layers = plan.kl ? plan.target.layers : last + 1;

  std::unique_ptr<Ops> ops = ops_create(plan.cfg.target.device, ctx.gpu);
  std::unique_ptr<TargetModel> model = train_load_target(plan, *ops, num_layers, false);
  const int64_t budget = plan.cfg.data.token_budget;
  TargetForward fwd(*model, budget);

  // Taps land side by side in one [budget, k·H] tensor: the wire layout, so packing is one conversion.
  TargetOutputs outs;
  outs.tap_layers = dc.target_layer_ids;
  outs.want_final_norm = plan.kl;
  Tensor feats, ids_all;
  auto layout = [&](Arena& a) {
    feats = a.alloc(ops->act_dtype(), budget, int64_t(k) * H);
    outs.taps.clear();
    for (int i = 0; i < k; ++i) outs.taps.push_back(feats.cols_view(int64_t(i) * H, H));
    if (plan.kl) outs.final_norm = a.alloc(ops->act_dtype(), budget, H);
    ids_all = a.alloc(DType::i32, 1, budget);
  };
  // Per-batch sequence layout: offsets (at most budget + 1) and positions (budget), i32, each 256-aligned.
  const size_t meta = size_t(2 * budget + 1) * 4 + 4 * Arena::kAlign;
  Arena arena;
  void* block = ops_alloc_planned(*ops, layout, meta, arena);
  const size_t meta_mark = arena.mark();

  const int64_t begin = plan.start_step * plan.batches_per_step, end = plan.total_steps * plan.batches_per_step;
  std::vector<int64_t> mine = batch_indices_for_target(begin, end, ctx.target_index, plan.num_targets);
  Prefetcher prefetch(*plan.corpus, *plan.batcher, mine, size_t(plan.cfg.data.prefetch_depth));
  std::unique_ptr<FeatureSender> sender =
      feature_sender_mpi(ctx.data_comm, ctx.roles.drafters, plan.cfg.pipeline.hs_queue_depth);

  std::vector<float> host;
  int64_t sent = 0;
  Watchdog watchdog(plan.cfg.run.watchdog_s, watchdog_checkpoint_s(drafter_param_table(dc).total),
                    watchdog_rank_names(ctx));
  watchdog.beat("waiting for the prefetcher");
  auto t_batch = std::chrono::steady_clock::now();
  while (std::optional<MaterialisedBatch> mb = prefetch.next()) {
    if (sender->stopped()) break;
    auto t0 = std::chrono::steady_clock::now();
    const int64_t T = int64_t(mb->tokens.size());
    std::vector<int32_t> lengths;
    for (size_t s = 0; s + 1 < mb->offsets.size(); ++s) lengths.push_back(int32_t(mb->offsets[s + 1] - mb->offsets[s]));
    arena.reset(meta_mark);
    SeqLayout seqs = seq_layout_make(lengths, *ops, arena);
    Tensor ids = ids_all.cols_view(0, T);
    ops->upload_raw(ids, mb->tokens.data());
    TargetOutputs o = outs;
    for (Tensor& t : o.taps) t = t.rows_view(0, T);
    if (plan.kl) o.final_norm = outs.final_norm.rows_view(0, T);
    fwd.run(ids, seqs, o);

    FeaturePacket p;
    p.hdr.batch_id = mb->global_index;
    p.hdr.epoch = mb->epoch;
    p.hdr.num_seqs = int64_t(lengths.size());
    p.hdr.tokens = T;
    p.hdr.feat_cols = int64_t(k) * H;
    p.hdr.final_cols = plan.kl ? H : 0;
    p.hdr.q_pre = int64_t(prefetch.depth());
    if (signals_stop_requested()) p.hdr.flags |= FeatureHeader::kFlagStopRequested;
    // The wire is bf16: a bf16 backend's activations are copied as they are (one device-to-host copy, no
    // conversion), the CPU's f32 ones rounded here.
    auto to_bf16 = [&](const Tensor& t, std::vector<uint16_t>& out) {
      out.resize(size_t(t.numel()));
      if (t.dtype == DType::bf16) return ops->download_raw(t, out.data());
      host.resize(out.size());
      ops->download_f32(t, host.data());
      for (size_t i = 0; i < host.size(); ++i) out[i] = f32_to_bf16(host[i]);
    };
    to_bf16(feats.rows_view(0, T), p.features);
    if (plan.kl) to_bf16(o.final_norm, p.final_hidden);
    p.offsets = std::move(mb->offsets);
    p.tokens = std::move(mb->tokens);
    p.loss_mask = std::move(mb->loss_mask);
    p.hdr.target_busy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int drafter = int(p.hdr.batch_id % plan.num_drafters);
    // The drafter may itself wait for another target: twice the patience, so that it names that target first.
    watchdog.beat("sending a batch, waiting for the credit of", ctx.roles.drafters[size_t(drafter)], 2.0);
    if (!sender->send(drafter, std::move(p))) break;
    ++sent;
    const auto now = std::chrono::steady_clock::now();
    watchdog.step_done(std::chrono::duration<double>(now - t_batch).count());
    t_batch = now;
    watchdog.beat("waiting for the prefetcher");
  }
  watchdog.beat("waiting for every drafter to stop", -1, 2.0);
  sender->finish();
  ops->free_bytes(block);
  log_all("target %d done: %lld batches sent", ctx.target_index, (long long)sent);
}

}  // namespace df
