// CudaOps: validates each op's tensors (device, dtype, shapes; messages name the op and the tensor) and
// forwards raw pointers, row strides and the stream to the launchers in kernels/.
#include "ops/cuda/cuda_ops.h"

#include <vector>

#include "core/dtype.h"
#include "kernels/cuda_check.cuh"
#include "kernels/gemm.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  DF_CHECK(t.device == Device::cuda && t.data != nullptr, "%s: tensor '%s' %s must be non-empty CUDA memory", op, what,
           t.shape_str().c_str());
  DF_CHECK(t.dtype == dt, "%s: tensor '%s' is %s, expected %s", op, what, t.shape_str().c_str(), dtype_name(dt));
}

void expect_shape(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* what) {
  DF_CHECK(t.rows == rows && t.cols == cols, "%s: tensor '%s' is %s, expected [%lld, %lld]", op, what,
           t.shape_str().c_str(), (long long)rows, (long long)cols);
}

bf16* bptr(const Tensor& t) { return static_cast<bf16*>(t.data); }
float* fptr(const Tensor& t) { return static_cast<float*>(t.data); }
const int32_t* iptr(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls are not poisoned
    return 0;
  }
  return n;
}

CudaOps::CudaOps(int device) : device_(device) {
  int n = cuda_device_count();
  DF_CHECK(device >= 0 && device < n, "CUDA device %d requested but %d visible; check CUDA_VISIBLE_DEVICES", device, n);
  DF_CUDA_CHECK(cudaSetDevice(device));
  DF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = gemm_init();
}

