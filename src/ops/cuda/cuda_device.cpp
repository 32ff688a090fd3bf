// CudaDevice and the CUDA tensor checks (cuda_device.h): the one place the CUDA backends create their stream
// and cuBLASLt context, allocate, move host bytes and convert between f32 and bf16.
#include "ops/cuda/cuda_device.h"

#include "core/dtype.h"
#include "core/log.h"
#include "kernels/dispatch/measured.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

void cuda_expect(const Tensor& t, DType dt, const char* op, const char* what) {
  DF_CHECK(t.device == Device::cuda && t.data != nullptr, "%s: tensor '%s' %s must be non-empty CUDA memory",
           op, what, t.shape_str().c_str());
  DF_CHECK(t.dtype == dt, "%s: tensor '%s' is %s, expected %s", op, what, t.shape_str().c_str(),
           dtype_name(dt));
}

void cuda_expect_shape(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* what) {
  DF_CHECK(t.rows == rows && t.cols == cols, "%s: tensor '%s' is %s, expected [%lld, %lld]", op, what,
           t.shape_str().c_str(), (long long)rows, (long long)cols);
}

void cuda_expect_as(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op, const char* what) {
  cuda_expect(t, dt, op, what);
  cuda_expect_shape(t, rows, cols, op, what);
}

void cuda_expect_float(const Tensor& t, const char* op, const char* what) {
  DF_CHECK(t.device == Device::cuda && t.data != nullptr && cuda_is_float(t.dtype),
           "%s: tensor '%s' %s must be non-empty CUDA f32 or bf16 memory", op, what, t.shape_str().c_str());
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls are not poisoned
    return 0;
  }
  return n;
}

CudaDevice::CudaDevice(int device) : index(device) {
  int n = cuda_device_count();
  DF_CHECK(device >= 0 && device < n, "CUDA device %d requested but %d visible; check CUDA_VISIBLE_DEVICES",
           device, n);
  cuda_check_device_supported(device);
  DF_CUDA_CHECK(cudaSetDevice(device));
  DF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm = gemm_init();
  // Measured kernel choices (kernels/dispatch/measured.h) log through rank 0's info log.
  dispatch_log_set([](const std::string& line) { log_info("%s", line.c_str()); });
}

CudaDevice::~CudaDevice() {
  gemm_free(gemm);
  if (stream) cudaStreamDestroy(stream);
}

void* CudaDevice::alloc(size_t bytes) const {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  DF_CHECK(e == cudaSuccess, "cudaMalloc of %zu bytes on device %d failed: %s (lower the token budget?)",
           bytes, index, cudaGetErrorString(e));
  return p;
}

void CudaDevice::free(void* p) const {
  if (p) DF_CUDA_CHECK(cudaFree(p));
}

