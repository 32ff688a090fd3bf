// The CUDA backend of the op interface: bf16 activations, f32 parameter vectors, one stream, cudaMalloc'd
// memory. Every op is a thin check of shapes/dtypes followed by one launcher call into kernels/.
// Only compiled when CUDA is on; CPU-only code must not include this header (it pulls in cuda_runtime.h).
#pragma once
#include <cuda_runtime.h>

#include "ops/cuda/cuda_device.h"
#include "ops/ops.h"

namespace df {

class CudaOps final : public Ops {
 public:
  // Selects `device` for this thread and creates the stream and the cuBLASLt context on it.
  explicit CudaOps(int device = 0);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::cuda; }
  DType act_dtype() const override { return DType::bf16; }
  const char* name() const override { return "cuda"; }
  void check_target(const TargetShape& shape) const override;
  // The stream every op is queued on (NCCL sends and events order themselves against it).
  cudaStream_t stream() const { return dev_.stream; }

  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload_f32(const Tensor& dst, const float* host) override;
  void upload_raw(const Tensor& dst, const void* host) override;
  void download_f32(const Tensor& src, float* host) override;
  void download_raw(const Tensor& src, void* host) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) override;
  void synchronize() override;
  std::unique_ptr<WirePool> wire_pool(int depth, size_t bytes, bool mirrors = true) override {
    return cuda_wire_pool(dev_, depth, bytes, mirrors);
  }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) override;
  void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) override;
  void add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out, float eps,
                   NormKind kind) override;
  void qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim, float theta,
                    float eps, NormKind kind) override;
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const SeqLayout& seqs,
                        int hq, int hkv, int hd, float scale, const Tensor* gate = nullptr) override;
  void sigmoid_gate(const Tensor& o, const Tensor& gate) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) override;
  void gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                   const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape,
                   const Tensor& workspace) override;
  int64_t gdn_workspace_bytes(int64_t tokens, const GdnShape& shape) const override;
  // Fused (kernels/gdn/gdn.cu gdn_mixer_launch) unless the shape or layout needs the three ops.
  void gdn_mixer(const Tensor& x, const Tensor& z, const Tensor& a, const Tensor& b, const GdnWeights& w,
                 const Tensor& out, const SeqLayout& seqs, const GdnShape& shape, const Tensor& workspace,
                 const Tensor& conv, const Tensor& o) override;
  void gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                     float eps) override;
  // Mixture of experts (kernels/moe/moe.cu): routing on the device, the experts as grouped GEMMs.
  void moe_route(const Tensor& x, const Tensor& router, const MoeShape& shape, const Tensor& ids,
                 const Tensor& weights, const Tensor& workspace) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                   const MoeShape& shape, const Tensor& out, const Tensor& workspace) override;
  int64_t moe_workspace_bytes(int64_t tokens, const MoeShape& shape) const override;
  bool fp8_gemm() const override { return true; }
  void fp8_quantize_rows(const Tensor& x, const Tensor& codes, const Tensor& scales, bool write_back) override;
  void swiglu_fp8(const Tensor& gate, const Tensor& up, const Tensor& codes, const Tensor& scales) override;
  void rmsnorm_fp8(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind,
                   const Tensor& codes, const Tensor& scales, bool write_back) override;
  void gemm_fp8(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& sw, const Tensor& c,
                float beta) override;
  void fp8_quantize_groups(const Tensor& x, const Tensor& codes, const Tensor& scales, bool write_back) override;
  void gemm_fp8_block(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& sw, const Tensor& c,
                      float beta) override;
  // Incremental decoding (kernels/decode/decode.cu). attention_cached's split-KV partials live in decode_ws_, grown
  // on first use of a larger shape (the step size and head counts, not the cache length, set its size).
  void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t past, int hq,
                        int hkv, int hd, float scale, const Tensor* gate = nullptr) override;
  void gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                  const Tensor& out, const Tensor& state, const Tensor& states, const GdnShape& shape) override;

 private:
  CudaDevice dev_;
  void* decode_ws_ = nullptr;
  size_t decode_ws_bytes_ = 0;
};

}  // namespace df
