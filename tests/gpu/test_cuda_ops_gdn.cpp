// The DeltaNet side of the CUDA ops against the CPU fp32 oracle: the depthwise causal conv (kernel sizes,
// awkward widths and offsets, sequence starts), the gated RMSNorm, the Gated DeltaNet prefill (chunked and
// recurrent paths, chunk and sequence seams, workspace refusal, the state pass's one-stage form) and decode,
// and the fused mixer (conv, prefill and norm). Split from test_cuda_ops.cpp, whose fixture
// (tests/gpu/cuda_ops_test_util.h) it shares. Skips itself without a GPU or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaOpsGdnTest, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without CUDA: GPU op tests skipped"; }
#else
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "kernels/dispatch/dispatch.h"
#include "tests/gpu/cuda_ops_test_util.h"

TEST_F(CudaOpsTest, Conv1dSiluResetsAtSequenceStarts) {
  for (const auto& lens : kBatches)
    for (int64_t C : {5, 96, 264}) {  // 264: a second 256-channel warp span with one live lane
      Layouts L = layouts(lens);
      int64_t T = L.cpu.tokens;
      Pair x = rand(T, C, -2, 2, DType::bf16, 8), w = rand(C, 4, -1, 1, DType::f32), y = out(T, C);
      cpu_.conv1d_silu(x.cpu, w.cpu, y.cpu, L.cpu);
      gpu_->conv1d_silu(x.gpu, w.gpu, y.gpu, L.gpu);
      check(y, 1e-5, kBf16Ulp + 1e-5, name_of("conv1d_silu T C", {T, C}));  // fp32 inside, one rounding
    }
}

TEST_F(CudaOpsTest, GatedRmsnorm) {
  for (int64_t T : {1, 7, 65, 300})
    // dv 8/32/128: the register kernel (heads 1 and 3 walk rows across tokens); dv 36: the 4-wide
    // warp-per-row kernel; dv 19: its scalar form; dv 300: past the 128 values the register kernel holds.
    for (auto [heads, dv] : {std::pair{1, 8}, {3, 32}, {4, 128}, {5, 128}, {2, 36}, {2, 19}, {2, 300}}) {
      Pair o = rand(T, int64_t(heads) * dv, -2, 2), z = rand(T, int64_t(heads) * dv, -3, 3, DType::bf16, 16);
      Pair w = rand(1, dv, 0.5f, 1.5f, DType::f32), y = out(T, int64_t(heads) * dv);
      cpu_.gated_rmsnorm(o.cpu, z.cpu, w.cpu, y.cpu, heads, dv, 1e-6f);
      gpu_->gated_rmsnorm(o.gpu, z.gpu, w.gpu, y.gpu, heads, dv, 1e-6f);
      // w·x̂·silu(z) in fp32, one rounding (HF rounds x̂ and w·x̂ first); 1e-4 for r's fp32 sum order.
      check(y, 1e-5, kBf16Ulp + 1e-4, name_of("gated_rmsnorm T heads dv", {T, heads, dv}));
    }
}

// The chunk kernel (a CTA per key head) against the CPU, and run to run the same bits. nv / nk 2, 3, 3 and 1
// (the last at tile width 64).
TEST_F(CudaOpsTest, GdnPrefillChunkedMatchesCpuAcrossChunkAndSequenceSeams) {
  for (const auto& lens : kBatches)
    for (GdnShape s :
         {GdnShape{2, 4, 32, 32}, GdnShape{1, 3, 16, 40}, GdnShape{2, 6, 128, 128}, GdnShape{3, 3, 64, 48}}) {
      Layouts L = layouts(lens);
      int64_t T = L.cpu.tokens;
      int64_t cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv;
      Pair qkv = rand(T, cols, -1, 1, DType::bf16, 8);
      Pair a = rand(T, s.nv, -3, 3), b = rand(T, s.nv, -3, 3);
      Pair A_log = rand(1, s.nv, -2, 1, DType::f32), dt = rand(1, s.nv, -1, 1, DType::f32);
      Pair o = out(T, int64_t(s.nv) * s.dv), ov = out(T, int64_t(s.nv) * s.dv);
      // Filled with NaN bytes: the kernels must write every workspace byte they later read.
      Tensor ws = gpu_arena_.alloc(DType::u8, 1, gpu_->gdn_workspace_bytes(T, s));
      poison(ws.data, ws.nbytes());
      EXPECT_EQ(cpu_.gdn_workspace_bytes(T, s), 0);
      cpu_.gdn_prefill(qkv.cpu, a.cpu, b.cpu, A_log.cpu, dt.cpu, o.cpu, L.cpu, s, Tensor{});
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, L.gpu, s, ws);
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, ov.gpu, L.gpu, s, ws);
      const std::string what = name_of("gdn_prefill T nk nv dk dv", {T, s.nk, s.nv, s.dk, s.dv}) + " seqs " +
                               std::to_string(lens.size());
      expect_same_bits(o.gpu, ov.gpu, what, "first run", "second run");
      // Same chunked algorithm on identical inputs. The GPU's recurrence products keep ~16 mantissa bits
      // (bf16 hi + lo); its two output products (S·Qᵀ, V'·Pᵀ) round S and V' to bf16: 2^-9 relative per term,
      // random in sign over 128 + 64 terms whose sum is |o| ≲ 1, ≈ 2^-9·|o| ≈ 2e-3 typical, below 6e-3 with
      // margin; then one bf16 rounding of the output (2 ulps with the state's drift).
      check(o, 6e-3, 2 * kBf16Ulp, what);
    }
}

