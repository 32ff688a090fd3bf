// Training metrics: accumulated per log interval on drafter 0 from the globally reduced step statistics,
// printed as one line and appended to <run_dir>/metrics.jsonl as one JSON object. Every (re)start of a run
// appends a marker line first ({"event": "start", ...}, no "loss"), so a reader can tell the segments apart.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace df {

// Everything one optimizer step contributes, summed over drafters (the layout of the reduced vector).
struct StepStats {
  double loss_sum = 0, weight_sum = 0;
  std::vector<double> correct, count;  // per block offset k = 1..B−1
  double tau_sum = 0, tau_blocks = 0;
  double tokens = 0;                   // context tokens trained on
  double batches = 0;
  double target_busy_s = 0;            // Σ over batches of the target's forward + pack time
  double drafter_busy_s = 0;           // Σ over drafters of their compute time this step
  double q_pre = 0, q_hs = 0;          // Σ of samples (divide by batches / drafters)
  double stop = 0;                     // > 0: some rank asked to stop
  double anchors_dropped = 0;          // anchors over drafter.max_block_rows, dropped (Σ over the window)
  double rebalance = 0;                // > 0: drafter 0 moves the roles to this many targets after this step
  // Per rank, for the per-rank rates and the cost of streaming (index: target index, or the drafter's reader
  // thread offline; drafter index): busy seconds, batches, and each target's send-path seconds.
  std::vector<double> target_busy_by, target_send_by, target_batches_by;  // [targets]
  std::vector<double> drafter_busy_by, drafter_batches_by;               // [drafters]

  // Zeroed stats with every vector sized: block − 1 offsets, `targets` and `drafters` ranks.
  static StepStats shaped(int block, int targets, int drafters);
  // Sizes every vector so (keeping what it holds, zeros after).
  void reshape(size_t block, size_t targets, size_t drafters);
  std::vector<double> pack() const;
  void unpack(const std::vector<double>& v, int block, int targets = 0, int drafters = 0);
  void add(const StepStats& o);
};

// Expected acceptance length from per-offset accuracies: 1 + Σ_k Π_{j≤k} acc_j (offsets treated as
// independent — an estimate; the measured τ comes from leading-correct counts).
double tau_from_accuracy(const std::vector<double>& acc);

class MetricsLog {
 public:
  MetricsLog(const std::string& run_dir, double interval_s, int64_t total_steps, int num_targets, int num_drafters);
  ~MetricsLog();
  // The start marker: the step the run starts at, the checkpoint it resumed ("" for none), its lineage id,
  // and where --fresh-start moved earlier checkpoints ("" for nowhere).
  void mark_start(int64_t step, const std::string& resumed_from, const std::string& run_id,
                  const std::string& moved_aside);
  // Called every step on drafter 0; prints and appends when the interval has passed (or force).
  void step(int64_t step, const StepStats& s, double lr, double grad_norm, bool force);
  // A held-out evaluation after this step (pipeline/heldout.h): the next line printed carries its loss, τ and
  // per-offset accuracy (eval_loss, eval_tau, eval_acc in the JSON).
  void set_eval(double loss, double tau, const std::vector<double>& acc);
  // Any other record (role rebalancing, pipeline/rebalance.h): one JSON object, appended as it is.
  void event(const std::string& json_line) { append(json_line); }
  std::string path() const { return path_; }
  // Per-GPU rates over the whole run so far (batches/s): for the split recommendation.
  double target_rate() const;
  double drafter_rate() const;

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  double interval_;
  int64_t total_steps_;
  int num_targets_, num_drafters_;
  std::chrono::steady_clock::time_point start_, last_;
  int64_t first_step_ = -1;
  StepStats window_, run_;
  bool has_eval_ = false;
  double eval_loss_ = 0, eval_tau_ = 0;
  std::vector<double> eval_acc_;

  void append(const std::string& json_line);
};

}  // namespace df
