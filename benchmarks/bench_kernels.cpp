// CUDA kernel benchmark at the Qwen3.6-27B shapes for one 32,768-token batch (8 sequences × 4096): each
// GEMM of a layer, causal attention (24 q / 4 kv heads, hd 256), Gated DeltaNet prefill (16/48 heads, 128)
// and the memory-bound ops, then the drafter's lm_head loss (8192 block rows). Prints work, median time, rate
// and % of the measured H200 ceilings (790 TFLOP/s bf16 GEMM, ~4.8 TB/s HBM). Each op's output on a small
// slice is checked against CpuOps (the loss: a host double computation); a failed check makes the run exit 1.
// Plain main(): the GPU machine has no Google Benchmark. `bench_kernels decode [T]` runs the decode kernels
// alone (at T 1 and 16, or at T only), `bench_kernels attention` the causal attention at the 27B (24/4 × 256,
// gated) and Qwen3-8B (32/8 × 128) shapes, in separate tensors, as views of the forward's fused projection,
// and those views timed straight after GEMMs, each on the default dispatch, on ours and on cuDNN's fused
// attention (where cuDNN is available); `bench_kernels gdn` the Gated DeltaNet prefill alone (and its
// state pass's one-stage form, where the device takes the two-stage one);
// `bench_kernels dflash [S [HD]]` the DFlash drafter attention at the drafter step's shape and 8x it (or S
// sequences, at head dim HD), on the wgmma and the portable kernels, these in both shared-memory forms;
// `bench_kernels norms` the drafter's RMSNorm and QK-norm + RoPE backwards and training forwards;
// `bench_kernels lm [H V]` the lm_head loss alone (default the 27B shape). The FP8 input quantisers are
// bench_kernels_fp8. benchmarks/run_kernels_peer.sh sets these rows beside their peers' in the same call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/cuda_timing.h"
#include "benchmarks/kernel_bench.h"
#include "core/arena.h"
#include "kernels/decode/decode_plan.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train_launchers.cuh"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

// The drafter's lm_head loss at the 27B shape: R block rows (every 16th, the anchor, inactive) against
// V = 248,320; CE at two chunk sizes, the KL at one, and the two GEMMs of the CE alone for the overhead. Each
// configuration's last timed run is checked on rows 1 (first chunk), R − 1 (last) and 16 (inactive) against
// a double-precision host computation from the same bf16 values (the CPU oracle would need 5 GB of f32).
void bench_lm_head_loss(Bench& b, int64_t H, int64_t V = 248320) {
  const int64_t R = 8192;
  size_t mark = b.arena.mark();
  Tensor hid = b.rand(DType::bf16, R, H, -2, 2), tgt = b.rand(DType::bf16, R, H, -2, 2);
  Tensor W = b.rand(DType::bf16, V, H, -0.05f, 0.05f);
  std::vector<int32_t> labels(R);
  std::vector<uint8_t> active(R);
  std::mt19937 rng(7);
  int64_t n_active = 0;
  for (int64_t r = 0; r < R; ++r) {
    labels[size_t(r)] = int32_t(rng() % uint32_t(V));
    active[size_t(r)] = r % 16 != 0;
    n_active += active[size_t(r)];
  }
  Tensor lab = b.arena.alloc(DType::i32, 1, R), act = b.arena.alloc(DType::u8, 1, R);
  b.gpu.upload_raw(lab, labels.data());
  b.gpu.upload_raw(act, active.data());
  Tensor loss = b.arena.alloc(DType::f32, 1, R), pl = b.arena.alloc(DType::f32, 1, R);
  Tensor am = b.arena.alloc(DType::i32, 1, R), dh = b.arena.alloc(DType::bf16, R, H);
  GemmContext* gemm = gemm_init();
  auto bf = [](const Tensor& t) { return static_cast<bf16*>(t.data); };
  auto run = [&](bool kl, int64_t chunk, void* ws, size_t ws_bytes) {
    lm_head_loss_launch(gemm, bf(hid), H, bf(W), H, lab.ptr<int32_t>(), act.ptr<uint8_t>(),
                        kl ? bf(tgt) : nullptr, H, kl, loss.ptr<float>(), pl.ptr<float>(), am.ptr<int32_t>(),
                        bf(dh), H, R, H, V, chunk, n_active, ws, ws_bytes, b.gpu.stream());
  };
  // The CE loss's chunk GEMMs alone over the first `rows` rows, 1024 a chunk (logits f32, then dhidden from
  // bf16 dlogits), either or both, on the bytes of the workspace `ws`: ms of one pass.
  auto gemm_ms = [&](void* ws, int64_t rows, bool logits_gemm, bool dhidden_gemm) {
    constexpr int64_t chunk = 1024;
    char* base = static_cast<char*>(ws);
    float* logits = reinterpret_cast<float*>(base);
    bf16* grad = reinterpret_cast<bf16*>(base + size_t(chunk * V) * 4);
    bf16* dhc = reinterpret_cast<bf16*>(base + size_t(chunk * V) * 6);
    return b.time_ms(
        [&] {
          for (int64_t p0 = 0; p0 < rows; p0 += chunk) {
            const int64_t n = std::min(chunk, rows - p0);
            if (logits_gemm)
              gemm_launch_ex(gemm, bf(hid) + p0 * H, H, false, bf(W), H, true, logits, V, true, n, V, H, 1.0f,
                             0.0f, b.gpu.stream());
            if (dhidden_gemm)
              gemm_launch_ex(gemm, grad, V, false, bf(W), H, false, dhc, H, false, n, H, V, 1.0f, 0.0f,
                             b.gpu.stream());
          }
        },
        5);
  };
  std::vector<uint16_t> w(size_t(V * H)), x(size_t(R * H)), xt(size_t(R * H));
  DF_CUDA_CHECK(cudaMemcpy(w.data(), W.data, w.size() * 2, cudaMemcpyDeviceToHost));
  DF_CUDA_CHECK(cudaMemcpy(x.data(), hid.data, x.size() * 2, cudaMemcpyDeviceToHost));
  DF_CUDA_CHECK(cudaMemcpy(xt.data(), tgt.data, xt.size() * 2, cudaMemcpyDeviceToHost));
  // Row r's logits in double from the bf16 values.
  auto host_logits = [&](const std::vector<uint16_t>& in, int64_t r) {
    std::vector<double> z(static_cast<size_t>(V));
#pragma omp parallel for schedule(static)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h)
        s += double(bf16_to_f32(in[size_t(r * H + h)])) * bf16_to_f32(w[size_t(v * H + h)]);
      z[size_t(v)] = s;
    }
    return z;
  };
  auto log_softmax = [](std::vector<double> z) {
    const double m = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double v : z) sum += std::exp(v - m);
    for (double& v : z) v -= m + std::log(sum);
    return z;
  };
  auto check = [&](const char* what, bool kl) {
    std::vector<uint16_t> dh_got(size_t(R * H));
    std::vector<float> loss_got(R), pl_got(R);
    std::vector<int32_t> am_got(R);
    DF_CUDA_CHECK(cudaMemcpy(dh_got.data(), dh.data, dh_got.size() * 2, cudaMemcpyDeviceToHost));
    DF_CUDA_CHECK(cudaMemcpy(loss_got.data(), loss.data, size_t(R) * 4, cudaMemcpyDeviceToHost));
    DF_CUDA_CHECK(cudaMemcpy(pl_got.data(), pl.data, size_t(R) * 4, cudaMemcpyDeviceToHost));
    DF_CUDA_CHECK(cudaMemcpy(am_got.data(), am.data, size_t(R) * 4, cudaMemcpyDeviceToHost));
    double loss_err = 0, p_err = 0, dh_err = 0, dh_ref = 0;
    bool ok = true;
    for (int64_t r : {int64_t(1), R - 1, int64_t(16)}) {
      const size_t ur = size_t(r);
      if (!active[ur]) {
        ok &= loss_got[ur] == 0.0f && pl_got[ur] == 0.0f && am_got[ur] == -1;
        for (int64_t h = 0; h < H; ++h) ok &= bf16_to_f32(dh_got[size_t(r * H + h)]) == 0.0f;
        continue;
      }
      const std::vector<double> z = host_logits(x, r), lpd = log_softmax(z);
      const std::vector<double> lpt = kl ? log_softmax(host_logits(xt, r)) : std::vector<double>();
      const int32_t l = labels[ur], a = am_got[ur];
      double want = -lpd[size_t(l)];
      std::vector<double> g(static_cast<size_t>(V));
      if (kl) want = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double pd = std::exp(lpd[size_t(v)]), pt = kl ? std::exp(lpt[size_t(v)]) : (v == l ? 1.0 : 0.0);
        if (kl) want += pt * (lpt[size_t(v)] - lpd[size_t(v)]);
        g[size_t(v)] = pd - pt;
      }
      loss_err = std::max(loss_err, std::fabs(loss_got[ur] - want) / std::max(1.0, std::fabs(want)));
      p_err = std::max(p_err, std::fabs(pl_got[ur] / std::exp(lpd[size_t(l)]) - 1.0));
      // A maximum up to the fp32 rounding of logits of size ~10 (5120 terms of ~0.05).
      ok &= a >= 0 && a < V && z[size_t(a)] >= *std::max_element(z.begin(), z.end()) - 1e-3;
      // dhidden in blocks of 64 columns, each streaming over all of W once.
#pragma omp parallel for schedule(static)
      for (int64_t h0 = 0; h0 < H; h0 += 64) {
        const int64_t nh = std::min<int64_t>(64, H - h0);
        double acc[64] = {};
        for (int64_t v = 0; v < V; ++v)
          for (int64_t k = 0; k < nh; ++k) acc[k] += g[size_t(v)] * bf16_to_f32(w[size_t(v * H + h0 + k)]);
        double e = 0, m = 0;
        for (int64_t k = 0; k < nh; ++k) {
          e = std::max(e, std::fabs(bf16_to_f32(dh_got[size_t(r * H + h0 + k)]) - acc[k]));
          m = std::max(m, std::fabs(acc[k]));
        }
#pragma omp critical
        dh_err = std::max(dh_err, e), dh_ref = std::max(dh_ref, m);
      }
    }
    // Loss and p_label come from fp32 logits and fp32 sums (errors ~1e-6 here; 1e-4 and 1e-3 leave wide
    // margins); dhidden goes through bf16 dlogits and a bf16 output, two roundings of at most 2^-8.
    const double dh_rel = dh_err / std::max(dh_ref, 1e-30);
    ok &= loss_err <= 1e-4 && p_err <= 1e-3 && dh_rel <= 2e-2;
    std::printf(
        "check %-34s loss rel %.1e, p_label rel %.1e, dhidden max|err|/max|ref| %.1e, argmax, zeros: %s\n",
        what, loss_err, p_err, dh_rel, ok ? "ok" : "FAILED");
    if (!ok) ++b.failures;
  };

  for (auto [kl, chunk] : {std::pair{false, int64_t(1024)}, {false, int64_t(4096)}, {true, int64_t(1024)}}) {
    const size_t m2 = b.arena.mark();
    const size_t ws_bytes = lm_head_loss_workspace_bytes(R, H, V, chunk, kl);
    void* ws = b.arena.alloc_bytes(ws_bytes);
    char name[96];
    std::snprintf(name, sizeof(name), "lm_head_loss %s chunk %lld, %lld rows", kl ? "kl" : "ce",
                  (long long)chunk, (long long)R);
    const double ms = b.time_ms([&] { run(kl, chunk, ws, ws_bytes); }, 5);
    check(name, kl);
    // FLOPs of the GEMMs as launched (every row: the host does not know which are active) and as needed.
    const double per_row = (kl ? 6.0 : 4.0) * double(H) * double(V);
    row_flops(name, per_row * R, ms);
    std::snprintf(name, sizeof(name), "  same, counting the %lld active rows", (long long)n_active);
    row_flops(name, per_row * n_active, ms);
    std::printf("  workspace %.2f GB\n", ws_bytes / 1e9);
    if (!kl && chunk == 1024) {
      // The two GEMMs of each chunk alone, together and each by itself (which falls short of the ceiling);
      // the operands are workspace bytes, whatever they hold.
      row_flops("  its GEMMs alone (logits + dhidden)", per_row * R, gemm_ms(ws, R, true, true));
      row_flops("  logits GEMM alone (f32 out)", per_row / 2 * R, gemm_ms(ws, R, true, false));
      row_flops("  dhidden GEMM alone", per_row / 2 * R, gemm_ms(ws, R, false, true));
    }
    b.arena.reset(m2);
  }
  gemm_free(gemm);
  b.arena.reset(mark);
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

