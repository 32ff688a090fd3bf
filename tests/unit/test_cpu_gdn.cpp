// The CPU Gated DeltaNet: the recurrence and the chunked UT/WY form against a double-precision recurrence
// written here from MODELS.md, against each other, across chunk seams (lengths 63, 64, 65, 200), packed
// batches, nk != nv, dk != dv, strided inputs from a fused projection, and through CpuOps::gdn_prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu_test_util.h"
#include "ops/cpu/cpu_gdn.h"
#include "ops/cpu/cpu_ops.h"

using namespace df;
using namespace df::test;

namespace {

// The inputs of one GDN call, cut as column views out of one fused projection [qkv | z | b | a] so every
// operand is strided, as in the model.
struct GdnInputs {
  GdnShape shape;
  Mat proj, A_log, dt_bias;
  Tensor qkv, a, b;
  GdnInputs(const GdnShape& s, int64_t T, std::mt19937& rng, float a_log_lo, float a_log_hi)
      : shape(s),
        proj(T, qkv_width(s) + 8 + 2 * s.nv, 3, 1),
        A_log(1, s.nv),
        dt_bias(1, s.nv) {
    proj.fill_uniform(rng, -1, 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = qkv_width(s) + 8; c < proj.t.cols; ++c) proj.at(t, c) *= 3.0f;  // a, b in [-3, 3]
    A_log.fill_uniform(rng, a_log_lo, a_log_hi);
    dt_bias.fill_uniform(rng, -1, 1);
    qkv = proj.t.cols_view(0, qkv_width(s));
    b = proj.t.cols_view(qkv_width(s) + 8, s.nv);
    a = proj.t.cols_view(qkv_width(s) + 8 + s.nv, s.nv);
  }
  static int64_t qkv_width(const GdnShape& s) { return 2 * int64_t(s.nk) * s.dk + int64_t(s.nv) * s.dv; }
  float in(const Tensor& t, int64_t r, int64_t c) const { return reinterpret_cast<const float*>(t.row_bytes(r))[c]; }
};

// MODELS.md's per-head recurrence in double, straight from the definition.
std::vector<double> ref_gdn(const GdnInputs& in, const Packed& pk) {
  const GdnShape& s = in.shape;
  const int64_t T = pk.seqs.tokens, kw = int64_t(s.nk) * s.dk;
  std::vector<double> o(size_t(T * s.nv * s.dv));
  auto l2 = [](std::vector<double> x) {
    double ss = 0;
    for (double v : x) ss += v * v;
    for (double& v : x) v /= std::sqrt(ss + 1e-6);
    return x;
  };
  for (size_t seq = 0; seq + 1 < pk.cu.size(); ++seq) {
    for (int h = 0; h < s.nv; ++h) {
      const int kh = h / (s.nv / s.nk);
      std::vector<double> S(size_t(s.dk * s.dv), 0.0);
      for (int64_t t = pk.cu[seq]; t < pk.cu[seq + 1]; ++t) {
        std::vector<double> q(size_t(s.dk)), k(size_t(s.dk)), v(size_t(s.dv)), u(size_t(s.dv), 0.0);
        for (int e = 0; e < s.dk; ++e) {
          q[size_t(e)] = in.in(in.qkv, t, kh * s.dk + e);
          k[size_t(e)] = in.in(in.qkv, t, kw + kh * s.dk + e);
        }
        for (int j = 0; j < s.dv; ++j) v[size_t(j)] = in.in(in.qkv, t, 2 * kw + h * s.dv + j);
        q = l2(q);
        k = l2(k);
        for (double& x : q) x /= std::sqrt(double(s.dk));
        const double beta = 1.0 / (1.0 + std::exp(-double(in.in(in.b, t, h))));
        const double x = double(in.in(in.a, t, h)) + in.dt_bias.t.ptr<float>()[h];
        const double g = -std::exp(double(in.A_log.t.ptr<float>()[h])) * (x > 20 ? x : std::log1p(std::exp(x)));
        for (double& e : S) e *= std::exp(g);
        for (int e = 0; e < s.dk; ++e)
          for (int j = 0; j < s.dv; ++j) u[size_t(j)] += S[size_t(e * s.dv + j)] * k[size_t(e)];
        for (int e = 0; e < s.dk; ++e)
          for (int j = 0; j < s.dv; ++j) S[size_t(e * s.dv + j)] += k[size_t(e)] * beta * (v[size_t(j)] - u[size_t(j)]);
        for (int j = 0; j < s.dv; ++j) {
          double acc = 0;
          for (int e = 0; e < s.dk; ++e) acc += S[size_t(e * s.dv + j)] * q[size_t(e)];
          o[size_t((t * s.nv + h) * s.dv + j)] = acc;
        }
      }
    }
  }
  return o;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::string tag(const char* what, const GdnShape& s, const std::vector<int>& lens) {
  std::string r = std::string(what) + " nk" + std::to_string(s.nk) + " nv" + std::to_string(s.nv) + " dk" +
                  std::to_string(s.dk) + " dv" + std::to_string(s.dv) + " lens";
  for (int l : lens) r += " " + std::to_string(l);
  return r;
}

struct Case {
  GdnShape shape;
  std::vector<int> lens;
  float a_log_lo, a_log_hi;  // A_log range: [-1, 1] decays fast, [-5, -4] keeps memory over the whole sequence
};

const Case kCases[] = {
    {{1, 1, 8, 8}, {1}, -1, 1},
    {{1, 3, 8, 24}, {63}, -1, 1},
    {{2, 4, 32, 24}, {64}, -5, -4},
    {{3, 3, 24, 8}, {65}, -1, 1},
    {{2, 6, 16, 32}, {200}, -5, -4},
    {{1, 2, 24, 32}, {3, 64, 1, 65}, -1, 1},
    {{2, 4, 8, 24}, {200, 7, 19}, -5, -4},
    {{3, 6, 32, 8}, {63, 129, 1}, -2, 0},
};

}  // namespace

// Tolerances. o is bounded by about |v| ≤ 1 (unit keys, β ≤ 1 keep S contractive) times |q| ≤ dk^−½.
// The fp32 recurrence accumulates a few ulp per step, damped by the decay: observed ≤ 1.1e-7 against the
// double reference. The chunked form additionally solves a 64x64 unit-lower-triangular system whose
// off-diagonal entries β(kᵢ·kⱼ)Γᵢⱼ are up to 1 in size, which amplifies rounding: observed ≤ 6.2e-7.
// atol 2e-5 + rtol 1e-4 sits 30x above both and below what a wrong decay order or a state decay slip at a
// chunk seam produces (observed 3e-4 .. 6e-2 when those were injected).
constexpr double kAtol = 2e-5, kRtol = 1e-4;

TEST(CpuGdn, RecurrentAndChunkedMatchDoubleReference) {
  std::mt19937 rng(11);
  for (const Case& cs : kCases) {
    auto pk = packed_make(cs.lens);
    const int64_t T = pk->seqs.tokens, W = int64_t(cs.shape.nv) * cs.shape.dv;
    GdnInputs in(cs.shape, T, rng, cs.a_log_lo, cs.a_log_hi);
    const std::vector<double> want = ref_gdn(in, *pk);
    Mat rec(T, W, 5, 2), chk(T, W, 3, 0);
    cpu_gdn_recurrent(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, rec.t, pk->seqs, cs.shape);
    cpu_gdn_chunked(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, chk.t, pk->seqs, cs.shape, kCpuGdnChunk);
    count_mismatch(rec.host(), want, kAtol, kRtol, tag("recurrent vs double", cs.shape, cs.lens));
    count_mismatch(chk.host(), want, kAtol, kRtol, tag("chunked vs double", cs.shape, cs.lens));
    count_mismatch(chk.host(), to_double(rec.host()), kAtol, kRtol, tag("chunked vs recurrent", cs.shape, cs.lens));
    EXPECT_EQ(rec.guards_clobbered() + chk.guards_clobbered(), 0);
    // Other chunk lengths put the seams elsewhere; chunk 1 is the recurrence reorganised.
    for (int chunk : {1, 7, 16}) {
      Mat c2(T, W);
      cpu_gdn_chunked(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, c2.t, pk->seqs, cs.shape, chunk);
      count_mismatch(c2.host(), want, kAtol, kRtol,
                     tag(("chunk " + std::to_string(chunk)).c_str(), cs.shape, cs.lens));
    }
  }
}

// A packed run must give exactly the rows of separate per-sequence runs: the state resets at each start and
// chunks are counted from the sequence start.
TEST(CpuGdn, PackedEqualsSeparateSequencesBitwise) {
  std::mt19937 rng(12);
  const GdnShape shape{2, 4, 16, 24};
  const std::vector<int> lens = {65, 1, 63, 64, 7};
  auto pk = packed_make(lens);
  const int64_t T = pk->seqs.tokens, W = int64_t(shape.nv) * shape.dv;
  GdnInputs in(shape, T, rng, -5, -4);
  for (CpuGdnMode mode : {CpuGdnMode::chunked, CpuGdnMode::recurrent}) {
    CpuOps ops(mode);
    Mat all(T, W);
    ops.gdn_prefill(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, all.t, pk->seqs, shape, Tensor{});
    const std::vector<float> packed = all.host();
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t t0 = pk->cu[s], n = lens[s];
      auto one = packed_make({int(n)});
      Mat o1(n, W);
      ops.gdn_prefill(in.qkv.rows_view(t0, n), in.a.rows_view(t0, n), in.b.rows_view(t0, n), in.A_log.t,
                      in.dt_bias.t, o1.t, one->seqs, shape, Tensor{});
      const std::vector<float> alone = o1.host();
      ASSERT_EQ(0, std::memcmp(alone.data(), &packed[size_t(t0 * W)], alone.size() * 4))
          << "sequence " << s << " mode " << int(mode);
    }
  }
}

