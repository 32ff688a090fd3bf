// The drafter role: for every optimizer step, take this drafter's micro-batches off the feature channel
// (from target b % T, in global batch order), run the DFlash forward/backward on drafter.device, all-reduce
// gradients and the step statistics among drafters, AdamW, then metrics and checkpoints on drafter 0. A stop
// requested by a signal on any rank travels with the statistics, so all drafters leave after the same step;
// so does drafter 0's decision to move the roles (pipeline/rebalance.h), one step after it is made.
#include <chrono>
#include <filesystem>

#include "core/log.h"
#include "core/rng.h"
#include "comm/feature_channel.h"
#include "comm/grad_reducer.h"
#include "comm/watchdog.h"
#ifdef DF_HAVE_CUDA
#include "comm/nccl_comm.h"
#include "ops/cuda/cuda_train_ops.h"
#endif
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops_factory.h"
#include "pipeline/drafter_memory.h"
#include "pipeline/feature_source.h"
#include "pipeline/heldout.h"
#include "pipeline/loops.h"
#include "pipeline/metrics.h"
#include "topo/plan_split.h"
#include "train/anchors.h"
#include "train/checkpoint.h"
#include "train/checkpoint_saver.h"
#include "train/init_from.h"
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

// A CPU drafter reduces its host gradients over MPI; a CUDA drafter its device gradients, by NCCL when the
// run's transport is NCCL, else over MPI through a pinned host buffer.
std::unique_ptr<GradReducer> reducer_create(const DistContext& ctx, TrainOps& ops, size_t grads) {
  if (ops.device() == Device::cpu) return grad_reducer_mpi(ctx.drafter_comm);
#ifdef DF_HAVE_CUDA
  auto* cuda = dynamic_cast<CudaTrainOps*>(&ops);
  DF_CHECK(cuda != nullptr, "drafter on %s: no gradient reducer for this backend", ops.name());
  if (ctx.nccl_drafters) return grad_reducer_nccl(*ctx.nccl_drafters, cuda->stream(), ctx.drafter_comm);
  return grad_reducer_staged(ctx.drafter_comm, cuda->stream(), grads);
#else
  DF_FAIL("drafter on %s in a build without CUDA", ops.name());
#endif
}

}  // namespace