// Median time of each kernel that `fn` launches, run alone: fn is captured into a CUDA graph and each kernel
// node, in launch order, is replayed by itself in a one-node graph (same function, grid, shared memory and
// arguments). A call's kernels run back to back on one stream, so their times add up to about the call's.
// A call that cannot be captured gives no times (the caller says so) rather than ending the benchmark.
std::vector<double> kernel_times_ms(Bench& b, const std::function<void()>& fn, int reps) {
  const cudaStream_t st = b.gpu.stream();
  cudaGraph_t graph = nullptr;
  DF_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  try {
    fn();
  } catch (const std::exception& e) {
    std::printf("  (could not capture the call into a CUDA graph: %s)\n", e.what());
    cudaStreamEndCapture(st, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return {};
  }
  DF_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  // A stream capture is a chain: start at the root and follow each node's one dependent.
  size_t n = 1;
  cudaGraphNode_t node = nullptr;
  DF_CUDA_CHECK(cudaGraphGetRootNodes(graph, &node, &n));
  std::vector<double> ms;
  while (n == 1) {
    cudaGraphNodeType type;
    DF_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams kp{};
      DF_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &kp));
      cudaGraph_t one;
      cudaGraphNode_t added;
      cudaGraphExec_t exec;
      DF_CUDA_CHECK(cudaGraphCreate(&one, 0));
      DF_CUDA_CHECK(cudaGraphAddKernelNode(&added, one, nullptr, 0, &kp));
      // The launch attributes are not in the params: a cluster launch replayed without its cluster dimension
      // runs CTAs with no peers, and their distributed shared-memory reads fault.
      DF_CUDA_CHECK(cudaGraphKernelNodeCopyAttributes(added, node));
      DF_CUDA_CHECK(cudaGraphInstantiate(&exec, one, 0));
      ms.push_back(b.time_ms([&] { DF_CUDA_CHECK(cudaGraphLaunch(exec, st)); }, reps));
      DF_CUDA_CHECK(cudaGraphExecDestroy(exec));
      DF_CUDA_CHECK(cudaGraphDestroy(one));
    }
    n = 1;
    // A programmatic launch's edge is not the default one: its data must be asked for, or the query fails.
    cudaGraphEdgeData edge{};
    DF_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, &node, &edge, &n));
  }
  DF_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms;
}

