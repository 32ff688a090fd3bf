// `eval --device cuda` on a Qwen3.6-27B-shaped target, as bandwidth: a speculative-decoding verify step (16
// tokens after a 4096-token prompt) of the full 64-layer target with random bf16 weights on one GPU, run by
// TargetDecoder exactly as eval runs it (step, the 16 logits rows read back for the argmax, commit), set
// against the bytes the step must move and the copy bandwidth measured in the same run. Checked first: the
// verify step's logits against one step over all 4112 tokens from empty caches on the general decode kernels
// (the registry's decode=general), anchored to how far two correct paths differ (the check below), so a wrong
// split-KV or DeltaNet slice kernel, cache offset or state hand-over fails the run. [general] rows then time
// the same step on those kernels. Plain main(): the GPU machine has no Google Benchmark. Arguments: none.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "benchmarks/cuda_timing.h"
#include "benchmarks/target_configs.h"
#include "core/clock.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/cuda_check.cuh"
#include "model/drafter.h"
#include "model/target.h"
#include "model/target_decode.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

constexpr int64_t kPrompt = 4096, kBlock = 16, kSteps = 20;
constexpr uint64_t kSeed = 1234;
// The check's anchor, measured in the same run: what two correct computations of the same logits differ by.
// The verify step (the prompt, then the 16-token block) on the general decode kernels and one step over all 4112
// tokens from empty caches differ only in where bf16 rounds (GEMMs of 16 vs 4112 rows, the DeltaNet chunk
// boundaries), compounded over 64 random layers: that difference is measured here, not guessed (it was 9.6e-2
// rel RMS on the H200, far above the 1e-3..1e-2 such paths differ by on the small test models). The fast kernels'
// verify step may differ from the general kernels' verify step by at most 1.25x that: both are fp32 inside and
// differ by accumulation order alone, a bf16 ulp here and there that the 64 layers amplify as they amplify the
// re-split's ulps (1.25: the margin of the golden tests, where two such draws land a few tens of percent apart).
// A wrong split-KV or DeltaNet slice kernel, cache offset or state hand-over gives O(1).
constexpr double kAnchorFactor = 1.25;
double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The copy ceiling on this card now: a 1 GiB device-to-device copy, read + write bytes per second.
double copy_bandwidth(CudaOps& gpu) {
  const size_t n = size_t(1) << 30;
  void* a = gpu.alloc_bytes(2 * n);
  char* src = static_cast<char*>(a);
  DF_CUDA_CHECK(cudaMemsetAsync(src, 1, 2 * n, gpu.stream()));
  const double ms = cuda_median_ms(
      gpu.stream(),
      [&] { DF_CUDA_CHECK(cudaMemcpyAsync(src + n, src, n, cudaMemcpyDeviceToDevice, gpu.stream())); }, 10);
  gpu.free_bytes(a);
  return 2.0 * double(n) / (ms * 1e-3);
}

// Bytes one verify step of T tokens after `past` must move at least once: every projection and the lm_head
// (the embedding is a gather of T rows; norms and gates are KB), K and V of the attention layers' caches, and
// per DeltaNet layer its state read, T saved states written and, at commit, one state copied (read + write).
double step_bytes(const TargetModel& m, int64_t past, int64_t T) {
  const QwenConfig& c = m.cfg;
  double b = double(m.lm_head.nbytes());
  for (const TargetLayer& L : m.layers)
    for (const Tensor* w : L.projections()) b += double(w->nbytes());
  b += c.num_full_layers() * 2.0 * double(past + T) * c.kv_heads * c.head_dim * 2;
  const double state = double(c.lin_nv) * c.lin_dk * c.lin_dv * 4;
  b += c.num_linear_layers() * state * (1 + T + 2);
  return b;
}

// Median and minimum seconds of kSteps verify steps (step + synchronize), and of the logits read-back, with
// the decode kernels the registry selects now. Each step commits its first token, as a step whose drafts all
// missed.
struct StepTimes {
  double step_med = 0, step_min = 0, readback_med = 0;
};

StepTimes time_steps(TargetDecoder& dec, Ops& gpu, const std::vector<int32_t>& block) {
  std::vector<double> step, readback;
  for (int64_t i = 0; i < kSteps + 2; ++i) {  // the first two untimed: module loads, GEMM heuristics
    auto t0 = std::chrono::steady_clock::now();
    dec.step(block);
    gpu.synchronize();
    const double s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    dec.argmax_rows();
    const double r = seconds_since(t0);
    dec.commit(1);
    if (i >= 2) step.push_back(s), readback.push_back(r);
  }
  std::sort(step.begin(), step.end());
  std::sort(readback.begin(), readback.end());
  return {step[step.size() / 2], step.front(), readback[readback.size() / 2]};
}

}  // namespace

