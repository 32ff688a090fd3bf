// The FP8 target on a 128x128 block-scaled checkpoint (what `model init --fp8` writes and the official Qwen
// FP8 releases ship): the CPU oracle keeps the file's codes and block scales as they are, and rounds each
// linear layer's input per token per 128 columns (Ops::fp8_round_rows with a group), the last group partial
// on odd widths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "model/fp8_weights.h"
#include "model/safetensors.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;

namespace {

// Widths that are not multiples of 128 wherever the model allows: H = 200 (groups 128 + 72), I = 300
// (128 + 128 + 44), so every projection has a partial last block and every input a partial last group.
QwenConfig block_hybrid() {
  return gated_hybrid(200, 300, 64, 32, 64, "block_hybrid");
}

// The reference rounding of one row, group by group, with core/fp8.h alone.
std::vector<float> round_groups(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t group) {
  std::vector<float> out = x;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += group) {
      const int64_t c1 = std::min(cols, c0 + group);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
      if (amax == 0) continue;
      const float s = e4m3_scale(amax), inv = e4m3_inv_scale(s);
      for (int64_t c = c0; c < c1; ++c) {
        float& v = out[size_t(r * cols + c)];
        v = e4m3_to_f32(e4m3_quantize(v, inv)) * s;
      }
    }
  return out;
}

// Rows whose 128-column groups span 2^-12 .. 2^0: one scale per row would flush the small groups to zero
// codes.
std::vector<float> graded_rows(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> x(size_t(rows * cols));
  Rng r(seed);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(i * cols + c)] = float(r.normal()) * std::ldexp(1.0f, -6 * int(c / 128));
  return x;
}

class Fp8BlockCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("df_fp8_block_" + std::to_string(::getpid()))).string();
    TargetLoadOptions with_head;
    with_head.need_lm_head = true;
    TargetSaveOptions save;
    save.fp8_block_n = save.fp8_block_k = 128;  // as `model init --fp8` writes (src/cli/cmd_model.cpp)
    target_save_hf(*target_random(block_hybrid(), 21, ops_, with_head), dir_, save);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  CpuOps ops_{CpuGdnMode::recurrent};
  std::string dir_;
};

}  // namespace

TEST(Fp8RoundGroups, EachGroupOnItsOwnScaleLastOnePartial) {
  CpuOps ops;
  const int64_t rows = 3, cols = 300;  // groups of 128, 128 and a partial 44
  const std::vector<float> x = graded_rows(rows, cols, 5);
  std::vector<float> got = x;
  ops.fp8_round_rows(tensor_make(got.data(), DType::f32, Device::cpu, rows, cols), 128);
  const std::vector<float> want = round_groups(x, rows, cols, 128);
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (got[i] != want[i] && bad++ < 5)
      ADD_FAILURE() << "[" << i / cols << ", " << i % cols << "] of [" << rows << ", " << cols << "]: got "
                    << got[i] << ", group reference " << want[i] << " (input " << x[i] << ")";
  EXPECT_EQ(bad, 0);
  // Group 0 is one scale per row; on these rows that is a different rounding, so the group did matter.
  std::vector<float> per_row = x;
  ops.fp8_round_rows(tensor_make(per_row.data(), DType::f32, Device::cpu, rows, cols));
  EXPECT_EQ(per_row, round_groups(x, rows, cols, cols));
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += per_row[i] != got[i];
  EXPECT_GT(differ, rows * 44) << "per-row and per-group rounding agree: the test shows nothing";
}

