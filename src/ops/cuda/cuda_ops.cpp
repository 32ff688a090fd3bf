// CudaOps: validates each op's tensors (device, dtype, shapes; messages name the op and the tensor) and
// forwards raw pointers, row strides and the stream to the launchers in kernels/.
#include "ops/cuda/cuda_ops.h"

#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/moe/moe.cuh"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

// The checks conv1d_silu, gdn_prefill and gdn_mixer share. The causal conv's weights for x_cols channels:
// contiguous f32 [x_cols, K] with K one of the built sizes.
void expect_conv_w(const Tensor& w, int64_t x_cols, const char* op, const char* name) {
  cuda_expect(w, DType::f32, op, name);
  cuda_expect_shape(w, x_cols, w.cols, op, name);
  DF_CHECK(w.contiguous() && w.cols >= 2 && w.cols <= 8,
           "%s: %s %s must be contiguous [C, K] with K in 2..8 (the conv sizes built)", op, name,
           w.shape_str().c_str());
}

// The DeltaNet's head counts and dims, a and b [T, nv] and the per-head A_log and dt_bias [1, nv].
void expect_gdn_heads(const GdnShape& s, const Tensor& a, const Tensor& b, const Tensor& A_log,
                      const Tensor& dt_bias, int64_t tokens, const char* op) {
  cuda_expect(a, DType::bf16, op, "a");
  cuda_expect(b, DType::bf16, op, "b");
  cuda_expect(A_log, DType::f32, op, "A_log");
  cuda_expect(dt_bias, DType::f32, op, "dt_bias");
  DF_CHECK(s.nk > 0 && s.nv % s.nk == 0, "%s: %d value heads are not a multiple of %d key heads", op, s.nv, s.nk);
  DF_CHECK(s.dk > 0 && s.dv > 0 && s.dk <= kDecodeMaxHeadDim, "%s: head dims dk %d / dv %d must be positive, dk <= %d",
           op, s.dk, s.dv, kDecodeMaxHeadDim);
  cuda_expect_shape(a, tokens, s.nv, op, "a");
  cuda_expect_shape(b, tokens, s.nv, op, "b");
  cuda_expect_shape(A_log, 1, s.nv, op, "A_log");
  cuda_expect_shape(dt_bias, 1, s.nv, op, "dt_bias");
}

// The prefill's workspace: empty (it passes through as 0 bytes, so the launcher's message gives the size that is
// needed) or contiguous bytes.
void expect_gdn_workspace(const Tensor& workspace, const char* op) {
  if (workspace.empty()) return;
  cuda_expect(workspace, DType::u8, op, "workspace");
  DF_CHECK(workspace.contiguous(), "%s: workspace %s must be contiguous", op, workspace.shape_str().c_str());
}

}  // namespace

CudaOps::CudaOps(int device) : dev_(device) {}

CudaOps::~CudaOps() { dev_.free(decode_ws_); }

void* CudaOps::alloc_bytes(size_t bytes) {
  return dev_.alloc(bytes);
}

void CudaOps::free_bytes(void* p) {
  dev_.free(p);
}

void CudaOps::upload_f32(const Tensor& dst, const float* host) {
  cuda_expect_float(dst, "upload_f32", "dst");
  if (dst.dtype == DType::f32) return dev_.upload_raw(dst, host);
  std::vector<uint16_t> tmp(static_cast<size_t>(dst.numel()));
  for (size_t i = 0; i < tmp.size(); ++i) tmp[i] = f32_to_bf16(host[i]);
  dev_.upload_raw(dst, tmp.data());
}

void CudaOps::upload_raw(const Tensor& dst, const void* host) {
  dev_.upload_raw(dst, host);
}

void CudaOps::download_raw(const Tensor& src, void* host) {
  dev_.download_raw(src, host);
}

void CudaOps::download_f32(const Tensor& src, float* host) {
  cuda_expect_float(src, "download_f32", "src");
  if (src.dtype == DType::f32) return dev_.download_raw(src, host);
  std::vector<uint16_t> tmp(static_cast<size_t>(src.numel()));
  dev_.download_raw(src, tmp.data());
  for (size_t i = 0; i < tmp.size(); ++i) host[i] = bf16_to_f32(tmp[i]);
}

