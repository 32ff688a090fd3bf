// The CPU fp32 backend of the op interface: the oracle every CUDA kernel and golden test is checked against,
// and the backend of the CPU demo. Plain loops parallelised with OpenMP; GEMM through OpenBLAS when present.
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace df {

// Which Gated DeltaNet form gdn_prefill runs: the chunked UT/WY form (what FLA and the GPU compute) or the
// token-by-token recurrence (the definition, slower).
enum class CpuGdnMode : uint8_t { chunked, recurrent };

// c[M, N] = a[M, K] · w[N, K]ᵀ + beta · c with row strides lda/ldw/ldc; c is not read when beta == 0.
// The OpenMP cache-blocked loop used when OpenBLAS is absent; public so tests can check it against BLAS.
void cpu_gemm_loop(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                   float beta, float* c, int64_t ldc);
// True when CpuOps::gemm goes through cblas_sgemm (built with OpenBLAS), false when it runs cpu_gemm_loop.
bool cpu_gemm_uses_blas();
// The general form both CPU backends call: c[M, N] = alpha · op(a) · op(b) + beta · c, op(x) = xᵀ when
// trans_x, row-major with row strides lda/ldb/ldc (at least the stored row length). cblas_sgemm when built
// with it; without it cpu_gemm_loop for the Linear form (false, true, alpha 1) and a double-accumulating loop
// otherwise. c is not read when beta == 0; k == 0 gives c = beta · c.
void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

class CpuOps final : public Ops {
 public:
  explicit CpuOps(CpuGdnMode gdn_mode = CpuGdnMode::chunked) : gdn_mode_(gdn_mode) {}

  Device device() const override { return Device::cpu; }
  DType act_dtype() const override { return DType::f32; }
  const char* name() const override { return "cpu"; }

  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload_f32(const Tensor& dst, const float* host) override;
  void upload_raw(const Tensor& dst, const void* host) override;
  void download_f32(const Tensor& src, float* host) override;
  void download_raw(const Tensor& src, void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) override;
  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) override;
  void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) override;
  void add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out, float eps,
                   NormKind kind) override;
  void qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim,
                    float theta, float eps, NormKind kind) override;
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const SeqLayout& seqs, int hq, int hkv, int hd, float scale,
                        const Tensor* gate = nullptr) override;
  void sigmoid_gate(const Tensor& o, const Tensor& gate) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) override;
  void gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                   const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape,
                   const Tensor& workspace) override;
  void fp8_round_rows(const Tensor& x, int64_t group = 0) override;
  void gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                     float eps) override;
  void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t past, int hq,
                        int hkv, int hd, float scale, const Tensor* gate = nullptr) override;
  void gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                  const Tensor& out, const Tensor& state, const Tensor& states, const GdnShape& shape) override;
  // In cpu_moe.cpp.
  void moe_route(const Tensor& x, const Tensor& router, const MoeShape& shape, const Tensor& ids,
                 const Tensor& weights, const Tensor& workspace) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                   const MoeShape& shape, const Tensor& out, const Tensor& workspace) override;

 private:
  CpuGdnMode gdn_mode_;
};

// Puts the k largest of q's (value, index) pairs first in descending order exactly as torch.topk does on the CPU
// (sorted, largest), equal values included: MoE routing ties go where transformers sends them (cpu_moe.cpp).
void cpu_topk_torch_order(std::vector<std::pair<double, int64_t>>& q, int64_t k);

// Checks shared by the CPU ops and the CPU Gated DeltaNet: a host f32 tensor of the given shape (rows < 0 or
// cols < 0: any), a host i32 tensor of exactly [rows, cols], and a SeqLayout whose host offsets cover exactly
// `tokens` rows.
void cpu_check_f32(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols);
void cpu_check_i32(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols);
void cpu_check_layout(const char* op, const SeqLayout& seqs, int64_t tokens);

// Row r of a host f32 tensor, honouring its row stride.
inline float* cpu_row(const Tensor& t, int64_t r) { return reinterpret_cast<float*>(t.row_bytes(r)); }
inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// In place: rows [rows, cols] of host f32 at row stride `stride` rounded to e4m3 and back per row (group 0)
// or per `group` columns of a row (CpuOps::fp8_round_rows, the MoE experts' FP8 inputs).
void cpu_fp8_round(float* x, int64_t rows, int64_t cols, int64_t stride, int64_t group);

inline float cpu_silu(float x) { return x / (1.0f + std::exp(-x)); }

// out = norm(x) over n values (out may equal x); returns rstd = rsqrt(mean(x²) + eps), the sum of squares in
// double. Shared by the target's norms and the drafter's training forward so both round the same way.
float cpu_norm_row(const float* x, const float* w, float* out, int64_t n, float eps, NormKind kind);
// RoPE as transformers computes it: inv_freq_j = 1 / theta^(2j / rot_dim) in fp32 (rot_dim / 2 values), the
// angle pos · inv_freq_j rounded to fp32, its cos/sin evaluated in double and rounded once.
std::vector<float> cpu_rope_inv_freq(int rot_dim, float theta);
void cpu_rope_cos_sin(int32_t pos, const std::vector<float>& inv_freq, float* cs, float* sn);
// Rotate-half in place on v[0, 2·half): (v_j, v_{j+half}) ← (v_j·c − v_{j+half}·s, v_{j+half}·c + v_j·s);
// with −sin it applies the transpose (the backward's rotation by −angle).
inline void cpu_rope_rotate(float* v, int half, const float* cs, const float* sn) {
  for (int j = 0; j < half; ++j) {
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * cs[j] - x2 * sn[j];
    v[j + half] = x2 * cs[j] + x1 * sn[j];
  }
}

}  // namespace df
