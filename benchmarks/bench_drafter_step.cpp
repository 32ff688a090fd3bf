// One drafter training step (forward + backward + AdamW) on a TrainOps backend, on the drafter shapes of the
// run configs (Qwen3.6-27B and Qwen3-8B drafters; --kind domino: their Domino recipes, the GRU head and both
// CE terms included; --kind dspark: their DSpark recipes, the Markov and confidence heads and the CE + L1 +
// BCE loss with the target's final hidden state included), random weights, 1 x 4096 context tokens, the
// recipe's anchors. Prints FLOPs, time, TFLOP/s against the 790 TFLOP/s ceiling, context tok/s, device
// memory, a per-op breakdown and the result check, then one JSON line that run_drafter_step.sh divides into
// SpecForge's (same shapes). Plain main(): the GPU machine has no Google Benchmark.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/strfmt.h"
#include "model/drafter.h"
#include "model/model_flops.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/ops_factory.h"
#include "topo/plan_vram.h"
#include "train/anchors.h"
#include "train/loss.h"
#include "train/optimizer.h"
#ifdef DF_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/cuda_check.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#endif

using namespace df;

namespace {

constexpr double kPeakTflops = 790.0;  // cuBLASLt bf16 8192³ on this H200 (bench_kernels.md)
constexpr double kGiB = double(1 << 30);
// An "80 GB" H100 reports 81,559 MiB of device memory: what the <= 80 GB claim of the 27B recipe is held to.
constexpr double k80GB = 81559.0 * (1 << 20);

// The targets whose drafters are timed: the run configs name checkpoint directories the benchmark machine
// lacks, so the drafter borrows these shapes (MODELS.md) instead of reading the target's config.json.
struct BenchTarget {
  const char* label;
  const char* toml;         // relative to the source tree
  const char* domino_toml;  // the Domino recipe of the same target
  const char* dspark_toml;   // the DSpark recipe of the same target
  const char* dflash2_toml;  // its DFlash2 recipe; null: none yet
  int hidden, layers, intermediate, vocab;
};
constexpr BenchTarget kTargets[] = {
    {"27b", "configs/qwen3.6-27b.toml", "configs/qwen3.6-27b-domino.toml", "configs/qwen3.6-27b-dspark.toml",
     "configs/qwen3.6-27b-dflash2.toml", 5120, 64, 17408, 248320},
    {"8b", "configs/qwen3-8b.toml", "configs/qwen3-8b-domino.toml", "configs/qwen3-8b-dspark.toml", nullptr, 4096,
     36, 12288, 151936}};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void device_sync(TrainOps& ops) {
#ifdef DF_HAVE_CUDA
  if (ops.device() == Device::cuda) DF_CUDA_CHECK(cudaDeviceSynchronize());
#else
  (void)ops;
#endif
}

// Forwards every op to the real backend. When `timing` is on it brackets each op with cudaEvents (CUDA) or
// the wall clock (CPU, whose ops are synchronous) and collect() sums the times per op name. It always tracks
// the bytes the model holds through alloc_bytes, so the allocator's high water is reported on both backends.
class TimedTrainOps final : public TrainOps {
 public:
  explicit TimedTrainOps(TrainOps& inner) : g_(inner) {
#ifdef DF_HAVE_CUDA
    if (auto* cuda = dynamic_cast<CudaTrainOps*>(&inner)) stream_ = cuda->stream();
#endif
  }
  ~TimedTrainOps() override {
#ifdef DF_HAVE_CUDA
    for (auto& e : events_) cudaEventDestroy(e);
#endif
  }
  bool timing = false;
  size_t live_bytes = 0, peak_bytes = 0;

  Device device() const override {
    return g_.device();
  }
  const char* name() const override {
    return g_.name();
  }
  DType act_dtype() const override {
    return g_.act_dtype();
  }