CudaOps::~CudaOps() {
  gemm_free(gemm_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaOps::alloc_bytes(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  DF_CHECK(e == cudaSuccess, "cudaMalloc of %zu bytes on device %d failed: %s (lower the token budget?)", bytes,
           device_, cudaGetErrorString(e));
  return p;
}

void CudaOps::free_bytes(void* p) {
  if (p) DF_CUDA_CHECK(cudaFree(p));
}

void CudaOps::upload_f32(const Tensor& dst, const float* host) {
  DF_CHECK(dst.device == Device::cuda && is_float(dst.dtype), "upload_f32: destination %s must be CUDA f32/bf16",
           dst.shape_str().c_str());
  size_t es = dtype_size(dst.dtype);
  std::vector<uint16_t> tmp;
  const void* src = host;
  if (dst.dtype == DType::bf16) {
    tmp.resize(static_cast<size_t>(dst.numel()));
    for (size_t i = 0; i < tmp.size(); ++i) tmp[i] = f32_to_bf16(host[i]);
    src = tmp.data();
  }
  DF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.stride * es, src, dst.cols * es, dst.cols * es, dst.rows,
                                  cudaMemcpyHostToDevice, stream_));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::upload_raw(const Tensor& dst, const void* host) {
  DF_CHECK(dst.device == Device::cuda, "upload_raw: destination %s must be CUDA memory", dst.shape_str().c_str());
  size_t es = dtype_size(dst.dtype);
  DF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.stride * es, host, dst.cols * es, dst.cols * es, dst.rows,
                                  cudaMemcpyHostToDevice, stream_));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::download_raw(const Tensor& src, void* host) {
  DF_CHECK(src.device == Device::cuda, "download_raw: source %s must be CUDA memory", src.shape_str().c_str());
  const size_t es = dtype_size(src.dtype);
  DF_CUDA_CHECK(cudaMemcpy2DAsync(host, src.cols * es, src.data, src.stride * es, src.cols * es, src.rows,
                                  cudaMemcpyDeviceToHost, stream_));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::download_f32(const Tensor& src, float* host) {
  DF_CHECK(src.device == Device::cuda && is_float(src.dtype), "download_f32: source %s must be CUDA f32/bf16",
           src.shape_str().c_str());
  size_t es = dtype_size(src.dtype);
  std::vector<uint16_t> tmp;
  void* dst = host;
  if (src.dtype == DType::bf16) {
    tmp.resize(static_cast<size_t>(src.numel()));
    dst = tmp.data();
  }
  DF_CUDA_CHECK(cudaMemcpy2DAsync(dst, src.cols * es, src.data, src.stride * es, src.cols * es, src.rows,
                                  cudaMemcpyDeviceToHost, stream_));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (src.dtype == DType::bf16)
    for (size_t i = 0; i < tmp.size(); ++i) host[i] = bf16_to_f32(tmp[i]);
}

void CudaOps::copy(const Tensor& src, const Tensor& dst) {
  DF_CHECK(src.rows == dst.rows && src.cols == dst.cols, "copy: shapes differ, %s -> %s", src.shape_str().c_str(),
           dst.shape_str().c_str());
  DF_CHECK(src.device == Device::cuda && dst.device == Device::cuda, "copy: both tensors must be CUDA memory");
  if (src.dtype == dst.dtype) {
    size_t es = dtype_size(src.dtype);
    DF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.stride * es, src.data, src.stride * es, src.cols * es, src.rows,
                                    cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  DF_CHECK(is_float(src.dtype) && is_float(dst.dtype), "copy: %s -> %s is not an f32/bf16 conversion",
           src.shape_str().c_str(), dst.shape_str().c_str());
  cast_launch(src.data, src.dtype == DType::f32, src.stride, dst.data, dst.dtype == DType::f32, dst.stride, src.rows,
              src.cols, stream_);
}

void CudaOps::fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) {
  DF_CHECK(dst.device == Device::cuda && is_float(dst.dtype), "fill_normal: destination %s must be CUDA f32/bf16",
           dst.shape_str().c_str());
  fill_normal_launch(dst.data, dst.dtype == DType::f32, dst.stride, dst.rows, dst.cols, mean, std, seed, stream,
                     stream_);
}

void CudaOps::synchronize() { DF_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  expect(ids, DType::i32, "embedding", "ids");
  expect(table, DType::bf16, "embedding", "table");
  expect(out, DType::bf16, "embedding", "out");
  DF_CHECK(ids.rows == 1 && ids.contiguous(), "embedding: ids must be [1, T], got %s", ids.shape_str().c_str());
  expect_shape(out, ids.cols, table.cols, "embedding", "out");
  embedding_launch(iptr(ids), bptr(table), table.stride, bptr(out), out.stride, ids.cols, table.cols, stream_);
}

void CudaOps::gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) {
  expect(a, DType::bf16, "gemm", "a");
  expect(w, DType::bf16, "gemm", "w");
  DF_CHECK(c.device == Device::cuda && is_float(c.dtype), "gemm: c %s must be CUDA bf16 or f32", c.shape_str().c_str());
  DF_CHECK(a.cols == w.cols, "gemm: a %s and w %s disagree on K", a.shape_str().c_str(), w.shape_str().c_str());
  expect_shape(c, a.rows, w.rows, "gemm", "c");
  gemm_launch(gemm_, a.data, a.stride, w.data, w.stride, c.data, c.stride, c.dtype == DType::f32, a.rows, w.rows,
              a.cols, beta, stream_);
}

void CudaOps::rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) {
  expect(x, DType::bf16, "rmsnorm", "x");
  expect(w, DType::f32, "rmsnorm", "w");
  expect(out, DType::bf16, "rmsnorm", "out");
  expect_shape(w, 1, x.cols, "rmsnorm", "w");
  expect_shape(out, x.rows, x.cols, "rmsnorm", "out");
  rmsnorm_launch(bptr(x), x.stride, fptr(w), bptr(out), out.stride, x.rows, x.cols, eps, kind == NormKind::zero_centred,
                 stream_);
}

void CudaOps::add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out, float eps,
                          NormKind kind) {
  expect(residual, DType::bf16, "add_rmsnorm", "residual");
  expect(delta, DType::bf16, "add_rmsnorm", "delta");
  expect(w, DType::f32, "add_rmsnorm", "w");
  expect(out, DType::bf16, "add_rmsnorm", "out");
  expect_shape(delta, residual.rows, residual.cols, "add_rmsnorm", "delta");
  expect_shape(w, 1, residual.cols, "add_rmsnorm", "w");
  expect_shape(out, residual.rows, residual.cols, "add_rmsnorm", "out");
  add_rmsnorm_launch(bptr(residual), residual.stride, bptr(delta), delta.stride, fptr(w), bptr(out), out.stride,
                     residual.rows, residual.cols, eps, kind == NormKind::zero_centred, stream_);
}

