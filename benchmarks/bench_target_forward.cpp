// End-to-end target forward on one GPU: Qwen3.6-27B, Qwen3-8B and Qwen3.6-35B-A3B shapes with random weights
// (drawn on the device by Ops::fill_normal), 32,768 tokens as 8 sequences of 4096, five DFlash taps plus the
// final norm. For the mixture-of-experts 35B-A3B the routed experts' grouped GEMMs are also timed alone (one
// layer's pair, as moe_experts runs them under a balanced router): their rate against the bf16 ceiling (FP8:
// the FP8 burst) and their share of the forward.
// Prints tok/s, achieved TFLOP/s against the 790 TFLOP/s bf16 ceiling, a per-op time breakdown, the device
// memory and one JSON line per model; benchmarks/run_target_forward.sh times the peer (HF transformers + FLA)
// in the same call and prints the ratio. Every run checks its result: the first layers' taps on a slice of
// the tokens must match the CPU fp32 path, or the benchmark fails and claims no speed.
// With --dtype fp8 the target is the FP8 one (target.dtype = "fp8": e4m3 projections, cuBLASLt FP8 GEMMs):
// the breakdown then also gives the FP8 GEMMs' rate against a cuBLASLt FP8 8192³ burst measured in the same
// run, and the result check compares with the CPU FP8 emulation; the 35B-A3B's experts are then e4m3 codes
// run by the FP8 grouped GEMM (kernels/moe/moe_fp8_gemm.cu), their time the moe_experts line. Plain main():
// the GPU machine has no Google Benchmark. Arguments: "27b", "8b" or "35b-a3b" (default all three), then
// optionally --dtype bf16|fp8 (default bf16).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "benchmarks/cuda_timing.h"
#include "benchmarks/target_configs.h"
#include "core/arena.h"
#include "core/rng.h"
#include "core/strfmt.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/moe/moe.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "model/drafter.h"
#include "model/model_flops.h"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

constexpr double kPeakTflops = 790.0;   // cuBLASLt bf16 8192³ on this H200 (bench_kernels.md)
constexpr int kSeqs = 8, kSeqLen = 4096;
constexpr uint64_t kSeed = 1234;