void CudaOps::copy(const Tensor& src, const Tensor& dst) {
  dev_.copy(src, dst);
}

void CudaOps::fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) {
  cuda_expect_float(dst, "fill_normal", "dst");
  fill_normal_launch(dst.data, dst.dtype == DType::f32, dst.stride, dst.rows, dst.cols, mean, std, seed,
                     stream, dev_.stream);
}

void CudaOps::synchronize() {
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
}

void CudaOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  cuda_embedding(dev_, ids, table, out);
}

void CudaOps::gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) {
  cuda_gemm(dev_, a, false, w, true, c, c, 1.0f, beta);
}

void CudaOps::fp8_quantize_rows(const Tensor& x, const Tensor& codes, const Tensor& scales, bool write_back) {
  cuda_expect(x, DType::bf16, "fp8_quantize_rows", "x");
  cuda_expect_as(codes, DType::f8_e4m3, x.rows, x.cols, "fp8_quantize_rows", "codes");
  cuda_expect_as(scales, DType::f32, 1, x.rows, "fp8_quantize_rows", "scales");
  fp8_quantize_rows_launch(bptr(x), x.stride, static_cast<uint8_t*>(codes.data), codes.stride, fptr(scales), x.rows,
                           x.cols, write_back, dev_.stream);
}

void CudaOps::swiglu_fp8(const Tensor& gate, const Tensor& up, const Tensor& codes, const Tensor& scales) {
  cuda_expect(gate, DType::bf16, "swiglu_fp8", "gate");
  cuda_expect_as(up, DType::bf16, gate.rows, gate.cols, "swiglu_fp8", "up");
  cuda_expect_as(codes, DType::f8_e4m3, gate.rows, gate.cols, "swiglu_fp8", "codes");
  cuda_expect_as(scales, DType::f32, 1, gate.rows, "swiglu_fp8", "scales");
  swiglu_fp8_launch(bptr(gate), gate.stride, bptr(up), up.stride, static_cast<uint8_t*>(codes.data),
                    codes.stride, fptr(scales), gate.rows, gate.cols, dev_.stream);
}

void CudaOps::gemm_fp8(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& sw, const Tensor& c,
                       float beta) {
  cuda_expect(x8, DType::f8_e4m3, "gemm_fp8", "x8");
  cuda_expect(w8, DType::f8_e4m3, "gemm_fp8", "w8");
  DF_CHECK(w8.cols == x8.cols, "gemm_fp8: x8 %s and w8 %s disagree on K", x8.shape_str().c_str(),
           w8.shape_str().c_str());
  cuda_expect_as(sx, DType::f32, 1, x8.rows, "gemm_fp8", "sx");
  cuda_expect_as(sw, DType::f32, 1, w8.rows, "gemm_fp8", "sw");
  cuda_expect_as(c, DType::bf16, x8.rows, w8.rows, "gemm_fp8", "c");
  gemm_fp8_launch(dev_.gemm, static_cast<const uint8_t*>(x8.data), cuda_gemm_ld(x8), fptr(sx),
                  static_cast<const uint8_t*>(w8.data), cuda_gemm_ld(w8), fptr(sw), c.data, cuda_gemm_ld(c), x8.rows,
                  w8.rows, x8.cols, beta, dev_.stream);
}

void CudaOps::fp8_quantize_groups(const Tensor& x, const Tensor& codes, const Tensor& scales, bool write_back) {
  cuda_expect(x, DType::bf16, "fp8_quantize_groups", "x");
  cuda_expect_as(codes, DType::f8_e4m3, x.rows, x.cols, "fp8_quantize_groups", "codes");
  cuda_expect_as(scales, DType::f32, 1, fp8_group_scales_size(x.rows, (x.cols + 127) / 128), "fp8_quantize_groups",
                 "scales");
  fp8_quantize_groups_launch(bptr(x), x.stride, static_cast<uint8_t*>(codes.data), codes.stride, fptr(scales),
                             x.rows, x.cols, write_back, dev_.stream);
}