void CudaDevice::upload_raw(const Tensor& dst, const void* host) const {
  DF_CHECK(dst.device == Device::cuda, "upload_raw: destination %s must be CUDA memory",
           dst.shape_str().c_str());
  if (dst.numel() == 0) return;
  size_t es = dtype_size(dst.dtype);
  DF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.stride * es, host, dst.cols * es, dst.cols * es, dst.rows,
                                  cudaMemcpyHostToDevice, stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaDevice::download_raw(const Tensor& src, void* host) const {
  DF_CHECK(src.device == Device::cuda, "download_raw: source %s must be CUDA memory",
           src.shape_str().c_str());
  if (src.numel() == 0) return;
  size_t es = dtype_size(src.dtype);
  DF_CUDA_CHECK(cudaMemcpy2DAsync(host, src.cols * es, src.data, src.stride * es, src.cols * es, src.rows,
                                  cudaMemcpyDeviceToHost, stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaDevice::copy(const Tensor& src, const Tensor& dst) const {
  DF_CHECK(src.rows == dst.rows && src.cols == dst.cols, "copy: shapes differ, %s -> %s",
           src.shape_str().c_str(), dst.shape_str().c_str());
  DF_CHECK(src.device == Device::cuda && dst.device == Device::cuda,
           "copy: both tensors must be CUDA memory");
  if (src.numel() == 0) return;
  if (src.dtype == dst.dtype) {
    size_t es = dtype_size(src.dtype);
    DF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.stride * es, src.data, src.stride * es, src.cols * es,
                                    src.rows, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  DF_CHECK(cuda_is_float(src.dtype) && cuda_is_float(dst.dtype),
           "copy: %s -> %s is not an f32/bf16 conversion", src.shape_str().c_str(), dst.shape_str().c_str());
  cast_launch(src.data, src.dtype == DType::f32, src.stride, dst.data, dst.dtype == DType::f32, dst.stride,
              src.rows, src.cols, stream);
}

void cuda_embedding(const CudaDevice& dev, const Tensor& ids, const Tensor& table, const Tensor& out) {
  cuda_expect(ids, DType::i32, "embedding", "ids");
  cuda_expect(table, DType::bf16, "embedding", "table");
  cuda_expect(out, DType::bf16, "embedding", "out");
  DF_CHECK(ids.rows == 1 && ids.contiguous(), "embedding: ids must be [1, T], got %s",
           ids.shape_str().c_str());
  cuda_expect_shape(out, ids.cols, table.cols, "embedding", "out");
  embedding_launch(static_cast<const int32_t*>(ids.data), static_cast<const bf16*>(table.data), table.stride,
                   static_cast<bf16*>(out.data), out.stride, ids.cols, table.cols, dev.stream);
}

void cuda_swiglu(const CudaDevice& dev, const Tensor& gate, const Tensor& up, const Tensor& out) {
  cuda_expect(gate, DType::bf16, "swiglu", "gate");
  cuda_expect(up, DType::bf16, "swiglu", "up");
  cuda_expect(out, DType::bf16, "swiglu", "out");
  cuda_expect_shape(up, gate.rows, gate.cols, "swiglu", "up");
  cuda_expect_shape(out, gate.rows, gate.cols, "swiglu", "out");
  swiglu_launch(static_cast<const bf16*>(gate.data), gate.stride, static_cast<const bf16*>(up.data),
                up.stride, static_cast<bf16*>(out.data), out.stride, gate.rows, gate.cols, dev.stream);
}

void cuda_gemm(const CudaDevice& dev, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               const Tensor& c_in, const Tensor& c, float alpha, float beta) {
  cuda_expect(a, DType::bf16, "gemm", "a");
  cuda_expect(b, DType::bf16, "gemm", "b");
  cuda_expect_float(c, "gemm", "c");
  const int64_t m = trans_a ? a.cols : a.rows, k = trans_a ? a.rows : a.cols, n = trans_b ? b.rows : b.cols;
  DF_CHECK((trans_b ? b.cols : b.rows) == k,
           "gemm: op(a) of %s (trans %d) and op(b) of %s (trans %d) disagree on K", a.shape_str().c_str(),
           int(trans_a), b.shape_str().c_str(), int(trans_b));
  cuda_expect_shape(c, m, n, "gemm", "c");
  const bool in_place = c_in.data == c.data && cuda_gemm_ld(c_in) == cuda_gemm_ld(c);
  if (!in_place) {
    cuda_expect(c_in, c.dtype, "gemm", "c_in");
    cuda_expect_shape(c_in, m, n, "gemm", "c_in");
    DF_CHECK(!tensor_spans_overlap(c_in, c), "gemm: c_in %s overlaps c %s without being it",
             c_in.shape_str().c_str(), c.shape_str().c_str());
  }
  gemm_launch_addend(dev.gemm, a.data, cuda_gemm_ld(a), trans_a, b.data, cuda_gemm_ld(b), trans_b, c_in.data,
                     cuda_gemm_ld(c_in), c.data, cuda_gemm_ld(c), c.dtype == DType::f32, m, n, k, alpha, beta,
                     dev.stream);
}

}  // namespace df
