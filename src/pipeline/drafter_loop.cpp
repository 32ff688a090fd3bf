// The drafter role: for every optimizer step, take this drafter's micro-batches off the feature channel
// (from target b % T, in global batch order), run the DFlash forward/backward on drafter.device, all-reduce
// gradients and the step statistics among drafters, AdamW, then metrics and checkpoints on drafter 0. A stop
// requested by a signal on any rank travels with the statistics, so all drafters leave after the same step;
// so does drafter 0's decision to move the roles (pipeline/rebalance.h), one step after it is made.
#include <chrono>
#include <optional>

#include "core/clock.h"
#include "core/log.h"
#include "core/rng.h"
#include "comm/drafter_links.h"
#include "comm/watchdog.h"
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
#include "train/loss.h"
#include "train/optimizer.h"

namespace df {

namespace {

using Clock = std::chrono::steady_clock;

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

// What a role move may do from this run's roles (pipeline/rebalance.h).
RebalanceLimits rebalance_limits(const TrainPlan& p, const DistContext& ctx) {
  RebalanceLimits l;
  l.gpus = p.num_targets + p.num_drafters;
  l.targets = p.num_targets;
  l.drafters = p.num_drafters;
  l.grad_accum = p.grad_accum;
  l.range = role_move_range(roles_slots(ctx.roles, ctx.gpus), ctx.roles.drafters[0]);
  return l;
}

// One drafter rank's run. The constructor sets it up: the frozen target embedding and lm_head, the model and
// its weights (fresh, drafter.init_from or the resumed checkpoint), where batches come from (the feature
// channel, or offline the feature files), the gradient reducer, and on drafter 0 the metrics, the held-out
// evaluation and the role rebalancer. step() runs one optimizer step; finish() drains and reports.
class DrafterRun {
 public:
  DrafterRun(const TrainPlan& plan, const DistContext& ctx);
  // Optimizer step `step`; false when the run leaves after it (a stop, or a role move agreed on).
  bool step(int64_t step);
  // After the last step run, with `next_step` the one a later run starts at: drains the targets, waits for
  // the last checkpoint and, on drafter 0 at the end of training, prints the summary and the split advice.
  LoopEnd finish(int64_t next_step);

 private:
  void load_weights();
  FeatureInbox open_inbox();
  FeaturePacket receive(int64_t batch, int source, StepStats& ss, double& wait_s);
  void train_micro_batch(int64_t step, int micro, StepStats& ss, double& wait_s);
  void take_loss_stats(StepStats& ss);
  AdamwStepResult reduce_and_update(int64_t step, StepStats& ss);
  bool after_update(int64_t step, const StepStats& ss, const AdamwStepResult& r, Clock::time_point t_step);
  // A move agreed on in this step's statistics: the split it makes and, on drafter 0, the ranks that move.
  void take_role_move(int64_t step, int new_targets);
  // Drafter 0: this step's rates to the rebalancer; a move it decides is announced with the next step's
  // statistics, anything else recorded.
  void watch_rates(int64_t step, const StepStats& ss);
  void save(int64_t next_step);
  void record(const RebalanceEvent& e, const char* when);
  void report(int64_t next_step);

