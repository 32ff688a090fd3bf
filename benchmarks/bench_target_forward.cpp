// End-to-end target forward on one GPU: Qwen3.6-27B and Qwen3-8B shapes with random weights (drawn on the
// device by Ops::fill_normal), 32,768 tokens as 8 sequences of 4096, five DFlash taps plus the final norm.
// Prints tok/s, achieved TFLOP/s against the 790 TFLOP/s bf16 ceiling, the ratio to a *recorded* 9,000 tok/s
// transformers + flash-linear-attention figure (27B, shared/device/README.md; not measured in this run: the
// same-call peer measurement is still to be built), a per-op time breakdown and the device memory.
// Plain main(): the GPU machine has no Google Benchmark. Optional argument: "27b" or "8b" (default both).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/arena.h"
#include "core/strfmt.h"
#include "kernels/cuda_check.cuh"
#include "model/drafter.h"
#include "model/target.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

constexpr double kPeakTflops = 790.0;   // cuBLASLt bf16 8192³ on this H200 (bench_kernels.md)
constexpr double kPeerTokS = 9000.0;    // HF transformers + flash-linear-attention, Qwen3.6-27B, one H200
constexpr int kSeqs = 8, kSeqLen = 4096;
constexpr int kGdnChunk = 64;

// Forwards every op to CudaOps and brackets it with a pair of cudaEvents; after a synchronised forward,
// collect() sums the elapsed times per op name (GEMMs are named by their N×K so the projections separate).
class TimedOps final : public Ops {
 public:
  explicit TimedOps(CudaOps& inner) : g_(inner) {}
  ~TimedOps() override {
    for (auto& e : pool_) cudaEventDestroy(e);
  }
  Device device() const override { return g_.device(); }
  DType act_dtype() const override { return g_.act_dtype(); }
  const char* name() const override { return "cuda+timed"; }

  void* alloc_bytes(size_t bytes) override { return g_.alloc_bytes(bytes); }
  void free_bytes(void* p) override { g_.free_bytes(p); }
  void upload_f32(const Tensor& d, const float* h) override { g_.upload_f32(d, h); }
  void upload_raw(const Tensor& d, const void* h) override { g_.upload_raw(d, h); }
  void download_f32(const Tensor& s, float* h) override { g_.download_f32(s, h); }
  void download_raw(const Tensor& s, void* h) override { g_.download_raw(s, h); }
  void fill_normal(const Tensor& d, uint64_t seed, uint64_t stream, float mean, float std) override {
    g_.fill_normal(d, seed, stream, mean, std);
  }
  void synchronize() override { g_.synchronize(); }

