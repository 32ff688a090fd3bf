// The target role: a flat loop of prefetch → forward with taps → send. The wire is bf16: a CUDA rank's
// forward writes its bf16 taps straight into a slot of its wire pool, and the channel sends them from there
// by NCCL, or copies them to the host for MPI off the compute stream while the next forward runs; a CPU
// rank's taps are f32 and are rounded into the slot.
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "data/prefetcher.h"
#include "comm/feature_channel.h"
#include "comm/watchdog.h"
#include "model/target.h"
#include "ops/ops_factory.h"
#include "pipeline/loops.h"

namespace df {

void target_loop(const TrainPlan& plan, const DistContext& ctx) {
  const DrafterConfig& dc = plan.drafter;
  const int H = plan.target.hidden, k = dc.num_taps();
  int last = 0;
  for (int l : dc.target_layer_ids) last = std::max(last, l);
  const int num_layers = plan.final_hidden ? plan.target.layers : last + 1;

  std::unique_ptr<Ops> ops = ops_create(plan.cfg.target.device, ctx.gpu);
  std::unique_ptr<TargetModel> model = target_load_for_run(plan.cfg.target, plan.target, *ops, num_layers, false);
  const int64_t budget = plan.cfg.data.token_budget;
  TargetForward fwd(*model, budget);

  // Taps land side by side in one [T, k·H] tensor, the wire layout (WireLayout): in the wire slot itself when
  // the activations are bf16, else in f32 tensors rounded into the slot after the forward.
  const int64_t feat_cols = int64_t(k) * H, final_cols = plan.final_hidden ? H : 0;
  const bool in_place = ops->act_dtype() == DType::bf16;
  Tensor feats_f32, final_f32, ids_all;
  auto layout = [&](Arena& a) {
    if (!in_place) {
      feats_f32 = a.alloc(ops->act_dtype(), budget, feat_cols);
      if (plan.final_hidden) final_f32 = a.alloc(ops->act_dtype(), budget, H);
    }
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
  const int depth = plan.cfg.pipeline.hs_queue_depth;
  NcclComm* nccl = ctx.nccl_world.get();  // transport nccl: the payload leaves from the device slot itself
  std::unique_ptr<WirePool> pool =
      ops->wire_pool(depth, WireLayout::bytes(budget, feat_cols, final_cols), nccl == nullptr);
  std::unique_ptr<FeatureSender> sender = feature_sender(ctx.data_comm, ctx.roles.drafters, depth, *pool,
                                                         payload_wire(ctx.data_comm, nccl, *pool));

  std::vector<float> host;
  int64_t sent = 0;
  double send_path_reported = 0;  // of sender->send_path_s(), what earlier headers carried
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
    // A slot frees when its batch has reached its drafter, which may itself wait for another target: twice
    // the patience, as for a credit, so that the drafter names that target first.
    watchdog.beat("waiting for a free send slot (a batch still on its way to a drafter)", -1, 2.0);
    // An NCCL send gives up before the watchdog's 2x patience of its waits, naming the batch and the drafter.
    dist_nccl_set_step(nccl, mb->global_index / plan.batches_per_step, 1.5 * watchdog.bound_s());
    const auto t_slot = std::chrono::steady_clock::now();
    char* slot = sender->acquire();
    // Waiting for a slot is the drafters' back-pressure, not the target's work: it stays out of the busy time
    // the split planner reads as this target's rate.
    const double slot_wait_s = seconds_since(t_slot);
    watchdog.beat("running the forward");
    const Device where = pool->device();
    Tensor feats = in_place ? tensor_make(slot, DType::bf16, where, T, feat_cols) : feats_f32.rows_view(0, T);
    TargetOutputs o;
    o.tap_layers = dc.target_layer_ids;
    o.want_final_norm = plan.final_hidden;
    for (int i = 0; i < k; ++i) o.taps.push_back(feats.cols_view(int64_t(i) * H, H));
    char* fin = slot + WireLayout::final_offset(T, feat_cols);
    if (plan.final_hidden)
      o.final_norm = in_place ? tensor_make(fin, DType::bf16, where, T, H) : final_f32.rows_view(0, T);
    fwd.run(ids, seqs, o);
    // pipeline.test_target_delay_s, a test knob: a slower target whatever the machine (inside the busy time).
    if (plan.cfg.pipeline.test_target_delay_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(plan.cfg.pipeline.test_target_delay_s));
    if (!in_place) {
      // A host backend: its f32 taps are rounded into the (host) slot.
      auto round_into = [&](const Tensor& t, char* at) {
        host.resize(size_t(t.numel()));
        ops->download_f32(t, host.data());
        uint16_t* out = reinterpret_cast<uint16_t*>(at);
        for (size_t i = 0; i < host.size(); ++i) out[i] = f32_to_bf16(host[i]);
      };
      round_into(feats, slot);
      if (plan.final_hidden) round_into(o.final_norm, fin);
    }

    FeaturePacket p;
    p.hdr.batch_id = mb->global_index;
    p.hdr.epoch = mb->epoch;
    p.hdr.num_seqs = int64_t(lengths.size());
    p.hdr.tokens = T;
    p.hdr.feat_cols = int64_t(k) * H;
    p.hdr.final_cols = plan.final_hidden ? H : 0;
    p.hdr.q_pre = int64_t(prefetch.depth());
    if (signals_stop_requested()) p.hdr.flags |= FeatureHeader::kFlagStopRequested;
    p.offsets = std::move(mb->offsets);
    p.tokens = std::move(mb->tokens);
    p.loss_mask = std::move(mb->loss_mask);
    p.hdr.target_busy_s = seconds_since(t0) - slot_wait_s;
    p.hdr.target_send_s = sender->send_path_s() - send_path_reported;
    send_path_reported = sender->send_path_s();
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
