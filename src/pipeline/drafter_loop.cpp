// The drafter role: for every optimizer step, take this drafter's micro-batches off the feature channel
// (from target b % T, in global batch order), run the DFlash forward/backward, all-reduce gradients and the
// step statistics among drafters, AdamW, then metrics and checkpoints on drafter 0. A stop requested by a
// signal on any rank travels with the statistics, so all drafters leave after the same step.
#include <chrono>
#include <filesystem>

#include "core/log.h"
#include "core/rng.h"
#include "dist/feature_channel.h"
#include "dist/grad_reducer.h"
#include "dist/watchdog.h"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_train_ops.h"
#include "pipeline/heldout.h"
#include "pipeline/loops.h"
#include "pipeline/metrics.h"
#include "topo/plan_split.h"
#include "train/anchors.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace df {

namespace {

OptimConfig optim_config(const TrainPlan& p) {
  const TrainSection& t = p.cfg.train;
  OptimConfig o;
  o.lr = float(t.lr);
  o.beta1 = float(t.beta1);
  o.beta2 = float(t.beta2);
  o.eps = float(t.eps);
  o.weight_decay = float(t.weight_decay);
  o.clip = float(t.clip);
  o.total_steps = p.total_steps;
  o.warmup_steps = int64_t(t.warmup_ratio * double(p.total_steps));
  return o;
}

// Host copies of one received batch, converted to the f32 the CPU drafter trains on.
struct HostBatch {
  std::vector<float> taps, final_hidden;
};

DrafterBatch batch_from_packet(const FeaturePacket& p, HostBatch& store) {
  DrafterBatch b;
  b.offsets = p.offsets;
  b.tokens = p.tokens;
  b.loss_mask = p.loss_mask;
  const int64_t T = p.hdr.tokens;
  store.taps.resize(p.features.size());
  for (size_t i = 0; i < p.features.size(); ++i) store.taps[i] = bf16_to_f32(p.features[i]);
  b.taps = tensor_make(store.taps.data(), DType::f32, Device::cpu, T, p.hdr.feat_cols);
  if (p.hdr.final_cols > 0) {
    store.final_hidden.resize(p.final_hidden.size());
    for (size_t i = 0; i < p.final_hidden.size(); ++i) store.final_hidden[i] = bf16_to_f32(p.final_hidden[i]);
    b.target_hidden = tensor_make(store.final_hidden.data(), DType::f32, Device::cpu, T, p.hdr.final_cols);
  }
  return b;
}

}  // namespace