// The result check: the first kCheckLayers layers (27B: three DeltaNet layers and the first full-attention
// layer; 8B: four attention layers) on the first kCheckTokens tokens of the first and the last sequence, bf16
// CUDA against the fp32 CPU path with the same random weights (fill_normal draws the same values on both).
// 100 tokens span one 64-token GDN chunk and a partial one. Bound on the relative RMS error per layer: the
// golden CUDA test measured 1.2e-2 (3 Qwen3 layers) to 3.2e-2 (4 Qwen3.5 layers) for bf16 against fp32, and
// this init is gentler than the golden's; wiring or kernel bugs give 0.3 to 1 (tests/gpu/test_golden_cuda.cpp).
constexpr int kCheckLayers = 4;
constexpr int kCheckTokens = 100;
constexpr double kCheckMaxRelRms = 8e-2;
// FP8: the CUDA FP8 taps against the CPU FP8 emulation, bounded by 1x of what the FP8 rounding itself moves the
// CPU taps (CPU FP8 vs CPU fp32 on the same slice): the two FP8 paths differ only where bf16 moved an element
// across an e4m3 rounding boundary, about half that (tests/gpu/test_fp8_cuda.cpp derives it); wrong scales or
// lost rows give many times it.
constexpr double kCheckFp8Factor = 1.0;

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
    const std::string name = strfmt("gemm %lldx%lld", (long long)w.rows, (long long)w.cols);
    flops_[name] += 2.0 * a.rows * w.rows * w.cols;
    timed(name, [&] { g_.gemm(a, w, c, beta); });
  }
  bool fp8_gemm() const override { return g_.fp8_gemm(); }
  void fp8_quantize_rows(const Tensor& x, const Tensor& q, const Tensor& s, bool back) override {
    timed("fp8_quantize_rows", [&] { g_.fp8_quantize_rows(x, q, s, back); });
  }
  void rmsnorm_fp8(const Tensor& x, const Tensor& w, const Tensor& o, float eps, NormKind k, const Tensor& q,
                   const Tensor& s, bool back) override {
    timed("rmsnorm_fp8", [&] { g_.rmsnorm_fp8(x, w, o, eps, k, q, s, back); });
  }
  void swiglu_fp8(const Tensor& g, const Tensor& u, const Tensor& q, const Tensor& s) override {
    timed("swiglu_fp8", [&] { g_.swiglu_fp8(g, u, q, s); });
  }
  void gemm_fp8(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& sw, const Tensor& c,
                float beta) override {
    const std::string name = strfmt("gemm_fp8 %lldx%lld", (long long)w8.rows, (long long)w8.cols);
    flops_[name] += 2.0 * x8.rows * w8.rows * w8.cols;
    timed(name, [&] { g_.gemm_fp8(x8, sx, w8, sw, c, beta); });
  }
  // FLOPs per GEMM name over the forward just collected (cleared by collect()).
  double flops(const std::string& name) const {
    auto it = last_flops_.find(name);
    return it == last_flops_.end() ? 0.0 : it->second;
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
  // The DeltaNet mixer: one row (CudaOps fuses it where the shape allows).
  void gdn_mixer(const Tensor& x, const Tensor& z, const Tensor& a, const Tensor& b, const GdnWeights& w,
                 const Tensor& o, const SeqLayout& s, const GdnShape& sh, const Tensor& ws, const Tensor& conv,
                 const Tensor& mid) override {
    timed("gdn_mixer", [&] { g_.gdn_mixer(x, z, a, b, w, o, s, sh, ws, conv, mid); });
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
  // The MoE block: routing (its router GEMM counted), and the experts with the FLOPs of the routed pairs' and
  // the shared expert's three projections (the sort, gather, SwiGLU and combine inside are time without
  // FLOPs).
  void moe_route(const Tensor& x, const Tensor& r, const MoeShape& sh, const Tensor& ids, const Tensor& w,
                 const Tensor& ws) override {
    flops_["moe_route"] += 2.0 * x.rows * r.rows * r.cols;
    timed("moe_route", [&] { g_.moe_route(x, r, sh, ids, w, ws); });
  }
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& w, const MoeWeights& mw,
                   const MoeShape& sh, const Tensor& o, const Tensor& ws) override {
    flops_["moe_experts"] += 6.0 * x.rows * x.cols * (double(sh.top_k) * sh.inter + sh.shared_inter);
    timed("moe_experts", [&] { g_.moe_experts(x, ids, w, mw, sh, o, ws); });
  }
  int64_t moe_workspace_bytes(int64_t tokens, const MoeShape& sh) const override {
    return g_.moe_workspace_bytes(tokens, sh);
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
    last_flops_ = std::move(flops_);
    flops_.clear();
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
  std::map<std::string, double> flops_, last_flops_;
};

// cuBLASLt's FP8 rate at 8192³ (e4m3 codes with outer-vector scales, bf16 out), the ceiling the forward's FP8
// GEMMs are measured against: the median of 5 timed launches after 2 untimed ones (tuning, module load).
double fp8_burst_tflops(CudaOps& gpu) {
  const int64_t n = 8192;
  const size_t bytes = size_t(n) * n * (2 + 1 + 1 + 2) + 2 * size_t(n) * 4 + 4 * Arena::kAlign;
  void* block = gpu.alloc_bytes(bytes);
  Arena a(block, bytes, Device::cuda);
  Tensor src = a.alloc(DType::bf16, n, n), x8 = a.alloc(DType::f8_e4m3, n, n), w8 = a.alloc(DType::f8_e4m3, n, n);
  Tensor sx = a.alloc(DType::f32, 1, n), sw = a.alloc(DType::f32, 1, n), c = a.alloc(DType::bf16, n, n);
  gpu.fill_normal(src, 1, 1, 0.0f, 1.0f);
  gpu.fp8_quantize_rows(src, x8, sx, false);
  gpu.fill_normal(src, 1, 2, 0.0f, 1.0f);
  gpu.fp8_quantize_rows(src, w8, sw, false);
  const double ms = cuda_median_ms(gpu.stream(), [&] { gpu.gemm_fp8(x8, sx, w8, sw, c, 0.0f); }, 5);
  gpu.free_bytes(block);
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

double gib(double bytes) { return bytes / double(size_t(1) << 30); }

// One MoE layer's routed-expert GEMMs alone: the gate_up and down grouped GEMMs as moe_experts runs them for
// T tokens (kernels/moe/moe.cuh), with the tile plan's row count and tile bound and a balanced router (expert
// e gets T·k/E pairs, the remainder one each to the first experts). bf16: cuBLASLt's pointer-array batch
// (gemm.cuh gemm_batched_launch), tile addresses built here as moe.cu's plan kernel builds them; FP8: the own
// grouped GEMM (moe_fp8_gemm_launch) on e4m3 codes with per-row scales, as target.dtype = "fp8" holds a bf16
// checkpoint's experts. ms: median of 5 after 2 warm-ups; tflops counts the useful 6·T·k·H·I (the bound's
// padding tiles are work, not FLOPs).
struct ExpertGemms {
  double ms = 0, tflops = 0;
  int rows = 0;
  int64_t tiles = 0, real_tiles = 0;
};

// The balanced router's tiles: each real tile's expert, in order, under moe_plan_tiles' bound.
struct BalancedTiles {
  MoeDims d;
  MoeTiles plan;
  int64_t pairs = 0;
  std::vector<int32_t> tile_expert;
};

BalancedTiles balanced_tiles(const QwenConfig& cfg, int64_t T) {
  BalancedTiles b;
  b.d = MoeDims{cfg.hidden,           cfg.num_experts,         cfg.experts_per_tok,
                cfg.moe_intermediate, cfg.shared_intermediate, cfg.norm_topk_prob};
  b.plan = moe_plan_tiles(T, b.d);
  b.pairs = T * b.d.k;
  const int64_t E = b.d.E, rows = b.plan.rows;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = b.pairs / E + (e < b.pairs % E ? 1 : 0);
    for (int64_t i = 0; i < (m + rows - 1) / rows; ++i) b.tile_expert.push_back(int32_t(e));
  }
  DF_CHECK(int64_t(b.tile_expert.size()) <= b.plan.tiles,
           "expert GEMMs: %lld tiles exceed the plan's bound %lld", (long long)b.tile_expert.size(),
           (long long)b.plan.tiles);
  return b;
}

ExpertGemms time_expert_gemms(const QwenConfig& cfg, int64_t T, CudaOps& gpu) {
  const BalancedTiles bt = balanced_tiles(cfg, T);
  const MoeDims& d = bt.d;
  const std::vector<int32_t>& tile_expert = bt.tile_expert;
  const int64_t H = d.H, I = d.I, E = d.E, rows = bt.plan.rows, tiles = bt.plan.tiles, R = tiles * rows,
                pairs = bt.pairs, real = int64_t(tile_expert.size());
  const size_t bytes = (size_t(E) * 2 * I * H + size_t(E) * H * I + size_t(R) * H + size_t(R) * 2 * I) * 2 +
                       6 * size_t(tiles) * sizeof(void*) + 8 * Arena::kAlign;
  void* block = gpu.alloc_bytes(bytes);
  Arena a(block, bytes, Device::cuda);
  Tensor gate_up = a.alloc(DType::bf16, E * 2 * I, H), down = a.alloc(DType::bf16, E * H, I);
  Tensor xs = a.alloc(DType::bf16, R, H), gu = a.alloc(DType::bf16, R, 2 * I);
  Tensor ptrs = a.alloc(DType::u8, 1, 6 * tiles * int64_t(sizeof(void*)));
  gpu.fill_normal(gate_up, kSeed, 1, 0.0f, 1.0f / std::sqrt(float(H)));
  gpu.fill_normal(down, kSeed, 2, 0.0f, 1.0f / std::sqrt(float(I)));
  gpu.fill_normal(xs, kSeed, 3, 0.0f, 1.0f);
  std::vector<const void*> host(size_t(6 * tiles));
  const auto* xs_p = static_cast<const __nv_bfloat16*>(xs.data);
  const auto* gu_p = static_cast<const __nv_bfloat16*>(gu.data);
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t e = i < real ? tile_expert[size_t(i)] : 0, r0 = i * rows;
    host[size_t(i)] = xs_p + (i < real ? r0 : 0) * H;
    host[size_t(tiles + i)] = static_cast<const __nv_bfloat16*>(gate_up.data) + e * 2 * I * H;
    host[size_t(2 * tiles + i)] = gu_p + r0 * 2 * I;
    host[size_t(3 * tiles + i)] = gu_p + r0 * 2 * I;
    host[size_t(4 * tiles + i)] = static_cast<const __nv_bfloat16*>(down.data) + e * H * I;
    host[size_t(5 * tiles + i)] = xs_p + r0 * H;
  }
  gpu.upload_raw(ptrs, host.data());
  const void** p = static_cast<const void**>(ptrs.data);
  void** q = static_cast<void**>(ptrs.data);
  const int align = moe_gemm_align(xs.data, gu.data, gate_up.data, down.data, rows, d);
  GemmContext* ctx = gemm_init();
  const double ms = cuda_median_ms(
      gpu.stream(),
      [&] {
        gemm_batched_launch(ctx, p, H, p + tiles, H, q + 2 * tiles, 2 * I, rows, 2 * I, H, tiles, align,
                            gpu.stream());
        gemm_batched_launch(ctx, p + 3 * tiles, 2 * I, p + 4 * tiles, I, q + 5 * tiles, H, rows, H, I, tiles,
                            align, gpu.stream());
      },
      5);
  gemm_free(ctx);
  gpu.free_bytes(block);
  return ExpertGemms{ms, 6.0 * double(pairs) * H * I / (ms * 1e-3) / 1e12, int(rows), tiles, real};
}