// DFlash drafter attention of the Qwen3.6-27B drafter (32 q / 8 kv heads, hd 128, B 16; or head dim hd): S
// sequences of 4096 context tokens with 512 blocks each (S = 1 is bench_drafter_step's shape), forward and
// backward, on each kernel path in the same process: the default (wgmma on a Hopper GPU of an sm_90a build),
// the portable mma.sync kernels (every other GPU) and their small shared-memory form (sm_120, sm_89), the
// last two forced through the kernel-variant registry. Checked first, on each path: out, lse, dq and the
// own-block dk/dv of the 4 longest-context blocks of sequence 0 against CpuTrainOps on that sub-problem (its
// backward fed the path's out and lse), then every dv row, context rows included, through Σ_t dV[t] = Σ_q
// dO[q] (each query's softmax sums to 1). FLOPs: 2·hd per (query, key) pair the mask admits per GEMM and q
// head, pairs counted exactly; the whole backward is credited its 5 GEMMs, its passes what each executes.
void bench_dflash_attention(Bench& b, int window, int S, int hd = 128) {
  const int L = 4096, per_seq = 512, B = 16, hq = 32, hkv = 8, group = hq / hkv;
  const int64_t nb = int64_t(S) * per_seq, T = int64_t(S) * L, qr = nb * B, kr = T + qr;
  size_t mark = b.arena.mark();
  Tensor q = b.rand(DType::bf16, qr, hq * hd, -2, 2), dout = b.rand(DType::bf16, qr, hq * hd, -1, 1);
  Tensor k = b.rand(DType::bf16, kr, hkv * hd, -2, 2), v = b.rand(DType::bf16, kr, hkv * hd, -1, 1);
  Tensor out = b.arena.alloc(DType::bf16, qr, hq * hd), dq = b.arena.alloc(DType::bf16, qr, hq * hd);
  Tensor lse = b.arena.alloc(DType::f32, qr, hq), dk = b.arena.alloc(DType::bf16, kr, hkv * hd);
  Tensor dv = b.arena.alloc(DType::bf16, kr, hkv * hd), blocks = b.arena.alloc(DType::i32, nb, 2);
  // Anchors spread over the whole context, one every 8 tokens with a varying offset, ascending per sequence.
  std::vector<int32_t> hb;
  double pairs = 0, own_pairs = 0;  // (query, key) pairs the mask admits, per q head; those on own rows
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < per_seq; ++i) {
      const int a = 8 * i + (i * 5) % 8;
      hb.push_back(s * L);
      hb.push_back(a);
      for (int kq = 0; kq < B; ++kq) {
        pairs += window > 0 ? a - std::min(a, std::max(0, a + kq - (window - 1))) + kq + 1 : a + B;
        own_pairs += window > 0 ? kq + 1 : B;
      }
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
  char tag[64];
  std::snprintf(tag, sizeof(tag), "%s S%d hd%d", window ? "W2048" : "full", S, hd);
  const double gemm = 2.0 * hd * hq * pairs;  // one GEMM over the visible pairs
  std::printf("dflash attn %s: %d x %d context, %lld blocks of %d, %d/%d heads x %d; %.4g visible (query, key) "
              "pairs per q head; 1 GEMM = 2*hd*hq*pairs = %.1f GFLOP\n",
              tag, S, L, (long long)nb, B, hq, hkv, hd, pairs, gemm / 1e9);
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
  Tensor hdq = b.harena.alloc(DType::f32, nc * B, hq * hd);
  Tensor hdk = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
  Tensor hdv = b.harena.alloc(DType::f32, L + nc * B, hkv * hd);
  const std::vector<double> sdo = col_sums(b, dout);
  char name[112];

  // Each path; where the device or head dim has no wgmma kernels the default is the portable path, run once.
  // The portable path takes the form dispatch picks for the device (the small one where the large does not
  // fit); the small path is that form forced.
  const KernelVariants saved = kernel_variants();
  const bool wg = device_caps().wgmma && hd > 64 && hd <= 128 && !saved.dflash_attention_portable &&
                  !saved.dflash_attention_small;
  for (const int form : wg ? std::vector<int>{0, 1, 2} : std::vector<int>{1, 2}) {
    const KernelVariants v =
        kernel_variants_with(saved, &KernelVariants::dflash_attention_portable, form == 1);
    kernel_variants_set(kernel_variants_with(v, &KernelVariants::dflash_attention_small, form == 2));
    const char* path = form == 0 ? "wgmma" : form == 1 ? "mma.sync" : "mma.sync small";
    std::printf("dflash attn %s, %s path:\n", tag, path);
    for (const Tensor* t : {&out, &lse, &dq, &dk, &dv})  // NaN: what a path leaves unwritten fails its checks
      DF_CUDA_CHECK(cudaMemsetAsync(t->data, 0xff, size_t(t->rows * t->stride) * dtype_size(t->dtype),
                                    b.gpu.stream()));
    fwd();
    b.check("dflash attention out", out.rows_view(j0 * B, nc * B), ho, 1e-2);
    b.check("dflash attention lse", lse.rows_view(j0 * B, nc * B), hl, 1e-4);
    std::snprintf(name, sizeof(name), "dflash attn fwd %s %s (2 GEMMs)", tag, path);
    row_flops(name, 2 * gemm, b.time_ms(fwd, 5));
    bwd();
    {
      size_t hm2 = b.harena.mark();
      cpu.dflash_attention_bwd(hq_, hk, hv, hblk, b.to_host(out.rows_view(j0 * B, nc * B)),
                               b.to_host(lse.rows_view(j0 * B, nc * B)), hdo, hdq, hdk, hdv, s);
      b.harena.reset(hm2);
    }
    b.check("dflash attention dq", dq.rows_view(j0 * B, nc * B), hdq, 2e-2);
    b.check("dflash attention dk (own rows)", dk.rows_view(T + j0 * B, nc * B), hdk.rows_view(L, nc * B), 2e-2);
    b.check("dflash attention dv (own rows)", dv.rows_view(T + j0 * B, nc * B), hdv.rows_view(L, nc * B), 2e-2);
    const std::vector<double> sdv = col_sums(b, dv);
    double err = 0, ref = 0;
    for (int g = 0; g < hkv; ++g)
      for (int e = 0; e < hd; ++e) {
        double want = 0;
        for (int h = g * group; h < (g + 1) * group; ++h) want += sdo[size_t(h * hd + e)];
        err = std::max(err, std::fabs(sdv[size_t(g * hd + e)] - want));
        ref = std::max(ref, std::fabs(want));
      }
    const bool ok = err <= 1e-2 * ref;  // NaN (a row never written) fails too
    std::printf("check %-34s max|err|/max|ref| = %.2e (tol 1e-02) %s\n", "dflash attention sum_t dV = sum_q dO",
                err / std::max(ref, 1e-30), ok ? "ok" : "FAILED");
    if (!ok) ++b.failures;
    std::snprintf(name, sizeof(name), "dflash attn bwd %s %s (5 GEMMs)", tag, path);
    row_flops(name, 5 * gemm, b.time_ms(bwd, 5));
    // The three kernels alone: row terms (reads out and dO), the dq pass (S, dP, dS·K), the dk/dv pass (S,
    // dP, dV, dK), in the order the launch's plan says (each is timed alone here). Where the dq pass writes
    // the own rows' dk and dv, their dV and dK products move from the dk/dv pass to the dq pass: each pass is
    // credited what it then executes.
    const std::vector<double> ks = kernel_times_ms(b, bwd, 5);
    if (ks.size() == 3) {
      const DFlashBwdPlan plan = dflash_attention_bwd_plan(d, true);
      const bool kv_first = plan.kv_first, own = plan.own_rows_in_dq;
      const double own_gemm = own ? 2.0 * hd * hq * own_pairs : 0.0;
      row_bytes("  row terms (out, dO read)", 2.0 * qr * hq * hd * 2, ks[0]);
      row_flops(own ? "  dq pass (3 GEMMs + own dV, dK)" : "  dq pass (3 GEMMs)", 3 * gemm + 2 * own_gemm,
                ks[kv_first ? 2 : 1]);
      row_flops(own ? "  dk/dv pass (4 GEMMs, context rows)" : "  dk/dv pass (4 GEMMs)",
                4 * (gemm - own_gemm), ks[kv_first ? 1 : 2]);
    } else if (!ks.empty()) {
      std::printf("  (the backward launched %zu kernels, not 3: no per-pass rows)\n", ks.size());
    }
  }
  kernel_variants_set(saved);
  b.harena.reset(hm);
  b.arena.reset(mark);
}