void CudaOps::qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim,
                           float theta, float eps, NormKind kind) {
  expect(x, DType::bf16, "qk_norm_rope", "x");
  expect(w, DType::f32, "qk_norm_rope", "w");
  expect(pos, DType::i32, "qk_norm_rope", "pos");
  expect_shape(x, x.rows, (int64_t)heads * hd, "qk_norm_rope", "x");
  expect_shape(w, 1, hd, "qk_norm_rope", "w");
  expect_shape(pos, 1, x.rows, "qk_norm_rope", "pos");
  DF_CHECK(rot_dim >= 0 && rot_dim <= hd && rot_dim % 2 == 0, "qk_norm_rope: rot_dim %d must be even and <= hd %d",
           rot_dim, hd);
  qk_norm_rope_launch(bptr(x), x.stride, fptr(w), iptr(pos), x.rows, heads, hd, rot_dim, theta, eps,
                      kind == NormKind::zero_centred, stream_);
}

void CudaOps::attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const SeqLayout& seqs, int hq, int hkv, int hd, float scale, const Tensor* gate) {
  const char* op = "attention_causal";
  expect(q, DType::bf16, op, "q");
  expect(k, DType::bf16, op, "k");
  expect(v, DType::bf16, op, "v");
  expect(out, DType::bf16, op, "out");
  expect(seqs.cu, DType::i32, op, "seqs.cu");
  expect_shape(q, seqs.tokens, (int64_t)hq * hd, op, "q");
  expect_shape(k, seqs.tokens, (int64_t)hkv * hd, op, "k");
  expect_shape(v, seqs.tokens, (int64_t)hkv * hd, op, "v");
  expect_shape(out, seqs.tokens, (int64_t)hq * hd, op, "out");
  DF_CHECK(hkv > 0 && hq % hkv == 0, "%s: %d q heads are not a multiple of %d kv heads", op, hq, hkv);
  DF_CHECK(hd % 8 == 0 && hd <= 256, "%s: head_dim %d must be a multiple of 8 and <= 256", op, hd);
  if (gate) {
    expect(*gate, DType::bf16, op, "gate");
    expect_shape(*gate, seqs.tokens, (int64_t)hq * hd, op, "gate");
  }
  attention_causal_launch(bptr(q), q.stride, bptr(k), k.stride, bptr(v), v.stride, bptr(out), out.stride,
                          gate ? bptr(*gate) : nullptr, gate ? gate->stride : 0, iptr(seqs.cu), seqs.num_seqs,
                          seqs.tokens, seqs.max_len, hq, hkv, hd, scale, stream_);
}

void CudaOps::sigmoid_gate(const Tensor& o, const Tensor& gate) {
  expect(o, DType::bf16, "sigmoid_gate", "o");
  expect(gate, DType::bf16, "sigmoid_gate", "gate");
  expect_shape(gate, o.rows, o.cols, "sigmoid_gate", "gate");
  sigmoid_gate_launch(bptr(o), o.stride, bptr(gate), gate.stride, o.rows, o.cols, stream_);
}

void CudaOps::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  expect(gate, DType::bf16, "swiglu", "gate");
  expect(up, DType::bf16, "swiglu", "up");
  expect(out, DType::bf16, "swiglu", "out");
  expect_shape(up, gate.rows, gate.cols, "swiglu", "up");
  expect_shape(out, gate.rows, gate.cols, "swiglu", "out");
  swiglu_launch(bptr(gate), gate.stride, bptr(up), up.stride, bptr(out), out.stride, gate.rows, gate.cols, stream_);
}

void CudaOps::conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) {
  expect(x, DType::bf16, "conv1d_silu", "x");
  expect(w, DType::f32, "conv1d_silu", "w");
  expect(out, DType::bf16, "conv1d_silu", "out");
  expect(seqs.pos, DType::i32, "conv1d_silu", "seqs.pos");
  expect_shape(x, seqs.tokens, x.cols, "conv1d_silu", "x");
  expect_shape(w, x.cols, w.cols, "conv1d_silu", "w");
  expect_shape(out, x.rows, x.cols, "conv1d_silu", "out");
  DF_CHECK(w.contiguous() && w.cols == 4, "conv1d_silu: w %s must be contiguous [C, 4] (the only conv size built)",
           w.shape_str().c_str());
  conv1d_silu_launch(bptr(x), x.stride, fptr(w), static_cast<int>(w.cols), bptr(out), out.stride, iptr(seqs.pos),
                     x.rows, x.cols, stream_);
}