  void* alloc_bytes(size_t bytes) override {
    void* p = g_.alloc_bytes(bytes);
    sizes_[p] = bytes;
    live_bytes += bytes;
    peak_bytes = std::max(peak_bytes, live_bytes);
    return p;
  }
  void free_bytes(void* p) override {
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      live_bytes -= it->second;
      sizes_.erase(it);
    }
    g_.free_bytes(p);
  }
  void upload_raw(const Tensor& d, const void* h) override {
    timed("upload", [&] { g_.upload_raw(d, h); });
  }
  void download_raw(const Tensor& s, void* h) override {
    timed("download", [&] { g_.download_raw(s, h); });
  }
  void copy(const Tensor& s, const Tensor& d) override {
    timed("copy", [&] { g_.copy(s, d); });
  }
  void fill(const Tensor& d, float v) override {
    timed("fill", [&] { g_.fill(d, v); });
  }
  // GEMMs are named by their role (from the transposes) and the two dims that identify the weight.
  void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float alpha,
            float beta) override {
    const char* role = ta ? "dW += dY^T X" : (tb ? "Y = X W^T" : "dX = dY W");
    const int64_t k = ta ? a.rows : a.cols;
    timed(strfmt("gemm %s [%lld x %lld, K %lld]", role, (long long)c.rows, (long long)c.cols, (long long)k),
          [&] { g_.gemm(a, ta, b, tb, c, alpha, beta); });
  }
  void gemm_add(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c_in, const Tensor& c,
                float alpha, float beta) override {
    const char* role = ta ? "dW += dY^T X" : (tb ? "Y = X W^T" : "dX = dY W");
    const int64_t k = ta ? a.rows : a.cols;
    timed(
        strfmt("gemm %s + C [%lld x %lld, K %lld]", role, (long long)c.rows, (long long)c.cols, (long long)k),
        [&] { g_.gemm_add(a, ta, b, tb, c_in, c, alpha, beta); });
  }
  void embedding(const Tensor& ids, const Tensor& t, const Tensor& o) override {
    timed("embedding", [&] { g_.embedding(ids, t, o); });
  }
  void scale_rows(const Tensor& x, const Tensor& s) override {
    timed("scale_rows", [&] { g_.scale_rows(x, s); });
  }
  void add_gaussian_noise(const Tensor& x, float std, uint64_t seed) override {
    timed("add_gaussian_noise", [&] { g_.add_gaussian_noise(x, std, seed); });
  }
  void rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd,
                   float eps) override {
    timed("rmsnorm_fwd", [&] { g_.rmsnorm_fwd(x, w, y, rstd, eps); });
  }
  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw, float beta_dx, float beta_dw) override {
    timed("rmsnorm_bwd", [&] { g_.rmsnorm_bwd(x, w, rstd, dy, dx, dw, beta_dx, beta_dw); });
  }
  void qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& y,
                        const Tensor& rstd, int heads, int hd, float theta, float eps) override {
    timed("qk_norm_rope_fwd", [&] { g_.qk_norm_rope_fwd(x, w, pos, y, rstd, heads, hd, theta, eps); });
  }
  void qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dx, const Tensor& dw, int heads, int hd, float theta,
                        float beta_dw) override {
    timed("qk_norm_rope_bwd",
          [&] { g_.qk_norm_rope_bwd(x, w, pos, rstd, dy, dx, dw, heads, hd, theta, beta_dw); });
  }
  void dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                            const Tensor& out, const Tensor& lse, const DFlashAttnShape& s) override {
    timed(strfmt("dflash_attention_fwd (%s)", s.window ? "sliding" : "full"),
          [&] { g_.dflash_attention_fwd(q, k, v, blocks, out, lse, s); });
  }
  void dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const DFlashAttnShape& s) override {
    timed(strfmt("dflash_attention_bwd (%s)", s.window ? "sliding" : "full"),
          [&] { g_.dflash_attention_bwd(q, k, v, blocks, out, lse, dout, dq, dk, dv, s); });
  }
  void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    timed("swiglu_fwd", [&] { g_.swiglu_fwd(gate, up, out); });
  }
  void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                  const Tensor& dup) override {
    timed("swiglu_bwd", [&] { g_.swiglu_bwd(gate, up, dout, dgate, dup); });
  }
  void lm_head_loss(const Tensor& hidden, const Tensor& lm_head, const Tensor& labels, const Tensor& active,
                    const Tensor& target_hidden, LmLossKind kind, const Tensor& loss, const Tensor& p_label,
                    const Tensor& argmax, const Tensor& dhidden, int64_t max_active) override {
    timed("lm_head_loss", [&] {
      g_.lm_head_loss(hidden, lm_head, labels, active, target_hidden, kind, loss, p_label, argmax, dhidden,
                      max_active);
    });
  }
  void loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss, const Tensor& p_label,
                      const Tensor& argmax, const LossRowArgs& a, const Tensor& row_w, const Tensor& stats) override {
    timed("loss_row_stats", [&] { g_.loss_row_stats(labels, active, loss, p_label, argmax, a, row_w, stats); });
  }
  void domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                        const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                        const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DominoHeadWeights& dw, const Tensor& stats) override {
    timed("domino_head_loss",
          [&] { g_.domino_head_loss(y, lm_head, gru_in, w, labels, row_w, a, argmax, dy, dw, stats); });
  }
  void dflash2_conv_fwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                        const Tensor& resid, const Tensor& out, const Dflash2ConvDims& d) override {
    // The bytes it must move: u (and resid) read, out written, its side's coefficients and base read.
    const double act = double(u.rows) * d.hidden * 2, side_coeffs = double(u.rows) * d.taps * d.groups() * 2;
    timed(
        "dflash2_conv_fwd", [&] { g_.dflash2_conv_fwd(u, base, coeff, side, resid, out, d); },
        act * (resid.empty() ? 2 : 3) + side_coeffs + double(d.taps) * d.hidden * 4);
  }
  void dflash2_conv_bwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                        const Tensor& dout, const Tensor& du, const Tensor& dcoeff, const Tensor& dbase,
                        float beta_dbase, const Dflash2ConvDims& d) override {
    // The bytes it must move: u and dout read, du written, its side's coefficients read and their gradient
    // written, base read, dbase read and written.
    const double act = double(u.rows) * d.hidden * 2, side_coeffs = double(u.rows) * d.taps * d.groups() * 2;
    timed(
        "dflash2_conv_bwd",
        [&] { g_.dflash2_conv_bwd(u, base, coeff, side, dout, du, dcoeff, dbase, beta_dbase, d); },
        3 * act + 2 * side_coeffs + 3.0 * d.taps * d.hidden * 4);
  }
  void dflash2_selector_loss(const Tensor& y, const Tensor& lm_head, const Dflash2SelectorWeights& w,
                             const Tensor& labels, const Tensor& prev, const Tensor& row_w,
                             const Dflash2SelectorArgs& a, const Tensor& argmax, const Tensor& dy,
                             const Dflash2SelectorWeights& dw, const Tensor& stats) override {
    timed("dflash2_selector_loss",
          [&] { g_.dflash2_selector_loss(y, lm_head, w, labels, prev, row_w, a, argmax, dy, dw, stats); });
  }
  std::vector<int32_t> dflash2_selector_propose(const Tensor& y, const Tensor& lm_head,
                                                const Dflash2SelectorWeights& w, const Dflash2SelectorDims& d,
                                                int32_t first) override {
    std::vector<int32_t> r;
    timed("dflash2_selector_propose", [&] { r = g_.dflash2_selector_propose(y, lm_head, w, d, first); });
    return r;
  }
  std::vector<int32_t> domino_head_propose(const Tensor& y, const Tensor& lm_head, const Tensor& embed,
                                           const DominoHeadWeights& w, const DominoHeadDims& d,
                                           int32_t first) override {
    std::vector<int32_t> r;
    timed("domino_head_propose", [&] { r = g_.domino_head_propose(y, lm_head, embed, w, d, first); });
    return r;
  }
  void dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                        const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                        const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DSparkHeadWeights& dw, const Tensor& stats) override {
    timed("dspark_head_loss", [&] {
      g_.dspark_head_loss(y, lm_head, target_hidden, w, labels, prev, row_w, a, argmax, dy, dw, stats);
    });
  }
  std::vector<int32_t> dspark_head_propose(const Tensor& y, const Tensor& lm_head, const DSparkHeadWeights& w,
                                           const DSparkHeadDims& d, int32_t first,
                                           std::vector<double>* confidence) override {
    std::vector<int32_t> r;
    timed("dspark_head_propose", [&] { r = g_.dspark_head_propose(y, lm_head, w, d, first, confidence); });
    return r;
  }
  double sum_squares(const Tensor& x) override {
    double r = 0;
    timed("sum_squares", [&] { r = g_.sum_squares(x); });
    return r;
  }
  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& p_lp,
             const AdamW& hp) override {
    timed("adamw", [&] { g_.adamw(p, g, m, v, p_lp, hp); });
  }

  // Per op name since the last collect(): total ms, calls, and the bytes the calls must move (0: not given).
  struct OpTime {
    double ms = 0;
    int calls = 0;
    double bytes = 0;
  };
  std::map<std::string, OpTime> collect() {
    device_sync(g_);
    std::map<std::string, OpTime> out;
    for (size_t i = 0; i < names_.size(); ++i) {
      double ms = cpu_ms_.empty() ? 0.0 : cpu_ms_[i];
#ifdef DF_HAVE_CUDA
      if (stream_) {
        float e = 0;
        DF_CUDA_CHECK(cudaEventElapsedTime(&e, events_[2 * i], events_[2 * i + 1]));
        ms = e;
      }
#endif
      OpTime& o = out[names_[i]];
      o.ms += ms;
      o.calls += 1;
      o.bytes += bytes_[i];
    }
    names_.clear();
    bytes_.clear();
    cpu_ms_.clear();
    return out;
  }

 private:
  template <class F>
  void timed(const std::string& what, F&& fn, double bytes = 0) {
    if (!timing) return fn();
    bytes_.push_back(bytes);
#ifdef DF_HAVE_CUDA
    if (stream_) {
      const size_t i = names_.size();
      while (events_.size() < 2 * (i + 1)) {
        cudaEvent_t e;
        DF_CUDA_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
      }
      DF_CUDA_CHECK(cudaEventRecord(events_[2 * i], stream_));
      fn();
      DF_CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], stream_));
      names_.push_back(what);
      return;
    }