LoopEnd drafter_loop(const TrainPlan& plan, const DistContext& ctx) {
  const TrainSection& tc = plan.cfg.train;
  const bool owner = ctx.drafter_index == 0;
  const int B = plan.drafter.block_size;

  // Frozen target embedding and lm_head, from the same source as the targets' weights.
  CpuOps target_ops;
  std::unique_ptr<TargetModel> frozen = train_load_target(plan, target_ops, 0, true);
  std::unique_ptr<TrainOps> ops = train_ops_create(plan.cfg.drafter.device, std::max(ctx.gpu, 0));
  DrafterModel model(plan.drafter, *ops);
  const int64_t H = plan.drafter.hidden;
  const int64_t budget = plan.cfg.data.token_budget, feat_cols = H * plan.drafter.num_taps();
  const int64_t final_cols = plan.kl ? H : 0;
  const bool offline = plan.cfg.topology.offline;
  // Host-built batches (offline feature files, held-out data) are staged; the channel's land in its pool.
  const bool host_batches = offline || (owner && plan.cfg.eval.interval > 0);
  DrafterMemory mem(*ops, frozen->embed, frozen->lm_head, host_batches ? budget : 0, feat_cols, final_cols);
  model.set_frozen(mem.embed(), mem.lm_head());
  const DrafterLimits limits = drafter_limits_from_run(plan.cfg);
  drafter_plan_workspace(model, limits);
  if (owner)
    log_here("drafter on %s: workspace %.1f MiB for %lld tokens and %lld blocks per micro-batch", ops->name(),
             double(model.workspace_bytes) / (1 << 20), (long long)limits.max_tokens,
             (long long)limits.max_blocks);
  drafter_init_params(model, plan.cfg.drafter.init_seed);
  if (plan.resume_path.empty() && !plan.cfg.drafter.init_from.empty()) {
    // A resumed checkpoint's weights win over init_from (the folder only seeds a fresh run).
    drafter_init_from(model, plan.cfg.drafter.init_from);
    drafter_refresh_shadow(model);
    if (owner)
      log_here("drafter weights from %s (optimizer state fresh)", plan.cfg.drafter.init_from.c_str());
  }
  int64_t tokens_seen = 0;  // context tokens trained on by all drafters, since step 0
  if (!plan.resume_path.empty()) {
    CheckpointState st = checkpoint_load(plan.resume_path, model);
    drafter_refresh_shadow(model);
    tokens_seen = st.tokens_seen;
    train_plan_check_loaded(plan, st);
    if (owner) log_here("resumed from %s at step %lld", plan.resume_path.c_str(), (long long)st.step);
  }

  // One receive slot: a batch is trained from in place and the next one's copy to the device waits for that
  // work anyway, so a second slot would buy no overlap for its memory (1.6 GiB at the 27B budget).
  std::unique_ptr<WirePool> pool;
  std::unique_ptr<FeatureReceiver> rx;
  if (offline) {
    rx = feature_receiver_files(plan, ctx.drafter_index);
  } else {
    NcclComm* nccl = ctx.nccl_world.get();  // transport nccl: the payload lands in the device slot itself
    pool = ops->wire_pool(1, WireLayout::bytes(budget, feat_cols, final_cols), nccl == nullptr);
    const DrafterBatches order{plan.batch_of(plan.start_step, 0, ctx.drafter_index), plan.num_drafters};
    rx = feature_receiver(ctx.data_comm, ctx.roles.targets, order, *pool,
                          payload_wire(ctx.data_comm, nccl, *pool));
  }
  std::unique_ptr<GradReducer> reducer = reducer_create(ctx, *ops, size_t(model.grads.numel()));
  OptimConfig optim = optim_config(plan);
  std::unique_ptr<MetricsLog> metrics;
  if (owner)
    // Offline, each drafter's reader thread stands where a target would: "tgt b/s" is the feature read rate.
    metrics = std::make_unique<MetricsLog>(plan.cfg.run.dir, plan.cfg.run.log_interval, plan.total_steps,
                                           plan.cfg.topology.offline ? plan.num_drafters : plan.num_targets,
                                           plan.num_drafters);
  if (owner) metrics->mark_start(plan.start_step, plan.resume_path, plan.run_id, plan.moved_aside);
  std::unique_ptr<HeldoutEval> heldout;  // [eval]: drafter 0 alone, between its steps
  if (owner && plan.cfg.eval.interval > 0) heldout = std::make_unique<HeldoutEval>(plan.cfg, plan.drafter);
  // Offline, each drafter's reader thread stands where a target would (as in the metrics' rates).
  const int stats_targets = plan.cfg.topology.offline ? plan.num_drafters : plan.num_targets;
  std::vector<int> all_targets;  // q_hs: how many targets have a batch for us waiting on the channel
  for (int t = 0; t < plan.num_targets; ++t) all_targets.push_back(t);

  CheckpointSaver saver(model);  // a device drafter writes in the background from a host snapshot
  auto save = [&](int64_t next_step) {
    if (!owner) return;
    CheckpointState st;
    st.step = next_step;
    st.batch_cursor = next_step * plan.batches_per_step;
    st.data_fingerprint = plan.data_fingerprint;
    st.tokens_seen = tokens_seen;
    st.config_text = plan.cfg.text;
    st.run_id = plan.run_id;
    saver.save(plan.ckpt_dir(), st, plan.cfg.checkpoint.keep_last);
  };

  // Role rebalancing: drafter 0 watches the rates; a move it decides travels in the next step's statistics.
  RebalanceLimits limits_now;
  limits_now.gpus = plan.num_targets + plan.num_drafters;
  limits_now.targets = plan.num_targets;
  limits_now.drafters = plan.num_drafters;
  limits_now.grad_accum = plan.grad_accum;
  limits_now.range = role_move_range(roles_slots(ctx.roles, ctx.gpus), ctx.roles.drafters[0]);
  std::unique_ptr<Rebalancer> rebalancer;
  if (owner && !offline && limits_now.gpus >= 2)
    rebalancer = std::make_unique<Rebalancer>(plan.cfg.pipeline, limits_now, plan.start_step);
  LoopEnd end;
  auto record = [&](const RebalanceEvent& e, const char* when) {
    const bool hint = e.kind == RebalanceEvent::Kind::advise && plan.cfg.pipeline.rebalance == "advise";
    log_here("%s%s%s", when, rebalance_event_text(e).c_str(),
             hint ? "; pipeline.rebalance = \"auto\" would move by itself" : "");
    metrics->event(rebalance_event_json(e));
  };

  Watchdog watchdog(plan.cfg.run.watchdog_s, watchdog_checkpoint_s(model.table().total),
                    watchdog_rank_names(ctx));
  int64_t step = plan.start_step;
  double last_lr = 0, last_gnorm = 0;
  for (; step < plan.total_steps; ++step) {
    auto t_step = std::chrono::steady_clock::now();
    double wait_s = 0;
    drafter_begin_step(model);
    StepStats ss = StepStats::shaped(B, stats_targets, plan.num_drafters);
#ifdef DF_HAVE_CUDA
    // The payload's NCCL receive gives up just inside the watchdog's bound for that wait (patience 1), so its
    // message, naming the batch and the target, comes first.
    if (ctx.nccl_world) ctx.nccl_world->set_step(step, 0.9 * watchdog.bound_s());
#endif
    for (int a = 0; a < plan.grad_accum; ++a) {
      const int64_t b = plan.batch_of(step, a, ctx.drafter_index);
      auto t_wait = std::chrono::steady_clock::now();
      ss.q_hs += rx->pending(all_targets);
      const int source = plan.num_targets > 0 ? int(b % plan.num_targets) : 0;  // offline: no targets
      if (plan.num_targets > 0)
        watchdog.beat("waiting for a batch from", ctx.roles.targets[size_t(source)]);
      else
        watchdog.beat("waiting for the feature reader thread");
      FeaturePacket p = rx->recv(source);
      watchdog.beat("training on a batch");
      wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
      DF_CHECK(p.hdr.batch_id == b, "drafter %d expected batch %lld from target %d but got batch %lld; HINT: all "
               "ranks must run the same config and data",
               ctx.drafter_index, (long long)b, source, (long long)p.hdr.batch_id);
      if (p.hdr.flags & FeatureHeader::kFlagStopRequested) ss.stop = 1;
      DrafterBatch db = mem.load(p);
      Rng rng(rng_mix(plan.cfg.run.seed, uint64_t(b)));
      std::vector<DrafterAnchor> anchors = anchors_sample_batch(db, plan.drafter.num_anchors, rng);
      ss.anchors_dropped += double(anchors_cap(anchors, limits.max_blocks, rng));
      DrafterLossOptions lo = loss_options_from_config(tc);
      lo.noise_std = noise_std_at(float(tc.noise_std), step, plan.total_steps);
      lo.noise_seed = rng.next_u64();
      drafter_accumulate(model, db, anchors, lo);
      ss.tokens += double(p.hdr.tokens);
      ss.batches += 1;
      ss.target_busy_s += p.hdr.target_busy_s;
      const size_t from = size_t(plan.num_targets > 0 ? source : ctx.drafter_index);
      ss.target_busy_by[from] += p.hdr.target_busy_s;
      ss.target_send_by[from] += p.hdr.target_send_s;
      ss.target_batches_by[from] += 1;
      ss.q_pre += double(p.hdr.q_pre);
    }
    drafter_grads_ready(model);  // zeros if none of the micro-batches ran a backward
    if (signals_stop_requested()) ss.stop = 1;
    if (end.move.new_targets > 0) ss.rebalance = end.move.new_targets;  // drafter 0 only: the sum is its value
    const LossStats ls = drafter_take_stats(model);
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
    ss.drafter_busy_by[size_t(ctx.drafter_index)] = ss.drafter_busy_s;
    ss.drafter_batches_by[size_t(ctx.drafter_index)] = double(plan.grad_accum);

    // Here a drafter waits on one that may wait on a target: more patience, so that one names the target.
    watchdog.beat("in the gradient all-reduce (waiting for the other drafters)", -1, 1.5);
#ifdef DF_HAVE_CUDA
    // The NCCL wait gives up at the watchdog's bound, before the watchdog's 1.5x above: its message names
    // the NCCL operation and the step.
    if (ctx.nccl_drafters) ctx.nccl_drafters->set_step(step, watchdog.bound_s());
#endif
    reducer->sum(model.grads.ptr<float>(), size_t(model.grads.numel()));
    std::vector<double> packed = ss.pack();
    reducer->sum(packed.data(), packed.size());
    ss.unpack(packed, B, stats_targets, plan.num_drafters);
    tokens_seen += int64_t(ss.tokens);
    // No labelled row anywhere this step: nothing to learn from, and 1/Σw would be infinite.
    AdamwStepResult r{};
    if (ss.weight_sum > 0) r = adamw_step(model, optim, step, 1.0 / ss.weight_sum);
    last_lr = r.lr;
    last_gnorm = r.grad_norm;
    const bool stop = ss.stop > 0 || step + 1 == plan.stop_at_step;
    const bool last = step + 1 == plan.total_steps;
    // A stop or the run's end wins over a move: the next start measures again.
    const bool reform = ss.rebalance > 0 && !stop && !last;
    const bool eval_now = heldout && ((step + 1) % plan.cfg.eval.interval == 0 || stop || last);
    if (eval_now) {
      watchdog.beat("evaluating on the held-out set (eval.data)");
      const LossStats ev = heldout->run(model, mem, loss_options_from_config(tc));
      metrics->set_eval(ev.mean_loss(), ev.tau(), loss_accuracy(ev));
    }
    if (owner) metrics->step(step, ss, r.lr, r.grad_norm, stop || last || eval_now || reform);
    watchdog.beat("writing a checkpoint");
    if ((step + 1) % plan.cfg.checkpoint.interval == 0 || stop || last || reform) save(step + 1);
    watchdog.step_done(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count());
    if (reform) {
      end.new_targets = int(ss.rebalance);
      if (owner) {
        end.move.moved_at = step + 1;
        end.move.moved = role_move_pick(roles_slots(ctx.roles, ctx.gpus), ctx.roles.drafters[0], end.new_targets);
        record(end.move, "");
      }
      ++step;
      break;
    }
    if (rebalancer && end.move.new_targets == 0)
      for (const RebalanceEvent& e : rebalancer->observe(step, ss.batches, ss.target_busy_s, ss.drafter_busy_s)) {
        if (e.kind == RebalanceEvent::Kind::move) {
          end.move = e;  // announced to the other drafters with the next step's statistics
          continue;
        }
        record(e, "");
      }
    if (stop) {
      if (owner)
        log_here("stop requested (%s): checkpointed step %lld, exiting",
                 ss.stop > 0 ? "signal or stop file on some rank" : "--stop-at-step", (long long)(step + 1));
      ++step;
      break;
    }
  }
  watchdog.beat("draining the targets at the end of the run");
  rx->finish();
  watchdog.beat("finishing the last checkpoint write");
  saver.wait();
  if (owner && end.new_targets > 0) log_here("checkpointed step %lld for the role move", (long long)step);
  if (owner && end.new_targets == 0) {
    log_here("training done: %lld steps, last lr %.2e, grad norm %.3f", (long long)step, last_lr, last_gnorm);
    log_here("checkpoints: %s (latest: %s)", plan.ckpt_dir().c_str(), checkpoint_find_latest(plan.ckpt_dir()).c_str());
    log_here("metrics: %s", metrics->path().c_str());
    double rt = metrics->target_rate(), rd = metrics->drafter_rate();
    if (plan.cfg.topology.offline && rt > 0 && rd > 0)
      log_here("offline features: read at %.3f batches/s per drafter, trained at %.3f batches/s (%s)", rt, rd,
               rt >= rd ? "reading keeps up" : "reading is the bottleneck: faster storage, or extract with fewer taps");
    if (rt > 0 && rd > 0 && plan.num_targets > 0 && plan.num_targets + plan.num_drafters >= 2) {
      SplitPlan sp = plan_split_compute(rt, rd, limits_now.gpus, rebalance_split_limits(limits_now));
      log_here("measured per-rank rates: target %.3f batches/s, drafter %.3f batches/s\n%s", rt, rd,
               plan_split_format(sp, "batches/s").c_str());
      // The whole run's advice, with its predicted gain and what the global batch and pins allow.
      if (plan.cfg.pipeline.rebalance != "off")
        for (RebalanceEvent e : rebalance_choose(rt, rd, limits_now, plan.cfg.pipeline.rebalance_margin, step)) {
          e.window_steps = step - plan.start_step;
          record(e, "at the end of the run: ");
        }
    }
  }
  return end;
}

}  // namespace df