void drafter_loop(const TrainPlan& plan, const DistContext& ctx) {
  const TrainSection& tc = plan.cfg.train;
  const bool owner = ctx.drafter_index == 0;
  const int B = plan.drafter.block_size;

  // Frozen target embedding and lm_head, from the same source as the targets' weights.
  CpuOps target_ops;
  std::unique_ptr<TargetModel> frozen = train_load_target(plan, target_ops, 0, true);
  CpuTrainOps ops;
  DrafterModel model(plan.drafter, ops);
  model.set_frozen(frozen->embed, frozen->lm_head);
  drafter_init_params(model, plan.cfg.drafter.init_seed);
  int64_t tokens_seen = 0;  // context tokens trained on by all drafters, since step 0
  if (!plan.resume_path.empty()) {
    CheckpointState st = checkpoint_load(plan.resume_path, model);
    tokens_seen = st.tokens_seen;
    DF_CHECK(st.step == plan.start_step, "%s holds step %lld but the run was told to start at %lld",
             plan.resume_path.c_str(), (long long)st.step, (long long)plan.start_step);
    DF_CHECK(st.data_fingerprint == plan.batcher->fingerprint(),
             "%s was written for another corpus or batching (fingerprint %016llx, now %016llx); HINT: resume with "
             "the same data.train, data.token_budget, data.buckets and run.seed, or set checkpoint.resume = \"none\"",
             plan.resume_path.c_str(), (unsigned long long)st.data_fingerprint,
             (unsigned long long)plan.batcher->fingerprint());
    if (owner) log_here("resumed from %s at step %lld", plan.resume_path.c_str(), (long long)st.step);
  }

  std::unique_ptr<FeatureReceiver> rx = feature_receiver_mpi(ctx.data_comm, ctx.roles.targets);
  std::unique_ptr<GradReducer> reducer = grad_reducer_mpi(ctx.drafter_comm);
  OptimConfig optim = optim_config(plan);
  std::unique_ptr<MetricsLog> metrics;
  if (owner)
    metrics = std::make_unique<MetricsLog>(plan.cfg.run.dir, plan.cfg.run.log_interval, plan.total_steps,
                                           plan.num_targets, plan.num_drafters);
  std::unique_ptr<HeldoutEval> heldout;  // [eval]: drafter 0 alone, between its steps
  if (owner && plan.cfg.eval.interval > 0) heldout = std::make_unique<HeldoutEval>(plan.cfg, plan.drafter);
  std::vector<int> all_targets;  // q_hs: how many targets have a batch for us waiting on the channel
  for (int t = 0; t < plan.num_targets; ++t) all_targets.push_back(t);

  auto save = [&](int64_t next_step) {
    if (!owner) return;
    CheckpointState st;
    st.step = next_step;
    st.batch_cursor = next_step * plan.batches_per_step;
    st.data_fingerprint = plan.batcher->fingerprint();
    st.rng_state = {plan.cfg.run.seed};  // every draw is keyed by (seed, global batch index): the seed is the state
    st.tokens_seen = tokens_seen;
    st.config_text = plan.cfg.text;
    checkpoint_save(plan.ckpt_dir(), model, st, plan.cfg.checkpoint.keep_last);
  };

  Watchdog watchdog(plan.cfg.run.watchdog_s);
  int64_t step = plan.start_step;
  double last_lr = 0, last_gnorm = 0;
  for (; step < plan.total_steps; ++step) {
    auto t_step = std::chrono::steady_clock::now();
    double wait_s = 0;
    drafter_zero_grads(model);
    LossStats ls;
    StepStats ss;
    for (int a = 0; a < plan.grad_accum; ++a) {
      const int64_t b = plan.batch_of(step, a, ctx.drafter_index);
      auto t_wait = std::chrono::steady_clock::now();
      ss.q_hs += rx->pending(all_targets);
      watchdog.beat("waiting for a batch from a target");
      FeaturePacket p = rx->recv(int(b % plan.num_targets));
      watchdog.beat("training on a batch");
      wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
      DF_CHECK(p.hdr.batch_id == b, "drafter %d expected batch %lld from target %lld but got batch %lld; HINT: all "
               "ranks must run the same config and data",
               ctx.drafter_index, (long long)b, (long long)(b % plan.num_targets), (long long)p.hdr.batch_id);
      if (p.hdr.flags & FeatureHeader::kFlagStopRequested) ss.stop = 1;
      HostBatch store;
      DrafterBatch db = batch_from_packet(p, store);
      Rng rng(rng_mix(plan.cfg.run.seed, uint64_t(b)));
      std::vector<DrafterAnchor> anchors = anchors_sample_batch(db, plan.drafter.num_anchors, rng);
      DrafterLossOptions lo = loss_options_from_config(tc);
      lo.noise_std = noise_std_at(float(tc.noise_std), step, plan.total_steps);
      lo.noise_seed = rng.next_u64();
      ls.merge(drafter_forward_backward(model, db, anchors, lo));
      ss.tokens += double(p.hdr.tokens);
      ss.batches += 1;
      ss.target_busy_s += p.hdr.target_busy_s;
      ss.q_pre += double(p.hdr.q_pre);
    }
    if (signals_stop_requested()) ss.stop = 1;
    ss.loss_sum = ls.loss_sum;
    ss.weight_sum = ls.weight_sum;
    ss.correct.assign(ls.correct.begin(), ls.correct.end());
    ss.count.assign(ls.count.begin(), ls.count.end());
    ss.correct.resize(B - 1, 0.0);
    ss.count.resize(B - 1, 0.0);
    ss.tau_sum = ls.tau_sum;
    ss.tau_blocks = double(ls.tau_blocks);
    ss.drafter_busy_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count() - wait_s;

    watchdog.beat("in the gradient all-reduce (waiting for the other drafters)");
    reducer->sum(model.grads.ptr<float>(), size_t(model.grads.numel()));
    std::vector<double> packed = ss.pack();
    reducer->sum(packed.data(), packed.size());
    ss.unpack(packed, B);
    tokens_seen += int64_t(ss.tokens);
    // No labelled row anywhere this step: nothing to learn from, and 1/Σw would be infinite.
    AdamwStepResult r{};
    if (ss.weight_sum > 0) r = adamw_step(model, optim, step, 1.0 / ss.weight_sum);
    last_lr = r.lr;
    last_gnorm = r.grad_norm;
    const bool stop = ss.stop > 0 || step + 1 == plan.stop_at_step;
    const bool last = step + 1 == plan.total_steps;
    const bool eval_now = heldout && ((step + 1) % plan.cfg.eval.interval == 0 || stop || last);
    if (eval_now) {
      watchdog.beat("evaluating on the held-out set (eval.data)");
      const LossStats ev = heldout->run(model, loss_options_from_config(tc));
      metrics->set_eval(ev.mean_loss(), ev.tau(), loss_accuracy(ev));
    }
    if (owner) metrics->step(step, ss, r.lr, r.grad_norm, stop || last || eval_now);
    watchdog.beat("writing a checkpoint");
    if ((step + 1) % plan.cfg.checkpoint.interval == 0 || stop || last) save(step + 1);
    if (stop) {
      if (owner)
        log_here("stop requested (%s): checkpointed step %lld, exiting",
                 ss.stop > 0 ? "signal on some rank" : "--stop-at-step", (long long)(step + 1));
      ++step;
      break;
    }
  }
  watchdog.beat("draining the targets at the end of the run");
  rx->finish();
  if (owner) {
    log_here("training done: %lld steps, last lr %.2e, grad norm %.3f", (long long)step, last_lr, last_gnorm);
    log_here("checkpoints: %s (latest: %s)", plan.ckpt_dir().c_str(), checkpoint_find_latest(plan.ckpt_dir()).c_str());
    log_here("metrics: %s", metrics->path().c_str());
    double rt = metrics->target_rate(), rd = metrics->drafter_rate();
    if (rt > 0 && rd > 0 && plan.num_targets + plan.num_drafters >= 2) {
      SplitPlan sp = plan_split_compute(rt, rd, plan.num_targets + plan.num_drafters);
      log_here("measured per-rank rates: target %.3f batches/s, drafter %.3f batches/s\n%s", rt, rd,
               plan_split_format(sp, "batches/s").c_str());
    }
  }
}

}  // namespace df