ExpertGemms time_expert_gemms_fp8(const QwenConfig& cfg, int64_t T, CudaOps& gpu) {
  const BalancedTiles bt = balanced_tiles(cfg, T);
  const MoeDims& d = bt.d;
  const int64_t H = d.H, I = d.I, E = d.E, rows = bt.plan.rows, tiles = bt.plan.tiles, R = tiles * rows,
                real = int64_t(bt.tile_expert.size());
  const size_t bytes = size_t(E) * 3 * I * H + size_t(R) * (H + I) +
                       (size_t(E) * (2 * I + H) + 2 * size_t(R)) * 4 + size_t(R) * (2 * I + H) * 2 +
                       size_t(tiles + 1) * 4 + 16 * Arena::kAlign;
  void* block = gpu.alloc_bytes(bytes);
  Arena a(block, bytes, Device::cuda);
  Tensor gate_up = a.alloc(DType::f8_e4m3, E * 2 * I, H), down = a.alloc(DType::f8_e4m3, E * H, I);
  Tensor s_gate_up = a.alloc(DType::f32, 1, E * 2 * I), s_down = a.alloc(DType::f32, 1, E * H);
  Tensor xq = a.alloc(DType::f8_e4m3, R, H), sx = a.alloc(DType::f32, 1, R);
  Tensor aq = a.alloc(DType::f8_e4m3, R, I), sa = a.alloc(DType::f32, 1, R);
  Tensor gu = a.alloc(DType::bf16, R, 2 * I), ys = a.alloc(DType::bf16, R, H);
  Tensor te = a.alloc(DType::i32, 1, tiles), used = a.alloc(DType::i32, 1, 1);
  // Codes: e4m3 values of magnitude 2^-3..2^1 with both signs (never the NaN code); scales of 2^-6.
  auto codes = [&](const Tensor& t, uint64_t stream) {
    std::vector<uint8_t> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = uint8_t(0x20 + (rng_uniform_at(kSeed, stream, i) < 0.5f ? 0 : 0x80) +
                     int(rng_uniform_at(kSeed, stream + 1, i) * 32.0f));
    gpu.upload_raw(t, v.data());
  };
  codes(gate_up, 11), codes(down, 13), codes(xq, 15), codes(aq, 17);
  for (const Tensor& t : {s_gate_up, s_down, sx, sa}) {
    const std::vector<float> v(size_t(t.numel()), 1.0f / 64.0f);
    gpu.upload_f32(t, v.data());
  }
  std::vector<int32_t> host_te(size_t(tiles), 0);
  std::copy(bt.tile_expert.begin(), bt.tile_expert.end(), host_te.begin());
  gpu.upload_raw(te, host_te.data());
  const int32_t used_rows = int32_t(real * rows);
  gpu.upload_raw(used, &used_rows);
  const auto* tep = static_cast<const int32_t*>(te.data);
  const auto* usedp = static_cast<const int32_t*>(used.data);
  const double ms = cuda_median_ms(
      gpu.stream(),
      [&] {
        moe_fp8_gemm_launch(static_cast<const uint8_t*>(xq.data), static_cast<const float*>(sx.data), R,
                            static_cast<const uint8_t*>(gate_up.data),
                            static_cast<const float*>(s_gate_up.data), 0, tep, usedp, int(rows), tiles,
                            static_cast<__nv_bfloat16*>(gu.data), 2 * I, 2 * I, H, gpu.stream());
        moe_fp8_gemm_launch(static_cast<const uint8_t*>(aq.data), static_cast<const float*>(sa.data), R,
                            static_cast<const uint8_t*>(down.data), static_cast<const float*>(s_down.data), 0,
                            tep, usedp, int(rows), tiles, static_cast<__nv_bfloat16*>(ys.data), H, H, I,
                            gpu.stream());
      },
      5);
  gpu.free_bytes(block);
  return ExpertGemms{ms, 6.0 * double(bt.pairs) * H * I / (ms * 1e-3) / 1e12, int(rows), tiles, real};
}

