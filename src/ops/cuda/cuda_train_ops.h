// The CUDA backend of the drafter's training ops (train_ops.h): bf16 activations and GEMM operands, f32 norm
// weights, statistics, parameter gradients and optimizer buffers. Shares the device, the stream, the one
// cuBLASLt entry point (kernels/gemm/gemm.cuh) and the kernels of the target's CudaOps; only compiled with CUDA.
#pragma once
#include <cuda_runtime.h>

#include <unordered_map>

#include "ops/cuda/cuda_device.h"
#include "ops/train_ops.h"

namespace df {

// The arguments every head-loss op checks (domino_head_loss, dflash2_selector_loss): y bf16 [N, H] of whole
// blocks of B rows, lm_head bf16 [V, H] contiguous, labels i32, row_w f32, argmax i32 [1, N] and the
// statistics slots; messages name op and the tensor.
void cuda_expect_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& labels, const Tensor& row_w,
                           const Tensor& argmax, const Tensor& stats, int B, int H, int V, const char* op);

class CudaTrainOps final : public TrainOps {
 public:
  // Selects `device` for this thread and creates the stream and the cuBLASLt context on it. lm_head_loss
  // holds logits for at most loss_chunk_rows rows at a time ([chunk, V] f32).
  explicit CudaTrainOps(int device = 0, int64_t loss_chunk_rows = 1024);
  ~CudaTrainOps() override;
  CudaTrainOps(const CudaTrainOps&) = delete;
  CudaTrainOps& operator=(const CudaTrainOps&) = delete;

  Device device() const override { return Device::cuda; }
  const char* name() const override { return "cuda"; }
  DType act_dtype() const override { return DType::bf16; }
  cudaStream_t stream() const { return dev_.stream; }
  int device_index() const { return dev_.index; }
  // Device bytes this backend holds (alloc_bytes and the op scratch), now and at most since construction:
  // what `plan vram` itemises for a drafter, checked against it by tests/gpu/test_plan_vram_cuda.cpp. The
  // cuBLASLt context's own buffers (kernels/train/train_workspace.h) are not included.
  size_t live_bytes() const { return live_bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }

  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload_raw(const Tensor& dst, const void* host) override;
  void download_raw(const Tensor& src, void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  std::unique_ptr<WirePool> wire_pool(int depth, size_t bytes, bool mirrors = true) override {
    return cuda_wire_pool(dev_, depth, bytes, mirrors);
  }

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

  // Domino's head and its proposals (cuda_train_ops.cpp, kernels/train/domino_head.cu).
  void domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                        const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                        const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DominoHeadWeights& dw, const Tensor& stats) override;
  std::vector<int32_t> domino_head_propose(const Tensor& y, const Tensor& lm_head, const Tensor& embed,
                                           const DominoHeadWeights& w, const DominoHeadDims& d,
                                           int32_t first) override;

  // DFlash2's convolution and selector (cuda_dflash2.cpp, kernels/train/dflash2_conv.cu and _selector.cu).
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

  double sum_squares(const Tensor& x) override;
  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& p_lp,
             const AdamW& hp) override;

  // DSpark's head (kernels/train/dspark_head.cu).
  void dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                        const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                        const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                        const DSparkHeadWeights& dw, const Tensor& stats) override;
  std::vector<int32_t> dspark_head_propose(const Tensor& y, const Tensor& lm_head, const DSparkHeadWeights& w,
                                           const DSparkHeadDims& d, int32_t first,
                                           std::vector<double>* confidence) override;

  // ---- drafter bookkeeping (cuda_train_stats.cpp, kernels/train/loss_stats.cu) --------------------------------
  void loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss, const Tensor& p_label,
                      const Tensor& argmax, const LossRowArgs& a, const Tensor& row_w,
                      const Tensor& stats) override;

 private:
  // Device scratch of at least `bytes` (backward partial sums, attention and loss workspaces): one buffer for
  // every op, since they run one after another on the stream; grown, never shrunk.
  void* scratch(size_t bytes);
  // A head's proposal launcher left `block` tokens on the device (the first the committed one): the others,
  // after the stream drained.
  std::vector<int32_t> download_proposals(const int32_t* tok, int block);
  void* tracked_alloc(size_t bytes);
  void tracked_free(void* p);

  CudaDevice dev_;
  int64_t loss_chunk_rows_ = 1024;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::unordered_map<void*, size_t> sizes_;
  size_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace df