// The drafter's RMSNorm and QK-norm + RoPE backwards (rmsnorm_bwd_launch, qk_norm_rope_bwd_launch) at the 8B
// and 27B drafter shapes: hidden 4096 / 5120 over 8192 block rows (beta_dx 1, as the layers call it) and 4096
// context rows (beta_dx 0); q 32 × 128 / 24 × 256 over 8192 rows, k 8 × 128 / 4 × 256 over 4096 + 8192.
// The whole call and each of its kernels alone (dx, dw partials, column sum). Bytes: what must cross HBM once
// (x and dy read, dx written, and read at beta_dx 1); the dw partial kernel reads x and dy a second time, so a
// call cannot reach that rate. Then the training forwards on the same rows. Each is checked first by a call
// over the first 512 rows against CpuTrainOps from the same bf16 inputs (dx and dw; y and rstd), max |err| /
// max |ref| within 1e-2 (bf16 outputs, f32 sums in another order).
void bench_train_norms(Bench& b) {
  struct Case {
    const char* name;
    int64_t rows, cols;
    int heads, hd;  // heads 0: the row norm over cols
    float beta;
  };
  const Case cases[] = {{"rmsnorm_bwd 8B [8192, 4096] beta 1", 8192, 4096, 0, 0, 1.0f},
                        {"rmsnorm_bwd 8B [4096, 4096] beta 0", 4096, 4096, 0, 0, 0.0f},
                        {"rmsnorm_bwd 27B [8192, 5120] beta 1", 8192, 5120, 0, 0, 1.0f},
                        {"qk_norm_rope_bwd 8B q 8192 x 32x128", 8192, 32 * 128, 32, 128, 0.0f},
                        {"qk_norm_rope_bwd 8B k 12288 x 8x128", 12288, 8 * 128, 8, 128, 0.0f},
                        {"qk_norm_rope_bwd 27B q 8192 x 24x256", 8192, 24 * 256, 24, 256, 0.0f},
                        {"qk_norm_rope_bwd 27B k 12288 x 4x256", 12288, 4 * 256, 4, 256, 0.0f}};
  CpuTrainOps cpu;
  for (const Case& c : cases) {
    size_t mark = b.arena.mark(), hmark = b.harena.mark();
    const bool qk = c.heads > 0;
    const int64_t wn = qk ? c.hd : c.cols, rs_cols = qk ? c.heads : 1, n = 512;
    Tensor x = b.rand(DType::bf16, c.rows, c.cols, -2, 2), dy = b.rand(DType::bf16, c.rows, c.cols, -1, 1);
    Tensor dx0 = b.rand(DType::bf16, c.rows, c.cols, -1, 1), dx = b.arena.alloc(DType::bf16, c.rows, c.cols);
    Tensor w = b.rand(DType::f32, 1, wn, 0.5f, 1.5f), dw = b.arena.alloc(DType::f32, 1, wn);
    Tensor rstd = b.rand(DType::f32, c.rows, rs_cols, 0.5f, 1.5f);
    Tensor pos = b.arena.alloc(DType::i32, 1, c.rows);
    std::vector<int32_t> hp(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) hp[size_t(r)] = int32_t(r % 4096);
    b.gpu.upload_raw(pos, hp.data());
    const size_t ws_bytes =
        qk ? qk_norm_rope_bwd_workspace_bytes(c.rows, c.hd) : rmsnorm_bwd_workspace_bytes(c.rows, c.cols);
    void* ws = b.arena.alloc_bytes(ws_bytes);
    const bf16 *xp = x.ptr<bf16>(), *dyp = dy.ptr<bf16>();
    auto bwd_rows = [&](int64_t rows) {
      if (qk)
        qk_norm_rope_bwd_launch(xp, x.stride, w.ptr<float>(), pos.ptr<int32_t>(), rstd.ptr<float>(),
                                rstd.stride, dyp, dy.stride, dx.ptr<bf16>(), dx.stride, dw.ptr<float>(), 1.0f,
                                rows, c.heads, c.hd, 1e6f, ws, ws_bytes, b.gpu.stream());
      else
        rmsnorm_bwd_launch(xp, x.stride, w.ptr<float>(), rstd.ptr<float>(), dyp, dy.stride, dx.ptr<bf16>(),
                           dx.stride, dw.ptr<float>(), c.beta, 1.0f, rows, c.cols, ws, ws_bytes, b.gpu.stream());
    };
    auto fwd_rows = [&](int64_t rows) {  // y into dx, rstd overwritten
      if (qk)
        qk_norm_rope_fwd_launch(xp, x.stride, w.ptr<float>(), pos.ptr<int32_t>(), dx.ptr<bf16>(), dx.stride,
                                rstd.ptr<float>(), rstd.stride, rows, c.heads, c.hd, 1e6f, 1e-6f,
                                b.gpu.stream());
      else
        rmsnorm_fwd_launch(xp, x.stride, w.ptr<float>(), dx.ptr<bf16>(), dx.stride, rstd.ptr<float>(), rows,
                           c.cols, 1e-6f, b.gpu.stream());
    };
    auto call = [&] { bwd_rows(c.rows); };
    auto fwd = [&] { fwd_rows(c.rows); };
    const Tensor hx = b.to_host(x.rows_view(0, n)), hdy = b.to_host(dy.rows_view(0, n)), hw = b.to_host(w);
    const Tensor hrs_rows = b.to_host(rstd.rows_view(0, n));
    const Tensor hrs = qk ? hrs_rows : tensor_make(hrs_rows.data, DType::f32, Device::cpu, 1, n);
    const Tensor hpos = tensor_make(hp.data(), DType::i32, Device::cpu, 1, n);
    // The backward over the first n rows from dx0 and a zero dw.
    DF_CUDA_CHECK(cudaMemcpyAsync(dx.data, dx0.data, size_t(c.rows * c.cols) * 2, cudaMemcpyDeviceToDevice,
                                  b.gpu.stream()));
    DF_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, size_t(wn) * 4, b.gpu.stream()));
    bwd_rows(n);
    Tensor hdx = b.to_host(dx0.rows_view(0, n)), hdw = b.harena.alloc(DType::f32, 1, wn);
    std::fill_n(hdw.ptr<float>(), wn, 0.0f);
    if (qk)
      cpu.qk_norm_rope_bwd(hx, hw, hpos, hrs, hdy, hdx, hdw, c.heads, c.hd, 1e6f, 1.0f);
    else
      cpu.rmsnorm_bwd(hx, hw, hrs, hdy, hdx, hdw, c.beta, 1.0f);
    b.check(qk ? "qk_norm_rope_bwd dx" : "rmsnorm_bwd dx", dx.rows_view(0, n), hdx, 1e-2);
    b.check(qk ? "qk_norm_rope_bwd dw" : "rmsnorm_bwd dw", dw, hdw, 1e-2);
    const double bytes = 2.0 * c.rows * c.cols * (c.beta != 0.0f ? 4 : 3);
    row_bytes(c.name, bytes, b.time_ms(call));
    const std::vector<double> ks = kernel_times_ms(b, call, 10);
    if (ks.size() == 3)
      std::printf("  dx %.3f ms, dw partials %.3f ms, column sum %.3f ms\n", ks[0], ks[1], ks[2]);
    // The training forward on the same rows.
    fwd_rows(n);
    Tensor hy = b.harena.alloc(DType::f32, n, c.cols);
    Tensor hrs_out = b.harena.alloc(DType::f32, qk ? n : 1, qk ? c.heads : n);
    if (qk)
      cpu.qk_norm_rope_fwd(hx, hw, hpos, hy, hrs_out, c.heads, c.hd, 1e6f, 1e-6f);
    else
      cpu.rmsnorm_fwd(hx, hw, hy, hrs_out, 1e-6f);
    b.check(qk ? "qk_norm_rope forward y" : "rmsnorm forward y", dx.rows_view(0, n), hy, 1e-2);
    b.check(qk ? "qk_norm_rope forward rstd" : "rmsnorm forward rstd",
            qk ? rstd.rows_view(0, n) : tensor_make(rstd.data, DType::f32, Device::cuda, 1, n), hrs_out, 1e-2);
    char name[112];
    std::snprintf(name, sizeof(name), "%s forward", qk ? "qk_norm_rope" : "rmsnorm");
    row_bytes(name, 4.0 * c.rows * c.cols, b.time_ms(fwd));
    b.harena.reset(hmark);
    b.arena.reset(mark);
  }
}

