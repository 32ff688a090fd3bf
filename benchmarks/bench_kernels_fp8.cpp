// The FP8 target's input quantisers at the Qwen3.6-27B shapes for one 32,768-token batch: fp8_quantize_rows
// on [T, 5120] and [T, 17408] rows and swiglu_fp8 on the [T, 2·17408] gate|up, with bytes moved and % of the
// HBM ceiling, each checked first against the CPU oracle or the unfused path (a failed check exits 1). Plain
// main() like bench_kernels, whose swiglu row plus the [T,17408] one here are the unfused down_proj input.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "benchmarks/kernel_bench.h"
#include "core/fp8.h"
#include "kernels/cuda_check.cuh"

using namespace df;

namespace {

// fp8_quantize_rows at the 27B's GEMM input widths (hidden 5120 and down_proj's 17408): bf16 in, e4m3 codes
// and one f32 scale per row out, T·K·3 + 4T bytes; then swiglu_fp8, down_proj's codes straight from gate|up,
// T·I·5 + 4T bytes. Checked first on 64 rows: code · scale is CpuOps::fp8_round_rows of the same rows bit for
// bit, and swiglu_fp8's codes and scales are those of swiglu then fp8_quantize_rows.
void bench_fp8_quantize(Bench& b, int64_t T) {
  const int64_t n = 64;
  auto codes_of = [&](const Tensor& q, const Tensor& s, std::vector<uint8_t>& qh, std::vector<float>& sh) {
    qh.resize(size_t(n * q.cols));
    sh.resize(size_t(n));
    b.gpu.download_raw(Tensor{q.data, DType::u8, Device::cuda, n, q.cols, q.cols}, qh.data());
    b.gpu.download_f32(s.cols_view(0, n), sh.data());
  };
  auto report = [&](const char* name, int64_t bad, const char* against) {
    std::printf("check %-34s %lld of %lld differ from %s %s\n", name, (long long)bad, (long long)n, against,
                bad ? "FAILED" : "ok");
    if (bad) ++b.failures;
  };
  std::vector<uint8_t> qh, qh2;
  std::vector<float> sh, sh2;
  for (int64_t K : {int64_t(5120), int64_t(17408)}) {
    size_t mark = b.arena.mark(), hmark = b.harena.mark();
    Tensor x = b.rand(DType::bf16, T, K, -3, 3), s = b.arena.alloc(DType::f32, 1, T);
    Tensor q = b.arena.alloc(DType::f8_e4m3, T, K);
    b.gpu.fp8_quantize_rows(x, q, s, false);
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
    report(name, bad, "CpuOps::fp8_round_rows (rows)");
    row_bytes(name, 3.0 * T * K + 4.0 * T, b.time_ms([&] { b.gpu.fp8_quantize_rows(x, q, s, false); }));
    if (K == 17408) {
      Tensor gu = b.rand(DType::bf16, T, 2 * K, -3, 3), q2 = b.arena.alloc(DType::f8_e4m3, T, K);
      Tensor s2 = b.arena.alloc(DType::f32, 1, T);
      const Tensor g = gu.cols_view(0, K), u = gu.cols_view(K, K);
      b.gpu.swiglu(g, u, x);
      b.gpu.fp8_quantize_rows(x, q, s, false);
      b.gpu.swiglu_fp8(g, u, q2, s2);
      codes_of(q, s, qh, sh);
      codes_of(q2, s2, qh2, sh2);
      bad = 0;
      for (int64_t r = 0; r < n; ++r)
        bad += sh[size_t(r)] != sh2[size_t(r)] ||
               !std::equal(qh.begin() + r * K, qh.begin() + (r + 1) * K, qh2.begin() + r * K);
      report("swiglu_fp8 17408", bad, "swiglu + fp8_quantize_rows (rows)");
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
