// CUDA kernel benchmark at the Qwen3.6-27B shapes for one 32,768-token batch (8 sequences × 4096): each
// GEMM of a layer, causal attention (24 q / 4 kv heads, hd 256), Gated DeltaNet prefill (16/48 heads, 128)
// and the memory-bound ops. Prints work, median time, rate and % of the measured H200 ceilings (790 TFLOP/s
// bf16 GEMM, ~4.8 TB/s HBM). Before timing, each op's output on a small slice is checked against CpuOps;
// a failed check makes the run exit 1. Plain main(): the GPU machine has no Google Benchmark.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/arena.h"
#include "kernels/cuda_check.cuh"
#include "kernels/launchers.cuh"
#include "kernels/train_launchers.cuh"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

constexpr double kPeakTflops = 790.0;  // cuBLASLt bf16 8192³ on this H200 (shared/device/README.md)
constexpr double kPeakGBs = 4800.0;    // HBM3e datasheet; copy kernels reach a little less

struct Bench {
  CudaOps gpu{0};
  CpuOps cpu;
  void* block = nullptr;
  Arena arena;
  HostBuffer host{size_t(2) << 30};
  Arena harena{host.data(), host.size(), Device::cpu};
  uint64_t seed = 1;
  int failures = 0;

  explicit Bench(size_t bytes) {
    block = gpu.alloc_bytes(bytes);
    arena = Arena(block, bytes, Device::cuda);
  }
  ~Bench() { gpu.free_bytes(block); }