// Head dims the chunked DeltaNet kernels are not built for (not multiples of 8, above 128) and a layout they
// cannot read (an odd qkv row stride) run the token recurrence from zero states per sequence: no workspace.
TEST_F(CudaOpsTest, GdnPrefillRecurrentPathMatchesCpu) {
  struct Case { GdnShape s; int64_t pad; };
  for (const auto& lens : {std::vector<int32_t>{1}, {7}, {1, 7, 65, 300}, {64, 64, 3}})
    for (Case c : {Case{GdnShape{1, 3, 8, 4}, 8}, {GdnShape{2, 4, 12, 20}, 8}, {GdnShape{1, 2, 136, 24}, 8},
                   {GdnShape{1, 1, 256, 160}, 8}, {GdnShape{2, 4, 32, 32}, 3}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      const GdnShape& s = c.s;
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv;
      Pair qkv = rand(T, cols, -1, 1, DType::bf16, c.pad);
      Pair a = rand(T, s.nv, -3, 3, DType::bf16, 3), b = rand(T, s.nv, -3, 3, DType::bf16, 3);
      Pair A_log = rand(1, s.nv, -2, 1, DType::f32), dt = rand(1, s.nv, -1, 1, DType::f32);
      Pair o = out(T, int64_t(s.nv) * s.dv, DType::bf16, c.pad);
      const int64_t ws_bytes = gpu_->gdn_workspace_bytes(T, s);
      const bool chunked_shape = s.dk % 8 == 0 && s.dv % 8 == 0 && s.dk <= 128 && s.dv <= 128;
      EXPECT_EQ(ws_bytes == 0, !chunked_shape) << "the recurrence needs no workspace, the chunked kernels do";
      Tensor ws = ws_bytes > 0 ? gpu_arena_.alloc(DType::u8, 1, ws_bytes) : Tensor{};
      cpu_.gdn_prefill(qkv.cpu, a.cpu, b.cpu, A_log.cpu, dt.cpu, o.cpu, L.cpu, s, Tensor{});
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, L.gpu, s, ws);
      // fp32 recurrence on both sides (the CPU's chunked form agrees with it to ~1e-6); the sums over dk run in
      // another order: 2e-4 absolute, then one bf16 rounding of the output.
      check(o, 2e-4, kBf16Ulp,
            name_of("gdn_prefill recurrent T nk nv dk dv pad", {T, s.nk, s.nv, s.dk, s.dv, c.pad}) + " seqs " +
                std::to_string(lens.size()));
    }
}

// Conv kernel sizes other than Qwen's 4, on the vector (aligned) and scalar (strided) paths.
TEST_F(CudaOpsTest, Conv1dSiluOtherKernelSizes) {
  for (int K : {2, 3, 5, 8})
    for (int64_t pad : {0, 3}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts({1, 7, 65, 300});
      const int64_t T = L.cpu.tokens, C = 96;
      Pair x = rand(T, C, -2, 2, DType::bf16, pad), w = rand(C, K, -0.5f, 0.5f, DType::f32);
      Pair y = out(T, C, DType::bf16, pad);
      cpu_.conv1d_silu(x.cpu, w.cpu, y.cpu, L.cpu);
      gpu_->conv1d_silu(x.gpu, w.gpu, y.gpu, L.gpu);
      // fp32 sums of K products, then silu and one rounding.
      check(y, 1e-5, kBf16Ulp, name_of("conv1d_silu K pad", {K, pad}));
    }
}