void CudaOps::gemm_fp8_block(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& sw,
                             const Tensor& c, float beta) {
  cuda_expect(x8, DType::f8_e4m3, "gemm_fp8_block", "x8");
  cuda_expect(w8, DType::f8_e4m3, "gemm_fp8_block", "w8");
  DF_CHECK(w8.cols == x8.cols, "gemm_fp8_block: x8 %s and w8 %s disagree on K", x8.shape_str().c_str(),
           w8.shape_str().c_str());
  const int64_t K = x8.cols;
  cuda_expect_as(sx, DType::f32, 1, fp8_group_scales_size(x8.rows, (K + 127) / 128), "gemm_fp8_block", "sx");
  cuda_expect_as(sw, DType::f32, (w8.rows + 127) / 128, fp8_block_scale_ld(K), "gemm_fp8_block", "sw");
  DF_CHECK(sw.rows == 1 || sw.stride == sw.cols, "gemm_fp8_block: block scales sw %s (stride %lld) must be contiguous",
           sw.shape_str().c_str(), (long long)sw.stride);
  cuda_expect_as(c, DType::bf16, x8.rows, w8.rows, "gemm_fp8_block", "c");
  gemm_fp8_block_launch(dev_.gemm, static_cast<const uint8_t*>(x8.data), cuda_gemm_ld(x8), fptr(sx),
                        static_cast<const uint8_t*>(w8.data), cuda_gemm_ld(w8), fptr(sw), c.data, cuda_gemm_ld(c),
                        x8.rows, w8.rows, K, beta, dev_.stream);
}

void CudaOps::rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) {
  cuda_expect(x, DType::bf16, "rmsnorm", "x");
  cuda_expect(w, DType::f32, "rmsnorm", "w");
  cuda_expect(out, DType::bf16, "rmsnorm", "out");
  cuda_expect_shape(w, 1, x.cols, "rmsnorm", "w");
  cuda_expect_shape(out, x.rows, x.cols, "rmsnorm", "out");
  rmsnorm_launch(bptr(x), x.stride, fptr(w), bptr(out), out.stride, x.rows, x.cols, eps,
                 kind == NormKind::zero_centred, dev_.stream);
}

void CudaOps::rmsnorm_fp8(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind,
                          const Tensor& codes, const Tensor& scales, bool write_back) {
  cuda_expect(x, DType::bf16, "rmsnorm_fp8", "x");
  cuda_expect_as(w, DType::f32, 1, x.cols, "rmsnorm_fp8", "w");
  cuda_expect_as(out, DType::bf16, x.rows, x.cols, "rmsnorm_fp8", "out");
  cuda_expect_as(codes, DType::f8_e4m3, x.rows, x.cols, "rmsnorm_fp8", "codes");
  cuda_expect_as(scales, DType::f32, 1, x.rows, "rmsnorm_fp8", "scales");
  rmsnorm_fp8_launch(bptr(x), x.stride, fptr(w), bptr(out), out.stride, static_cast<uint8_t*>(codes.data),
                     codes.stride, fptr(scales), write_back, x.rows, x.cols, eps,
                     kind == NormKind::zero_centred, dev_.stream);
}

void CudaOps::add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out, float eps,
                          NormKind kind) {
  cuda_expect(residual, DType::bf16, "add_rmsnorm", "residual");
  cuda_expect(delta, DType::bf16, "add_rmsnorm", "delta");
  cuda_expect(w, DType::f32, "add_rmsnorm", "w");
  cuda_expect(out, DType::bf16, "add_rmsnorm", "out");
  cuda_expect_shape(delta, residual.rows, residual.cols, "add_rmsnorm", "delta");
  cuda_expect_shape(w, 1, residual.cols, "add_rmsnorm", "w");
  cuda_expect_shape(out, residual.rows, residual.cols, "add_rmsnorm", "out");
  add_rmsnorm_launch(bptr(residual), residual.stride, bptr(delta), delta.stride, fptr(w), bptr(out),
                     out.stride, residual.rows, residual.cols, eps, kind == NormKind::zero_centred,
                     dev_.stream);
}