// Incremental decoding at the 27B shapes: one verify block of T = 16 tokens after a context of 4096 —
// The decode kernels against the memory bandwidth measured in the same run. Bytes are what must cross HBM
// once: attention_cached reads the cache (K and V of past + T rows), q and the gate and writes out;
// gdn_decode reads the state and writes the R saved states (R = T: every token of a verify block can be the
// one kept), plus its small per-token inputs and outputs. The split-KV partials are the kernel's own overhead
// and not counted. Each call runs on its own of N rotating input sets whose total passes 4× the L2, so every
// call reads from HBM as in a real step (where the layer's weights flush the cache between calls); the N
// calls go back to back on the stream (no graph: the launches are what a decode step pays), and the per-call
// time is the event span / N, the median of 10 spans. bw x = time / (bytes / copy bandwidth); the issue's
// goal is ≤ 2. Each configuration is first checked in full against CpuOps. [general] rows time the general
// warp-per-item kernels (the registry's decode=general: the path of shapes and devices the fast kernels do
// not take) in the same process. [graph] rows replay the default rows' calls from a CUDA graph
// (decode_graph_us): the GPU's time alone, without the host's launch cost.
struct DecodeRow {
  std::string name;
  double bytes = 0, us = 0;
};

// Median per-call µs of `sets` back-to-back calls of fn(set).
double decode_time_us(Bench& b, int sets, const std::function<void(int)>& fn) {
  return 1e3 * b.time_ms([&] {
           for (int i = 0; i < sets; ++i) fn(i);
         }) / sets;
}

