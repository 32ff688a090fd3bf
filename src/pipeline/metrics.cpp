// Metric lines and JSONL; see metrics.h.
#include "pipeline/metrics.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace df {

StepStats StepStats::shaped(int block, int targets, int drafters) {
  StepStats s;
  s.reshape(size_t(block), size_t(targets), size_t(drafters));
  return s;
}

void StepStats::reshape(size_t block, size_t targets, size_t drafters) {
  for (std::vector<double>* v : {&correct, &count}) v->resize(block - 1, 0.0);
  for (std::vector<double>* v : {&target_busy_by, &target_send_by, &target_batches_by}) v->resize(targets, 0.0);
  for (std::vector<double>* v : {&drafter_busy_by, &drafter_batches_by}) v->resize(drafters, 0.0);
}

namespace {

// The packed layout, in order, for pack and unpack alike (S: StepStats or const StepStats): the scalars, then
// the vectors at their current sizes.
template <class S>
auto scalar_fields(S& s) {
  return std::array{&s.loss_sum, &s.weight_sum,     &s.tau_sum, &s.tau_blocks, &s.tokens,
                    &s.batches,  &s.target_busy_s,  &s.drafter_busy_s, &s.q_pre, &s.q_hs,
                    &s.stop,     &s.anchors_dropped, &s.rebalance};
}
template <class S>
auto vector_fields(S& s) {
  return std::array{&s.correct,         &s.count,          &s.target_busy_by,   &s.target_send_by,
                    &s.target_batches_by, &s.drafter_busy_by, &s.drafter_batches_by};
}

}  // namespace

std::vector<double> StepStats::pack() const {
  std::vector<double> v;
  for (const double* d : scalar_fields(*this)) v.push_back(*d);
  for (const std::vector<double>* x : vector_fields(*this)) v.insert(v.end(), x->begin(), x->end());
  return v;
}

void StepStats::unpack(const std::vector<double>& v, int block, int targets, int drafters) {
  reshape(size_t(block), size_t(targets), size_t(drafters));
  auto at = v.begin();
  for (double* d : scalar_fields(*this)) *d = *at++;
  for (std::vector<double>* x : vector_fields(*this)) {
    std::copy(at, at + long(x->size()), x->begin());
    at += long(x->size());
  }
}

void StepStats::add(const StepStats& o) {
  const size_t block = std::max(correct.size(), o.correct.size()) + 1;
  const size_t targets = std::max(target_busy_by.size(), o.target_busy_by.size());
  const size_t drafters = std::max(drafter_busy_by.size(), o.drafter_busy_by.size());
  // Both packed at the common shape (a window starts empty), then summed element by element.
  auto widened = [&](StepStats s) {
    s.reshape(block, targets, drafters);
    return s.pack();
  };
  std::vector<double> a = widened(*this);
  const std::vector<double> b = widened(o);
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  unpack(a, int(block), int(targets), int(drafters));
}

double tau_from_accuracy(const std::vector<double>& acc) {
  double tau = 1, prod = 1;
  for (double a : acc) {
    prod *= a;
    tau += prod;
  }
  return tau;
}