// The taps at layers 0..kCheckLayers-1 of `model` on `ids` (packed sequences of `lengths`), downloaded as f32.
std::vector<std::vector<float>> slice_taps(const TargetModel& model, Ops& ops, const std::vector<int32_t>& ids,
                                           const std::vector<int32_t>& lengths) {
  const int64_t T = int64_t(ids.size()), H = model.cfg.hidden;
  TargetForward fwd(model, T);
  TargetOutputs out;
  Tensor id_t;
  Arena arena;
  const size_t layout_bytes = (lengths.size() + 1 + size_t(T)) * 4 + 2 * Arena::kAlign;
  void* block = ops_alloc_planned(
      ops,
      [&](Arena& a) {
        out.taps.clear();
        for (int l = 0; l < kCheckLayers; ++l) out.taps.push_back(a.alloc(ops.act_dtype(), T, H));
        id_t = a.alloc(DType::i32, 1, T);
      },
      layout_bytes, arena);
  SeqLayout seqs = seq_layout_make(lengths, ops, arena);
  ops.upload_raw(id_t, ids.data());
  for (int l = 0; l < kCheckLayers; ++l) out.tap_layers.push_back(l);
  fwd.run(id_t, seqs, out);
  std::vector<std::vector<float>> taps;
  for (const Tensor& t : out.taps) {
    taps.emplace_back(size_t(T * H));
    ops.download_f32(t, taps.back().data());
  }
  ops.free_bytes(block);
  return taps;
}