// The same `sets` calls captured once into a CUDA graph and replayed: the per-call GPU time without the
// host's launch cost (what a decode step captured in a graph would pay), to tell the kernels' time from the
// launches'. A call that cannot be captured gives −1 (the row then says so) rather than ending the benchmark.
double decode_graph_us(Bench& b, int sets, const std::function<void(int)>& fn) {
  const cudaStream_t st = b.gpu.stream();
  cudaGraph_t graph = nullptr;
  DF_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  try {
    for (int i = 0; i < sets; ++i) fn(i);
  } catch (const std::exception& e) {
    std::printf("  (could not capture the decode calls into a CUDA graph: %s)\n", e.what());
    cudaStreamEndCapture(st, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1;
  }
  DF_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec = nullptr;
  DF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = 1e3 * b.time_ms([&] { DF_CUDA_CHECK(cudaGraphLaunch(exec, st)); }) / sets;
  DF_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DF_CUDA_CHECK(cudaGraphDestroy(graph));
  return us;
}

int decode_sets(double bytes_per_set, int l2_bytes) {
  return std::max(2, int(std::ceil(4.0 * l2_bytes / bytes_per_set)));
}

void decode_print(const DecodeRow& r, double copy_gbs) {
  const double gbs = r.bytes / (r.us * 1e-6) / 1e9, ideal_us = r.bytes / (copy_gbs * 1e9) * 1e6;
  const double ratio = r.us / ideal_us;
  std::printf("%-84s %7.2f MB %9.2f us %8.0f GB/s %6.1f %% of copy %6.2fx bw time  %s\n", r.name.c_str(),
              r.bytes / 1e6, r.us, gbs, 100.0 * gbs / copy_gbs, ratio, ratio <= 2.0 ? "PASS" : "FAIL (> 2x)");
}

// Decoding on the general kernels (the registry's decode=general) or on the device's own choice, from now on.
void decode_general_set(bool general) {
  KernelVariants v = kernel_variants();
  v.decode_general = general;
  kernel_variants_set(v);
}

// The kernels a call of attention_cached takes on this device (aligned rows), as a row's tag: {tr 4x2w
// 2st/64k 33ch} = the transposed kernel, 4 key slices of 2 warps, 2 stages of 64 keys a chunk, 33 chunks a kv
// head; {m16 6t 2w 1sl ...} = the m16-tile kernel, 6 row tiles of 2 warps, 1 key slice. So a row says which
// launch it timed.
std::string decode_plan_tag(int64_t T, int64_t past, int hq, int hkv, int hd) {
  if (kernel_variants().decode_general) return " {general}";
  const DecodeAttnChoice c =
      decode_attention_choose(device_caps(), kernel_variants(), T, past, hq, hkv, hd, true);
  if (c.kernel == DecodeAttnKernel::general) return " {general: no split plan fits}";
  const SplitPlan& p = c.plan;
  char tag[96];
  const int stage_keys = p.slices * p.wk;
  if (p.tr)
    std::snprintf(tag, sizeof tag, " {tr %dx%dw %dst/%dk %dch}", p.slices, p.halves, p.stages, stage_keys,
                  p.chunks);
  else
    std::snprintf(tag, sizeof tag, " {m16 %dt %dw %dsl %dst/%dk %dch x%dg}", p.wtiles, p.halves, p.slices,
                  p.stages, stage_keys, p.chunks, p.groups);
  return tag;
}

// attention_cached over past cached + T new tokens, hq / hkv heads of hd, gated or not.
void bench_decode_attention(Bench& b, const char* shape, int64_t T, int64_t past, int hq, int hkv, int hd,
                            bool gated, int l2_bytes, std::vector<DecodeRow>& rows) {
  size_t mark = b.arena.mark(), hmark = b.harena.mark();
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t qc = int64_t(hq) * hd, kc = int64_t(hkv) * hd;
  const double bytes = 2.0 * double(past + T) * kc * 2 + (gated ? 3.0 : 2.0) * double(T) * qc * 2;
  const int sets = decode_sets(bytes, l2_bytes);
  struct Set { Tensor q, k, v, g, o; };
  std::vector<Set> S;
  for (int i = 0; i < sets; ++i)
    S.push_back({b.rand(DType::bf16, T, qc, -2, 2), b.rand(DType::bf16, past + T, kc, -2, 2),
                 b.rand(DType::bf16, past + T, kc, -1, 1), b.rand(DType::bf16, T, qc, -4, 4),
                 b.arena.alloc(DType::bf16, T, qc)});
  auto call = [&](int i) {
    const Set& s = S[size_t(i)];
    b.gpu.attention_cached(s.q, s.k, s.v, s.o, past, hq, hkv, hd, scale, gated ? &s.g : nullptr);
  };
  Tensor ho = b.harena.alloc(DType::f32, T, qc), hg = b.to_host(S[0].g);
  b.cpu.attention_cached(b.to_host(S[0].q), b.to_host(S[0].k), b.to_host(S[0].v), ho, past, hq, hkv, hd,
                         scale, gated ? &hg : nullptr);
  char name[192];
  for (bool general : {false, true}) {
    decode_general_set(general);
    std::snprintf(name, sizeof name, "attention_cached %s T %lld past %lld%s%s", shape, (long long)T,
                  (long long)past, general ? " [general]" : "", decode_plan_tag(T, past, hq, hkv, hd).c_str());
    call(0);
    b.check(name, S[0].o, ho, 1e-2);
    rows.push_back({name, bytes, decode_time_us(b, sets, call)});
    if (!general) {  // the plan's launches once more, replayed from a graph
      std::snprintf(name, sizeof name, "attention_cached %s T %lld past %lld [graph]", shape, (long long)T,
                    (long long)past);
      const double us = decode_graph_us(b, sets, call);
      if (us > 0) rows.push_back({name, bytes, us});
    }
  }
  decode_general_set(false);
  b.arena.reset(mark);
  b.harena.reset(hmark);
}

// gdn_decode at the 27B shape (16 / 48 heads, 128 × 128 states) over T tokens, all T states saved.
void bench_decode_gdn(Bench& b, int64_t T, int l2_bytes, std::vector<DecodeRow>& rows) {
  size_t mark = b.arena.mark(), hmark = b.harena.mark();
  const GdnShape s{16, 48, 128, 128};
  const int64_t cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv, sdim = int64_t(s.nv) * s.dk * s.dv;
  const double bytes = double(sdim) * 4 * (1 + T) + double(T) * (cols + 2 * s.nv + s.nv * s.dv) * 2;
  const int sets = decode_sets(bytes, l2_bytes);
  Tensor A_log = b.rand(DType::f32, 1, s.nv, -2, 1), dt = b.rand(DType::f32, 1, s.nv, -1, 1);
  struct Set { Tensor qkv, a, bb, st, o, sts; };
  std::vector<Set> S;
  for (int i = 0; i < sets; ++i)
    S.push_back({b.rand(DType::bf16, T, cols, -1, 1), b.rand(DType::bf16, T, s.nv, -3, 3),
                 b.rand(DType::bf16, T, s.nv, -3, 3), b.rand(DType::f32, 1, sdim, -0.5f, 0.5f),
                 b.arena.alloc(DType::bf16, T, int64_t(s.nv) * s.dv), b.arena.alloc(DType::f32, T, sdim)});
  auto call = [&](int i) {
    const Set& x = S[size_t(i)];
    b.gpu.gdn_decode(x.qkv, x.a, x.bb, A_log, dt, x.o, x.st, x.sts, s);
  };
  Tensor ho = b.harena.alloc(DType::f32, T, int64_t(s.nv) * s.dv), hs = b.harena.alloc(DType::f32, T, sdim);
  b.cpu.gdn_decode(b.to_host(S[0].qkv), b.to_host(S[0].a), b.to_host(S[0].bb), b.to_host(A_log), b.to_host(dt),
                   ho, b.to_host(S[0].st), hs, s);
  char name[128];
  for (bool general : {false, true}) {
    decode_general_set(general);
    std::snprintf(name, sizeof name, "gdn_decode 27B 16/48 x 128 T %lld (%lld saved)%s", (long long)T,
                  (long long)T, general ? " [general]" : "");
    call(0);
    b.check((std::string(name) + " out").c_str(), S[0].o, ho, 1e-2);
    b.check((std::string(name) + " states").c_str(), S[0].sts, hs, 1e-4);
    rows.push_back({name, bytes, decode_time_us(b, sets, call)});
    if (!general) {
      std::snprintf(name, sizeof name, "gdn_decode 27B 16/48 x 128 T %lld (%lld saved) [graph]", (long long)T,
                    (long long)T);
      const double us = decode_graph_us(b, sets, call);
      if (us > 0) rows.push_back({name, bytes, us});
    }
  }
  decode_general_set(false);
  b.arena.reset(mark);
  b.harena.reset(hmark);
}

// only_T > 0: that step length alone (T 1 or 16), for a profiler to find its launches first.
void bench_decode(Bench& b, int64_t only_T) {
  cudaDeviceProp prop{};
  DF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  double copy_gbs = 0;
  {  // the copy ceiling now, on this card: a 1 GiB device-to-device copy, read + write bytes
    size_t mark = b.arena.mark();
    const int64_t n = int64_t(1) << 30;  // bytes: 2^14 rows of 2^15 bf16
    Tensor src = b.rand(DType::bf16, 1 << 14, 1 << 15, -1, 1), dst = b.arena.alloc(DType::bf16, 1 << 14, 1 << 15);
    const double ms = b.time_ms([&] {
      DF_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, size_t(n), cudaMemcpyDeviceToDevice, b.gpu.stream()));
    });
    copy_gbs = 2.0 * double(n) / (ms * 1e-3) / 1e9;
    b.arena.reset(mark);
  }
  std::printf("decode: copy bandwidth %.0f GB/s (1 GiB device copy, read + write); L2 %d MB. Each row: N "
              "back-to-back launches (no graph) over N rotating input sets (> 4x L2), per-call time = span / N, "
              "median of 10\n",
              copy_gbs, prop.l2CacheSize >> 20);
  std::vector<DecodeRow> rows;
  for (int64_t T : {16, 1}) {
    if (only_T > 0 && T != only_T) continue;
    bench_decode_attention(b, "27B 24/4 x 256 gated", T, 4096, 24, 4, 256, true, prop.l2CacheSize, rows);
    bench_decode_attention(b, "8B 32/8 x 128", T, 4096, 32, 8, 128, false, prop.l2CacheSize, rows);
    bench_decode_gdn(b, T, prop.l2CacheSize, rows);
  }
  for (const DecodeRow& r : rows) decode_print(r, copy_gbs);
}