void CudaOps::qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim,
                           float theta, float eps, NormKind kind) {
  cuda_expect(x, DType::bf16, "qk_norm_rope", "x");
  cuda_expect(w, DType::f32, "qk_norm_rope", "w");
  cuda_expect(pos, DType::i32, "qk_norm_rope", "pos");
  cuda_expect_shape(x, x.rows, (int64_t)heads * hd, "qk_norm_rope", "x");
  cuda_expect_shape(w, 1, hd, "qk_norm_rope", "w");
  cuda_expect_shape(pos, 1, x.rows, "qk_norm_rope", "pos");
  DF_CHECK(rot_dim >= 0 && rot_dim <= hd && rot_dim % 2 == 0, "qk_norm_rope: rot_dim %d must be even and <= hd %d",
           rot_dim, hd);
  qk_norm_rope_launch(bptr(x), x.stride, fptr(w), iptr(pos), x.rows, heads, hd, rot_dim, theta, eps,
                      kind == NormKind::zero_centred, dev_.stream);
}

void CudaOps::attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const SeqLayout& seqs, int hq, int hkv, int hd, float scale, const Tensor* gate) {
  const char* op = "attention_causal";
  cuda_expect(q, DType::bf16, op, "q");
  cuda_expect(k, DType::bf16, op, "k");
  cuda_expect(v, DType::bf16, op, "v");
  cuda_expect(out, DType::bf16, op, "out");
  cuda_expect(seqs.cu, DType::i32, op, "seqs.cu");
  cuda_expect_shape(q, seqs.tokens, (int64_t)hq * hd, op, "q");
  cuda_expect_shape(k, seqs.tokens, (int64_t)hkv * hd, op, "k");
  cuda_expect_shape(v, seqs.tokens, (int64_t)hkv * hd, op, "v");
  cuda_expect_shape(out, seqs.tokens, (int64_t)hq * hd, op, "out");
  DF_CHECK(hkv > 0 && hq % hkv == 0, "%s: %d q heads are not a multiple of %d kv heads", op, hq, hkv);
  DF_CHECK(hd > 0 && hd <= kDecodeMaxHeadDim, "%s: head_dim %d must be in 1..%d", op, hd, kDecodeMaxHeadDim);
  if (gate) {
    cuda_expect(*gate, DType::bf16, op, "gate");
    cuda_expect_shape(*gate, seqs.tokens, (int64_t)hq * hd, op, "gate");
  }
  attention_causal_launch(bptr(q), q.stride, bptr(k), k.stride, bptr(v), v.stride, bptr(out), out.stride,
                          gate ? bptr(*gate) : nullptr, gate ? gate->stride : 0, iptr(seqs.cu), seqs.num_seqs,
                          seqs.tokens, seqs.max_len, hq, hkv, hd, scale, dev_.stream);
}

void CudaOps::sigmoid_gate(const Tensor& o, const Tensor& gate) {
  cuda_expect(o, DType::bf16, "sigmoid_gate", "o");
  cuda_expect(gate, DType::bf16, "sigmoid_gate", "gate");
  cuda_expect_shape(gate, o.rows, o.cols, "sigmoid_gate", "gate");
  sigmoid_gate_launch(bptr(o), o.stride, bptr(gate), gate.stride, o.rows, o.cols, dev_.stream);
}

void CudaOps::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  cuda_swiglu(dev_, gate, up, out);
}

void CudaOps::conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) {
  cuda_expect(x, DType::bf16, "conv1d_silu", "x");
  cuda_expect(out, DType::bf16, "conv1d_silu", "out");
  cuda_expect(seqs.pos, DType::i32, "conv1d_silu", "seqs.pos");
  cuda_expect_shape(x, seqs.tokens, x.cols, "conv1d_silu", "x");
  expect_conv_w(w, x.cols, "conv1d_silu", "w");
  cuda_expect_shape(out, x.rows, x.cols, "conv1d_silu", "out");
  conv1d_silu_launch(bptr(x), x.stride, fptr(w), static_cast<int>(w.cols), bptr(out), out.stride,
                     iptr(seqs.pos), x.rows, x.cols, dev_.stream);
}

