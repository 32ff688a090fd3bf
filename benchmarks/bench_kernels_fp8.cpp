// The FP8 target's input quantisers at the Qwen3.6-27B shapes for one 32,768-token batch: fp8_quantize_rows
// on [T, 5120] and [T, 17408] rows, rmsnorm_fp8 and swiglu_fp8, with bytes moved and % of the HBM ceiling,
// each checked first against the CPU oracle or the unfused path (a failed check exits 1). Plain main() like
// bench_kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "benchmarks/kernel_bench.h"
#include "core/fp8.h"
#include "kernels/primitives/cuda_check.cuh"

using namespace df;

namespace {

// fp8_quantize_rows at the 27B's GEMM input widths (hidden 5120 and down_proj's 17408): bf16 in, e4m3 codes
// and one f32 scale per row out, T·K·3 + 4T bytes. Then the fused producers of those inputs: rmsnorm_fp8 on
// [T, 5120] (x in, norm out, codes out: T·K·5 + 4T) and swiglu_fp8 on the [T, 2·17408] gate|up (codes out:
// T·I·5
// + 4T); the unfused pairs are bench_kernels' rmsnorm and swiglu rows plus the quantiser rows here. Checked
// first on 64 rows: code · scale is CpuOps::fp8_round_rows of the same rows bit for bit, and each fused op's
// codes and scales are those of its op then fp8_quantize_rows.
void bench_fp8_quantize(Bench& b, int64_t T) {
  const int64_t n = 64;
  auto codes_of = [&](const Tensor& q, const Tensor& s, std::vector<uint8_t>& qh, std::vector<float>& sh) {
    qh.resize(size_t(n * q.cols));
    sh.resize(size_t(n));
    b.gpu.download_raw(Tensor{q.data, DType::u8, Device::cuda, n, q.cols, q.cols}, qh.data());
    b.gpu.download_f32(s.cols_view(0, n), sh.data());
  };
  auto report = [&](const char* name, int64_t bad, const char* against) {
    std::printf("check %-34s %lld of %lld rows differ from %s %s\n", name, (long long)bad, (long long)n,
                against, bad ? "FAILED" : "ok");
    if (bad) ++b.failures;
  };
  // Rows of two quantisations (contiguous [T, K] codes) whose codes or scale differ.
  auto rows_differing = [&](const Tensor& q1, const Tensor& s1, const Tensor& q2, const Tensor& s2) {
    std::vector<uint8_t> c1, c2;
    std::vector<float> h1, h2;
    codes_of(q1, s1, c1, h1);
    codes_of(q2, s2, c2, h2);
    const int64_t K = q1.cols;
    int64_t bad = 0;
    for (int64_t r = 0; r < n; ++r)
      bad += h1[size_t(r)] != h2[size_t(r)] ||
             !std::equal(c1.begin() + r * K, c1.begin() + (r + 1) * K, c2.begin() + r * K);
    return bad;
  };
  for (int64_t K : {int64_t(5120), int64_t(17408)}) {
    size_t mark = b.arena.mark(), hmark = b.harena.mark();
    Tensor x = b.rand(DType::bf16, T, K, -3, 3), s = b.arena.alloc(DType::f32, 1, T);
    Tensor q = b.arena.alloc(DType::f8_e4m3, T, K), q2 = b.arena.alloc(DType::f8_e4m3, T, K);
    Tensor s2 = b.arena.alloc(DType::f32, 1, T);
    b.gpu.fp8_quantize_rows(x, q, s, false);
    std::vector<uint8_t> qh;
    std::vector<float> sh;
    codes_of(q, s, qh, sh);
    Tensor want = b.to_host(x.rows_view(0, n));
    b.cpu.fp8_round_rows(want);
    int64_t bad = 0;
    for (int64_t r = 0; r < n; ++r) {
      bool same = true;
      for (int64_t c = 0; c < K; ++c)
        same &= e4m3_to_f32(qh[size_t(r * K + c)]) * sh[size_t(r)] == want.ptr<float>()[r * want.stride + c];
      bad += !same;
    }
    char name[64];
    std::snprintf(name, sizeof(name), "fp8_quantize_rows [T,%lld]", (long long)K);
    report(name, bad, "CpuOps::fp8_round_rows");
    row_bytes(name, 3.0 * T * K + 4.0 * T, b.time_ms([&] { b.gpu.fp8_quantize_rows(x, q, s, false); }));
    if (K == 5120) {
      Tensor w = b.rand(DType::f32, 1, K, -0.2f, 0.2f), y = b.arena.alloc(DType::bf16, T, K);
      b.gpu.rmsnorm(x, w, y, 1e-6f, NormKind::zero_centred);
      b.gpu.fp8_quantize_rows(y, q, s, false);
      b.gpu.rmsnorm_fp8(x, w, y, 1e-6f, NormKind::zero_centred, q2, s2, false);
      report("rmsnorm_fp8 5120", rows_differing(q, s, q2, s2), "rmsnorm + fp8_quantize_rows");
      row_bytes("rmsnorm_fp8 [T,5120] zero-centred", 5.0 * T * K + 4.0 * T,
                b.time_ms([&] { b.gpu.rmsnorm_fp8(x, w, y, 1e-6f, NormKind::zero_centred, q2, s2, false); }));
    } else {
      Tensor gu = b.rand(DType::bf16, T, 2 * K, -3, 3);
      const Tensor g = gu.cols_view(0, K), u = gu.cols_view(K, K);
      b.gpu.swiglu(g, u, x);
      b.gpu.fp8_quantize_rows(x, q, s, false);
      b.gpu.swiglu_fp8(g, u, q2, s2);
      report("swiglu_fp8 17408", rows_differing(q, s, q2, s2), "swiglu + fp8_quantize_rows");
      row_bytes("swiglu_fp8 17408 (gate|up in, codes out)", 5.0 * T * K + 4.0 * T,
                b.time_ms([&] { b.gpu.swiglu_fp8(g, u, q2, s2); }));
    }
    b.arena.reset(mark);
    b.harena.reset(hmark);
  }
}

}  // namespace

int main() {
  try {
    if (cuda_device_count() == 0) {
      std::printf("bench_kernels_fp8: no CUDA device visible; nothing measured\n");
      return 0;
    }
    const int64_t T = 8 * 4096;
    Bench b(size_t(8) << 30);
    cudaDeviceProp prop{};
    DF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs; T = %lld tokens\n", prop.name, prop.multiProcessorCount, (long long)T);
    bench_fp8_quantize(b, T);
    std::printf("bench_kernels_fp8: %s\n",
                b.failures ? "a correctness check FAILED" : "all correctness checks passed");
    return b.failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels_fp8: %s\n", e.what());
    return 1;
  }
}