// The conv kernels' edges: C not a multiple of 8 and column offsets not a multiple of 8 (the scalar kernel), a
// 256-channel span with one live lane (264, 520), sequences of 1..3 tokens, T not a multiple of the vector
// kernel's 32-row stage or 256-token block, and sequences crossing a block boundary (the halo is the previous
// block's rows), at K 4 and 8 (a 7-row halo). x is a column view of a wider buffer, as conv1d reads the fused
// projection. Against the CPU, and where the vector kernel runs, bit for bit against the scalar kernel (forced
// by an output pitch of 4 mod 8): both sum the K products in the same fp32 order and apply the same SiLU.
TEST_F(CudaOpsTest, Conv1dSiluAwkwardShapes) {
  for (const auto& lens : {std::vector<int32_t>{1}, {2}, {3}, {1, 2, 3, 1}, {33}, {257}, {255, 3, 300}, {600, 1, 2}})
    for (int K : {4, 8})
      for (auto [C, col] : {std::pair<int64_t, int64_t>{8, 0}, {13, 0}, {264, 0}, {520, 8}, {96, 1}, {1000, 3}}) {
        const ArenaMarks marks(cpu_arena_, gpu_arena_);
        Layouts L = layouts(lens);
        const int64_t T = L.cpu.tokens;
        Pair buf = rand(T, col + C + 8, -2, 2);
        Pair x{buf.cpu.cols_view(col, C), buf.gpu.cols_view(col, C)};
        Pair w = rand(C, K, -0.5f, 0.5f, DType::f32), y = out(T, C);
        cpu_.conv1d_silu(x.cpu, w.cpu, y.cpu, L.cpu);
        gpu_->conv1d_silu(x.gpu, w.gpu, y.gpu, L.gpu);
        const std::string what = name_of("conv1d_silu T C col K", {T, C, col, K}) + " seqs " +
                                 std::to_string(lens.size()) + " (element i is token i / C, channel i % C)";
        check(y, 1e-5, kBf16Ulp, what);  // fp32 sums of K products, then silu and one rounding
        if (C % 8 != 0 || col % 8 != 0) continue;  // the scalar kernel ran already
        Pair y4 = out(T, C, DType::bf16, 4);
        gpu_->conv1d_silu(x.gpu, w.gpu, y4.gpu, L.gpu);
        expect_same_bits(y.gpu, y4.gpu, what, "vector kernel", "scalar kernel");
      }
}