  const TrainPlan& plan_;
  const DistContext& ctx_;
  const TrainSection& tc_;
  const bool owner_;  // drafter 0: checkpoints, metrics, held-out evaluation, rebalancing
  const int B_;
  const int64_t feat_cols_, final_cols_;
  // Offline, each drafter's reader thread stands where a target would (as in the metrics' rates).
  const int stats_targets_;
  CpuOps target_ops_;
  std::unique_ptr<TargetModel> frozen_;  // the target's embedding and lm_head, from the targets' source
  std::unique_ptr<TrainOps> ops_;
  DrafterModel model_;
  DrafterMemory mem_;
  const DrafterLimits limits_;
  int64_t tokens_seen_ = 0;  // context tokens trained on by all drafters, since step 0
  FeatureInbox inbox_;
  std::unique_ptr<GradReducer> reducer_;
  const OptimConfig optim_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<HeldoutEval> heldout_;  // [eval]: drafter 0 alone, between its steps
  std::vector<int> all_targets_;          // q_hs: how many targets have a batch for us waiting on the channel
  CheckpointSaver saver_;                 // a device drafter writes in the background from a host snapshot
  const RebalanceLimits limits_now_;
  std::unique_ptr<Rebalancer> rebalancer_;
  LoopEnd end_;
  std::optional<Watchdog> watchdog_;  // started once the set-up is done
  double last_lr_ = 0, last_gnorm_ = 0;
};

DrafterRun::DrafterRun(const TrainPlan& plan, const DistContext& ctx)
    : plan_(plan),
      ctx_(ctx),
      tc_(plan.cfg.train),
      owner_(ctx.drafter_index == 0),
      B_(plan.drafter.block_size),
      feat_cols_(int64_t(plan.drafter.hidden) * plan.drafter.num_taps()),
      final_cols_(plan.final_hidden ? plan.drafter.hidden : 0),
      stats_targets_(plan.cfg.topology.offline ? plan.num_drafters : plan.num_targets),
      frozen_(target_load_for_run(plan.cfg.target, plan.target, target_ops_, 0, true)),
      ops_(train_ops_create(plan.cfg.drafter.device, std::max(ctx.gpu, 0))),
      model_(plan.drafter, *ops_),
      // Host-built batches (offline feature files, held-out data) are staged; the channel's land in its pool.
      mem_(*ops_, frozen_->embed, frozen_->lm_head,
           plan.cfg.topology.offline || (owner_ && plan.cfg.eval.interval > 0) ? plan.cfg.data.token_budget
                                                                               : 0,
           feat_cols_, final_cols_),
      limits_(drafter_limits_from_run(plan.cfg)),
      optim_(optim_config(plan)),
      saver_(model_),
      limits_now_(rebalance_limits(plan, ctx)) {
  model_.set_frozen(mem_.embed(), mem_.lm_head());
  drafter_plan_workspace(model_, limits_);
  if (owner_)
    log_here("drafter on %s: workspace %.1f MiB for %lld tokens and %lld blocks per micro-batch", ops_->name(),
             double(model_.workspace_bytes) / (1 << 20), (long long)limits_.max_tokens,
             (long long)limits_.max_blocks);
  load_weights();
  inbox_ = open_inbox();
  reducer_ = grad_reducer_create(ctx, *ops_, size_t(model_.grads.numel()));
  if (owner_) {
    // Offline, "tgt b/s" is the feature read rate.
    metrics_ = std::make_unique<MetricsLog>(plan.cfg.run.dir, plan.cfg.run.log_interval, plan.total_steps,
                                            stats_targets_, plan.num_drafters);
    metrics_->mark_start(plan.start_step, plan.resume_path, plan.run_id, plan.moved_aside);
    if (plan.cfg.eval.interval > 0) heldout_ = std::make_unique<HeldoutEval>(plan.cfg, plan.drafter);
  }
  for (int t = 0; t < plan.num_targets; ++t) all_targets_.push_back(t);
  // Role rebalancing: drafter 0 watches the rates; a move it decides travels in the next step's statistics.
  if (owner_ && !plan.cfg.topology.offline && limits_now_.gpus >= 2)
    rebalancer_ = std::make_unique<Rebalancer>(plan.cfg.pipeline, limits_now_, plan.start_step);
  watchdog_.emplace(plan.cfg.run.watchdog_s, watchdog_checkpoint_s(model_.table().total), watchdog_rank_names(ctx));
}

void DrafterRun::load_weights() {
  drafter_init_params(model_, plan_.cfg.drafter.init_seed);
  if (plan_.resume_path.empty() && !plan_.cfg.drafter.init_from.empty()) {
    // A resumed checkpoint's weights win over init_from (the folder only seeds a fresh run).
    drafter_init_from(model_, plan_.cfg.drafter.init_from);
    drafter_refresh_shadow(model_);
    if (owner_) log_here("drafter weights from %s (optimizer state fresh)", plan_.cfg.drafter.init_from.c_str());
  }
  if (!plan_.resume_path.empty()) {
    CheckpointState st = checkpoint_load(plan_.resume_path, model_);
    drafter_refresh_shadow(model_);
    tokens_seen_ = st.tokens_seen;
    train_plan_check_loaded(plan_, st);
    if (owner_) log_here("resumed from %s at step %lld", plan_.resume_path.c_str(), (long long)st.step);
  }
}

FeatureInbox DrafterRun::open_inbox() {
  if (plan_.cfg.topology.offline) {
    FeatureInbox files;
    files.rx = feature_receiver_files(plan_, ctx_.drafter_index);
    return files;
  }
  // One receive slot: a batch is trained from in place and the next one's copy to the device waits for that
  // work anyway, so a second slot would buy no overlap for its memory (1.6 GiB at the 27B budget).
  const DrafterBatches order{plan_.batch_of(plan_.start_step, 0, ctx_.drafter_index), plan_.num_drafters};
  return feature_inbox_create(ctx_, *ops_, 1, WireLayout::bytes(plan_.cfg.data.token_budget, feat_cols_, final_cols_),
                              order);
}

bool DrafterRun::step(int64_t step) {
  const auto t_step = Clock::now();
  double wait_s = 0;
  drafter_begin_step(model_);
  StepStats ss = StepStats::shaped(B_, stats_targets_, plan_.num_drafters);
  // The payload's NCCL receive gives up just inside the watchdog's bound for that wait (patience 1), so its
  // message, naming the batch and the target, comes first.
  dist_nccl_set_step(ctx_.nccl_world.get(), step, 0.9 * watchdog_->bound_s());
  for (int a = 0; a < plan_.grad_accum; ++a) train_micro_batch(step, a, ss, wait_s);
  drafter_grads_ready(model_);  // zeros if none of the micro-batches ran a backward
  if (signals_stop_requested()) ss.stop = 1;
  if (end_.move.new_targets > 0) ss.rebalance = end_.move.new_targets;  // drafter 0 only: the sum is its value
  take_loss_stats(ss);
  ss.drafter_busy_s = seconds_since(t_step) - wait_s;
  ss.drafter_busy_by[size_t(ctx_.drafter_index)] = ss.drafter_busy_s;
  ss.drafter_batches_by[size_t(ctx_.drafter_index)] = double(plan_.grad_accum);
  const AdamwStepResult r = reduce_and_update(step, ss);
  return after_update(step, ss, r, t_step);
}

// Batch `batch` from `source`, checked to be the one the global order gives this drafter; the wait is added
// to wait_s, the channel's queue depth and a stop a target passed on to ss.
FeaturePacket DrafterRun::receive(int64_t batch, int source, StepStats& ss, double& wait_s) {
  const auto t_wait = Clock::now();
  ss.q_hs += inbox_.rx->pending(all_targets_);
  if (plan_.num_targets > 0)
    watchdog_->beat("waiting for a batch from", ctx_.roles.targets[size_t(source)]);
  else
    watchdog_->beat("waiting for the feature reader thread");
  FeaturePacket p = inbox_.rx->recv(source);
  watchdog_->beat("training on a batch");
  wait_s += seconds_since(t_wait);
  DF_CHECK(p.hdr.batch_id == batch, "drafter %d expected batch %lld from target %d but got batch %lld; HINT: all "
           "ranks must run the same config and data",
           ctx_.drafter_index, (long long)batch, source, (long long)p.hdr.batch_id);
  if (p.hdr.flags & FeatureHeader::kFlagStopRequested) ss.stop = 1;
  return p;
}

void DrafterRun::train_micro_batch(int64_t step, int micro, StepStats& ss, double& wait_s) {
  const int64_t b = plan_.batch_of(step, micro, ctx_.drafter_index);
  const int source = plan_.num_targets > 0 ? int(b % plan_.num_targets) : 0;  // offline: no targets
  const FeaturePacket p = receive(b, source, ss, wait_s);
  DrafterBatch db = mem_.load(p);
  Rng rng(rng_mix(plan_.cfg.run.seed, uint64_t(b)));
  std::vector<DrafterAnchor> anchors = anchors_sample_batch(db, plan_.drafter.num_anchors, rng);
  ss.anchors_dropped += double(anchors_cap(anchors, limits_.max_blocks, rng));
  DrafterLossOptions lo = loss_options_from_config(tc_);
  lo.noise_std = noise_std_at(float(tc_.noise_std), step, plan_.total_steps);
  lo.noise_seed = rng.next_u64();
  lo.domino_lambda = loss_domino_lambda(tc_, model_.config(), step, plan_.total_steps);
  lo.dflash2_selector_alpha = loss_dflash2_selector_alpha(tc_, model_.config(), step, plan_.total_steps);
  drafter_accumulate(model_, db, anchors, lo);
  ss.tokens += double(p.hdr.tokens);
  ss.batches += 1;
  ss.target_busy_s += p.hdr.target_busy_s;
  const size_t from = size_t(plan_.num_targets > 0 ? source : ctx_.drafter_index);
  ss.target_busy_by[from] += p.hdr.target_busy_s;
  ss.target_send_by[from] += p.hdr.target_send_s;
  ss.target_batches_by[from] += 1;
  ss.q_pre += double(p.hdr.q_pre);
}

void DrafterRun::take_loss_stats(StepStats& ss) {
  const LossStats ls = drafter_take_stats(model_);
  ss.loss_sum = ls.loss_sum;
  ss.weight_sum = ls.weight_sum;
  ss.correct.assign(ls.correct.begin(), ls.correct.end());
  ss.count.assign(ls.count.begin(), ls.count.end());
  ss.correct.resize(B_ - 1, 0.0);
  ss.count.resize(B_ - 1, 0.0);
  ss.tau_sum = ls.tau_sum;
  ss.tau_blocks = double(ls.tau_blocks);
}

AdamwStepResult DrafterRun::reduce_and_update(int64_t step, StepStats& ss) {
  // Here a drafter waits on one that may wait on a target: more patience, so that one names the target.
  watchdog_->beat("in the gradient all-reduce (waiting for the other drafters)", -1, 1.5);
  // The NCCL wait gives up at the watchdog's bound, before the watchdog's 1.5x above: its message names
  // the NCCL operation and the step.
  dist_nccl_set_step(ctx_.nccl_drafters.get(), step, watchdog_->bound_s());
  reducer_->sum(model_.grads.ptr<float>(), size_t(model_.grads.numel()));
  std::vector<double> packed = ss.pack();
  reducer_->sum(packed.data(), packed.size());
  ss.unpack(packed, B_, stats_targets_, plan_.num_drafters);
  tokens_seen_ += int64_t(ss.tokens);
  // No labelled row anywhere this step: nothing to learn from, and 1/Σw would be infinite.
  AdamwStepResult r{};
  if (ss.weight_sum > 0) r = adamw_step(model_, optim_, step, 1.0 / ss.weight_sum);
  last_lr_ = r.lr;
  last_gnorm_ = r.grad_norm;
  return r;
}

// The held-out evaluation, the metrics line and the checkpoint this step calls for, then whether the run goes
// on: not after a stop, nor after a role move agreed on in this step's statistics.
bool DrafterRun::after_update(int64_t step, const StepStats& ss, const AdamwStepResult& r, Clock::time_point t_step) {
  const bool stop = ss.stop > 0 || step + 1 == plan_.stop_at_step;
  const bool last = step + 1 == plan_.total_steps;
  // A stop or the run's end wins over a move: the next start measures again.
  const bool reform = ss.rebalance > 0 && !stop && !last;
  const bool eval_now = heldout_ && ((step + 1) % plan_.cfg.eval.interval == 0 || stop || last);
  if (eval_now) {
    watchdog_->beat("evaluating on the held-out set (eval.data)");
    DrafterLossOptions eo = loss_options_from_config(tc_);
    // At the steps done, as SpecForge evaluates (its global_step counts the step just taken).
    eo.domino_lambda = loss_domino_lambda(tc_, model_.config(), step + 1, plan_.total_steps);
    eo.dflash2_selector_alpha =
        loss_dflash2_selector_alpha(tc_, model_.config(), step + 1, plan_.total_steps);
    const LossStats ev = heldout_->run(model_, mem_, eo);
    metrics_->set_eval(ev.mean_loss(), ev.tau(), loss_accuracy(ev));
  }
  if (owner_) metrics_->step(step, ss, r.lr, r.grad_norm, stop || last || eval_now || reform);
  watchdog_->beat("writing a checkpoint");
  if ((step + 1) % plan_.cfg.checkpoint.interval == 0 || stop || last || reform) save(step + 1);
  watchdog_->step_done(seconds_since(t_step));
  if (reform) {
    take_role_move(step, int(ss.rebalance));
    return false;
  }
  if (rebalancer_ && end_.move.new_targets == 0) watch_rates(step, ss);
  if (stop && owner_)
    log_here("stop requested (%s): checkpointed step %lld, exiting",
             ss.stop > 0 ? "signal or stop file on some rank" : "--stop-at-step", (long long)(step + 1));
  return !stop;
}

void DrafterRun::take_role_move(int64_t step, int new_targets) {
  end_.new_targets = new_targets;
  if (!owner_) return;
  end_.move.moved_at = step + 1;
  end_.move.moved = role_move_pick(roles_slots(ctx_.roles, ctx_.gpus), ctx_.roles.drafters[0], new_targets);
  record(end_.move, "");
}

void DrafterRun::watch_rates(int64_t step, const StepStats& ss) {
  for (const RebalanceEvent& e : rebalancer_->observe(step, ss.batches, ss.target_busy_s, ss.drafter_busy_s)) {
    if (e.kind == RebalanceEvent::Kind::move) {
      end_.move = e;  // announced to the other drafters with the next step's statistics
      continue;
    }
    record(e, "");
  }
}

void DrafterRun::save(int64_t next_step) {
  if (!owner_) return;
  CheckpointState st;
  st.step = next_step;
  st.batch_cursor = next_step * plan_.batches_per_step;
  st.data_fingerprint = plan_.data_fingerprint;
  st.tokens_seen = tokens_seen_;
  st.config_text = plan_.cfg.text;
  st.run_id = plan_.run_id;
  saver_.save(plan_.ckpt_dir(), st, plan_.cfg.checkpoint.keep_last);
}

void DrafterRun::record(const RebalanceEvent& e, const char* when) {
  const bool hint = e.kind == RebalanceEvent::Kind::advise && plan_.cfg.pipeline.rebalance == "advise";
  log_here("%s%s%s", when, rebalance_event_text(e).c_str(),
           hint ? "; pipeline.rebalance = \"auto\" would move by itself" : "");
  metrics_->event(rebalance_event_json(e));
}

LoopEnd DrafterRun::finish(int64_t next_step) {
  watchdog_->beat("draining the targets at the end of the run");
  inbox_.rx->finish();
  watchdog_->beat("finishing the last checkpoint write");
  saver_.wait();
  if (owner_ && end_.new_targets > 0) log_here("checkpointed step %lld for the role move", (long long)next_step);
  if (owner_ && end_.new_targets == 0) report(next_step);
  return end_;
}

// Drafter 0's end of training: where the checkpoints and metrics are, the measured per-rank rates and
// the split they call for.
void DrafterRun::report(int64_t next_step) {
  log_here("training done: %lld steps, last lr %.2e, grad norm %.3f", (long long)next_step, last_lr_, last_gnorm_);
  log_here("checkpoints: %s (latest: %s)", plan_.ckpt_dir().c_str(), checkpoint_find_latest(plan_.ckpt_dir()).c_str());
  log_here("metrics: %s", metrics_->path().c_str());
  const double rt = metrics_->target_rate(), rd = metrics_->drafter_rate();
  if (plan_.cfg.topology.offline && rt > 0 && rd > 0)
    log_here("offline features: read at %.3f batches/s per drafter, trained at %.3f batches/s (%s)", rt, rd,
             rt >= rd ? "reading keeps up" : "reading is the bottleneck: faster storage, or extract with fewer taps");
  if (!(rt > 0 && rd > 0 && plan_.num_targets > 0 && plan_.num_targets + plan_.num_drafters >= 2)) return;
  SplitPlan sp = plan_split_compute(rt, rd, limits_now_.gpus, rebalance_split_limits(limits_now_));
  log_here("measured per-rank rates: target %.3f batches/s, drafter %.3f batches/s\n%s", rt, rd,
           plan_split_format(sp, "batches/s").c_str());
  // The whole run's advice, with its predicted gain and what the global batch and pins allow.
  if (plan_.cfg.pipeline.rebalance != "off")
    for (RebalanceEvent e : rebalance_choose(rt, rd, limits_now_, plan_.cfg.pipeline.rebalance_margin, next_step)) {
      e.window_steps = next_step - plan_.start_step;
      record(e, "at the end of the run: ");
    }
}

}  // namespace

LoopEnd drafter_loop(const TrainPlan& plan, const DistContext& ctx) {
  DrafterRun run(plan, ctx);
  int64_t step = plan.start_step;
  while (step < plan.total_steps)
    if (!run.step(step++)) break;
  return run.finish(step);
}

}  // namespace df