void CudaOps::gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                          const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& s,
                          const Tensor& workspace) {
  const char* op = "gdn_prefill";
  expect(qkv, DType::bf16, op, "qkv");
  expect(a, DType::bf16, op, "a");
  expect(b, DType::bf16, op, "b");
  expect(A_log, DType::f32, op, "A_log");
  expect(dt_bias, DType::f32, op, "dt_bias");
  expect(out, DType::bf16, op, "out");
  expect(seqs.cu, DType::i32, op, "seqs.cu");
  DF_CHECK(s.nk > 0 && s.nv % s.nk == 0, "%s: %d value heads are not a multiple of %d key heads", op, s.nv, s.nk);
  DF_CHECK(s.dk <= 128 && s.dv <= 128 && s.dk % 8 == 0 && s.dv % 8 == 0,
           "%s: head dims dk %d / dv %d must be multiples of 8 and <= 128", op, s.dk, s.dv);
  expect_shape(qkv, seqs.tokens, 2LL * s.nk * s.dk + (int64_t)s.nv * s.dv, op, "qkv");
  expect_shape(a, seqs.tokens, s.nv, op, "a");
  expect_shape(b, seqs.tokens, s.nv, op, "b");
  expect_shape(A_log, 1, s.nv, op, "A_log");
  expect_shape(dt_bias, 1, s.nv, op, "dt_bias");
  expect_shape(out, seqs.tokens, (int64_t)s.nv * s.dv, op, "out");
  // An empty workspace passes through as 0 bytes so the launcher's message gives the size that is needed.
  if (!workspace.empty()) {
    expect(workspace, DType::u8, op, "workspace");
    DF_CHECK(workspace.contiguous(), "%s: workspace %s must be contiguous", op,
             workspace.shape_str().c_str());
  }
  gdn_prefill_launch(bptr(qkv), qkv.stride, bptr(a), a.stride, bptr(b), b.stride, fptr(A_log), fptr(dt_bias),
                     bptr(out), out.stride, iptr(seqs.cu), seqs.num_seqs, seqs.tokens, seqs.max_len, s.nk,
                     s.nv, s.dk, s.dv, workspace.data, workspace.empty() ? 0 : workspace.nbytes(), stream_);
}

int64_t CudaOps::gdn_workspace_bytes(int64_t tokens, const GdnShape& s) const {
  return static_cast<int64_t>(gdn_prefill_workspace_bytes(tokens, s.nv, s.dk, s.dv));
}

void CudaOps::gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                            float eps) {
  expect(o, DType::bf16, "gated_rmsnorm", "o");
  expect(z, DType::bf16, "gated_rmsnorm", "z");
  expect(w, DType::f32, "gated_rmsnorm", "w");
  expect(out, DType::bf16, "gated_rmsnorm", "out");
  expect_shape(o, o.rows, (int64_t)heads * dv, "gated_rmsnorm", "o");
  expect_shape(z, o.rows, o.cols, "gated_rmsnorm", "z");
  expect_shape(w, 1, dv, "gated_rmsnorm", "w");
  expect_shape(out, o.rows, o.cols, "gated_rmsnorm", "out");
  gated_rmsnorm_launch(bptr(o), o.stride, bptr(z), z.stride, fptr(w), bptr(out), out.stride, o.rows, heads, dv, eps,
                       stream_);
}

void CudaOps::attention_cached(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int, int, int,
                               float, const Tensor*) {
  DF_FAIL("attention_cached is not yet on CUDA (incremental target decoding runs on the CPU); HINT: use "
          "--device cpu for eval / --generate");
}

void CudaOps::gdn_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const GdnShape&) {
  DF_FAIL("gdn_decode is not yet on CUDA (incremental target decoding runs on the CPU); HINT: use --device cpu "
          "for eval / --generate");
}

}  // namespace df