int main() {
  if (cuda_device_count() == 0) {
    std::printf("bench_target_decode: no CUDA device visible; nothing measured\n");
    return 0;
  }
  try {
    const QwenConfig cfg = config_qwen36_27b();
    std::printf("=== verify step, Qwen3.6-27B shapes (bf16, random weights): %s ===\n",
                qwen_config_summary(cfg).c_str());
    CudaOps gpu(0);
    const double copy_bps = copy_bandwidth(gpu);
    TargetLoadOptions load;
    load.need_lm_head = true;
    std::unique_ptr<TargetModel> model = target_random(cfg, kSeed, gpu, load);
    const int64_t max_len = kPrompt + (kSteps + 2) + kBlock;  // each timed step commits one token
    TargetDecoder dec(*model, {max_len, max_len, kBlock}, drafter_default_target_layer_ids(cfg.layers, 5));
    std::vector<int32_t> prompt(static_cast<size_t>(kPrompt)), block(static_cast<size_t>(kBlock));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 2654435761ull) % uint64_t(cfg.vocab));
    for (size_t i = 0; i < block.size(); ++i) block[i] = int32_t((i * 40503ull + 7) % uint64_t(cfg.vocab));

    // The registry's variants with decoding on the device's own kernels and on the general ones.
    KernelVariants fast_kernels = kernel_variants(), general_kernels = fast_kernels;
    fast_kernels.decode_general = false;
    general_kernels.decode_general = true;
    // The check: the block verified after the prompt on the fast kernels, the same on the general kernels, and
    // prompt + block in one step from empty caches on the general kernels (the anchor above).
    auto verify_logits = [&](bool general) {
      kernel_variants_set(general ? general_kernels : fast_kernels);
      dec.reset();
      dec.step(prompt);
      dec.commit(kPrompt);
      dec.step(block);
      return dec.logits_host();
    };
    const std::vector<float> fast = verify_logits(false), general = verify_logits(true);
    dec.reset();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), block.begin(), block.end());
    dec.step(all);
    const std::vector<float> one_step = dec.logits_host();
    kernel_variants_set(fast_kernels);
    const double err = rel_rms(fast, general), anchor = rel_rms(general, one_step);
    const bool ok = err <= kAnchorFactor * anchor;
    std::printf("check: verify-step logits, fast vs general decode kernels: rel-RMS %.3e; bound: general verify "
                "step vs one general step over the same %lld tokens %.3e, times %.2f (fast vs that: %.3e) %s\n",
                err, (long long)all.size(), anchor, kAnchorFactor, rel_rms(fast, one_step), ok ? "ok" : "FAILED");
    if (!ok) {
      std::printf("bench_target_decode: result check FAILED, no speed reported\n");
      return 1;
    }

    std::printf("copy bandwidth %.0f GB/s (1 GiB device copy, read + write). Step = TargetDecoder::step of %lld "
                "tokens + stream sync, host wall clock, median of %lld; read-back = the %lld logits rows to the "
                "host for the argmax\n",
                copy_bps / 1e9, (long long)kBlock, (long long)kSteps, (long long)kBlock);
    for (bool general : {false, true}) {
      kernel_variants_set(general ? general_kernels : fast_kernels);
      dec.reset();
      dec.step(prompt);
      dec.commit(kPrompt);
      const int64_t past_mid = kPrompt + kSteps / 2;
      const StepTimes t = time_steps(dec, gpu, block);
      const double bytes = step_bytes(*model, past_mid, kBlock), ideal = bytes / copy_bps;
      std::printf("%-28s %8.2f GB %8.2f ms (min %.2f) %6.0f GB/s %5.1f %% of copy %5.2fx bw time  "
                  "+ read-back %.2f ms\n",
                  general ? "verify step [general]" : "verify step", bytes / 1e9, t.step_med * 1e3,
                  t.step_min * 1e3, bytes / t.step_med / 1e9, 100.0 * ideal / t.step_med, t.step_med / ideal,
                  t.readback_med * 1e3);
    }
    kernel_variants_set(fast_kernels);
    size_t free_b = 0, total_b = 0;
    DF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    std::printf("memory: model %.1f GB; device used %.1f of %.1f GB\n", model->block_bytes / 1e9,
                (total_b - free_b) / 1e9, total_b / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_target_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