// The DeltaNet recurrence continued from a carried state over T tokens, saving the last R states: GVA ratios
// 1..3, key dims 8..512 (2 to 16 state rows per thread of the 16-column kernel), value dims below one
// 16-column slice (4, 8), ragged (20: a last slice of one float4 of columns; 24, 200), the 27B layer (16 / 48
// heads of 128), and two shapes the 32-column slice kernel keeps (dv 30, not a multiple of 4; dv 200 with
// states rows padded by one float, so not 16-byte aligned); T across the 16-column kernel's staging (16 tokens,
// 4 at dk 512) and the 32-column one's (8): 1, 3, 7, 16, 17; the first, a middle and the last saved state,
// strided qkv / a / b / out as the decoder passes them.
TEST_F(CudaOpsTest, GdnDecodeMatchesCpu) {
  for (GdnShape s : {GdnShape{1, 3, 8, 4}, GdnShape{2, 4, 16, 24}, GdnShape{1, 2, 24, 16}, GdnShape{2, 6, 128, 128},
                     GdnShape{1, 1, 256, 32}, GdnShape{3, 3, 40, 64}, GdnShape{1, 2, 512, 8},
                     GdnShape{1, 3, 96, 20}, GdnShape{2, 2, 40, 30}, GdnShape{1, 2, 64, 200},
                     GdnShape{16, 48, 128, 128}})
    for (int64_t T : {1, 3, 7, 16, 17})
      for (int64_t R : {int64_t(1), (T + 1) / 2, T}) {
        if (R == (T + 1) / 2 && (R == 1 || R == T)) continue;  // already run
        const ArenaMarks marks(cpu_arena_, gpu_arena_);
        const int64_t cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv, sdim = int64_t(s.nv) * s.dk * s.dv;
        Pair qkv = rand(T, cols, -1, 1, DType::bf16, 8);
        Pair a = rand(T, s.nv, -3, 3, DType::bf16, 5), b = rand(T, s.nv, -3, 3, DType::bf16, 5);
        Pair A_log = rand(1, s.nv, -2, 1, DType::f32), dt = rand(1, s.nv, -1, 1, DType::f32);
        Pair state = rand(1, sdim, -0.5f, 0.5f, DType::f32);
        Pair o = out(T, int64_t(s.nv) * s.dv, DType::bf16, 3);
        Pair states = out(R, sdim, DType::f32, s.dv == 200 ? 1 : 0);
        cpu_.gdn_decode(qkv.cpu, a.cpu, b.cpu, A_log.cpu, dt.cpu, o.cpu, state.cpu, states.cpu, s);
        gpu_->gdn_decode(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, state.gpu, states.gpu, s);
        const std::string what = name_of("gdn_decode nk nv dk dv T R", {s.nk, s.nv, s.dk, s.dv, T, R});
        // fp32 end to end on both sides; the sums over dk run in another order (warp tree vs sequential) and
        // the gates use the CUDA expf/log1pf: 1e-4 absolute on O(1) states. The output is then rounded once.
        check(states, 1e-4, 1e-4, "states " + what);
        check(o, 1e-4, kBf16Ulp, "out " + what);
        // The state read is the caller's committed one: it must be left as it was.
        const std::vector<float> s_after = down_gpu(state.gpu);
        const std::vector<double> s_before = down_cpu(state.cpu);
        EXPECT_EQ(count_mismatch(s_after, s_before, 0.0, 0.0, "state unchanged " + what), 0);
      }
  const GdnShape s{1, 2, 16, 16};
  Pair qkv = rand(4, 64, -1, 1), a = rand(4, 2, -1, 1), b = rand(4, 2, -1, 1);
  Pair A_log = rand(1, 2, -1, 1, DType::f32), dt = rand(1, 2, -1, 1, DType::f32);
  Pair state = rand(1, 512, -1, 1, DType::f32), o = out(4, 32), five = out(5, 512, DType::f32);
  EXPECT_THROW(gpu_->gdn_decode(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, state.gpu, five.gpu, s), Error);
  EXPECT_THROW(gpu_->gdn_decode(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, o.gpu, five.gpu, s), Error);
}

// The registry's decode=general (kernel_variants_set) runs gdn_decode on the general warp-per-column kernel
// (the benchmarks' reference), per call: both kernels agree with the CPU on the 27B layer's shape.
TEST_F(CudaOpsTest, GdnDecodeGeneralVariantMatchesCpu) {
  const GdnShape s{16, 48, 128, 128};
  const int64_t T = 16, cols = 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv, sdim = int64_t(s.nv) * s.dk * s.dv;
  Pair qkv = rand(T, cols, -1, 1), a = rand(T, s.nv, -3, 3), b = rand(T, s.nv, -3, 3);
  Pair A_log = rand(1, s.nv, -2, 1, DType::f32), dt = rand(1, s.nv, -1, 1, DType::f32);
  Pair state = rand(1, sdim, -0.5f, 0.5f, DType::f32);
  const KernelVariants saved = kernel_variants();
  for (bool general : {true, false}) {
    KernelVariants forced = saved;
    forced.decode_general = general;
    kernel_variants_set(forced);
    Pair o = out(T, int64_t(s.nv) * s.dv), states = out(T, sdim, DType::f32);
    cpu_.gdn_decode(qkv.cpu, a.cpu, b.cpu, A_log.cpu, dt.cpu, o.cpu, state.cpu, states.cpu, s);
    gpu_->gdn_decode(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, state.gpu, states.gpu, s);
    const std::string what = general ? "gdn_decode decode=general" : "gdn_decode 16-column kernel";
    check(states, 1e-4, 1e-4, "states " + what);
    check(o, 1e-4, kBf16Ulp, "out " + what);
  }
  kernel_variants_set(saved);
}