// target_linear on a model with fp8_group multiplies the group-rounded input by the weights as they are:
// against a double product of the reference-rounded input, within fp32 accumulation (K · 2^-24 · Σ|terms|, K
// = 300).
TEST(Fp8RoundGroups, TargetLinearRoundsInputsPer128Columns) {
  CpuOps ops;
  const int64_t M = 4, K = 300, N = 9;
  std::vector<float> x = graded_rows(M, K, 7), w(size_t(N * K)), out(size_t(M * N));
  Rng r(8);
  for (float& v : w) v = float(r.normal());
  TargetModel m;
  m.ops = &ops;
  m.fp8 = true;
  m.fp8_group = 128;
  const std::vector<float> xq = round_groups(x, M, K, 128), xr = round_groups(x, M, K, K);
  target_linear(m, {}, tensor_make(x.data(), DType::f32, Device::cpu, M, K),
                tensor_make(w.data(), DType::f32, Device::cpu, N, K), Tensor(),
                tensor_make(out.data(), DType::f32, Device::cpu, M, N), 0.0f);
  int64_t row_rounding_fails = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, row_ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += double(xq[size_t(i * K + k)]) * w[size_t(j * K + k)];
        row_ref += double(xr[size_t(i * K + k)]) * w[size_t(j * K + k)];
        mag += std::fabs(double(xq[size_t(i * K + k)]) * w[size_t(j * K + k)]);
      }
      const double tol = double(K) * std::ldexp(1.0, -24) * mag;
      EXPECT_LE(std::fabs(out[size_t(i * N + j)] - ref), tol)
          << "[" << i << ", " << j << "] of [" << M << ", " << N << "]: got " << out[size_t(i * N + j)]
          << ", double product of the group-rounded input " << ref;
      row_rounding_fails += std::fabs(row_ref - ref) > tol;
    }
  EXPECT_GT(row_rounding_fails, 0) << "per-row rounding passes the same bound: the test shows nothing";
}

// The loaded projections are the file's codes times its block scales, bit for bit: not re-rounded per
// channel.
TEST_F(Fp8BlockCheckpoint, LoadsTheFilesCodesAndBlockScales) {
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto m = target_load(dir_, ops_, fp8);
  ASSERT_EQ(m->fp8_group, 128);
  EXPECT_TRUE(m->fp8);
  const SafetensorsIndex st = SafetensorsIndex::open(dir_);
  const QwenConfig& c = m->cfg;
  int64_t checked = 0;
  // Rows [r0, r0 + rows of `name`) of w must be e4m3(code) · scale_inv[n / 128, k / 128] of the file's
  // tensor.
  auto expect_file = [&](const Tensor& w, int64_t r0, const std::string& name) {
    const StTensor* q = st.find(name);
    ASSERT_NE(q, nullptr) << name;
    ASSERT_EQ(q->dtype, DType::f8_e4m3) << name;
    const StTensor* s = st.find(fp8_scale_name(name));
    ASSERT_NE(s, nullptr) << name;
    const int64_t N = q->shape[0], K = q->shape[1], kb = s->shape[1];
    std::vector<float> scale(size_t(s->numel())), v(size_t(w.numel()));
    st_to_f32(*s, scale.data());
    ops_.download_f32(w, v.data());
    const uint8_t* codes = static_cast<const uint8_t*>(q->data);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float sc = scale[size_t((n / 128) * kb + k / 128)], got = v[size_t((r0 + n) * K + k)];
        const uint8_t code = codes[n * K + k];
        if ((got != e4m3_to_f32(code) * sc || f32_to_e4m3(got / sc) != code) && bad++ < 3)
          ADD_FAILURE() << name << " [" << n << ", " << k << "] of " << st_shape_text(q->shape) << ": loaded "
                        << got << ", file code 0x" << std::hex << int(code) << std::dec << " x block scale "
                        << sc << " = " << e4m3_to_f32(code) * sc;
      }
    EXPECT_EQ(bad, 0) << name;
    checked += N * K;
  };
  for (int l = 0; l < c.layers; ++l) {
    const TargetLayer& L = m->layers[size_t(l)];
    const std::string lp = "model.layers." + std::to_string(l) + ".";
    if (L.kind == LayerKind::full_attention) {
      const int64_t kv = int64_t(c.kv_heads) * c.head_dim, k0 = 2 * int64_t(c.heads) * c.head_dim;
      expect_file(L.w_qkv, k0, lp + "self_attn.k_proj.weight");
      expect_file(L.w_qkv, k0 + kv, lp + "self_attn.v_proj.weight");
      expect_file(L.w_o, 0, lp + "self_attn.o_proj.weight");
    } else {
      const int64_t conv_ch = L.conv_w.rows;
      expect_file(L.w_in, 0, lp + "linear_attn.in_proj_qkv.weight");
      expect_file(L.w_in, conv_ch, lp + "linear_attn.in_proj_z.weight");
      expect_file(L.w_out, 0, lp + "linear_attn.out_proj.weight");
    }
    expect_file(L.w_gate_up, 0, lp + "mlp.gate_proj.weight");
    expect_file(L.w_gate_up, c.intermediate, lp + "mlp.up_proj.weight");
    expect_file(L.w_down, 0, lp + "mlp.down_proj.weight");
  }
  EXPECT_GT(checked, 0);
}