void CudaOps::gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                          const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& s,
                          const Tensor& workspace) {
  const char* op = "gdn_prefill";
  cuda_expect(qkv, DType::bf16, op, "qkv");
  cuda_expect(out, DType::bf16, op, "out");
  cuda_expect(seqs.cu, DType::i32, op, "seqs.cu");
  expect_gdn_heads(s, a, b, A_log, dt_bias, seqs.tokens, op);
  cuda_expect_shape(qkv, seqs.tokens, 2LL * s.nk * s.dk + (int64_t)s.nv * s.dv, op, "qkv");
  cuda_expect_shape(out, seqs.tokens, (int64_t)s.nv * s.dv, op, "out");
  expect_gdn_workspace(workspace, op);
  gdn_prefill_launch(bptr(qkv), qkv.stride, bptr(a), a.stride, bptr(b), b.stride, fptr(A_log), fptr(dt_bias),
                     bptr(out), out.stride, iptr(seqs.cu), seqs.num_seqs, seqs.tokens, seqs.max_len, s.nk,
                     s.nv, s.dk, s.dv, workspace.data, workspace.empty() ? 0 : workspace.nbytes(),
                     dev_.stream);
}

int64_t CudaOps::gdn_workspace_bytes(int64_t tokens, const GdnShape& s) const {
  return static_cast<int64_t>(gdn_prefill_workspace_bytes(tokens, s.nv, s.dk, s.dv));
}

// Whether the byte ranges of two (possibly strided) views, first element to one past the last, meet.
static bool spans_overlap(const Tensor& x, const Tensor& y) {
  auto span = [](const Tensor& t) {
    const char* p = static_cast<const char*>(t.data);
    return std::pair{p, p + ((t.rows - 1) * t.stride + t.cols) * int64_t(dtype_size(t.dtype))};
  };
  if (x.empty() || y.empty()) return false;
  const auto [x0, x1] = span(x);
  const auto [y0, y1] = span(y);
  return x0 < y1 && y0 < x1;
}

void CudaOps::gdn_mixer(const Tensor& x, const Tensor& z, const Tensor& a, const Tensor& b, const GdnWeights& w,
                        const Tensor& out, const SeqLayout& seqs, const GdnShape& s, const Tensor& workspace,
                        const Tensor& conv, const Tensor& o) {
  const char* op = "gdn_mixer";
  for (auto [t, name] : {std::pair{&x, "x"}, {&z, "z"}, {&out, "out"}, {&conv, "conv"}, {&o, "o"}})
    cuda_expect(*t, DType::bf16, op, name);
  cuda_expect(w.norm_w, DType::f32, op, "norm_w");
  cuda_expect(seqs.cu, DType::i32, op, "seqs.cu");
  cuda_expect(seqs.pos, DType::i32, op, "seqs.pos");
  expect_gdn_heads(s, a, b, w.A_log, w.dt_bias, seqs.tokens, op);
  const int64_t vdim = int64_t(s.nv) * s.dv;
  cuda_expect_shape(x, seqs.tokens, 2LL * s.nk * s.dk + vdim, op, "x");
  cuda_expect_shape(z, seqs.tokens, vdim, op, "z");
  cuda_expect_shape(out, seqs.tokens, vdim, op, "out");
  cuda_expect_shape(conv, seqs.tokens, x.cols, op, "conv");
  cuda_expect_shape(o, seqs.tokens, vdim, op, "o");
  expect_conv_w(w.conv_w, x.cols, op, "conv_w");
  cuda_expect_shape(w.norm_w, 1, s.dv, op, "norm_w");
  const bool out_heads_conv = out.data == conv.data && out.stride == conv.stride;
  DF_CHECK(!spans_overlap(out, o) && (out_heads_conv || !spans_overlap(out, conv)),
           "%s: out %s must be conv's first %lld columns or apart from conv, and apart from o", op,
           out.shape_str().c_str(), (long long)vdim);
  expect_gdn_workspace(workspace, op);
  gdn_mixer_launch(bptr(x), x.stride, fptr(w.conv_w), static_cast<int>(w.conv_w.cols), bptr(z), z.stride, bptr(a),
                   a.stride, bptr(b), b.stride, fptr(w.A_log), fptr(w.dt_bias), fptr(w.norm_w), w.eps, bptr(out),
                   out.stride, iptr(seqs.cu), iptr(seqs.pos), seqs.num_seqs, seqs.tokens, seqs.max_len, s.nk, s.nv,
                   s.dk, s.dv, bptr(conv), conv.stride, bptr(o), o.stride, workspace.data,
                   workspace.empty() ? 0 : workspace.nbytes(), dev_.stream);
}

