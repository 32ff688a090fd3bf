// CpuOps' mixture-of-experts ops (ops.h moe_route, moe_experts): the fp32 oracle of the MoE MLP. Routing follows
// transformers' TopKRouter literally (fp32 softmax, torch.topk, renormalisation); the experts run grouped by
// expert, one GEMM pair per expert over the tokens that picked it, as the CUDA backend's grouped GEMM will.
#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace df {

namespace {

void check_moe_shape(const char* op, const MoeShape& s) {
  DF_CHECK(s.experts > 0 && s.top_k >= 1 && s.top_k <= s.experts && s.inter > 0 && s.shared_inter >= 0,
           "%s: MoeShape experts %d, top_k %d, inter %d, shared_inter %d: experts and inter must be positive, "
           "top_k in 1..experts, shared_inter >= 0",
           op, s.experts, s.top_k, s.inter, s.shared_inter);
}

// c[M, N] = a[M, K] · w[N, K]ᵀ for contiguous host rows.
void gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, const float* w, float* c) {
  if (m > 0) cpu_gemm(false, true, m, n, k, 1.0f, a, k, w, k, 0.0f, c, n);
}

// One SwiGLU expert over m gathered rows x [m, H]: y [m, H] = down(silu(gate x) · up x), gate_up [2I, H] rows
// (gate then up) and down [H, I] rows at the given row strides. fp8: x (in place) and the SwiGLU output are
// rounded to e4m3 per token per shape.fp8_group columns before their GEMMs (MoeShape::fp8).
void expert_rows(int64_t m, int64_t H, int64_t I, float* x, const Tensor& gate_up, int64_t gu_row0,
                 const Tensor& down, int64_t down_row0, const MoeShape& shape, std::vector<float>& gu,
                 std::vector<float>& act, float* y) {
  gu.resize(size_t(m * 2 * I));
  act.resize(size_t(m * I));
  if (shape.fp8) cpu_fp8_round(x, m, H, H, shape.fp8_group);
  cpu_gemm(false, true, m, 2 * I, H, 1.0f, x, H, cpu_row(gate_up, gu_row0), gate_up.stride, 0.0f, gu.data(), 2 * I);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < I; ++i)
      act[size_t(r * I + i)] = cpu_silu(gu[size_t(r * 2 * I + i)]) * gu[size_t(r * 2 * I + I + i)];
  if (shape.fp8) cpu_fp8_round(act.data(), m, I, I, shape.fp8_group);
  cpu_gemm(false, true, m, H, I, 1.0f, act.data(), I, cpu_row(down, down_row0), down.stride, 0.0f, y, H);
}

}  // namespace

void cpu_topk_torch_order(std::vector<std::pair<double, int64_t>>& q, int64_t k) {
  // aten/src/ATen/native/TopKImpl.h (largest = true, sorted = true): NaN sorts as largest; a partial sort when
  // k·64 <= n, else nth_element for the k-th and a sort of the k − 1 before it. Equal values end up wherever these
  // libstdc++ algorithms put them, so the same calls give the same order.
  auto greater = [](const std::pair<double, int64_t>& x, const std::pair<double, int64_t>& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  const int64_t n = int64_t(q.size());
  DF_CHECK(k >= 1 && k <= n, "cpu_topk_torch_order: k %lld of %lld values", (long long)k, (long long)n);
  if (k * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), greater);
  } else {
    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), greater);
    std::sort(q.begin(), q.begin() + k - 1, greater);
  }
}

void CpuOps::moe_route(const Tensor& x, const Tensor& router, const MoeShape& shape, const Tensor& ids,
                       const Tensor& weights, const Tensor& /*workspace*/) {
  const char* op = "moe_route";
  check_moe_shape(op, shape);
  cpu_check_f32(op, "x", x, -1, -1);
  cpu_check_f32(op, "router", router, shape.experts, x.cols);
  cpu_check_i32(op, "ids", ids, x.rows, shape.top_k);
  cpu_check_f32(op, "weights", weights, x.rows, shape.top_k);
  const int64_t T = x.rows, E = shape.experts, k = shape.top_k;
  std::vector<float> logits(size_t(std::max<int64_t>(T * E, 1)));
  if (T > 0)
    cpu_gemm(false, true, T, E, x.cols, 1.0f, x.ptr<float>(), std::max(x.stride, x.cols), router.ptr<float>(),
             std::max(router.stride, router.cols), 0.0f, logits.data(), E);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* l = &logits[size_t(t * E)];
    const float mx = *std::max_element(l, l + E);
    std::vector<float> p(static_cast<size_t>(E));
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    std::vector<std::pair<double, int64_t>> q(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) q[size_t(e)] = {double(p[size_t(e)] / sum), e};
    cpu_topk_torch_order(q, k);
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) top_sum += float(q[size_t(j)].first);
    int32_t* id = reinterpret_cast<int32_t*>(ids.row_bytes(t));
    float* w = cpu_row(weights, t);
    for (int64_t j = 0; j < k; ++j) {
      id[j] = int32_t(q[size_t(j)].second);
      w[j] = shape.renormalise ? float(q[size_t(j)].first) / top_sum : float(q[size_t(j)].first);
    }
  }
}

void CpuOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                         const MoeShape& shape, const Tensor& out, const Tensor& /*workspace*/) {
  const char* op = "moe_experts";
  check_moe_shape(op, shape);
  const int64_t T = x.rows, H = x.cols, E = shape.experts, k = shape.top_k, I = shape.inter, Is = shape.shared_inter;
  cpu_check_f32(op, "x", x, -1, -1);
  cpu_check_i32(op, "ids", ids, T, k);
  cpu_check_f32(op, "weights", weights, T, k);
  cpu_check_f32(op, "gate_up", w.gate_up, E * 2 * I, H);
  cpu_check_f32(op, "down", w.down, E * H, I);
  cpu_check_f32(op, "out", out, T, H);
  if (Is > 0) {
    cpu_check_f32(op, "shared_gate_up", w.shared_gate_up, 2 * Is, H);
    cpu_check_f32(op, "shared_down", w.shared_down, H, Is);
    cpu_check_f32(op, "shared_gate", w.shared_gate, 1, H);
  }
  DF_CHECK(!shape.fp8 || shape.fp8_group >= 0, "%s: fp8_group %d must be 0 (per token) or positive", op,
           shape.fp8_group);
  // Counting sort of the (token, slot) pairs by expert: expert e's pairs at [start[e], start[e + 1]), in token order.
  std::vector<int64_t> start(size_t(E + 1), 0), tok(size_t(T * k)), slot(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* id = reinterpret_cast<const int32_t*>(ids.row_bytes(t));
    for (int64_t j = 0; j < k; ++j) {
      DF_CHECK(id[j] >= 0 && id[j] < E, "%s: token %lld picks expert %d of %lld", op, (long long)t, id[j],
               (long long)E);
      ++start[size_t(id[j]) + 1];
    }
  }
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] += start[size_t(e)];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* id = reinterpret_cast<const int32_t*>(ids.row_bytes(t));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = fill[size_t(id[j])]++;
      tok[size_t(at)] = t;
      slot[size_t(at)] = j;
    }
  }
  std::vector<float> acc(size_t(T * H), 0.0f), xs, ys, gu, act;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = start[size_t(e)], m = start[size_t(e + 1)] - b;
    if (m == 0) continue;
    xs.resize(size_t(m * H));
    ys.resize(size_t(m * H));
    for (int64_t r = 0; r < m; ++r) std::copy_n(cpu_row(x, tok[size_t(b + r)]), H, &xs[size_t(r * H)]);
    expert_rows(m, H, I, xs.data(), w.gate_up, e * 2 * I, w.down, e * H, shape, gu, act, ys.data());
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = tok[size_t(b + r)];
      const float wt = cpu_row(weights, t)[slot[size_t(b + r)]];
      for (int64_t c = 0; c < H; ++c) acc[size_t(t * H + c)] += ys[size_t(r * H + c)] * wt;
    }
  }
  if (Is > 0 && T > 0) {
    xs.resize(size_t(T * H));
    ys.resize(size_t(T * H));
    for (int64_t t = 0; t < T; ++t) std::copy_n(cpu_row(x, t), H, &xs[size_t(t * H)]);
    std::vector<float> g(static_cast<size_t>(T));
    gemm_rows(T, 1, H, xs.data(), w.shared_gate.ptr<float>(), g.data());  // before expert_rows rounds xs
    expert_rows(T, H, Is, xs.data(), w.shared_gate_up, 0, w.shared_down, 0, shape, gu, act, ys.data());
    for (int64_t t = 0; t < T; ++t) {
      const float s = cpu_sigmoid(g[size_t(t)]);
      for (int64_t c = 0; c < H; ++c) acc[size_t(t * H + c)] += s * ys[size_t(t * H + c)];
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    float* o = cpu_row(out, t);
    for (int64_t c = 0; c < H; ++c) o[c] += acc[size_t(t * H + c)];
  }
}

}  // namespace df