// The DeltaNet mixer (gdn_mixer: conv1d_silu → gdn_prefill → gated_rmsnorm) fused against the CPU's three ops
// and against the three CUDA ops called one after another (conv1d_silu, gdn_prefill, gated_rmsnorm), as the
// forward calls it: x, z, b and a column views of one fused projection. Lengths 1, 63, 65, 130 alone and
// packed (sequences starting inside the chunk the conv's history rows would come from), the 27B layer (16 /
// 48 heads of 128), head dims below the kernels' tile (16 / 40, 24 / 8), and a conv of 3 taps, which the
// fused kernels leave to the three ops.
TEST_F(CudaOpsTest, GdnMixerFusedMatchesCpuAndSeparateOps) {
  struct Case { GdnShape s; int K; };
  for (const auto& lens : {std::vector<int32_t>{1}, {63}, {65}, {130}, {1, 63, 65, 130}, {64, 64, 3}, {3, 2, 70}})
    for (Case c : {Case{GdnShape{16, 48, 128, 128}, 4}, {GdnShape{1, 3, 16, 40}, 4}, {GdnShape{2, 4, 32, 32}, 4},
                   {GdnShape{3, 3, 24, 8}, 4}, {GdnShape{1, 3, 16, 40}, 3}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      const GdnShape& s = c.s;
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, vdim = int64_t(s.nv) * s.dv, cols = 2LL * s.nk * s.dk + vdim;
      const int64_t P = cols + vdim + 2 * s.nv;  // [q k v | z | b | a], the row pitch padded to 16 bytes
      Pair proj = rand(T, P, -2, 2, DType::bf16, (8 - P % 8) % 8);
      auto view = [&](int64_t c0, int64_t n) { return Pair{proj.cpu.cols_view(c0, n), proj.gpu.cols_view(c0, n)}; };
      const Pair x = view(0, cols), z = view(cols, vdim), b = view(cols + vdim, s.nv);
      const Pair a = view(cols + vdim + s.nv, s.nv);
      const Pair conv_w = rand(cols, c.K, -0.5f, 0.5f, DType::f32), A_log = rand(1, s.nv, -2, 1, DType::f32);
      const Pair dt = rand(1, s.nv, -1, 1, DType::f32), norm_w = rand(1, s.dv, 0.5f, 1.5f, DType::f32);
      const GdnWeights wc{conv_w.cpu, A_log.cpu, dt.cpu, norm_w.cpu, 1e-6f};
      const GdnWeights wg{conv_w.gpu, A_log.gpu, dt.gpu, norm_w.gpu, 1e-6f};
      Tensor ws = gpu_arena_.alloc(DType::u8, 1, gpu_->gdn_workspace_bytes(T, s));
      poison(ws.data, ws.nbytes());
      const std::string what = name_of("gdn_mixer T nk nv dk dv K", {T, s.nk, s.nv, s.dk, s.dv, c.K}) + " seqs " +
                               std::to_string(lens.size());

      Pair y = out(T, vdim), conv = out(T, cols), o = out(T, vdim);
      cpu_.gdn_mixer(x.cpu, z.cpu, a.cpu, b.cpu, wc, y.cpu, L.cpu, s, Tensor{}, conv.cpu, o.cpu);
      gpu_->gdn_mixer(x.gpu, z.gpu, a.gpu, b.gpu, wg, y.gpu, L.gpu, s, ws, conv.gpu, o.gpu);
      Pair y3 = out(T, vdim), conv3 = out(T, cols), o3 = out(T, vdim);
      gpu_->conv1d_silu(x.gpu, conv_w.gpu, conv3.gpu, L.gpu);
      gpu_->gdn_prefill(conv3.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o3.gpu, L.gpu, s, ws);
      gpu_->gated_rmsnorm(o3.gpu, z.gpu, norm_w.gpu, y3.gpu, s.nv, s.dv, 1e-6f);
      const std::vector<float> got = down_gpu(y.gpu), sep = down_gpu(y3.gpu);

      // Against the CPU, normalised: the norm divides by rms(o), which on these random inputs ranges over four
      // decades (median 2e-3, rows down to 5e-6, as q and k barely overlap), so a per-element bound on o means
      // little after it. The three ops' precision is held in their own tests (one rounding each against the CPU);
      // what this comparison adds is the composition (x, z, a, b as views of one projection, halo rows, sequence
      // resets, heads), whose mistakes move whole rows by O(max|y|). So both forms stay below 0.1 of max|y| per
      // element and 0.05 in relative RMS (the worst the H200 showed over these cases, either form, was 4.9e-2
      // and 1.7e-2, on the 3 / 3 × 24 / 8 heads at 65 tokens and the 1 / 3 × 16 / 40 heads at one token: few
      // elements, each row rescaled by its own rms(o)); the fused form is held to the three ops per element
      // below.
      const std::vector<double> want = down_cpu(y.cpu);
      auto stats = [&](const std::vector<float>& g) {
        double e2 = 0.0, r2 = 0.0, emax = 0.0, rmax = 0.0;
        bool nan = false;
        for (size_t i = 0; i < want.size(); ++i) {
          const double e = double(g[i]) - want[i];
          nan |= std::isnan(g[i]);
          e2 += e * e, r2 += want[i] * want[i];
          emax = std::max(emax, std::fabs(e)), rmax = std::max(rmax, std::fabs(want[i]));
        }
        return std::tuple{nan, emax / rmax, std::sqrt(e2 / r2)};
      };
      const auto [nan, max_rel, rms_rel] = stats(got);
      const auto [nan3, max_rel3, rms_rel3] = stats(sep);
      std::printf("[ maxerr ] %-48s max|err|/max|ref| %.2e rel RMS %.2e (three ops: %.2e, %.2e)\n",
                  what.c_str(), max_rel, rms_rel, max_rel3, rms_rel3);
      EXPECT_FALSE(nan || nan3) << what;
      EXPECT_LE(std::max(max_rel, max_rel3), 0.1) << what;
      EXPECT_LE(std::max(rms_rel, rms_rel3), 0.05) << what;

      // Against the three CUDA ops: the same q, k, v bits (checked below where the conv is fused), so the same
      // fp32 o. They round o to bf16 before the norm (≤ 1 ulp of o, so of y; r moves by an average of those,
      // far less), then each side rounds y once: 3 ulps.
      EXPECT_EQ(count_mismatch(got, std::vector<double>(sep.begin(), sep.end()), 1e-6, 3 * kBf16Ulp,
                               "fused vs three ops " + what),
                0);
      if (c.K != 4) {  // no fused form: the same three ops ran both times
        expect_same_bits(y.gpu, y3.gpu, what, "gdn_mixer", "three ops");
        continue;
      }
      // The fused form writes only conv's last 2·nk·dk columns: the conv'd q | k rows, bit for bit conv1d_silu's.
      const int64_t qk = 2LL * s.nk * s.dk;
      expect_same_bits(conv.gpu.cols_view(vdim, qk), conv3.gpu.cols_view(0, qk), what, "fused conv of q|k",
                       "conv1d_silu");
      const std::vector<float> untouched = down_gpu(conv.gpu.cols_view(0, vdim));
      EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return std::isnan(v); }))
          << what << ": the fused form wrote conv's first columns (did the three ops run instead?)";
      // As the forward calls it: out is conv's first nv·dv columns, the same bits.
      gpu_->gdn_mixer(x.gpu, z.gpu, a.gpu, b.gpu, wg, conv.gpu.cols_view(0, vdim), L.gpu, s, ws, conv.gpu, o.gpu);
      expect_same_bits(conv.gpu.cols_view(0, vdim), y.gpu, what, "out inside conv", "out apart");
    }
}