struct SliceError {
  double rel_rms = 0, max_abs = 0;
  int64_t worst = 0, non_finite = 0;  // worst: index of the largest |a − b|
};

SliceError slice_error(const std::vector<float>& got, const std::vector<float>& want) {
  SliceError e;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    if (!std::isfinite(got[i])) ++e.non_finite;
    num += d * d;
    den += double(want[i]) * want[i];
    if (std::fabs(d) > e.max_abs) e.max_abs = std::fabs(d), e.worst = int64_t(i);
  }
  e.rel_rms = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

// Checks the benchmark's result against the CPU fp32 path (see kCheckLayers): the timed forward's first tap
// on the slice rows, and a forward of the slice alone on the benchmark's model with a tap at every checked
// layer. Prints every figure; false when any layer is off or non-finite.
bool check_against_cpu(const QwenConfig& cfg, const TargetModel& gpu_model, Ops& gpu,
                       const std::vector<int32_t>& host_ids, const TargetOutputs& timed, bool fp8) {
  const int64_t H = cfg.hidden;
  const std::vector<int64_t> starts = {0, int64_t(kSeqs - 1) * kSeqLen};
  std::vector<int32_t> ids, lengths;
  for (int64_t s : starts) {
    ids.insert(ids.end(), host_ids.begin() + s, host_ids.begin() + s + kCheckTokens);
    lengths.push_back(kCheckTokens);
  }
  CpuOps cpu;
  TargetLoadOptions opt;
  opt.num_layers = kCheckLayers;
  // The bound per checked layer: fixed for bf16; for FP8 kCheckFp8Factor x the FP8 rounding's own effect.
  std::vector<double> bound(kCheckLayers, kCheckMaxRelRms);
  std::vector<std::vector<float>> fp32 = slice_taps(*target_random(cfg, kSeed, cpu, opt), cpu, ids, lengths), want;
  if (fp8) {
    opt.fp8 = true;
    want = slice_taps(*target_random(cfg, kSeed, cpu, opt), cpu, ids, lengths);
    for (int l = 0; l < kCheckLayers; ++l)
      bound[size_t(l)] = kCheckFp8Factor * slice_error(want[size_t(l)], fp32[size_t(l)]).rel_rms;
  } else {
    want = std::move(fp32);
  }
  std::vector<std::pair<std::string, SliceError>> rows;
  const std::vector<std::vector<float>> got = slice_taps(gpu_model, gpu, ids, lengths);
  for (int l = 0; l < kCheckLayers; ++l)
    rows.push_back({strfmt("layer %d (%s), slice alone", l,
                           cfg.layer_types[size_t(l)] == LayerKind::full_attention ? "attention" : "DeltaNet"),
                    slice_error(got[size_t(l)], want[size_t(l)])});
  const int tap0 = timed.tap_layers.front();
  if (tap0 < kCheckLayers) {
    std::vector<float> rows_got(want[0].size());
    for (size_t i = 0; i < starts.size(); ++i)
      gpu.download_f32(timed.taps.front().rows_view(starts[i], kCheckTokens),
                       rows_got.data() + i * size_t(kCheckTokens * H));
    rows.push_back({strfmt("layer %d, timed forward's tap", tap0), slice_error(rows_got, want[size_t(tap0)])});
  }
  bool ok = true;
  std::printf("result check vs the CPU %s path: %d + %d tokens (sequences 0 and %d), bound rel rms %s\n",
              fp8 ? "FP8-emulation" : "fp32", kCheckTokens, kCheckTokens, kSeqs - 1,
              fp8 ? "per layer, 1x the CPU's FP8-vs-fp32 distance" : strfmt("%.0e", kCheckMaxRelRms).c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [what, e] = rows[i];
    const double b = bound[std::min(i < size_t(kCheckLayers) ? i : size_t(tap0), size_t(kCheckLayers - 1))];
    const bool pass = e.non_finite == 0 && e.rel_rms <= b;
    ok &= pass;
    std::printf("  %-40s rel rms %.3e (bound %.3e)  max abs %.3e at token %lld col %lld  non-finite %lld  %s\n",
                what.c_str(), e.rel_rms, b, e.max_abs, (long long)(e.worst / H), (long long)(e.worst % H),
                (long long)e.non_finite, pass ? "ok" : "FAIL");
  }
  return ok;
}