  Tensor rand(DType dt, int64_t rows, int64_t cols, float lo, float hi) {
    Tensor t = arena.alloc(dt, rows, cols);
    fill_uniform_launch(t.data, dt == DType::f32, t.stride, rows, cols, lo, hi, seed++, gpu.stream());
    return t;
  }
  // A host f32 copy of a device tensor (any view), as a CPU tensor for CpuOps.
  Tensor to_host(const Tensor& t) {
    Tensor h = harena.alloc(DType::f32, t.rows, t.cols);
    gpu.download_f32(t, h.ptr<float>());
    return h;
  }
  // max |gpu − cpu| / max |cpu| over a slice; fails the run above tol.
  void check(const char* what, const Tensor& got_gpu, const Tensor& want_cpu, double tol) {
    std::vector<float> got(size_t(got_gpu.numel()));
    gpu.download_f32(got_gpu, got.data());
    double err = 0, ref = 0;
    bool nan = false;
    for (int64_t r = 0; r < want_cpu.rows; ++r)
      for (int64_t c = 0; c < want_cpu.cols; ++c) {
        double w = want_cpu.ptr<float>()[r * want_cpu.stride + c], g = got[size_t(r * want_cpu.cols + c)];
        nan |= std::isnan(g);
        err = std::max(err, std::fabs(g - w));
        ref = std::max(ref, std::fabs(w));
      }
    double rel = err / std::max(ref, 1e-30);
    bool ok = !nan && rel <= tol;
    std::printf("check %-34s max|err|/max|ref| = %.2e (tol %.0e) %s\n", what, rel, tol, ok ? "ok" : "FAILED");
    if (!ok) ++failures;
  }
  // Median of `reps` event-timed runs after two warm-up runs, in ms.
  double time_ms(const std::function<void()>& fn, int reps = 10) {
    fn();
    fn();
    cudaEvent_t a, b;
    DF_CUDA_CHECK(cudaEventCreate(&a));
    DF_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      DF_CUDA_CHECK(cudaEventRecord(a, gpu.stream()));
      fn();
      DF_CUDA_CHECK(cudaEventRecord(b, gpu.stream()));
      DF_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      DF_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

void row_flops(const char* name, double flops, double ms) {
  double tf = flops / (ms * 1e-3) / 1e12;
  std::printf("%-40s %10.1f GFLOP %9.3f ms %8.1f TFLOP/s %6.1f %% of %.0f\n", name, flops / 1e9, ms, tf,
              100.0 * tf / kPeakTflops, kPeakTflops);
}
void row_bytes(const char* name, double bytes, double ms) {
  double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-40s %10.1f MB    %9.3f ms %8.1f GB/s    %6.1f %% of %.0f\n", name, bytes / 1e6, ms, gbs,
              100.0 * gbs / kPeakGBs, kPeakGBs);
}


// Column sums of a device tensor in double, downloaded a slab of rows at a time (whole tensors do not fit the
// host arena at drafter sizes).
std::vector<double> col_sums(Bench& b, const Tensor& t) {
  std::vector<double> sums(size_t(t.cols), 0.0);
  const int64_t slab = 4096;
  std::vector<float> h;
  for (int64_t r0 = 0; r0 < t.rows; r0 += slab) {
    Tensor v = t.rows_view(r0, std::min(slab, t.rows - r0));
    h.resize(size_t(v.numel()));
    b.gpu.download_f32(v, h.data());
    for (int64_t i = 0; i < v.numel(); ++i) sums[size_t(i % t.cols)] += h[size_t(i)];
  }
  return sums;
}

// DFlash drafter attention of the Qwen3.6-27B drafter (32 q / 8 kv heads, hd 128, B 16), 8 sequences of 4096
// context tokens with 512 blocks each, forward and backward. Checked first: out, lse, dq and the own-block
// dk/dv of the 4 longest-context blocks against CpuTrainOps on that sub-problem; then every dv row, context
// rows included, through Σ_t dV[t] = Σ_q dO[q] (each query's softmax sums to 1).
void bench_dflash_attention(Bench& b, int window) {
  const int S = 8, L = 4096, per_seq = 512, B = 16, hq = 32, hkv = 8, hd = 128, group = hq / hkv;
  const int64_t nb = int64_t(S) * per_seq, T = int64_t(S) * L, qr = nb * B, kr = T + qr;
  size_t mark = b.arena.mark();
  Tensor q = b.rand(DType::bf16, qr, hq * hd, -2, 2), dout = b.rand(DType::bf16, qr, hq * hd, -1, 1);
  Tensor k = b.rand(DType::bf16, kr, hkv * hd, -2, 2), v = b.rand(DType::bf16, kr, hkv * hd, -1, 1);
  Tensor out = b.arena.alloc(DType::bf16, qr, hq * hd), dq = b.arena.alloc(DType::bf16, qr, hq * hd);
  Tensor lse = b.arena.alloc(DType::f32, qr, hq), dk = b.arena.alloc(DType::bf16, kr, hkv * hd);
  Tensor dv = b.arena.alloc(DType::bf16, kr, hkv * hd), blocks = b.arena.alloc(DType::i32, nb, 2);
  // Anchors spread over the whole context, one every 8 tokens with a varying offset, ascending per sequence.
  std::vector<int32_t> hb;
  double pairs = 0;  // (query, key) pairs the mask admits, per q head
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < per_seq; ++i) {
      const int a = 8 * i + (i * 5) % 8;
      hb.push_back(s * L);
      hb.push_back(a);
      for (int kq = 0; kq < B; ++kq)
        pairs += window > 0 ? a - std::min(a, std::max(0, a + kq - (window - 1))) + kq + 1 : a + B;
    }
  b.gpu.upload_raw(blocks, hb.data());
  DFlashAttnDims d;
  d.T = T, d.nb = nb, d.hq = hq, d.hkv = hkv, d.hd = hd, d.block = B, d.window = window;
  d.scale = 1.0f / std::sqrt(float(hd));
  const size_t ws_bytes = dflash_attention_bwd_workspace_bytes(d);
  void* ws = b.arena.alloc_bytes(ws_bytes);
  auto bf = [](const Tensor& t) { return t.ptr<bf16>(); };
  auto fwd = [&] {
    dflash_attention_fwd_launch(bf(q), q.stride, bf(k), k.stride, bf(v), v.stride, blocks.ptr<int32_t>(), bf(out),
                                out.stride, lse.ptr<float>(), lse.stride, d, b.gpu.stream());
  };
  auto bwd = [&] {
    dflash_attention_bwd_launch(bf(q), q.stride, bf(k), k.stride, bf(v), v.stride, blocks.ptr<int32_t>(), bf(out),
                                out.stride, lse.ptr<float>(), lse.stride, bf(dout), dout.stride, bf(dq), dq.stride,
                                bf(dk), dk.stride, bf(dv), dv.stride, d, ws, ws_bytes, b.gpu.stream());
  };
  fwd();
  bwd();
  {
    const int nc = 4, j0 = per_seq - nc;  // blocks 508..511 of sequence 0: the longest contexts
    size_t hm = b.harena.mark();
    Tensor hk = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
    Tensor hv = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
    for (auto [src, dst] : {std::pair{&k, &hk}, std::pair{&v, &hv}}) {
      b.gpu.download_f32(src->rows_view(0, L), dst->ptr<float>());
      b.gpu.download_f32(src->rows_view(T + j0 * B, nc * B), dst->rows_view(L, nc * B).ptr<float>());
    }
    std::vector<int32_t> sub(hb.begin() + 2 * j0, hb.begin() + 2 * (j0 + nc));
    Tensor hblk = tensor_make(sub.data(), DType::i32, Device::cpu, nc, 2);
    Tensor hq_ = b.to_host(q.rows_view(j0 * B, nc * B)), hdo = b.to_host(dout.rows_view(j0 * B, nc * B));
    Tensor ho = b.harena.alloc(DType::f32, nc * B, hq * hd), hl = b.harena.alloc(DType::f32, nc * B, hq);
    CpuTrainOps cpu;
    DFlashAttnShape s{hq, hkv, hd, B, window, d.scale};
    cpu.dflash_attention_fwd(hq_, hk, hv, hblk, ho, hl, s);
    b.check("dflash attention out", out.rows_view(j0 * B, nc * B), ho, 1e-2);
    b.check("dflash attention lse", lse.rows_view(j0 * B, nc * B), hl, 1e-4);
    Tensor hdq = b.harena.alloc(DType::f32, nc * B, hq * hd);
    Tensor hdk = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
    Tensor hdv = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
    cpu.dflash_attention_bwd(hq_, hk, hv, hblk, b.to_host(out.rows_view(j0 * B, nc * B)),
                             b.to_host(lse.rows_view(j0 * B, nc * B)), hdo, hdq, hdk, hdv, s);
    b.check("dflash attention dq", dq.rows_view(j0 * B, nc * B), hdq, 2e-2);
    b.check("dflash attention dk (own rows)", dk.rows_view(T + j0 * B, nc * B), hdk.rows_view(L, nc * B), 2e-2);
    b.check("dflash attention dv (own rows)", dv.rows_view(T + j0 * B, nc * B), hdv.rows_view(L, nc * B), 2e-2);
    b.harena.reset(hm);
    const std::vector<double> sdo = col_sums(b, dout), sdv = col_sums(b, dv);
    double err = 0, ref = 0;
    for (int g = 0; g < hkv; ++g)
      for (int e = 0; e < hd; ++e) {
        double want = 0;
        for (int h = g * group; h < (g + 1) * group; ++h) want += sdo[size_t(h * hd + e)];
        err = std::max(err, std::fabs(sdv[size_t(g * hd + e)] - want));
        ref = std::max(ref, std::fabs(want));
      }
    const bool ok = err <= 1e-2 * ref;
    std::printf("check %-34s max|err|/max|ref| = %.2e (tol 1e-02) %s\n", "dflash attention sum_t dV = sum_q dO",
                err / std::max(ref, 1e-30), ok ? "ok" : "FAILED");
    if (!ok) ++b.failures;
  }
  char name[96];
  std::snprintf(name, sizeof(name), "dflash attn fwd %s (visible FLOPs)", window ? "W2048" : "full");
  row_flops(name, 4.0 * hd * hq * pairs, b.time_ms(fwd, 5));
  std::snprintf(name, sizeof(name), "dflash attn bwd %s (5-GEMM FLOPs)", window ? "W2048" : "full");
  row_flops(name, 10.0 * hd * hq * pairs, b.time_ms(bwd, 5));
  b.arena.reset(mark);
}
}  // namespace