#endif
    const double t0 = now_s();
    fn();
    cpu_ms_.push_back((now_s() - t0) * 1e3);
    names_.push_back(what);
  }

  TrainOps& g_;
  std::map<void*, size_t> sizes_;
  std::vector<std::string> names_;
  std::vector<double> bytes_, cpu_ms_;
#ifdef DF_HAVE_CUDA
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
#endif
};


// Fills `t` (backend memory of the backend's activation dtype) with uniform values of standard deviation
// `std`, drawn per element from (seed, stream, index), uploaded a slab of rows at a time so the host never
// holds the whole [248320, 5120] table.
void fill_random(TrainOps& ops, const Tensor& t, uint64_t seed, uint64_t stream, float std) {
  const float amp = std * std::sqrt(3.0f);
  const int64_t slab = std::max<int64_t>(1, (int64_t(1) << 24) / std::max<int64_t>(1, t.cols));
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  for (int64_t r0 = 0; r0 < t.rows; r0 += slab) {
    const int64_t n = std::min(slab, t.rows - r0);
    f32.resize(size_t(n * t.cols));
    for (int64_t i = 0; i < n * t.cols; ++i)
      f32[size_t(i)] = amp * (2.0f * rng_uniform_at(seed, stream, uint64_t(r0 * t.cols + i)) - 1.0f);
    const Tensor dst = t.rows_view(r0, n);
    if (t.dtype == DType::f32) {
      ops.upload_raw(dst, f32.data());
      continue;
    }
    DF_CHECK(t.dtype == DType::bf16, "fill_random: %s tensors are not supported", dtype_name(t.dtype));
    bf16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) bf16[i] = f32_to_bf16(f32[i]);
    ops.upload_raw(dst, bf16.data());
  }
}