void CudaOps::gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                            float eps) {
  cuda_expect(o, DType::bf16, "gated_rmsnorm", "o");
  cuda_expect(z, DType::bf16, "gated_rmsnorm", "z");
  cuda_expect(w, DType::f32, "gated_rmsnorm", "w");
  cuda_expect(out, DType::bf16, "gated_rmsnorm", "out");
  cuda_expect_shape(o, o.rows, (int64_t)heads * dv, "gated_rmsnorm", "o");
  cuda_expect_shape(z, o.rows, o.cols, "gated_rmsnorm", "z");
  cuda_expect_shape(w, 1, dv, "gated_rmsnorm", "w");
  cuda_expect_shape(out, o.rows, o.cols, "gated_rmsnorm", "out");
  gated_rmsnorm_launch(bptr(o), o.stride, bptr(z), z.stride, fptr(w), bptr(out), out.stride, o.rows, heads,
                       dv, eps, dev_.stream);
}

void CudaOps::check_target(const TargetShape& s) const {
  auto need = [&](bool ok, const char* field, int value, const char* range) {
    DF_CHECK(ok, "target config: %s = %d: the CUDA backend runs %s; HINT: --device cpu (target.device = \"cpu\") "
             "runs any shape", field, value, range);
  };
  need(s.experts <= kMoeMaxExperts, "num_experts", s.experts, "up to 4096 routed experts");
  if (s.full_layers > 0) {
    need(s.head_dim > 0 && s.head_dim <= kDecodeMaxHeadDim, "head_dim", s.head_dim, "head_dim 1..512");
    need(s.kv_heads > 0 && s.heads % s.kv_heads == 0, "num_attention_heads", s.heads,
         "a multiple of num_key_value_heads");
  }
  if (s.linear_layers > 0) {
    need(s.gdn.dk > 0 && s.gdn.dk <= kDecodeMaxHeadDim, "linear_key_head_dim", s.gdn.dk, "key head dims 1..512");
    need(s.conv_kernel >= 2 && s.conv_kernel <= 8, "linear_conv_kernel_dim", s.conv_kernel, "conv sizes 2..8");
    need(s.gdn.nk > 0 && s.gdn.nv % s.gdn.nk == 0, "linear_num_value_heads", s.gdn.nv,
         "a multiple of linear_num_key_heads");
  }
}

// The MoE ops' sizes for the launchers, after the checks every MoE op shares.
static MoeDims moe_dims(const MoeShape& s, int64_t H, const char* op) {
  DF_CHECK(
      s.experts > 0 && s.experts <= kMoeMaxExperts && s.top_k >= 1 && s.top_k <= s.experts && s.inter > 0 &&
          s.shared_inter >= 0,
      "%s: MoeShape experts %d, top_k %d, inter %d, shared_inter %d: experts in 1..%d, top_k in 1..experts, "
      "inter > 0, shared_inter >= 0",
      op, s.experts, s.top_k, s.inter, s.shared_inter, kMoeMaxExperts);
  DF_CHECK(!s.fp8 || s.fp8_group == 0 || s.fp8_group == 128,
           "%s: fp8_group %d: the FP8 experts quantise their inputs per token (0) or per 128 columns", op,
           s.fp8_group);
  return MoeDims{H, s.experts, s.top_k, s.inter, s.shared_inter, s.renormalise, s.fp8, s.fp8_group};
}

// The MoE workspace: empty (the launcher then names the size it needs) or contiguous bytes.
static void expect_moe_workspace(const Tensor& workspace, const char* op) {
  if (workspace.empty()) return;
  cuda_expect(workspace, DType::u8, op, "workspace");
  DF_CHECK(workspace.contiguous(), "%s: workspace %s must be contiguous", op, workspace.shape_str().c_str());
}

// A weight the MoE launchers read as contiguous rows, of dtype dt.
static void expect_moe_weight(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* what,
                              DType dt = DType::bf16) {
  cuda_expect_as(t, dt, rows, cols, op, what);
  DF_CHECK(t.contiguous(), "%s: %s %s must be contiguous", op, what, t.shape_str().c_str());
}