// The state pass's one-stage form (what dispatch's gdn_state_kernel_choose gives devices with 99 KB a block
// at tile width 128, and at 64 with the norm fused), forced on this GPU through the registry's gdn=one_stage:
// the prefill against the CPU as the chunked test holds it, and the prefill and the fused mixer bit for bit
// the form dispatch picks here (two stages on a Hopper; both forms run the same products in the same order,
// only the copy schedule differs). Tile widths 128 (the 27B layer; 120 / 72 leaves zero columns), 64 and
// 32; one chunk, a chunk and a row, five chunks (every tile refilled four times), and packed sequences whose
// seams fall inside chunks.
TEST_F(CudaOpsTest, GdnStateOneStageMatchesCpuAndTheDefaultForm) {
  const KernelVariants saved = kernel_variants();
  const KernelVariants one = kernel_variants_with(saved, &KernelVariants::gdn_one_stage, true);
  const KernelVariants picked = kernel_variants_with(saved, &KernelVariants::gdn_one_stage, false);
  for (const auto& lens :
       {std::vector<int32_t>{1}, {64}, {65}, {300}, {1, 63, 65, 130}, {64, 64, 3}, {3, 2, 200}})
    for (GdnShape s : {GdnShape{16, 48, 128, 128}, GdnShape{1, 2, 120, 72}, GdnShape{3, 3, 64, 48},
                       GdnShape{1, 3, 16, 40}, GdnShape{2, 4, 32, 32}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, vdim = int64_t(s.nv) * s.dv, cols = 2LL * s.nk * s.dk + vdim;
      const std::string what = name_of("gdn one stage T nk nv dk dv", {T, s.nk, s.nv, s.dk, s.dv}) +
                               " seqs " + std::to_string(lens.size());
      Tensor ws = gpu_arena_.alloc(DType::u8, 1, gpu_->gdn_workspace_bytes(T, s));
      poison(ws.data, ws.nbytes());

      Pair qkv = rand(T, cols, -1, 1, DType::bf16, 8), a = rand(T, s.nv, -3, 3), b = rand(T, s.nv, -3, 3);
      Pair A_log = rand(1, s.nv, -2, 1, DType::f32), dt = rand(1, s.nv, -1, 1, DType::f32);
      Pair o = out(T, vdim), o_picked = out(T, vdim);
      cpu_.gdn_prefill(qkv.cpu, a.cpu, b.cpu, A_log.cpu, dt.cpu, o.cpu, L.cpu, s, Tensor{});
      kernel_variants_set(one);
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, L.gpu, s, ws);
      kernel_variants_set(picked);
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o_picked.gpu, L.gpu, s, ws);
      // The chunked test's bounds (GdnPrefillChunkedMatchesCpuAcrossChunkAndSequenceSeams says why).
      check(o, 6e-3, 2 * kBf16Ulp, "prefill " + what);
      expect_same_bits(o.gpu, o_picked.gpu, "prefill " + what, "one stage", "dispatch's form");

      // The fused mixer (conv in the chunk kernel, gated norm in the state kernel's epilogue).
      Pair x = rand(T, cols, -2, 2, DType::bf16, 8), z = rand(T, vdim, -2, 2, DType::bf16, 8);
      const Pair conv_w = rand(cols, 4, -0.5f, 0.5f, DType::f32);  // 4 taps: the fused form's conv
      const Pair norm_w = rand(1, s.dv, 0.5f, 1.5f, DType::f32);
      const GdnWeights wg{conv_w.gpu, A_log.gpu, dt.gpu, norm_w.gpu, 1e-6f};
      Pair y = out(T, vdim), y_picked = out(T, vdim), conv = out(T, cols), mid = out(T, vdim);
      kernel_variants_set(one);
      gpu_->gdn_mixer(x.gpu, z.gpu, a.gpu, b.gpu, wg, y.gpu, L.gpu, s, ws, conv.gpu, mid.gpu);
      kernel_variants_set(picked);
      gpu_->gdn_mixer(x.gpu, z.gpu, a.gpu, b.gpu, wg, y_picked.gpu, L.gpu, s, ws, conv.gpu, mid.gpu);
      expect_same_bits(y.gpu, y_picked.gpu, "mixer " + what, "one stage", "dispatch's form");
    }
  kernel_variants_set(saved);
}