// Against the same checkpoint loaded without FP8 (its dequantised weights, inputs unrounded) the taps differ
// by the input rounding alone: e4m3's 3 mantissa bits give a relative error uniform in ±2^-4, RMS 2^-4/√3
// ≈ 3.6 % on each GEMM input and so on its product (the errors of the K terms are independent), and each of a
// layer's two sub-layers adds that to the residual stream: 3.6 % · √(2L) ≈ 7 % after these L = 2 layers.
// Twice that bounds it; inputs left unrounded land near 0 (the lower bound).
TEST_F(Fp8BlockCheckpoint, TapsDifferFromTheDequantisedForwardByInputRounding) {
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto m8 = target_load(dir_, ops_, fp8);
  auto m32 = target_load(dir_, ops_, {});
  EXPECT_EQ(m32->fp8_group, 0);
  const QwenConfig& c = m8->cfg;
  const std::vector<int32_t> ids = random_ids(50, c.vocab, 3);
  const FwdResult a = run_model(*m32, ops_, ids, {30, 20}, c.layers, true);
  const FwdResult b = run_model(*m8, ops_, ids, {30, 20}, c.layers, true);
  double worst = 0;
  for (int l = 0; l < c.layers; ++l) {
    const double e = rel_rms(b.taps[size_t(l)], a.taps[size_t(l)]);
    worst = std::max(worst, e);
    EXPECT_GT(e, 1e-3) << "tap " << l << ": the input rounding had no effect";
    EXPECT_LT(e, 0.15) << "tap " << l;
  }
  std::printf("[ fp8blk ] worst tap rel-RMS vs the dequantised forward %.4f, final norm %.4f\n", worst,
              rel_rms(b.final_norm, a.final_norm));
}

// Computing with the checkpoint's own blocks needs every projection in FP8: one stored in f32 is refused by
// name.
TEST_F(Fp8BlockCheckpoint, RefusesAProjectionNotStoredInFp8) {
  const std::string mixed = dir_ + "_mixed", down = "model.layers.0.mlp.down_proj.weight";
  std::filesystem::create_directories(mixed);
  std::filesystem::copy_file(dir_ + "/config.json", mixed + "/config.json");
  {
    const SafetensorsIndex st = SafetensorsIndex::open(dir_);
    const StTensor* q = st.find(down);
    ASSERT_NE(q, nullptr);
    std::vector<float> deq(size_t(q->numel()));
    fp8_dequantize(st, *q, 128, 128, deq.data());
    std::vector<StWriteTensor> out;
    for (const std::string& name : st.names()) {
      const StTensor* t = st.find(name);
      if (name == fp8_scale_name(down)) continue;
      out.push_back(
          {name, t->dtype, t->shape, name == down ? static_cast<const void*>(deq.data()) : t->data});
      if (name == down) out.back().dtype = DType::f32;
    }
    safetensors_write(mixed + "/model.safetensors", out, {{"format", "pt"}});
  }
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  try {
    target_load(mixed, ops_, fp8);
    ADD_FAILURE() << "a block-scaled checkpoint with an f32 projection loaded with target.dtype = fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(down), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(target_load(mixed, ops_, {}));  // bf16 compute takes it as it is
  std::filesystem::remove_all(mixed);
}