// Gated DeltaNet prefill at the 27B shape (16 key / 48 value heads, dk = dv = 128) over the batch, checked on
// the first ns tokens against CpuOps, then timed.
void bench_gdn_prefill(Bench& b, const SeqLayout& seqs, const SeqLayout& hseqs, int64_t ns) {
  const int64_t T = seqs.tokens;
  size_t mark = b.arena.mark();
  GdnShape s{16, 48, 128, 128};
  const int64_t cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv;
  Tensor qkv = b.rand(DType::bf16, T, cols, -1, 1), a = b.rand(DType::bf16, T, s.nv, -3, 3);
  Tensor bb = b.rand(DType::bf16, T, s.nv, -3, 3), A_log = b.rand(DType::f32, 1, s.nv, -2, 1);
  Tensor dt = b.rand(DType::f32, 1, s.nv, -1, 1), o = b.arena.alloc(DType::bf16, T, int64_t(s.nv) * s.dv);
  Tensor ws = b.arena.alloc(DType::u8, 1, b.gpu.gdn_workspace_bytes(T, s));
  size_t hm = b.harena.mark();
  Tensor ho = b.harena.alloc(DType::f32, ns, int64_t(s.nv) * s.dv);
  b.cpu.gdn_prefill(b.to_host(qkv.rows_view(0, ns)), b.to_host(a.rows_view(0, ns)),
                    b.to_host(bb.rows_view(0, ns)), b.to_host(A_log), b.to_host(dt), ho, hseqs, s, Tensor{});
  // FLOPs of the chunked algorithm per (chunk of 64, value head): K Kᵀ, Q Kᵀ, A V' (2·C²·d each), the
  // triangular solve (C²·(dk+dv)), W S, Q S, Kᵀ V' (2·C·dk·dv each).
  const double C = 64, d = 128;
  double per_chunk = 3 * 2 * C * C * d + C * C * 2 * d + 3 * 2 * C * d * d;
  double flops = per_chunk * (T / C) * s.nv;
  // The state pass's form dispatch picks here and, where that is the two-stage one, the one-stage form that
  // devices with 99 KB a block run (the registry's gdn=one_stage), each checked before it is timed.
  const KernelVariants saved = kernel_variants();
  const bool two_stage = gdn_state_kernel_choose(device_caps(), saved, gdn_state_smem_bytes(128, false, 2)) ==
                         GdnStateKernel::two_stage;
  const std::vector<bool> one_stage_forms =
      two_stage ? std::vector<bool>{false, true} : std::vector<bool>{false};
  char label[96];
  for (const bool one : one_stage_forms) {
    kernel_variants_set(kernel_variants_with(saved, &KernelVariants::gdn_one_stage, one));
    const char* tag = one ? " [one stage]" : "";
    DF_CUDA_CHECK(cudaMemsetAsync(o.data, 0xff, size_t(o.rows * o.stride) * sizeof(bf16), b.gpu.stream()));
    b.gpu.gdn_prefill(qkv, a, bb, A_log, dt, o, seqs, s, ws);
    std::snprintf(label, sizeof label, "gdn_prefill 16/48 128%s", tag);
    b.check(label, o.rows_view(0, ns), ho, 2e-2);
    const double ms = b.time_ms([&] { b.gpu.gdn_prefill(qkv, a, bb, A_log, dt, o, seqs, s, ws); }, 5);
    std::snprintf(label, sizeof label, "gdn_prefill 16/48 dk=dv=128 (bf16 mma)%s", tag);
    row_flops(label, flops, ms);
    row_bytes("gdn_prefill (min bytes: qkv,a,b in, o out)", double(T) * (cols + 2 * s.nv + s.nv * s.dv) * 2,
              ms);
  }
  kernel_variants_set(saved);
  b.harena.reset(hm);

  // The whole mixer as the forward runs it (target_forward.cpp layer_linear): x, z, b and a are column views of
  // the fused projection [T, qkv 10240 | z 6144 | b 48 | a 48], out is the first 6144 columns of the conv
  // buffer; fused (the conv in the chunk kernel, the gated norm in the state kernel), then for comparison
  // conv1d_silu, gdn_prefill and gated_rmsnorm one after another.
  const int64_t vdim = int64_t(s.nv) * s.dv;
  Tensor proj = b.rand(DType::bf16, T, cols + vdim + 2 * s.nv, -2, 2);
  GdnWeights w{b.rand(DType::f32, cols, 4, -0.5f, 0.5f), A_log, dt, b.rand(DType::f32, 1, s.dv, 0.5f, 1.5f), 1e-6f};
  Tensor x = proj.cols_view(0, cols), z = proj.cols_view(cols, vdim);
  Tensor pb = proj.cols_view(cols + vdim, s.nv), pa = proj.cols_view(cols + vdim + s.nv, s.nv);
  Tensor conv = b.arena.alloc(DType::bf16, T, cols), y = conv.cols_view(0, vdim);
  size_t hm2 = b.harena.mark();
  Tensor hy = b.harena.alloc(DType::f32, ns, vdim), hc = b.harena.alloc(DType::f32, ns, cols);
  Tensor hmid = b.harena.alloc(DType::f32, ns, vdim);
  GdnWeights hw{b.to_host(w.conv_w), b.to_host(A_log), b.to_host(dt), b.to_host(w.norm_w), w.eps};
  b.cpu.gdn_mixer(b.to_host(x.rows_view(0, ns)), b.to_host(z.rows_view(0, ns)),
                  b.to_host(pa.rows_view(0, ns)), b.to_host(pb.rows_view(0, ns)), hw, hy, hseqs, s, Tensor{},
                  hc, hmid);
  auto fused = [&] { b.gpu.gdn_mixer(x, z, pa, pb, w, y, seqs, s, ws, conv, o); };
  auto three = [&] {
    b.gpu.conv1d_silu(x, w.conv_w, conv, seqs);
    b.gpu.gdn_prefill(conv, pa, pb, A_log, dt, o, seqs, s, ws);
    b.gpu.gated_rmsnorm(o, z, w.norm_w, y, s.nv, s.dv, w.eps);
  };
  for (const bool one : one_stage_forms) {
    kernel_variants_set(kernel_variants_with(saved, &KernelVariants::gdn_one_stage, one));
    for (const auto& [form, name] :
         {std::pair<std::function<void()>, const char*>{fused, "conv + norm fused"}, {three, "3 kernels"}}) {
      DF_CUDA_CHECK(
          cudaMemsetAsync(conv.data, 0xff, size_t(conv.rows * conv.stride) * sizeof(bf16), b.gpu.stream()));
      form();
      std::snprintf(label, sizeof label, "gdn_mixer 16/48 128, %s%s", name, one ? " [one stage]" : "");
      b.check(label, y.rows_view(0, ns), hy, 5e-2);
      const double ms = b.time_ms(form, 5);
      row_flops(label, flops, ms);
      row_bytes("gdn_mixer (min bytes: x,z,a,b in, out out)", double(T) * (cols + 2 * vdim + 2 * s.nv) * 2,
                ms);
    }
  }
  kernel_variants_set(saved);
  b.harena.reset(hm2);
  b.arena.reset(mark);
}

}  // namespace