int main() {
  try {
    if (cuda_device_count() == 0) {
      std::printf("bench_kernels: no CUDA device visible; nothing measured\n");
      return 0;
    }
    const int S = 8, L = 4096;
    const int64_t T = int64_t(S) * L, H = 5120, I = 17408;
    Bench b(size_t(24) << 30);
    std::vector<int32_t> lens(S, L);
    SeqLayout seqs = seq_layout_make(lens, b.gpu, b.arena);
    const int64_t ns = 256;  // check slice: the first 256 tokens of sequence 0 (causal ops are prefix-exact)
    SeqLayout hseqs = seq_layout_make({int32_t(ns)}, b.cpu, b.harena);
    cudaDeviceProp prop{};
    DF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs; T = %lld tokens (%d x %d), hidden %lld\n", prop.name, prop.multiProcessorCount,
                (long long)T, S, L, (long long)H);

    // ---- the two ceilings on this card, measured now (the % columns still use the README figures) ------
    {
      size_t mark = b.arena.mark();
      const int64_t n = 8192, bytes = int64_t(2) << 30;
      Tensor x = b.rand(DType::bf16, n, n, -1, 1), w = b.rand(DType::bf16, n, n, -1, 1);
      Tensor c = b.arena.alloc(DType::bf16, n, n);
      row_flops("ceiling: cuBLASLt bf16 8192^3", 2.0 * n * n * n, b.time_ms([&] { b.gpu.gemm(x, w, c, 0.0f); }));
      void* src = b.arena.alloc_bytes(bytes);
      void* dst = b.arena.alloc_bytes(bytes);
      row_bytes("ceiling: device copy 2 GiB (read+write)", 2.0 * bytes, b.time_ms([&] {
                  DF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b.gpu.stream()));
                }));
      b.arena.reset(mark);
    }

    // ---- GEMMs: c[T, N] = x[T, K] · w[N, K]ᵀ ------------------------------------------------------------
    struct G { const char* name; int64_t N, K; };
    const G gemms[] = {{"gemm linear in_proj_qkv 5120->10240", 10240, H}, {"gemm linear in_proj_z 5120->6144", 6144, H},
                       {"gemm linear out_proj 6144->5120", H, 6144},       {"gemm full q_proj+gate 5120->12288", 12288, H},
                       {"gemm full k_proj 5120->1024", 1024, H},            {"gemm full o_proj 6144->5120", H, 6144},
                       {"gemm mlp gate|up 5120->34816", 2 * I, H},          {"gemm mlp down 17408->5120", H, I}};
    Tensor xa = b.rand(DType::bf16, T, I, -1, 1);
    Tensor cbig = b.arena.alloc(DType::bf16, T, 2 * I);
    for (const G& g : gemms) {
      size_t mark = b.arena.mark();
      // Contiguous [T, K] and [T, N] views over the front of the big buffers.
      Tensor a = tensor_make(xa.data, DType::bf16, Device::cuda, T, g.K);
      Tensor w = b.rand(DType::bf16, g.N, g.K, -0.05f, 0.05f);
      Tensor c = tensor_make(cbig.data, DType::bf16, Device::cuda, T, g.N);
      b.gpu.gemm(a, w, c, 0.0f);
      size_t hm = b.harena.mark();
      Tensor hc = b.harena.alloc(DType::f32, 32, 256);
      b.cpu.gemm(b.to_host(a.rows_view(0, 32)), b.to_host(w.rows_view(0, 256)), hc, 0.0f);
      b.check(g.name, c.rows_view(0, 32).cols_view(0, 256), hc, 1e-2);
      b.harena.reset(hm);
      row_flops(g.name, 2.0 * T * g.N * g.K, b.time_ms([&] { b.gpu.gemm(a, w, c, 0.0f); }));
      b.arena.reset(mark);
    }

    // ---- attention (full layers): 24 q heads, 4 kv heads, hd 256 ---------------------------------------
    {
      size_t mark = b.arena.mark();
      const int hq = 24, hkv = 4, hd = 256;
      Tensor q = b.rand(DType::bf16, T, hq * hd, -2, 2), k = b.rand(DType::bf16, T, hkv * hd, -2, 2);
      Tensor v = b.rand(DType::bf16, T, hkv * hd, -1, 1), o = b.arena.alloc(DType::bf16, T, hq * hd);
      float scale = 1.0f / 16.0f;
      b.gpu.attention_causal(q, k, v, o, seqs, hq, hkv, hd, scale);
      size_t hm = b.harena.mark();
      Tensor ho = b.harena.alloc(DType::f32, ns, hq * hd);
      b.cpu.attention_causal(b.to_host(q.rows_view(0, ns)), b.to_host(k.rows_view(0, ns)), b.to_host(v.rows_view(0, ns)),
                             ho, hseqs, hq, hkv, hd, scale);
      b.check("attention 24/4 hd256", o.rows_view(0, ns), ho, 2e-2);
      b.harena.reset(hm);
      double flops = 4.0 * hd * hq * S * (double(L) * (L + 1) / 2);
      row_flops("attention causal 24/4 hd256 (causal FLOPs)", flops,
                b.time_ms([&] { b.gpu.attention_causal(q, k, v, o, seqs, hq, hkv, hd, scale); }, 5));
      b.arena.reset(mark);
    }

    // ---- DFlash drafter attention (27B drafter): sliding (W 2048) and full layers ------------------------
    bench_dflash_attention(b, 2048);
    bench_dflash_attention(b, 0);

    // ---- Gated DeltaNet prefill: 16 key / 48 value heads, dk = dv = 128 --------------------------------
    {
      size_t mark = b.arena.mark();
      GdnShape s{16, 48, 128, 128};
      const int64_t cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv;
      Tensor qkv = b.rand(DType::bf16, T, cols, -1, 1), a = b.rand(DType::bf16, T, s.nv, -3, 3);
      Tensor bb = b.rand(DType::bf16, T, s.nv, -3, 3), A_log = b.rand(DType::f32, 1, s.nv, -2, 1);
      Tensor dt = b.rand(DType::f32, 1, s.nv, -1, 1), o = b.arena.alloc(DType::bf16, T, int64_t(s.nv) * s.dv);
      Tensor ws = b.arena.alloc(DType::u8, 1, b.gpu.gdn_workspace_bytes(T, s));
      b.gpu.gdn_prefill(qkv, a, bb, A_log, dt, o, seqs, s, ws);
      size_t hm = b.harena.mark();
      Tensor ho = b.harena.alloc(DType::f32, ns, int64_t(s.nv) * s.dv);
      b.cpu.gdn_prefill(b.to_host(qkv.rows_view(0, ns)), b.to_host(a.rows_view(0, ns)),
                        b.to_host(bb.rows_view(0, ns)), b.to_host(A_log), b.to_host(dt), ho, hseqs, s,
                        Tensor{});
      b.check("gdn_prefill 16/48 128", o.rows_view(0, ns), ho, 2e-2);
      b.harena.reset(hm);
      // FLOPs of the chunked algorithm per (chunk of 64, value head): K Kᵀ, Q Kᵀ, A V' (2·C²·d each), the
      // triangular solve (C²·(dk+dv)), W S, Q S, Kᵀ V' (2·C·dk·dv each).
      const double C = 64, d = 128;
      double per_chunk = 3 * 2 * C * C * d + C * C * 2 * d + 3 * 2 * C * d * d;
      double flops = per_chunk * (T / C) * s.nv;
      double ms = b.time_ms([&] { b.gpu.gdn_prefill(qkv, a, bb, A_log, dt, o, seqs, s, ws); }, 5);
      row_flops("gdn_prefill 16/48 dk=dv=128 (bf16 mma)", flops, ms);
      row_bytes("gdn_prefill (min bytes: qkv,a,b in, o out)", double(T) * (cols + 2 * s.nv + s.nv * s.dv) * 2, ms);
      b.arena.reset(mark);
    }

    // ---- memory-bound ops -------------------------------------------------------------------------------
    {
      size_t mark = b.arena.mark();
      Tensor x = b.rand(DType::bf16, T, H, -2, 2), d = b.rand(DType::bf16, T, H, -2, 2);
      Tensor w = b.rand(DType::f32, 1, H, -0.2f, 0.2f), y = b.arena.alloc(DType::bf16, T, H);
      b.gpu.rmsnorm(x, w, y, 1e-6f, NormKind::zero_centred);
      {
        size_t hm = b.harena.mark();
        Tensor hy = b.harena.alloc(DType::f32, 64, H);
        b.cpu.rmsnorm(b.to_host(x.rows_view(0, 64)), b.to_host(w), hy, 1e-6f, NormKind::zero_centred);
        b.check("rmsnorm 5120", y.rows_view(0, 64), hy, 1e-2);
        b.harena.reset(hm);
      }
      row_bytes("rmsnorm [T,5120] zero-centred", 2.0 * T * H * 2,
                b.time_ms([&] { b.gpu.rmsnorm(x, w, y, 1e-6f, NormKind::zero_centred); }));
      row_bytes("add_rmsnorm [T,5120] zero-centred", 4.0 * T * H * 2,
                b.time_ms([&] { b.gpu.add_rmsnorm(x, d, w, y, 1e-6f, NormKind::zero_centred); }));
      b.arena.reset(mark);

      Tensor q = b.rand(DType::bf16, T, 24 * 256, -2, 2), qw = b.rand(DType::f32, 1, 256, -0.2f, 0.2f);
      row_bytes("qk_norm_rope q 24x256 rot 64", 2.0 * T * 24 * 256 * 2, b.time_ms([&] {
                  b.gpu.qk_norm_rope(q, qw, seqs.pos, 24, 256, 64, 1e7f, 1e-6f, NormKind::zero_centred);
                }));
      // Qwen3-8B q: 32 heads x 128, full rotation, plain norm (36 layers x q and k = 72 calls per forward).
      Tensor q8 = b.rand(DType::bf16, T, 32 * 128, -2, 2), qw8 = b.rand(DType::f32, 1, 128, 0.5f, 1.5f);
      row_bytes("qk_norm_rope q 32x128 rot 128 (8B)", 2.0 * T * 32 * 128 * 2, b.time_ms([&] {
                  b.gpu.qk_norm_rope(q8, qw8, seqs.pos, 32, 128, 128, 1e6f, 1e-6f, NormKind::plain);
                }));
      Tensor g = b.rand(DType::bf16, T, 24 * 256, -4, 4);
      row_bytes("sigmoid_gate 6144", 3.0 * T * 6144 * 2, b.time_ms([&] { b.gpu.sigmoid_gate(q, g); }));
      b.arena.reset(mark);

      Tensor gu = b.rand(DType::bf16, T, 2 * I, -3, 3), act = b.arena.alloc(DType::bf16, T, I);
      row_bytes("swiglu 17408 (from fused gate|up)", 3.0 * T * I * 2,
                b.time_ms([&] { b.gpu.swiglu(gu.cols_view(0, I), gu.cols_view(I, I), act); }));
      b.arena.reset(mark);

      // conv1d and gated_rmsnorm read their inputs as column views of the linear layers' fused projection
      // [T, qkv 10240 | z 6144 | b 48 | a 48], as in the forward, so the strided row pitch is what is timed.
      const int64_t C = 10240, P = C + 6144 + 2 * 48;
      Tensor proj = b.rand(DType::bf16, T, P, -2, 2), cw = b.rand(DType::f32, C, 4, -0.5f, 0.5f);
      Tensor cx = proj.cols_view(0, C), cy = b.arena.alloc(DType::bf16, T, C);
      b.gpu.conv1d_silu(cx, cw, cy, seqs);
      {
        size_t hm = b.harena.mark();
        Tensor hy = b.harena.alloc(DType::f32, ns, C);
        b.cpu.conv1d_silu(b.to_host(cx.rows_view(0, ns)), b.to_host(cw), hy, hseqs);
        b.check("conv1d_silu 10240", cy.rows_view(0, ns), hy, 1e-2);
        b.harena.reset(hm);
      }
      row_bytes("conv1d_silu 10240 K=4 (x in [T,16480])", 2.0 * T * C * 2,
                b.time_ms([&] { b.gpu.conv1d_silu(cx, cw, cy, seqs); }));

      Tensor go = b.rand(DType::bf16, T, 6144, -2, 2), gz = proj.cols_view(C, 6144);
      Tensor gw = b.rand(DType::f32, 1, 128, 0.5f, 1.5f), gy = b.arena.alloc(DType::bf16, T, 6144);
      b.gpu.gated_rmsnorm(go, gz, gw, gy, 48, 128, 1e-6f);
      {
        size_t hm = b.harena.mark();
        Tensor hy = b.harena.alloc(DType::f32, 64, 6144);
        b.cpu.gated_rmsnorm(b.to_host(go.rows_view(0, 64)), b.to_host(gz.rows_view(0, 64)), b.to_host(gw), hy,
                            48, 128, 1e-6f);
        b.check("gated_rmsnorm 48x128", gy.rows_view(0, 64), hy, 1e-2);
        b.harena.reset(hm);
      }
      row_bytes("gated_rmsnorm 48x128 (z in [T,16480])", 3.0 * T * 6144 * 2,
                b.time_ms([&] { b.gpu.gated_rmsnorm(go, gz, gw, gy, 48, 128, 1e-6f); }));
      b.arena.reset(mark);
    }
    if (b.failures) {
      std::printf("bench_kernels: %d correctness check(s) FAILED\n", b.failures);
      return 1;
    }
    std::printf("bench_kernels: all correctness checks passed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