// The workspace is the caller's: one byte short (or none) must be refused with both sizes in the message,
// never run past its end.
TEST_F(CudaOpsTest, GdnPrefillRefusesASmallWorkspace) {
  const GdnShape s{1, 3, 16, 40};
  Layouts L = layouts({7, 65});
  const int64_t T = L.gpu.tokens, need = gpu_->gdn_workspace_bytes(T, s);
  Pair qkv = rand(T, 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv, -1, 1), a = rand(T, s.nv, -3, 3),
       b = rand(T, s.nv, -3, 3), A_log = rand(1, s.nv, -2, 1, DType::f32),
       dt = rand(1, s.nv, -1, 1, DType::f32);
  Pair o = out(T, int64_t(s.nv) * s.dv);
  Tensor ws = gpu_arena_.alloc(DType::u8, 1, need);
  for (const Tensor& bad : {ws.cols_view(0, need - 1), Tensor{}}) {
    try {
      gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, L.gpu, s, bad);
      ADD_FAILURE() << "gdn_prefill ran with a workspace of " << bad.cols << " bytes, needs " << need;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("gdn_prefill"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("got " + std::to_string(bad.cols) + " bytes"), std::string::npos) << msg;
    }
  }
  EXPECT_NO_THROW(gpu_->gdn_prefill(qkv.gpu, a.gpu, b.gpu, A_log.gpu, dt.gpu, o.gpu, L.gpu, s, ws));
}

#endif  // DF_HAVE_CUDA