// An FP8 expert weight's scales (ops.h MoeWeights): one per row, or its 128x128 blocks.
static const float* moe_fp8_scale(const Tensor& s, int64_t rows, int64_t cols, int group, const char* op,
                                  const char* what) {
  if (group > 0)
    cuda_expect_as(s, DType::f32, rows / 128, fp8_block_scale_ld(cols), op, what);
  else
    cuda_expect_as(s, DType::f32, 1, rows, op, what);
  DF_CHECK(s.contiguous(), "%s: %s %s must be contiguous", op, what, s.shape_str().c_str());
  return static_cast<const float*>(s.data);
}

void CudaOps::moe_route(const Tensor& x, const Tensor& router, const MoeShape& shape, const Tensor& ids,
                        const Tensor& weights, const Tensor& workspace) {
  const char* op = "moe_route";
  cuda_expect(x, DType::bf16, op, "x");
  const MoeDims d = moe_dims(shape, x.cols, op);
  cuda_expect_as(router, DType::bf16, shape.experts, x.cols, op, "router");
  cuda_expect_as(ids, DType::i32, x.rows, shape.top_k, op, "ids");
  cuda_expect_as(weights, DType::f32, x.rows, shape.top_k, op, "weights");
  expect_moe_workspace(workspace, op);
  moe_route_launch(dev_.gemm, bptr(x), cuda_gemm_ld(x), bptr(router), cuda_gemm_ld(router), x.rows, d,
                   static_cast<int32_t*>(ids.data), ids.stride, fptr(weights), weights.stride, workspace.data,
                   workspace.empty() ? 0 : workspace.nbytes(), dev_.stream);
}

void CudaOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                          const MoeShape& shape, const Tensor& out, const Tensor& workspace) {
  const char* op = "moe_experts";
  cuda_expect(x, DType::bf16, op, "x");
  const MoeDims d = moe_dims(shape, x.cols, op);
  const int64_t T = x.rows, H = x.cols, E = shape.experts, I = shape.inter, Is = shape.shared_inter;
  cuda_expect_as(ids, DType::i32, T, shape.top_k, op, "ids");
  cuda_expect_as(weights, DType::f32, T, shape.top_k, op, "weights");
  cuda_expect_as(out, DType::bf16, T, H, op, "out");
  const DType wdt = shape.fp8 ? DType::f8_e4m3 : DType::bf16;
  expect_moe_weight(w.gate_up, E * 2 * I, H, op, "gate_up", wdt);
  expect_moe_weight(w.down, E * H, I, op, "down", wdt);
  if (Is > 0) {
    expect_moe_weight(w.shared_gate_up, 2 * Is, H, op, "shared_gate_up", wdt);
    expect_moe_weight(w.shared_down, H, Is, op, "shared_down", wdt);
    expect_moe_weight(w.shared_gate, 1, H, op, "shared_gate");
  }
  MoeFp8Scales scales;
  if (shape.fp8) {
    const int g = shape.fp8_group;
    scales.gate_up = moe_fp8_scale(w.s_gate_up, E * 2 * I, H, g, op, "s_gate_up");
    scales.down = moe_fp8_scale(w.s_down, E * H, I, g, op, "s_down");
    if (Is > 0) {
      scales.shared_gate_up = moe_fp8_scale(w.s_shared_gate_up, 2 * Is, H, g, op, "s_shared_gate_up");
      scales.shared_down = moe_fp8_scale(w.s_shared_down, H, Is, g, op, "s_shared_down");
    }
  }
  DF_CHECK(!spans_overlap(out, x), "moe_experts: out %s must not overlap x %s", out.shape_str().c_str(),
           x.shape_str().c_str());
  expect_moe_workspace(workspace, op);
  moe_experts_launch(dev_.gemm, bptr(x), cuda_gemm_ld(x), iptr(ids), ids.stride, fptr(weights),
                     weights.stride, w.gate_up.data, w.down.data, Is > 0 ? w.shared_gate_up.data : nullptr,
                     Is > 0 ? w.shared_down.data : nullptr, Is > 0 ? bptr(w.shared_gate) : nullptr, scales,
                     bptr(out), cuda_gemm_ld(out), T, d, workspace.data,
                     workspace.empty() ? 0 : workspace.nbytes(), dev_.stream);
}

int64_t CudaOps::moe_workspace_bytes(int64_t tokens, const MoeShape& shape) const {
  DF_CHECK(shape.hidden > 0, "moe_workspace_bytes: MoeShape.hidden (x's columns) must be set, got %d",
           shape.hidden);
  return static_cast<int64_t>(
      df::moe_workspace_bytes(tokens, moe_dims(shape, shape.hidden, "moe_workspace_bytes")));
}