  void copy(const Tensor& s, const Tensor& d) override {
    timed("copy (taps)", [&] { g_.copy(s, d); });
  }
  void embedding(const Tensor& ids, const Tensor& t, const Tensor& o) override {
    timed("embedding", [&] { g_.embedding(ids, t, o); });
  }
  void gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) override {
    timed(strfmt("gemm %lldx%lld", (long long)w.rows, (long long)w.cols), [&] { g_.gemm(a, w, c, beta); });
  }
  void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& o, float eps, NormKind k) override {
    timed("rmsnorm", [&] { g_.rmsnorm(x, w, o, eps, k); });
  }
  void add_rmsnorm(const Tensor& r, const Tensor& d, const Tensor& w, const Tensor& o, float eps,
                   NormKind k) override {
    timed("add_rmsnorm", [&] { g_.add_rmsnorm(r, d, w, o, eps, k); });
  }
  void qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot, float theta,
                    float eps, NormKind k) override {
    timed("qk_norm_rope", [&] { g_.qk_norm_rope(x, w, pos, heads, hd, rot, theta, eps, k); });
  }
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const SeqLayout& s,
                        int hq, int hkv, int hd, float scale, const Tensor* gate = nullptr) override {
    timed("attention_causal", [&] { g_.attention_causal(q, k, v, o, s, hq, hkv, hd, scale, gate); });
  }
  void sigmoid_gate(const Tensor& o, const Tensor& g) override {
    timed("sigmoid_gate", [&] { g_.sigmoid_gate(o, g); });
  }
  void swiglu(const Tensor& g, const Tensor& u, const Tensor& o) override {
    timed("swiglu", [&] { g_.swiglu(g, u, o); });
  }
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& o, const SeqLayout& s) override {
    timed("conv1d_silu", [&] { g_.conv1d_silu(x, w, o, s); });
  }
  void gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt,
                   const Tensor& o, const SeqLayout& s, const GdnShape& sh, const Tensor& ws) override {
    timed("gdn_prefill", [&] { g_.gdn_prefill(qkv, a, b, A_log, dt, o, s, sh, ws); });
  }
  int64_t gdn_workspace_bytes(int64_t tokens, const GdnShape& sh) const override {
    return g_.gdn_workspace_bytes(tokens, sh);
  }
  void gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                     float eps) override {
    timed("gated_rmsnorm", [&] { g_.gated_rmsnorm(o, z, w, out, heads, dv, eps); });
  }
  void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, int64_t past, int hq,
                        int hkv, int hd, float scale, const Tensor* gate = nullptr) override {
    timed("attention_cached", [&] { g_.attention_cached(q, k, v, o, past, hq, hkv, hd, scale, gate); });
  }
  void gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt,
                  const Tensor& o, const Tensor& st, const Tensor& sts, const GdnShape& sh) override {
    timed("gdn_decode", [&] { g_.gdn_decode(qkv, a, b, A_log, dt, o, st, sts, sh); });
  }

  // Per op name: (total ms, calls) over the forward just run; clears the record.
  std::map<std::string, std::pair<double, int>> collect() {
    g_.synchronize();
    std::map<std::string, std::pair<double, int>> out;
    for (size_t i = 0; i < names_.size(); ++i) {
      float ms = 0;
      DF_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[2 * i], pool_[2 * i + 1]));
      out[names_[i]].first += ms;
      out[names_[i]].second += 1;
    }
    names_.clear();
    return out;
  }

 private:
  template <class F>
  void timed(const std::string& what, F&& fn) {
    size_t i = names_.size();
    while (pool_.size() < 2 * (i + 1)) {
      cudaEvent_t e;
      DF_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    DF_CUDA_CHECK(cudaEventRecord(pool_[2 * i], g_.stream()));
    fn();
    DF_CUDA_CHECK(cudaEventRecord(pool_[2 * i + 1], g_.stream()));
    names_.push_back(what);
  }
  CudaOps& g_;
  std::vector<cudaEvent_t> pool_;
  std::vector<std::string> names_;
};