MetricsLog::MetricsLog(const std::string& run_dir, double interval_s, int64_t total_steps, int num_targets,
                       int num_drafters)
    : path_(run_dir + "/metrics.jsonl"), interval_(interval_s), total_steps_(total_steps), num_targets_(num_targets),
      num_drafters_(num_drafters), start_(std::chrono::steady_clock::now()), last_(start_) {
  std::filesystem::create_directories(run_dir);
  f_ = std::fopen(path_.c_str(), "a");
  DF_CHECK(f_ != nullptr, "cannot open %s for appending; HINT: is run.dir writable?", path_.c_str());
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::append(const std::string& json_line) {
  const std::string line = json_line + "\n";
  DF_CHECK(std::fputs(line.c_str(), f_) >= 0 && std::fflush(f_) == 0,
           "writing %s failed; HINT: is the disk full?", path_.c_str());
}

void MetricsLog::mark_start(int64_t step, const std::string& resumed_from, const std::string& run_id,
                            const std::string& moved_aside) {
  nlohmann::json j = {{"event", "start"},
                      {"step", step},
                      {"resumed_from", resumed_from},
                      {"run_id", run_id},
                      {"time", utc_now("%Y-%m-%dT%H:%M:%SZ")},
                      {"host", process_info().host},
                      {"targets", num_targets_},
                      {"drafters", num_drafters_}};
  if (!moved_aside.empty()) j["moved_aside"] = moved_aside;
  append(j.dump());
}

double MetricsLog::target_rate() const {
  return run_.target_busy_s > 0 ? run_.batches / run_.target_busy_s : 0.0;
}

double MetricsLog::drafter_rate() const {
  // drafter_busy_s sums every drafter's time; batches are shared among them.
  return run_.drafter_busy_s > 0 ? run_.batches / run_.drafter_busy_s : 0.0;
}

void MetricsLog::set_eval(double loss, double tau, const std::vector<double>& acc) {
  has_eval_ = true;
  eval_loss_ = loss;
  eval_tau_ = tau;
  eval_acc_ = acc;
}

void MetricsLog::step(int64_t step, const StepStats& s, double lr, double grad_norm, bool force) {
  if (first_step_ < 0) first_step_ = step;
  window_.add(s);
  run_.add(s);
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_).count();
  if (!force && since < interval_) return;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  const StepStats& w = window_;
  std::vector<double> acc;
  for (size_t k = 0; k < w.correct.size(); ++k) acc.push_back(w.count[k] > 0 ? w.correct[k] / w.count[k] : 0.0);
  double loss = w.weight_sum > 0 ? w.loss_sum / w.weight_sum : 0.0;
  double tau = w.tau_blocks > 0 ? w.tau_sum / w.tau_blocks : 0.0;
  double tau_est = tau_from_accuracy(acc);
  // Pipeline rates over the window: what each side could sustain (batches per second of busy time, times
  // its rank count) and what actually went through.
  double tgt_bps = w.target_busy_s > 0 ? num_targets_ * w.batches / w.target_busy_s : 0.0;
  double dft_bps = w.drafter_busy_s > 0 ? num_drafters_ * w.batches / w.drafter_busy_s : 0.0;
  double ktok_s = w.tokens / std::max(since, 1e-9) / 1e3;
  double steps_done = double(step + 1 - first_step_);
  double eta = steps_done > 0 ? elapsed / steps_done * double(total_steps_ - step - 1) : 0.0;
  double q_hs = w.q_hs / std::max(1.0, w.batches), q_pre = w.q_pre / std::max(1.0, w.batches);
  // Per rank: batches per second of its own busy time; and what streaming costs each target, as its send
  // path's share of its forward time.
  auto rates = [](const std::vector<double>& batches, const std::vector<double>& busy) {
    std::vector<double> r(busy.size(), 0.0);
    for (size_t i = 0; i < busy.size(); ++i) r[i] = busy[i] > 0 ? batches[i] / busy[i] : 0.0;
    return r;
  };
  const std::vector<double> send_share = rates(w.target_send_by, w.target_busy_by);
  double send_s = 0;
  for (double x : w.target_send_by) send_s += x;
  const double tgt_send_share = w.target_busy_s > 0 ? send_s / w.target_busy_s : 0.0;

  std::string acc_text;
  for (size_t k = 0; k < acc.size() && k < 8; ++k) acc_text += strfmt("%s%.2f", k ? " " : "", acc[k]);
  if (acc.size() > 8) acc_text += " ..";
  const std::string eval_text = has_eval_ ? strfmt(" | eval loss %.4f tau %.2f", eval_loss_, eval_tau_) : "";
  log_here("step %6lld/%lld | loss %.4f | acc[k] %s | tau %.2f (est %.2f) | lr %.2e | gnorm %.3f | tgt %.2f b/s "
           "dft %.2f b/s | q_hs %.1f q_pre %.1f | %.1f Ktok/s | ETA %.0fs%s",
           (long long)(step + 1), (long long)total_steps_, loss, acc_text.c_str(), tau, tau_est, lr, grad_norm, tgt_bps,
           dft_bps, q_hs, q_pre, ktok_s, eta, eval_text.c_str());
  nlohmann::json j = {{"step", step + 1},
                      {"loss", loss},
                      {"acc", acc},
                      {"tau", tau},
                      {"tau_est", tau_est},
                      {"lr", lr},
                      {"grad_norm", grad_norm},
                      {"tgt_batches_s", tgt_bps},
                      {"dft_batches_s", dft_bps},
                      {"q_hs", q_hs},
                      {"q_pre", q_pre},
                      {"ktok_s", ktok_s},
                      {"eta_s", eta},
                      {"elapsed_s", elapsed},
                      {"anchors_dropped", w.anchors_dropped},
                      {"tgt_rank_batches_s", rates(w.target_batches_by, w.target_busy_by)},
                      {"dft_rank_batches_s", rates(w.drafter_batches_by, w.drafter_busy_by)},
                      {"tgt_send_share", tgt_send_share},
                      {"tgt_rank_send_share", send_share}};
  if (has_eval_) {
    j["eval_loss"] = eval_loss_;
    j["eval_tau"] = eval_tau_;
    j["eval_acc"] = eval_acc_;
    has_eval_ = false;
  }
  append(j.dump());
  window_ = StepStats{};
  last_ = now;
}

}  // namespace df