// Causal attention over the batch (hq / hkv heads of hd, optionally gated as Qwen3.5's full layers are),
// checked on the first ns tokens against CpuOps, then timed (causal FLOPs: 4·hd·hq per visible pair).
// fused: q, gate, k and v are column views of one [T, q | gate | k | v] projection, as in the forward
// (target_forward.cpp, layer_full); otherwise each is its own contiguous tensor. hot: each timed run comes
// straight after 8192³ GEMMs (about 5 ms of them, untimed, with no sync in between), so the attention runs
// at the clock the GPU holds inside a forward rather than the one it reaches after idling.
void bench_attention(Bench& b, const SeqLayout& seqs, const SeqLayout& hseqs, int64_t ns, int hq, int hkv,
                     int hd, bool gated, bool fused = false, bool hot = false) {
  const int64_t T = seqs.tokens, q_cols = int64_t(hq) * hd, kv_cols = int64_t(hkv) * hd;
  size_t mark = b.arena.mark();
  Tensor q, g, k, v;
  if (fused) {
    const int64_t k0 = q_cols * (gated ? 2 : 1);
    Tensor proj = b.rand(DType::bf16, T, k0 + 2 * kv_cols, -2, 2);
    q = proj.cols_view(0, q_cols), k = proj.cols_view(k0, kv_cols), v = proj.cols_view(k0 + kv_cols, kv_cols);
    if (gated) g = proj.cols_view(q_cols, q_cols);
  } else {
    q = b.rand(DType::bf16, T, q_cols, -2, 2), k = b.rand(DType::bf16, T, kv_cols, -2, 2);
    v = b.rand(DType::bf16, T, kv_cols, -1, 1);
    if (gated) g = b.rand(DType::bf16, T, q_cols, -3, 3);
  }
  Tensor o = b.arena.alloc(DType::bf16, T, q_cols);
  const float scale = 1.0f / std::sqrt(float(hd));
  auto run = [&] { b.gpu.attention_causal(q, k, v, o, seqs, hq, hkv, hd, scale, gated ? &g : nullptr); };
  char label[64], name[96];
  const char* how = fused ? (hot ? ", fused, hot" : ", fused") : (hot ? ", hot" : "");
  std::snprintf(label, sizeof label, "%d/%d hd%d%s%s", hq, hkv, hd, gated ? " gated" : "", how);
  double flops = 0;
  for (int i = 0; i < seqs.num_seqs; ++i) {
    const double len = seqs.cu_host[i + 1] - seqs.cu_host[i];
    flops += 4.0 * hd * hq * (len * (len + 1) / 2);
  }
  Tensor x, w, c;  // hot: the GEMMs before each timed run
  if (hot) {
    const int64_t n = 8192;
    x = b.rand(DType::bf16, n, n, -1, 1), w = b.rand(DType::bf16, n, n, -1, 1);
    c = b.arena.alloc(DType::bf16, n, n);
  }
  // The default dispatch (ours or cuDNN's fused attention, whichever measured faster at the first call of the
  // shape class, as logged); where cuDNN is available, ours and cuDNN's each forced through the registry;
  // where ours is the wgmma kernel, the portable kernel forced (the one every other GPU runs); and where the
  // portable kernel takes 64-key tiles at this head dim, its 32-key form (what the 99 KB GPUs run at hd 256;
  // the callers' head dims are powers of two, their own padding). Each is checked before it is timed.
  struct Form {
    const char* tag;
    KernelVariants v;
  };
  const KernelVariants saved = kernel_variants();
  std::vector<Form> forms = {{"", saved}};
  std::string why;
  const bool forced = saved.attention_native || saved.attention_cudnn || saved.attention_portable ||
                      saved.attention_portable_k32;
  if (!forced && attention_cudnn_available(&why)) {
    forms.push_back({" [ours]", kernel_variants_with(saved, &KernelVariants::attention_native, true)});
    forms.push_back({" [cudnn]", kernel_variants_with(saved, &KernelVariants::attention_cudnn, true)});
  } else if (!forced) {
    std::printf("  (no cudnn row: %s)\n", why.c_str());
  }
  if (device_caps().wgmma && !saved.attention_portable && !saved.attention_portable_k32)
    forms.push_back({" [portable]", kernel_variants_with(saved, &KernelVariants::attention_portable, true)});
  if (attention_portable_keys_choose(device_caps(), saved, hd) == 64)
    forms.push_back(
        {" [portable k32]", kernel_variants_with(saved, &KernelVariants::attention_portable_k32, true)});
  for (const Form& form : forms) {
    kernel_variants_set(form.v);
    const char* tag = form.tag;
    DF_CUDA_CHECK(
        cudaMemsetAsync(o.data, 0xff, size_t(o.rows * o.stride) * dtype_size(o.dtype), b.gpu.stream()));
    run();
    size_t hm = b.harena.mark();
    Tensor ho = b.harena.alloc(DType::f32, ns, q_cols);
    Tensor hg = gated ? b.to_host(g.rows_view(0, ns)) : Tensor{};
    b.cpu.attention_causal(b.to_host(q.rows_view(0, ns)), b.to_host(k.rows_view(0, ns)),
                           b.to_host(v.rows_view(0, ns)), ho, hseqs, hq, hkv, hd, scale,
                           gated ? &hg : nullptr);
    std::snprintf(name, sizeof name, "attention %s%s", label, tag);
    b.check(name, o.rows_view(0, ns), ho, 2e-2);
    b.harena.reset(hm);
    double ms = 0;
    if (hot)
      ms = b.time_ms(run, 6, [&] {
        for (int i = 0; i < 4; ++i) b.gpu.gemm(x, w, c, 0.0f);
      });
    else
      ms = b.time_ms(run, 5);
    std::snprintf(name, sizeof name, "attention causal %s%s", label, tag);
    row_flops(name, flops, ms);
  }
  kernel_variants_set(saved);
  b.arena.reset(mark);
}

int main(int argc, char** argv) {
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
    if (argc > 1 && std::string(argv[1]) == "attention") {  // causal attention at the 27B and the 8B shapes
      for (bool fused : {false, true})
        for (bool hot : {false, true}) {
          bench_attention(b, seqs, hseqs, ns, 24, 4, 256, true, fused, hot);
          bench_attention(b, seqs, hseqs, ns, 32, 8, 128, false, fused, hot);
        }
      std::printf("bench_kernels attention: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }
    if (argc > 1 && std::string(argv[1]) == "gdn") {  // the Gated DeltaNet prefill alone
      bench_gdn_prefill(b, seqs, hseqs, ns);
      std::printf("bench_kernels gdn: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }
    if (argc > 1 && std::string(argv[1]) == "dflash") {  // DFlash attention at the step's and 8x its shape
      // `dflash S`: S sequences only; `dflash S HD`: at head dim HD.
      const std::vector<int> seq_counts =
          argc > 2 ? std::vector<int>{std::max(1, std::atoi(argv[2]))} : std::vector<int>{1, 8};
      const int hd = argc > 3 ? std::atoi(argv[3]) : 128;
      if (hd < 1 || hd > 256) {
        std::fprintf(stderr,
                     "bench_kernels dflash: head dim %s is not in 1..256; HINT: bench_kernels dflash S HD\n",
                     argv[3]);
        return 2;
      }
      for (int S : seq_counts) {
        bench_dflash_attention(b, 2048, S, hd);
        bench_dflash_attention(b, 0, S, hd);
      }
      std::printf("bench_kernels dflash: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }
    if (argc > 1 && std::string(argv[1]) == "norms") {  // the drafter's norm backwards, default and old
      bench_train_norms(b);
      std::printf("bench_kernels norms: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }
    if (argc > 1 && std::string(argv[1]) == "lm") {  // the lm_head loss alone; `lm H V`: another shape
      bench_lm_head_loss(b, argc > 2 ? std::atoll(argv[2]) : H, argc > 3 ? std::atoll(argv[3]) : 248320);
      std::printf("bench_kernels lm: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }
    if (argc > 1 && std::string(argv[1]) == "decode") {  // the decode kernels alone; `decode 1`: at T 1 only
      bench_decode(b, argc > 2 ? std::atoll(argv[2]) : 0);
      std::printf("bench_kernels decode: %s\n",
                  b.failures ? "a correctness check FAILED" : "all correctness checks passed");
      return b.failures ? 1 : 0;
    }

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

    // ---- attention (full layers): 24 q heads, 4 kv heads, hd 256, gated ---------------------------------
    bench_attention(b, seqs, hseqs, ns, 24, 4, 256, true);

    // ---- DFlash drafter attention (27B drafter): sliding (W 2048) and full layers ------------------------
    bench_dflash_attention(b, 2048, 8);
    bench_dflash_attention(b, 0, 8);

    bench_gdn_prefill(b, seqs, hseqs, ns);

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
      // The same on a contiguous [T, 10240] input: the gap between the two lines is what the row pitch costs.
      Tensor cxc = b.rand(DType::bf16, T, C, -2, 2);
      for (auto [x, what] : {std::pair{cx, "conv1d_silu 10240 K=4 (x in [T,16480])"},
                             std::pair{cxc, "conv1d_silu 10240 K=4 (x contiguous)"}}) {
        b.gpu.conv1d_silu(x, cw, cy, seqs);
        size_t hm = b.harena.mark();
        Tensor hy = b.harena.alloc(DType::f32, ns, C);
        b.cpu.conv1d_silu(b.to_host(x.rows_view(0, ns)), b.to_host(cw), hy, hseqs);
        b.check(what, cy.rows_view(0, ns), hy, 1e-2);
        b.harena.reset(hm);
        row_bytes(what, 2.0 * T * C * 2, b.time_ms([&] { b.gpu.conv1d_silu(x, cw, cy, seqs); }));
      }

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
    bench_lm_head_loss(b, H);
    bench_decode(b, 0);
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
