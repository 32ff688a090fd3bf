// Tensor views: slicing and reshaping with the bounds checks that catch layout mistakes early.
#include "core/tensor.h"

namespace df {

Tensor tensor_make(void* data, DType dtype, Device device, int64_t rows, int64_t cols) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rows = rows;
  t.cols = cols;
  t.stride = cols;
  return t;
}

Tensor Tensor::cols_view(int64_t c0, int64_t n) const {
  DF_CHECK(c0 >= 0 && n >= 0 && c0 + n <= cols, "column view [%lld, %lld) outside %s", (long long)c0,
           (long long)(c0 + n), shape_str().c_str());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + c0 * dtype_size(dtype);
  t.cols = n;
  return t;
}

Tensor Tensor::rows_view(int64_t r0, int64_t n) const {
  DF_CHECK(r0 >= 0 && n >= 0 && r0 + n <= rows, "row view [%lld, %lld) outside %s", (long long)r0,
           (long long)(r0 + n), shape_str().c_str());
  Tensor t = *this;
  t.data = row_bytes(r0);
  t.rows = n;
  return t;
}

Tensor Tensor::reshape(int64_t r, int64_t c) const {
  DF_CHECK(contiguous() && r * c == numel(), "cannot reshape %s to [%lld, %lld]", shape_str().c_str(),
           (long long)r, (long long)c);
  Tensor t = *this;
  t.rows = r;
  t.cols = c;
  t.stride = c;
  return t;
}

bool tensor_spans_overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto end = [](const Tensor& t) { return t.row_bytes(t.rows - 1) + t.cols * dtype_size(t.dtype); };
  const char *a0 = static_cast<const char*>(a.data), *b0 = static_cast<const char*>(b.data);
  return a0 < end(b) && b0 < end(a);
}

std::string Tensor::shape_str() const {
  return strfmt("%s[%lld, %lld]%s", dtype_name(dtype), (long long)rows, (long long)cols,
                contiguous() ? "" : strfmt(" stride %lld", (long long)stride).c_str());
}

}  // namespace df