void CudaOps::attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t past,
                               int hq, int hkv, int hd, float scale, const Tensor* gate) {
  const char* op = "attention_cached";
  DF_CHECK(hq > 0 && hkv > 0 && hd > 0 && hq % hkv == 0 && hd <= kDecodeMaxHeadDim,
           "%s: q heads %d must be a positive multiple of kv heads %d, head_dim %d in 1..%d", op, hq, hkv, hd,
           kDecodeMaxHeadDim);
  cuda_expect_as(q, DType::bf16, q.rows, int64_t(hq) * hd, op, "q");
  cuda_expect_as(k, DType::bf16, k.rows, int64_t(hkv) * hd, op, "k");
  cuda_expect_as(v, DType::bf16, k.rows, int64_t(hkv) * hd, op, "v");
  cuda_expect_as(out, DType::bf16, q.rows, int64_t(hq) * hd, op, "out");
  DF_CHECK(past >= 0 && past + q.rows <= k.rows, "%s: %lld cached + %lld new tokens exceed the %lld cache rows given",
           op, (long long)past, (long long)q.rows, (long long)k.rows);
  if (gate) cuda_expect_as(*gate, DType::bf16, q.rows, int64_t(hq) * hd, op, "gate");
  const size_t need = attention_cached_workspace_bytes(q.rows, hq, hkv, hd);
  if (need > decode_ws_bytes_) {  // the old buffer may still be read by queued kernels
    DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
    dev_.free(decode_ws_);
    decode_ws_ = nullptr;
    decode_ws_bytes_ = 0;
    decode_ws_ = dev_.alloc(need);
    decode_ws_bytes_ = need;
  }
  attention_cached_launch(bptr(q), q.stride, bptr(k), k.stride, bptr(v), v.stride, bptr(out), out.stride,
                          gate ? bptr(*gate) : nullptr, gate ? gate->stride : 0, q.rows, past, hq, hkv, hd, scale,
                          decode_ws_, decode_ws_bytes_, dev_.stream);
}

void CudaOps::gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                         const Tensor& dt_bias, const Tensor& out, const Tensor& state, const Tensor& states,
                         const GdnShape& s) {
  const char* op = "gdn_decode";
  DF_CHECK(s.nk > 0 && s.nv > 0 && s.dk > 0 && s.dv > 0 && s.nv % s.nk == 0 && s.dk <= kDecodeMaxHeadDim,
           "%s: GdnShape nk %d nv %d dk %d dv %d: all must be positive, nv a multiple of nk, dk <= %d", op, s.nk,
           s.nv, s.dk, s.dv, kDecodeMaxHeadDim);
  const int64_t T = qkv.rows, sdim = int64_t(s.nv) * s.dk * s.dv;
  cuda_expect_as(qkv, DType::bf16, T, 2LL * s.nk * s.dk + int64_t(s.nv) * s.dv, op, "qkv");
  cuda_expect_as(a, DType::bf16, T, s.nv, op, "a");
  cuda_expect_as(b, DType::bf16, T, s.nv, op, "b");
  cuda_expect_as(A_log, DType::f32, 1, s.nv, op, "A_log");
  cuda_expect_as(dt_bias, DType::f32, 1, s.nv, op, "dt_bias");
  cuda_expect_as(out, DType::bf16, T, int64_t(s.nv) * s.dv, op, "out");
  cuda_expect_as(state, DType::f32, 1, sdim, op, "state");
  cuda_expect_as(states, DType::f32, states.rows, sdim, op, "states");
  DF_CHECK(states.rows >= 1 && states.rows <= T, "%s: states has %lld rows; it needs 1..%lld (the tokens)", op,
           (long long)states.rows, (long long)T);
  gdn_decode_launch(bptr(qkv), qkv.stride, bptr(a), a.stride, bptr(b), b.stride, fptr(A_log), fptr(dt_bias),
                    bptr(out), out.stride, fptr(state), static_cast<float*>(states.data), states.stride,
                    states.rows, T, s.nk, s.nv, s.dk, s.dv, dev_.stream);
}

}  // namespace df