// Returns false when the forward produced non-finite values or failed the CPU check (then no speed may be
// claimed: the JSON line is not printed).
bool bench_model(const char* key, const char* label, const QwenConfig& cfg, bool fp8) {
  std::printf("\n=== %s (%s): %s ===\n", label, fp8 ? "FP8" : "bf16", qwen_config_summary(cfg).c_str());
  CudaOps gpu(0);
  std::printf("device: %s\n", device_caps_summary(device_caps()).c_str());
  const int64_t T = int64_t(kSeqs) * kSeqLen;
  // Timed before the model is drawn, while its weights do not yet take the memory.
  const ExpertGemms experts = !cfg.is_moe() ? ExpertGemms{}
                              : fp8         ? time_expert_gemms_fp8(cfg, T, gpu)
                                            : time_expert_gemms(cfg, T, gpu);
  const double burst = fp8 ? fp8_burst_tflops(gpu) : 0.0;
  if (fp8) std::printf("cuBLASLt FP8 8192^3 burst (outer-vector scales, bf16 out): %.0f TFLOP/s\n", burst);
  TargetLoadOptions load;
  load.fp8 = fp8;
  TimedOps timed(gpu);
  cudaEvent_t a, b;
  DF_CUDA_CHECK(cudaEventCreate(&a));
  DF_CUDA_CHECK(cudaEventCreate(&b));
  DF_CUDA_CHECK(cudaEventRecord(a, gpu.stream()));
  std::unique_ptr<TargetModel> model = target_random(cfg, kSeed, gpu, load);
  DF_CUDA_CHECK(cudaEventRecord(b, gpu.stream()));
  DF_CUDA_CHECK(cudaEventSynchronize(b));
  float init_ms = 0;
  DF_CUDA_CHECK(cudaEventElapsedTime(&init_ms, a, b));

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

  const double fpt =
      target_forward_flops_per_token(cfg, kSeqLen, cfg.layers);  // every layer: the final norm is wanted
  const double tok_s = T / (ms * 1e-3);
  const double tflops = fpt * T / (ms * 1e-3) / 1e12;
  std::printf("forward %.1f ms (median of %d; min %.1f max %.1f)  ->  %.0f tok/s\n", ms, reps, times.front(),
              times.back(), tok_s);
  std::printf("FLOPs/token %.2f GFLOP (2 x %.3f B active non-embedding params + attention + GDN chunks)\n",
              fpt / 1e9, cfg.params_active_non_embedding() / 1e9);
  std::printf("achieved %.1f TFLOP/s = %.1f %% of %.0f; upper bound at the ceiling %.0f tok/s\n", tflops,
              100.0 * tflops / kPeakTflops, kPeakTflops, kPeakTflops * 1e12 / fpt);
  std::printf("output finite: %s\n", finite ? "yes" : "NO");
  if (experts.ms > 0) {
    const int sparse = int(std::count(cfg.moe_layers.begin(), cfg.moe_layers.end(), 1));
    // bf16 against the bf16 ceiling; FP8 against the cuBLASLt FP8 burst measured above.
    const double ref = fp8 ? burst : kPeakTflops;
    std::printf(
        "routed-expert GEMMs alone (one layer: gate_up + down %s grouped GEMMs, %d-row tiles, %lld launched "
        "for "
        "%lld needed): %.3f ms, %.0f TFLOP/s = %.1f %% of %.0f%s; x %d MoE layers = %.1f ms = %.1f %% of the "
        "forward\n",
        fp8 ? "FP8" : "bf16", experts.rows, (long long)experts.tiles, (long long)experts.real_tiles,
        experts.ms, experts.tflops, 100.0 * experts.tflops / ref, ref, fp8 ? " (the FP8 burst)" : "", sparse,
        experts.ms * sparse, 100.0 * experts.ms * sparse / ms);
  }
  const bool checked = check_against_cpu(cfg, *model, gpu, host_ids, out, fp8);
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
    double sum = 0, fp8_flops = 0, fp8_ms = 0;
    for (auto& [name, v] : by) {
      const double f = timed.flops(name);
      rows.push_back({v.first, strfmt("%-26s %5d calls %9.1f ms%s", name.c_str(), v.second, v.first,
                                      f > 0 ? strfmt(" %6.0f TFLOP/s", f / (v.first * 1e-3) / 1e12).c_str() : "")});
      sum += v.first;
      if (name.rfind("gemm_fp8", 0) == 0) fp8_flops += f, fp8_ms += v.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::printf("per-op breakdown (event-timed forward, sum %.1f ms):\n", sum);
    for (auto& [t, line] : rows) std::printf("  %s %6.1f %%\n", line.c_str(), 100.0 * t / sum);
    if (fp8_ms > 0)
      std::printf("FP8 GEMMs: %.1f ms, %.0f TFLOP/s = %.1f %% of the %.0f TFLOP/s 8192^3 burst\n", fp8_ms,
                  fp8_flops / (fp8_ms * 1e-3) / 1e12, 100.0 * fp8_flops / (fp8_ms * 1e-3) / 1e12 / burst, burst);
  }
  model->ops = plain;
  gpu.free_bytes(io);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!finite || !checked) {
    std::printf("%s: result check FAILED, no speed reported\n", label);
    return false;
  }
  // The line run_target_forward.sh reads.
  nlohmann::json line = {{"model", key},
                         {"tok_s", tok_s},
                         {"seconds", ms * 1e-3},
                         {"tflops", tflops},
                         {"tokens", T},
                         {"used_gib", gib(total - free1)},
                         {"result_check", "ok"},
                         {"dtype", fp8 ? "fp8" : "bf16"},
                         {"gpu_profile", device_caps().profile}};
  std::printf("%s\n", line.dump().c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  std::string which = "all", dtype = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) {
      dtype = argv[++i];
    } else if (a.rfind("--", 0) != 0) {
      which = a;
    } else {
      std::fprintf(
          stderr,
          "bench_target_forward: unknown option '%s'; usage: [27b|8b|35b-a3b|all] [--dtype bf16|fp8]\n",
          a.c_str());
      return 2;
    }
  }
  bool ok = true;
  try {
    if (which != "all" && which != "27b" && which != "8b" && which != "35b-a3b") {
      std::fprintf(stderr, "bench_target_forward: model '%s': expected 27b, 8b, 35b-a3b or all\n",
                   which.c_str());
      return 2;
    }
    if (dtype != "bf16" && dtype != "fp8") {
      std::fprintf(stderr, "bench_target_forward: --dtype '%s': expected bf16 or fp8\n", dtype.c_str());
      return 2;
    }
    const bool fp8 = dtype == "fp8";
    if (which == "all" || which == "27b") ok &= bench_model("27b", "Qwen3.6-27B", config_qwen36_27b(), fp8);
    if (which == "all" || which == "8b") ok &= bench_model("8b", "Qwen3-8B", config_qwen3_8b(), fp8);
    if (which == "all" || which == "35b-a3b")
      ok &= bench_model("35b-a3b", "Qwen3.6-35B-A3B", config_qwen36_35b_a3b(), fp8);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_target_forward: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
}