QwenConfig config_qwen36_27b() {
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 64; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  nlohmann::json j = {{"model_type", "qwen3_5_text"},   {"hidden_size", 5120},
                      {"num_hidden_layers", 64},        {"layer_types", types},
                      {"intermediate_size", 17408},     {"vocab_size", 248320},
                      {"num_attention_heads", 24},      {"num_key_value_heads", 4},
                      {"head_dim", 256},                {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.25},  {"rope_theta", 1e7},
                      {"rms_norm_eps", 1e-6},           {"linear_num_key_heads", 16},
                      {"linear_num_value_heads", 48},   {"linear_key_head_dim", 128},
                      {"linear_value_head_dim", 128},   {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "Qwen3.6-27B shapes");
}

QwenConfig config_qwen3_8b() {
  nlohmann::json j = {{"model_type", "qwen3"},        {"hidden_size", 4096},     {"num_hidden_layers", 36},
                      {"intermediate_size", 12288},   {"vocab_size", 151936},    {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},     {"head_dim", 128},         {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},         {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "Qwen3-8B shapes");
}

// FLOPs per token of the forward that is timed (every layer up to the last tap, which for both models is the
// last layer since the final norm is wanted):
//   2 · non-embedding parameters (each weight one multiply-add; the embedding is a gather),
// + per full-attention layer 4 · heads · hd · (average causal context (L+1)/2)   (Q Kᵀ and P V),
// + per DeltaNet layer nv · (chunk FLOPs / C) with, per chunk of C = 64 and head dims dk = dv = d:
//   K Kᵀ, Q Kᵀ, A V' (2·C²·d each), the triangular solve (C²·(dk+dv)), W S, Q S, Kᵀ V' (2·C·dk·dv each).
double flops_per_token(const QwenConfig& c, int seq_len) {
  double f = 2.0 * c.params_non_embedding();
  f += c.num_full_layers() * 4.0 * c.heads * c.head_dim * (seq_len + 1) / 2.0;
  if (c.num_linear_layers() > 0) {
    const double C = kGdnChunk, dk = c.lin_dk, dv = c.lin_dv;
    double per_chunk = 2 * C * C * dk + 2 * C * C * dk + 2 * C * C * dv + C * C * (dk + dv) + 2 * C * dk * dv +
                       2 * C * dk * dv + 2 * C * dk * dv;
    f += c.num_linear_layers() * double(c.lin_nv) * per_chunk / C;
  }
  return f;
}

double gib(double bytes) { return bytes / double(size_t(1) << 30); }

// Returns false when the forward produced non-finite values (then no speed may be claimed).
bool bench_model(const char* label, const QwenConfig& cfg, bool with_peer) {
  std::printf("\n=== %s: %s ===\n", label, qwen_config_summary(cfg).c_str());
  CudaOps gpu(0);
  TimedOps timed(gpu);
  cudaEvent_t a, b;
  DF_CUDA_CHECK(cudaEventCreate(&a));
  DF_CUDA_CHECK(cudaEventCreate(&b));
  DF_CUDA_CHECK(cudaEventRecord(a, gpu.stream()));
  std::unique_ptr<TargetModel> model = target_random(cfg, 1234, gpu, TargetLoadOptions{});
  DF_CUDA_CHECK(cudaEventRecord(b, gpu.stream()));
  DF_CUDA_CHECK(cudaEventSynchronize(b));
  float init_ms = 0;
  DF_CUDA_CHECK(cudaEventElapsedTime(&init_ms, a, b));

  const int64_t T = int64_t(kSeqs) * kSeqLen;
  TargetForward fwd(*model, T);

  // Outputs, the layout and the ids in one block.
  TargetOutputs out;
  out.tap_layers = drafter_default_target_layer_ids(cfg.layers, 5);
  out.want_final_norm = true;
  const size_t out_bytes = (out.tap_layers.size() + 1) * size_t(T) * cfg.hidden * 2;
  const size_t io_bytes = out_bytes + size_t(T) * 8 + 4096;
  void* io = gpu.alloc_bytes(io_bytes);
  Arena arena(io, io_bytes, Device::cuda);
  for (size_t i = 0; i < out.tap_layers.size(); ++i) out.taps.push_back(arena.alloc(DType::bf16, T, cfg.hidden));
  out.final_norm = arena.alloc(DType::bf16, T, cfg.hidden);
  SeqLayout seqs = seq_layout_make(std::vector<int32_t>(kSeqs, kSeqLen), gpu, arena);
  Tensor ids = arena.alloc(DType::i32, 1, T);
  std::vector<int32_t> host_ids(T);
  for (int64_t i = 0; i < T; ++i) host_ids[i] = int32_t((i * 2654435761ull) % uint64_t(cfg.vocab));
  gpu.upload_raw(ids, host_ids.data());

  std::string taps;
  for (int l : out.tap_layers) taps += strfmt("%s%d", taps.empty() ? "" : ",", l);
  std::printf("tokens %lld (%d x %d), taps [%s] + final norm, random init %.0f ms\n", (long long)T, kSeqs, kSeqLen,
              taps.c_str(), init_ms);

  // Warm-up (cuBLASLt heuristics, first-touch), then timed runs on the plain backend.
  fwd.run(ids, seqs, out);
  gpu.synchronize();
  const int reps = 3;
  std::vector<float> times;
  for (int r = 0; r < reps; ++r) {
    DF_CUDA_CHECK(cudaEventRecord(a, gpu.stream()));
    fwd.run(ids, seqs, out);
    DF_CUDA_CHECK(cudaEventRecord(b, gpu.stream()));
    DF_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DF_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  size_t free1 = 0, total = 0;
  DF_CUDA_CHECK(cudaMemGetInfo(&free1, &total));

  // NaN guard on the last tap: a forward that produced garbage must not report a speed.
  std::vector<float> row(cfg.hidden);
  gpu.download_f32(out.final_norm.rows_view(T - 1, 1), row.data());
  bool finite = std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); });

  const double fpt = flops_per_token(cfg, kSeqLen);
  const double tok_s = T / (ms * 1e-3);
  const double tflops = fpt * T / (ms * 1e-3) / 1e12;
  std::printf("forward %.1f ms (median of %d; min %.1f max %.1f)  ->  %.0f tok/s\n", ms, reps, times.front(),
              times.back(), tok_s);
  std::printf("FLOPs/token %.2f GFLOP (2 x %.3f B non-embedding params + attention + GDN chunks)\n", fpt / 1e9,
              cfg.params_non_embedding() / 1e9);
  std::printf("achieved %.1f TFLOP/s = %.1f %% of %.0f; upper bound at the ceiling %.0f tok/s\n", tflops,
              100.0 * tflops / kPeakTflops, kPeakTflops, kPeakTflops * 1e12 / fpt);
  if (with_peer)
    std::printf("vs a recorded peer figure %.0f tok/s (HF transformers + FLA on an H200, not measured in this run): "
                "%.2fx  (goal 1.4x = %.0f tok/s)\n",
                kPeerTokS, tok_s / kPeerTokS, 1.4 * kPeerTokS);
  std::printf("output finite: %s\n", finite ? "yes" : "NO");
  std::printf("memory: model block %.2f GiB + forward workspace %.2f GiB + outputs %.2f GiB = %.2f GiB; "
              "cudaMemGetInfo used %.2f GiB of %.2f GiB (fits 80 GB: %s)\n",
              gib(model->block_bytes), gib(fwd.workspace_bytes()), gib(io_bytes),
              gib(model->block_bytes + fwd.workspace_bytes() + io_bytes), gib(total - free1), gib(total),
              (total - free1) < size_t(80e9) ? "yes" : "NO");

  // Breakdown: one more forward with the model's ops swapped for the event-bracketed decorator (the events
  // add a little host and launch time, so this sum is a bit above the plain forward's).
  Ops* plain = model->ops;
  model->ops = &timed;
  {
    TargetForward tfwd(*model, T);
    tfwd.run(ids, seqs, out);
    std::map<std::string, std::pair<double, int>> by = timed.collect();
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (auto& [name, v] : by) {
      rows.push_back({v.first, strfmt("%-22s %5d calls %9.1f ms", name.c_str(), v.second, v.first)});
      sum += v.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::printf("per-op breakdown (event-timed forward, sum %.1f ms):\n", sum);
    for (auto& [t, line] : rows) std::printf("  %s %6.1f %%\n", line.c_str(), 100.0 * t / sum);
  }
  model->ops = plain;
  gpu.free_bytes(io);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return finite;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  std::string which = argc > 1 ? argv[1] : "all";
  bool ok = true;
  try {
    if (which == "all" || which == "27b") ok &= bench_model("Qwen3.6-27B", config_qwen36_27b(), true);
    if (which == "all" || which == "8b") ok &= bench_model("Qwen3-8B", config_qwen3_8b(), false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_target_forward: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
}