TEST(CpuGdn, CpuOpsDispatchesByMode) {
  std::mt19937 rng(13);
  const GdnShape shape{1, 2, 8, 16};
  auto pk = packed_make({70, 5});
  const int64_t T = pk->seqs.tokens, W = int64_t(shape.nv) * shape.dv;
  GdnInputs in(shape, T, rng, -1, 1);
  Mat via_ops(T, W), direct(T, W);
  CpuOps chunked;
  // The CPU oracle needs no workspace (it keeps its own host vectors): an empty tensor is the documented
  // argument.
  EXPECT_EQ(chunked.gdn_workspace_bytes(T, shape), 0);
  chunked.gdn_prefill(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, via_ops.t, pk->seqs, shape, Tensor{});
  cpu_gdn_chunked(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, direct.t, pk->seqs, shape, kCpuGdnChunk);
  EXPECT_EQ(via_ops.host(), direct.host());
  CpuOps recurrent(CpuGdnMode::recurrent);
  recurrent.gdn_prefill(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, via_ops.t, pk->seqs, shape, Tensor{});
  cpu_gdn_recurrent(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, direct.t, pk->seqs, shape);
  EXPECT_EQ(via_ops.host(), direct.host());
}

TEST(CpuGdn, RejectsBadShapes) {
  std::mt19937 rng(14);
  auto pk = packed_make({4});
  GdnInputs in({2, 4, 8, 8}, 4, rng, -1, 1);
  Mat out(4, 32);
  const GdnShape not_multiple{3, 4, 8, 8};
  EXPECT_THROW(cpu_gdn_recurrent(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, out.t, pk->seqs, not_multiple), Error);
  const GdnShape wrong_width{2, 4, 8, 16};
  EXPECT_THROW(cpu_gdn_chunked(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, out.t, pk->seqs, wrong_width, 64), Error);
  auto longer = packed_make({5});
  EXPECT_THROW(cpu_gdn_chunked(in.qkv, in.a, in.b, in.A_log.t, in.dt_bias.t, out.t, longer->seqs, in.shape, 64),
               Error);
}
