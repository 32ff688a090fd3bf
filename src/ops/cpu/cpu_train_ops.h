// The CPU fp32 implementation of the drafter's training ops: the oracle the CUDA training kernels are checked
// against and the backend of the CPU demo. Plain loops parallelised with OpenMP, GEMM through OpenBLAS when
// present; every reduction runs in a fixed order so results do not depend on the thread count (what is and
// is not bit-identical: train_ops.h, Determinism).
#pragma once
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/train_ops.h"

namespace df {

class CpuTrainOps final : public TrainOps {
 public:
  // lm_head_loss processes this many active rows at a time (bounds the live logits to [chunk, V]).
  explicit CpuTrainOps(int loss_chunk_rows = 64) : loss_chunk_rows_(loss_chunk_rows) {}

  Device device() const override { return Device::cpu; }
  const char* name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::f32; }

  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload_raw(const Tensor& dst, const void* host) override;
  void download_raw(const Tensor& src, void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;

  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
            float beta) override;
  void gemm_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                const Tensor& out, float alpha, float beta) override;
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void scale_rows(const Tensor& x, const Tensor& s) override;
  void add_gaussian_noise(const Tensor& x, float std, uint64_t seed) override;

  void rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps) override;
  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw, float beta_dx, float beta_dw) override;
  void qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& y, const Tensor& rstd,
                        int heads, int hd, float theta, float eps) override;
  void qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dx, const Tensor& dw, int heads, int hd, float theta,
                        float beta_dw) override;

  void dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                            const Tensor& out, const Tensor& lse, const DFlashAttnShape& s) override;
  void dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const DFlashAttnShape& s) override;

  void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                  const Tensor& dup) override;

  void lm_head_loss(const Tensor& hidden, const Tensor& lm_head, const Tensor& labels, const Tensor& active,
                    const Tensor& target_hidden, LmLossKind kind, const Tensor& loss, const Tensor& p_label,
                    const Tensor& argmax, const Tensor& dhidden,
                    int64_t max_active = -1) override;

  void loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss, const Tensor& p_label,
                      const Tensor& argmax, const LossRowArgs& a, const Tensor& row_w,
                      const Tensor& stats) override;

  // cpu_dflash2.cpp
  void dflash2_conv_fwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                        const Tensor& resid, const Tensor& out, const Dflash2ConvDims& d) override;
  void dflash2_conv_bwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                        const Tensor& dout, const Tensor& du, const Tensor& dcoeff, const Tensor& dbase,
                        float beta_dbase, const Dflash2ConvDims& d) override;
  void dflash2_selector_loss(const Tensor& y, const Tensor& lm_head, const Dflash2SelectorWeights& w,
                             const Tensor& labels, const Tensor& prev, const Tensor& row_w,
                             const Dflash2SelectorArgs& a, const Tensor& argmax, const Tensor& dy,
                             const Dflash2SelectorWeights& dw, const Tensor& stats) override;
  std::vector<int32_t> dflash2_selector_propose(const Tensor& y, const Tensor& lm_head,
                                                const Dflash2SelectorWeights& w, const Dflash2SelectorDims& d,
                                                int32_t first) override;
  // cpu_domino.cpp
  void domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                        const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                        const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DominoHeadWeights& dw, const Tensor& stats) override;
  std::vector<int32_t> domino_head_propose(const Tensor& y, const Tensor& lm_head, const Tensor& embed,
                                           const DominoHeadWeights& w, const DominoHeadDims& d,
                                           int32_t first) override;

  // cpu_dspark.cpp
  void dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                        const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                        const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DSparkHeadWeights& dw, const Tensor& stats) override;
  std::vector<int32_t> dspark_head_propose(const Tensor& y, const Tensor& lm_head, const DSparkHeadWeights& w,
                                           const DSparkHeadDims& d, int32_t first,
                                           std::vector<double>* confidence) override;

  double sum_squares(const Tensor& x) override;
  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& p_lp,
             const AdamW& hp) override;

 private:
  int loss_chunk_rows_;
  CpuOps ops_;  // the target's CPU ops, for the ops whose math is the same (embedding, SwiGLU, uploads)
};

// The normal draw add_gaussian_noise adds (times std) at flat element index i: core/rng.h's
// rng_normal_at(seed, kRngStreamTrainNoise, i), which the CUDA backend draws too.
float cpu_noise_normal(uint64_t seed, uint64_t i);

}  // namespace df