struct Options {
  std::string device, model, config, target_config;
  // The drafter kind timed and whose recipe of the target it is read from (default: the kind's).
  std::string kind = "dflash", recipe;
  int seq_len = 4096, warmup = 2, steps = 5;
  uint64_t seed = 0;
};

// Returns false when the result check fails (then no speed may be claimed).
bool bench_shape(const std::string& label, const std::string& toml, const QwenConfig& target,
                 const Options& o) {
  Config cfg = config_load(toml);
  DrafterConfig dc = drafter_config_from_run(cfg, target);
  if (o.kind == "dflash" && dc.kind == DrafterKind::domino) {
    // The Domino recipe's backbone (layers, anchors) without its head: the DFlash step a Domino step is
    // weighed against.
    dc.kind = DrafterKind::dflash;
    dc.pure_draft_prefix_len = dc.emb_dim = dc.gru_hidden_dim = 0;
    dc.shift_label = false;
    cfg.drafter.kind = "dflash";
  }
  if (o.kind == "dflash" && dc.kind == DrafterKind::dspark) {
    // The DSpark recipe's backbone without its heads: the DFlash step a DSpark step is weighed against.
    dc.kind = DrafterKind::dflash;
    dc.markov_rank = 0;
    dc.markov_head_type = DrafterMarkovHead::vanilla;
    dc.enable_confidence_head = dc.confidence_head_with_markov = false;
    dc.confidence_head_alpha = 0.0f;
    cfg.drafter.kind = "dflash";
  }
  if (o.kind == "dflash" && dc.kind == DrafterKind::dflash2) {
    // The DFlash2 recipe's backbone without its convolutions and selector: the DFlash step it is weighed
    // against.
    dc.kind = DrafterKind::dflash;
    dc.conv_kernel_size = dc.conv_group_size = dc.selector_rank = dc.selector_top_k = 0;
    dc.output_multiplier = dc.final_logit_softcapping = 0.0f;
    cfg.drafter.kind = "dflash";
  }
  DF_CHECK(o.kind == drafter_kind_name(dc.kind), "--kind %s: %s configures a %s drafter", o.kind.c_str(),
           toml.c_str(), drafter_kind_name(dc.kind));
  const int64_t T = o.seq_len, H = dc.hidden, V = dc.vocab;
  // The micro-batch this benchmark trains is the limit its workspace is planned for (one sequence of T
  // tokens, num_anchors blocks), as the drafter loop plans once for the run's; plan vram sees the same
  // limits.
  cfg.data.token_budget = T;
  cfg.drafter.max_block_rows = int64_t(dc.num_anchors) * dc.block_size;
  size_t free0 = 0, total = 0;
#ifdef DF_HAVE_CUDA
  if (o.device == "cuda") {
    DF_CUDA_CHECK(cudaSetDevice(0));
    DF_CUDA_CHECK(cudaFree(nullptr));  // the context exists before the first count
    DF_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    std::printf("device: %s\n", device_caps_summary(device_caps()).c_str());
  }
#endif
  std::unique_ptr<TrainOps> backend = train_ops_create(o.device, 0);
  TimedTrainOps ops(*backend);
  std::printf(
      "\n=== %s drafter %s (%s) on %s: %d layers, H %lld, %d/%d heads x %d, intermediate %d, vocab %lld, "
      "block %d, %d anchors, %lld context tokens ===\n",
      drafter_kind_name(dc.kind), label.c_str(), toml.c_str(), o.device.c_str(), dc.layers, (long long)H,
      dc.heads, dc.kv_heads, dc.head_dim, dc.intermediate, (long long)V, dc.block_size, dc.num_anchors,
      (long long)T);

  const double t_init = now_s();
  DrafterModel model(dc, ops);
  drafter_plan_workspace(model, drafter_limits_from_run(cfg));
  drafter_init_params(model, o.seed);
  const DType act = ops.act_dtype();
  // A DSpark step also reads the target's final hidden state [T, H] (its L1 term and confidence target).
  const bool dspark_target = dc.kind == DrafterKind::dspark && drafter_streams_final_hidden(cfg);
  const int64_t io_elems = 2 * V * H + T * H * dc.num_taps() + (dspark_target ? T * H : 0);
  void* io = ops.alloc_bytes(size_t(io_elems) * dtype_size(act));
  Tensor embed = tensor_make(io, act, ops.device(), V, H);
  Tensor lm_head =
      tensor_make(static_cast<char*>(io) + size_t(V * H) * dtype_size(act), act, ops.device(), V, H);
  DrafterBatch batch;
  batch.taps = tensor_make(static_cast<char*>(io) + size_t(2 * V * H) * dtype_size(act), act, ops.device(), T,
                           H * dc.num_taps());
  fill_random(ops, embed, o.seed, 1, 0.02f);
  // lm_head std 0.1/√H: the drafter's output is RMS-normalised (rms 1), so the initial logits have std 0.1
  // and the first loss is ln(V) + ~0.005, which the result check can hold to ±0.1.
  fill_random(ops, lm_head, o.seed, 2, float(0.1 / std::sqrt(double(H))));
  fill_random(ops, batch.taps, o.seed, 3, 1.0f);
  if (dspark_target) {
    batch.target_hidden =
        tensor_make(static_cast<char*>(io) + size_t(2 * V * H + T * H * dc.num_taps()) * dtype_size(act), act,
                    ops.device(), T, H);
    fill_random(ops, batch.target_hidden, o.seed, 5, 1.0f);
  }
  model.set_frozen(embed, lm_head);
  batch.offsets = {0, T};
  batch.loss_mask.assign(size_t(T), 1);
  for (int64_t t = 0; t < T; ++t)
    batch.tokens.push_back(int32_t(rng_u64_at(o.seed, 4, uint64_t(t)) % uint64_t(V)));
  device_sync(ops);
  std::printf("trainable %.3f B params, random init + upload %.1f s\n", double(model.table().total) / 1e9,
              now_s() - t_init);

  OptimConfig optim;
  optim.total_steps = 1000;
  optim.warmup_steps = 40;
  DrafterLossOptions lo;
  lo.gamma = float(cfg.train.gamma);
  lo.dspark = dspark_loss_alphas(cfg.train);
  Rng rng(o.seed + 17);
  std::vector<DrafterAnchor> anchors;
  int64_t step_no = 0;
  bool ok = true;
  double first_loss = 0, last_grad_norm = 0;
  // One optimizer step as the drafter loop runs it for a single micro-batch: fresh anchors, forward/backward,
  // AdamW with grad_scale 1/Σw.
  auto step = [&]() {
    drafter_begin_step(model);
    anchors = anchors_sample_batch(batch, dc.num_anchors, rng);
    lo.domino_lambda = loss_domino_lambda(cfg.train, dc, step_no, optim.total_steps);
    lo.dflash2_selector_alpha = loss_dflash2_selector_alpha(cfg.train, dc, step_no, optim.total_steps);
    lo.dflash2_stop_gradient = cfg.train.dflash2_selector_stop_gradient;
    LossStats st = drafter_forward_backward(model, batch, anchors, lo);
    drafter_grads_ready(model);
    AdamwStepResult r = adamw_step(model, optim, step_no++, 1.0 / std::max(st.weight_sum, 1e-30));
    last_grad_norm = r.grad_norm;
    if (!std::isfinite(st.mean_loss()) || !std::isfinite(r.grad_norm) || !(r.grad_norm > 0)) ok = false;
    return st.mean_loss();
  };

  const double t_warm = now_s();
  for (int i = 0; i < o.warmup; ++i) {
    const double l = step();
    if (i == 0) first_loss = l;
  }
  device_sync(ops);
  const double warm_s = now_s() - t_warm;
  std::vector<double> times;
  double loss = first_loss;
  for (int i = 0; i < o.steps; ++i) {
    const double t0 = now_s();
    loss = step();
    device_sync(ops);
    times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  const double s = times[times.size() / 2];
  size_t free1 = free0;
#ifdef DF_HAVE_CUDA
  if (ops.device() == Device::cuda) DF_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
#endif
  const double params_sq = ops.sum_squares(model.params);

  const double flops = drafter_step_flops(dc, anchors, {T});
  const double tflops = flops / s / 1e12;
  const double ln_v = std::log(double(V));
  // The first loss: CE ≈ ln(V) (logits of std 0.1). DSpark's is α_ce·CE + α_l1·L1 + α_conf·BCE, whose L1 (two
  // softmaxes of std-0.1 logits: ≈ 0.11) and BCE (the confidence logit of a random head: the init's 0.02 std
  // over H inputs) have no tight closed form: there the first loss must lie between α_ce·(ln V − 0.1) and
  // α_ce·(ln V + 0.1) + α_l1·0.2 + α_conf·(ln 2 + 4σ_c), σ_c = 0.02·√H, which garbage (NaN, a wrong row, a
  // term of ln V's size too many) does not.
  double loss_lo = ln_v - 0.1, loss_hi = ln_v + 0.1;
  if (dc.kind == DrafterKind::dspark) {
    const DSparkLossAlphas& a = lo.dspark;
    const double sigma_c = 0.02 * std::sqrt(double(H));
    loss_lo = a.ce * (ln_v - 0.1);
    loss_hi = a.ce * (ln_v + 0.1) + a.l1 * 0.2 +
              (dc.enable_confidence_head ? a.confidence * (std::log(2.0) + 4 * sigma_c) : 0.0);
  }
  if (dc.kind == DrafterKind::dflash2) {
    // DFlash2's adds α·CE over the selector's K candidates, whose scores start nearly equal (a zero successor
    // codebook): about α·ln K, and at most α·(ln K + 1) where the gold token outside the top K takes a slot.
    loss_hi = ln_v + 0.1 + lo.dflash2_selector_alpha * (std::log(double(dc.selector_top_k)) + 1.0);
  }
  const bool loss_ok = o.warmup == 0 || (first_loss >= loss_lo && first_loss <= loss_hi);
  ok = ok && loss_ok && std::isfinite(params_sq);
  std::printf(
      "warm-up %d steps %.2f s; step %.4f s (median of %d; min %.4f max %.4f) -> %.0f context tok/s\n",
      o.warmup, warm_s, s, o.steps, times.front(), times.back(), double(T) / s);
  std::printf(
      "FLOPs/step %.4g T (layers over %zu x %d block rows, context K/V + fc over %lld rows, lm_head over "
      "the labelled rows, attention)\n",
      flops / 1e12, anchors.size(), dc.block_size, (long long)T);
  std::printf("achieved %.1f TFLOP/s = %.1f %% of %.0f; at the ceiling %.4f s/step\n", tflops,
              100.0 * tflops / kPeakTflops, kPeakTflops, flops / (kPeakTflops * 1e12));
  std::printf(
      "memory: TrainOps allocations peak %.2f GiB (params/grads/m/v, frozen tables + taps, workspace)",
      double(ops.peak_bytes) / double(1 << 30));
  if (ops.device() == Device::cuda)
    std::printf("; cudaMemGetInfo used +%.2f GiB of %.2f GiB", double(free0 - free1) / double(1 << 30),
                double(total) / double(1 << 30));
  std::printf("\n");
  // plan vram's drafter role for these limits beside what was allocated. The benchmark's own tables and taps
  // take the bytes DrafterMemory would (two bf16 [V, H] tables, the taps at T tokens); the plan's 1 GiB
  // runtime reserve is left out of the comparison (the context exists before the first count).
  VramAssumptions assume;
  assume.targets = 1;
  const VramRole plan = plan_vram_drafter(cfg, dc, false, assume);
  double in_use = 0;
#ifdef DF_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaTrainOps*>(backend.get())) {
    double reserve = 0, untracked = 0;  // CudaTrainOps' high water holds neither (the GemmContext's buffers)
    for (const VramItem& it : plan.items) {
      if (it.name == "CUDA context, NCCL, slack") reserve = it.bytes;
      if (it.name == "cuBLASLt workspace" || it.name == "GEMM tuning output") untracked += it.bytes;
    }
    const double peak = double(cuda->peak_bytes()), used = double(free0) - double(free1);
    const double want = plan.total - reserve - untracked;
    in_use = double(total) - double(free1);
    std::printf(
        "plan vram (drafter, %lld tokens, %lld block rows): %.2f GiB = allocations %.2f GiB + reserve "
        "%.2f GiB; CudaTrainOps high water %.2f GiB vs plan %.2f GiB (%+.2f %%); device used +%.2f GiB "
        "vs plan %.2f GiB (%+.2f %%)\n",
        (long long)T, (long long)cfg.drafter.max_block_rows, plan.total / kGiB, (plan.total - reserve) / kGiB,
        reserve / kGiB, peak / kGiB, want / kGiB, 100.0 * (want - peak) / peak, used / kGiB,
        (plan.total - reserve) / kGiB, 100.0 * (plan.total - reserve - used) / used);
    std::printf(
        "device memory in use at the end, CUDA context included: %.2f GiB; fits an 80 GB GPU "
        "(%.2f GiB): %s\n",
        in_use / kGiB, k80GB / kGiB, in_use <= k80GB ? "yes" : "NO");
  }
#endif
  std::printf(
      "check: first loss %.4f in [%.4f, %.4f] (ln V %.4f): %s, last loss %.4f, grad norm %.4g, "
      "losses/grads/params finite: %s -> %s\n",
      first_loss, loss_lo, loss_hi, ln_v, loss_ok ? "yes" : "NO", loss, last_grad_norm,
      std::isfinite(params_sq) && ok ? "yes" : "NO", ok ? "PASS" : "FAIL");

  // Breakdown: one more step with every op bracketed (the events add launch gaps, so the sum is a bit above
  // the plain step).
  ops.timing = true;
  step();
  ops.timing = false;
  const std::map<std::string, TimedTrainOps::OpTime> by = ops.collect();
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (const auto& [name, v] : by) {
    std::string line = strfmt("%-46s %5d calls %9.2f ms", name.c_str(), v.calls, v.ms);
    if (v.bytes > 0)  // the bytes the op must move and the rate that makes
      line += strfmt(" (%.1f MB, %.0f GB/s)", v.bytes / 1e6, v.ms > 0 ? v.bytes / (v.ms * 1e6) : 0.0);
    rows.push_back({v.ms, line});
    sum += v.ms;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("per-op breakdown (event-timed step, sum %.1f ms):\n", sum);
  for (auto& [t, line] : rows) std::printf("  %s %6.1f %%\n", line.c_str(), sum > 0 ? 100.0 * t / sum : 0.0);

  nlohmann::json j = {{"bench", "bench_drafter_step"},
                      {"model", label},
                      {"kind", drafter_kind_name(dc.kind)},
                      {"config", toml},
                      {"device", o.device},
                      {"tokens", T},
                      {"anchors", anchors.size()},
                      {"block", dc.block_size},
                      {"trainable_params", model.table().total},
                      {"seconds_per_step", s},
                      {"min_s", times.front()},
                      {"max_s", times.back()},
                      {"ctx_tok_s", double(T) / s},
                      {"tflop_per_step", flops / 1e12},
                      {"tflops", tflops},
                      {"pct_of_peak", 100.0 * tflops / kPeakTflops},
                      {"peak_alloc_gib", double(ops.peak_bytes) / double(1 << 30)},
                      {"mem_used_gib", double(free0 - free1) / double(1 << 30)},
                      {"plan_drafter_gib", plan.total / kGiB},
                      {"device_in_use_gib", in_use / kGiB},
                      {"loss_first", first_loss},
                      {"loss_last", loss},
                      {"ok", ok}};
  std::printf("%s\n", j.dump().c_str());
  ops.free_bytes(io);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
#ifdef DF_HAVE_CUDA
  o.device = cuda_device_count() > 0 ? "cuda" : "cpu";
#else
  o.device = "cpu";
#endif
  o.model = "all";
  CLI::App app{"Time one drafter training step (forward + backward + AdamW)"};
  app.add_option("--device", o.device, "cuda | cpu (default: cuda when a GPU is visible)");
  app.add_option("--model", o.model,
                 "27b | 8b | all: the drafter of configs/qwen3.6-27b.toml / qwen3-8b.toml");
  app.add_option("--kind", o.kind, "dflash | domino | dspark | dflash2: the drafter timed")
      ->check(CLI::IsMember({"dflash", "domino", "dspark", "dflash2"}));
  app.add_option("--recipe", o.recipe,
                 "dflash | domino | dspark | dflash2: whose recipe of --model to read (default --kind's); --kind "
                 "dflash --recipe domino (dspark, dflash2) times that recipe's backbone without its head")
      ->check(CLI::IsMember({"dflash", "domino", "dspark", "dflash2"}));
  app.add_option("--config", o.config, "a run config TOML instead (needs --target-config)");
  app.add_option("--target-config", o.target_config,
                 "the target's config.json (or its directory) for --config");
  app.add_option("--seq-len", o.seq_len, "context tokens (one sequence)");
  app.add_option("--warmup", o.warmup, "untimed steps");
  app.add_option("--steps", o.steps, "timed steps (median reported)");
  app.add_option("--seed", o.seed, "weights, taps, tokens and anchors");
  CLI11_PARSE(app, argc, argv);
  bool ok = true;
  try {
    DF_CHECK(o.steps >= 1 && o.seq_len >= 2 && o.warmup >= 0,
             "need --steps >= 1, --seq-len >= 2, --warmup >= 0");
    if (!o.config.empty()) {
      DF_CHECK(!o.target_config.empty(), "--config %s needs --target-config (the target's config.json)",
               o.config.c_str());
      ok = bench_shape("custom", o.config, qwen_config_load(o.target_config), o);
    } else {
      bool any = false;
      for (const BenchTarget& t : kTargets) {
        if (o.model != "all" && o.model != t.label) continue;
        any = true;
        QwenConfig q;
        q.hidden = t.hidden;
        q.layers = t.layers;
        q.intermediate = t.intermediate;
        q.vocab = t.vocab;
        const std::string recipe = o.recipe.empty() ? o.kind : o.recipe;
        const char* toml = recipe == "domino"    ? t.domino_toml
                           : recipe == "dspark"  ? t.dspark_toml
                           : recipe == "dflash2" ? t.dflash2_toml
                                                 : t.toml;
        if (!toml) {
          std::printf("%s: no %s recipe of this target yet, skipped\n", t.label, recipe.c_str());
          continue;
        }
        ok &= bench_shape(t.label, std::string(DF_SOURCE_DIR) + "/" + toml, q, o);
      }
      DF_CHECK(any, "--model %s: expected 27b, 8b or all", o.model.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_drafter_step: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
}
