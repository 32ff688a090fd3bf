// The op interface the models call. One model definition runs on every backend: cpu/ implements each
// op plainly in fp32 (the oracle), cuda/ dispatches to kernels/. Ops are at fused-kernel granularity.
//
// Conventions:
//  - Tensors are 2-D row-major views (core/tensor.h); token-major activations are [T, features].
//  - Linear weights are [out, in]; gemm computes c = a · wᵀ (+ beta · c).
//  - Activations use act_dtype() (f32 on CPU, bf16 on CUDA); vectors of parameters (norm weights,
//    A_log, dt_bias, conv weights) are always f32 (exact copies of the stored bf16/f32 values).
//  - Multi-head tensors are [T, heads·head_dim] with head h in columns [h·hd, (h+1)·hd).
//  - A packed batch of sequences is described by SeqLayout; state (attention context, conv history,
//    DeltaNet state) never crosses a sequence boundary.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/arena.h"
#include "core/fp8.h"
#include "core/norm_kind.h"
#include "core/tensor.h"
#include "ops/wire_pool.h"

namespace df {

struct SeqLayout {
  std::vector<int32_t> cu_host;  // S+1 offsets into the packed token axis, cu_host[0] = 0
  Tensor cu;                     // the same offsets, i32 [1, S+1], in backend memory
  Tensor pos;                    // i32 [1, T] position of each token within its sequence, backend memory
  int64_t tokens = 0;
  int num_seqs = 0;
  int max_len = 0;
};

struct GdnShape {
  int nk = 0;  // key heads
  int nv = 0;  // value heads (a multiple of nk; value head h reads key head h / (nv / nk))
  int dk = 0;  // key head dim
  int dv = 0;  // value head dim
};

// A Gated DeltaNet layer's mixer parameters (Ops::gdn_mixer): the causal conv's weights f32 [C, K], A_log and
// dt_bias f32 [1, nv], the output norm's weight f32 [1, dv] and its eps.
struct GdnWeights {
  Tensor conv_w, A_log, dt_bias, norm_w;
  float eps = 0.0f;
};

// A mixture-of-experts MLP (Ops::moe_route, Ops::moe_experts; MODELS.md "Mixture-of-experts MLP").
struct MoeShape {
  int experts = 0;           // routed experts E
  int top_k = 0;             // experts each token runs, 1..E
  int inter = 0;             // a routed expert's SwiGLU width I
  int shared_inter = 0;      // the shared expert's width; 0: the block has none
  bool renormalise = false;  // the top_k probabilities are divided by their sum (norm_topk_prob)
  int hidden = 0;            // H, the columns of x: sizes a backend's workspace (Ops::moe_workspace_bytes)
  // FP8 experts (target.dtype = "fp8"): every expert GEMM's input (x, and the SwiGLU output before the down
  // projection; routed and shared experts alike) is quantised to e4m3 per token (fp8_group 0) or per token
  // per fp8_group columns, as the dense FP8 linear layers' inputs are (model/target.h target_linear). The
  // router and the shared expert's gate read x unquantised (the FP8 releases keep both in bf16).
  bool fp8 = false;
  int fp8_group = 0;
};

// The experts of one MoE layer, each a SwiGLU MLP: gate_up [E·2I, H] holds expert e's gate rows then its up
// rows at rows [e·2I, (e+1)·2I) (the layout of Hugging Face's fused experts.gate_up_proj [E, 2I, H]); down
// [E·H, I] holds expert e's down projection at rows [e·H, (e+1)·H). The shared expert: shared_gate_up [2·Is,
// H], shared_down [H, Is] and its gate shared_gate [1, H]; all three empty without one. FP8 experts on a
// backend with FP8 GEMMs (Ops::fp8_gemm): gate_up, down, shared_gate_up and shared_down hold e4m3 codes
// (f8_e4m3) and s_* their scales: per output row f32 [1, rows] (MoeShape::fp8_group 0), or a 128x128 block
// checkpoint's block scales f32 [rows / 128, fp8_block_scale_ld(cols)] (fp8_group 128). Empty otherwise.
struct MoeWeights {
  Tensor gate_up, down;
  Tensor shared_gate_up, shared_down, shared_gate;
  Tensor s_gate_up, s_down, s_shared_gate_up, s_shared_down;
};


// The dimensions of a target model that a backend's kernels have limits on (Ops::check_target). The model
// fills it from its config; messages name the config.json field of each.
struct TargetShape {
  int full_layers = 0;  // softmax-attention layers
  int heads = 0;        // num_attention_heads
  int kv_heads = 0;     // num_key_value_heads
  int head_dim = 0;
  int linear_layers = 0;  // Gated DeltaNet layers
  GdnShape gdn;           // their heads and head dims (linear_num_key_heads, ...)
  int conv_kernel = 0;    // linear_conv_kernel_dim
  int experts = 0;        // num_experts: routed experts of an MoE target, 0 for a dense one
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  virtual const char* name() const = 0;
  // Refuses, naming the config field, a target this backend has no kernel for: called when a model is
  // built, so an unsupported shape fails at load time rather than in the middle of a forward.
  virtual void check_target(const TargetShape& /*shape*/) const {}

  // ---- memory -------------------------------------------------------------------------------------
  // Backend memory that lives until free_bytes; arenas are carved out of such blocks.
  virtual void* alloc_bytes(size_t bytes) = 0;
  virtual void free_bytes(void* p) = 0;
  // Host f32 values into a backend tensor of any float dtype (converted, rounded to nearest even).
  virtual void upload_f32(const Tensor& dst, const float* host) = 0;
  // Host bytes of exactly dst's dtype (ids, masks, offsets).
  virtual void upload_raw(const Tensor& dst, const void* host) = 0;
  // Backend tensor (any float dtype, may be strided) into host f32, row-major contiguous.
  virtual void download_f32(const Tensor& src, float* host) = 0;
  // Contiguous host bytes of src's own dtype (no conversion).
  virtual void download_raw(const Tensor& src, void* host) = 0;
  // dst = src (same shape; dtypes may differ between f32 and bf16). Used for taps.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // dst[r, c] = mean + std · rng_normal_at(seed, stream, r·cols + c) (core/rng.h), drawn where dst lives and
  // rounded to its dtype: random weights of any size without a host copy, the same draws on every backend.
  virtual void fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) = 0;
  virtual void synchronize() = 0;
  // The feature channel's slots in this backend's memory (ops/wire_pool.h): host memory here, device slots
  // with pinned mirrors on CUDA (mirrors = false: none, for the NCCL wire, which reads and fills the device
  // slots).
  virtual std::unique_ptr<WirePool> wire_pool(int depth, size_t bytes, bool mirrors = true) {
    return wire_pool_host(depth, bytes);
  }

  // ---- ops ----------------------------------------------------------------------------------------
  // out[t] = table[ids[t]]; ids i32 [1, T]; ids are validated by the caller.
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // c = a · wᵀ + beta · c, fp32 accumulation. a [M, K], w [N, K], c [M, N].
  virtual void gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) = 0;
  // out = norm(x) per row; w f32 [1, cols].
  virtual void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) = 0;
  // residual += delta (stored in act dtype), then out = norm(residual). The pre-norm residual stream step.
  virtual void add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out,
                           float eps, NormKind kind) = 0;
  // In place on x [T, heads·hd]: per-head RMSNorm with w f32 [1, hd], then rotate-half RoPE on the first
  // rot_dim dims of each head (pairs i, i + rot_dim/2; inv_freq_j = theta^(−2j/rot_dim)) at positions pos.
  virtual void qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim,
                            float theta, float eps, NormKind kind) = 0;
  // Causal GQA softmax attention within each sequence. q [T, hq·hd], k/v [T, hkv·hd], out [T, hq·hd].
  // With a gate [T, hq·hd] (may be a strided view), out is then gated exactly as sigmoid_gate(out, *gate)
  // would (same bits on every backend); the CUDA kernels do it in their epilogue, saving a pass over out.
  virtual void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const SeqLayout& seqs, int hq, int hkv, int hd, float scale,
                                const Tensor* gate = nullptr) = 0;
  // o *= sigmoid(gate), elementwise; the gated-attention output gate.
  virtual void sigmoid_gate(const Tensor& o, const Tensor& gate) = 0;
  // out = silu(gate) · up.
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // Depthwise causal conv over time, then SiLU: out[t,c] = silu(Σ_j w[c,j] · x[t−K+1+j, c]), zeros before
  // each sequence start. x/out [T, C], w f32 [C, K].
  virtual void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) = 0;
  // Gated DeltaNet prefill. qkv [T, nk·dk | nk·dk | nv·dv] after conv1d_silu; a, b [T, nv] raw projections;
  // A_log, dt_bias f32 [1, nv]. Computes β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias),
  // q = l2norm(q)·dk^−½, k = l2norm(k), runs the gated delta rule from a zero state per sequence and
  // writes o [T, nv·dv]. workspace: backend scratch, u8 [1, n] with n >= gdn_workspace_bytes(T, shape),
  // overwritten by the call; it may be an empty tensor where that size is 0 (the CPU backend).
  virtual void gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                           const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs,
                           const GdnShape& shape, const Tensor& workspace) = 0;
  // Scratch bytes gdn_prefill needs for a batch of `tokens` packed tokens (monotone in tokens), so a model
  // plans it once for its largest batch next to its other activations instead of the op allocating per call.
  // 0 where the backend needs none: the CPU oracle keeps its own per-call host vectors.
  virtual int64_t gdn_workspace_bytes(int64_t /*tokens*/, const GdnShape& /*shape*/) const { return 0; }
  // The Gated DeltaNet mixer of a prefill from the layer's fused projection: out = gated_rmsnorm(gdn_prefill(
  // conv1d_silu(x)), z), which the default computes with those three ops. x [T, 2·nk·dk + nv·dv] before the conv;
  // z [T, nv·dv]; a, b and workspace as in gdn_prefill; out [T, nv·dv]. conv [T, x.cols] and o [T, nv·dv] are
  // scratch for the intermediates, overwritten; out may be conv's first nv·dv columns (the conv output is dead
  // once o exists), never o. A backend may fuse the three (CUDA: the conv inside the prefill's chunk kernel,
  // the norm in its state kernel's epilogue) and leave the scratch holding something else.
  virtual void gdn_mixer(const Tensor& x, const Tensor& z, const Tensor& a, const Tensor& b, const GdnWeights& w,
                         const Tensor& out, const SeqLayout& seqs, const GdnShape& shape, const Tensor& workspace,
                         const Tensor& conv, const Tensor& o) {
    conv1d_silu(x, w.conv_w, conv, seqs);
    gdn_prefill(conv, a, b, w.A_log, w.dt_bias, o, seqs, shape, workspace);
    gated_rmsnorm(o, z, w.norm_w, out, shape.nv, shape.dv, w.eps);
  }
  // ---- mixture of experts (model/target.h target_moe) -------------------------------------------------
  // The router and its top-k as one op: p = softmax(x · routerᵀ) over the E experts (fp32 accumulation, softmax
  // in fp32), the top_k largest of each token in descending order, equal probabilities ordered as torch.topk on
  // the CPU orders them (its nth_element / partial_sort of (p, index) pairs, which a backend reproduces), then
  // divided by their sum when shape.renormalise. x [T, H], router [E, H]; ids i32 [T, top_k], weights f32
  // [T, top_k]. workspace as in moe_experts.
  virtual void moe_route(const Tensor& x, const Tensor& /*router*/, const MoeShape& /*shape*/, const Tensor& /*ids*/,
                         const Tensor& /*weights*/, const Tensor& /*workspace*/) {
    DF_FAIL("moe_route (%s): the %s backend has no mixture-of-experts kernels", x.shape_str().c_str(), name());
  }
  // out += Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) + sigmoid(x[t] · shared_gateᵀ) · shared(x[t]), with
  // expert(x) = down(silu(gate · x) · (up · x)): the routed experts summed in ascending expert order, then the
  // shared expert, the total added to out once (as transformers' sparse MoE block sums before its residual add).
  // Tokens are grouped by expert so each expert is one GEMM over its tokens (a grouped GEMM on a GPU); an expert
  // no token picked costs nothing. x [T, H], ids / weights from moe_route, out [T, H]. workspace: backend scratch
  // u8 [1, n], n >= moe_workspace_bytes(T, shape), overwritten; empty where that is 0 (the CPU backend).
  virtual void moe_experts(const Tensor& x, const Tensor& /*ids*/, const Tensor& /*weights*/, const MoeWeights& /*w*/,
                           const MoeShape& /*shape*/, const Tensor& /*out*/, const Tensor& /*workspace*/) {
    DF_FAIL("moe_experts (%s): the %s backend has no mixture-of-experts kernels", x.shape_str().c_str(), name());
  }
  // Scratch bytes moe_route and moe_experts need for `tokens` rows (monotone in tokens), planned once by the model
  // beside its other activations; 0 where the backend needs none (the CPU oracle keeps per-call host vectors).
  virtual int64_t moe_workspace_bytes(int64_t /*tokens*/, const MoeShape& /*shape*/) const { return 0; }

  // ---- incremental decoding (one sequence; model/target_decode.h) ------------------------------------
  // Attention of T new queries over a key/value cache: query i sits at position past + i and sees cache rows
  // [0, past + i]. q [T, hq·hd]; k, v [≥ past + T, hkv·hd] whose rows [past, past + T) already hold the new
  // tokens' keys and values; out [T, hq·hd]; gate as in attention_causal.
  virtual void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t past,
                                int hq, int hkv, int hd, float scale, const Tensor* gate = nullptr) = 0;
  // Gated DeltaNet over the T new tokens of one sequence, continuing from `state` (read only) by the
  // token-by-token recurrence, with the gating and normalisation of gdn_prefill. state f32 [1, nv·dk·dv]: value
  // head h's S [dk, dv] (row-major) at columns [h·dk·dv, (h+1)·dk·dv). states f32 [R, nv·dk·dv], 1 ≤ R ≤ T:
  // row r receives the state after token T − R + r, so the caller can roll back to any of the last R tokens.
  virtual void gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                          const Tensor& dt_bias, const Tensor& out, const Tensor& state, const Tensor& states,
                          const GdnShape& shape) = 0;
  // In place: each row rounded to float8 e4m3 on its own scale amax(|row|)/448 and back (core/fp8.h), an
  // all-zero row left as it is; group > 0: each run of `group` columns of a row (the last one partial where
  // group does not divide the width) on its own scale instead. The FP8 target's quantisation: per output
  // channel for weights (at load), per token, or per token and 128 columns, for the linear layers' inputs
  // (model/target.h target_linear).
  virtual void fp8_round_rows(const Tensor& x, int64_t /*group*/ = 0) {
    DF_FAIL("fp8_round_rows (%s): this backend runs FP8 through fp8_quantize_rows and gemm_fp8 instead",
            x.shape_str().c_str());
  }
  // True where the backend multiplies FP8 codes (fp8_quantize_rows + gemm_fp8): an FP8 target then holds its
  // projections as e4m3 codes and scales. Elsewhere FP8 is emulated by fp8_round_rows and the fp32 gemm.
  virtual bool fp8_gemm() const { return false; }
  // Each row of x (act dtype) to e4m3 codes, codes f8_e4m3 [R, C], and its scale, scales f32 [1, R], rounded
  // exactly as fp8_round_rows rounds it; write_back then replaces x's rows by code · scale in x's dtype.
  virtual void fp8_quantize_rows(const Tensor& x, const Tensor& /*codes*/, const Tensor& /*scales*/,
                                 bool /*write_back*/) {
    DF_FAIL("fp8_quantize_rows (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", x.shape_str().c_str());
  }
  // rmsnorm into out whose rows then go to an FP8 GEMM: also their codes and scales, bit for bit those of
  // fp8_quantize_rows(out, codes, scales, write_back) after the rmsnorm (so with write_back out ends as
  // code · scale), without reading out back (model/target.h TargetForward).
  virtual void rmsnorm_fp8(const Tensor& x, const Tensor& /*w*/, const Tensor& /*out*/, float /*eps*/,
                           NormKind /*kind*/, const Tensor& /*codes*/, const Tensor& /*scales*/,
                           bool /*write_back*/) {
    DF_FAIL("rmsnorm_fp8 (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", x.shape_str().c_str());
  }
  // fp8_quantize_rows of swiglu(gate, up) without the act-dtype tensor in between: the codes and scales that
  // swiglu into out then fp8_quantize_rows(out) give, bit for bit (the down projection's input,
  // model/target.h target_mlp).
  virtual void swiglu_fp8(const Tensor& gate, const Tensor& /*up*/, const Tensor& /*codes*/,
                          const Tensor& /*scales*/) {
    DF_FAIL("swiglu_fp8 (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", gate.shape_str().c_str());
  }
  // c = (sx ⊙ x8) · (sw ⊙ w8)ᵀ + beta · c, fp32 accumulation: x8 f8_e4m3 [M, K] with sx f32 [1, M] (per
  // token), w8 f8_e4m3 [N, K] with sw f32 [1, N] (per output channel), c act dtype [M, N].
  virtual void gemm_fp8(const Tensor& x8, const Tensor& /*sx*/, const Tensor& /*w8*/, const Tensor& /*sw*/,
                        const Tensor& /*c*/, float /*beta*/) {
    DF_FAIL("gemm_fp8 (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", x8.shape_str().c_str());
  }
  // A 128x128 block checkpoint's FP8 linear layer on a backend with FP8 GEMMs: x's rows to codes with a scale
  // per token per 128 columns, scales f32 [ceil(C/128), R] contiguous (token-major, as cuBLASLt reads them),
  // rounded as fp8_round_rows(x, 128) rounds; write_back as in fp8_quantize_rows.
  virtual void fp8_quantize_groups(const Tensor& x, const Tensor& /*codes*/, const Tensor& /*scales*/,
                                   bool /*write_back*/) {
    DF_FAIL("fp8_quantize_groups (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", x.shape_str().c_str());
  }
  // c = x8 · w8ᵀ + beta · c with x8's group scales sx (fp8_quantize_groups) and w8's block scales sw f32
  // [ceil(N/128), fp8_block_scale_ld(K)] (the checkpoint's weight_scale_inv, rows padded), fp32 accumulation.
  virtual void gemm_fp8_block(const Tensor& x8, const Tensor& /*sx*/, const Tensor& /*w8*/, const Tensor& /*sw*/,
                              const Tensor& /*c*/, float /*beta*/) {
    DF_FAIL("gemm_fp8_block (%s): this backend has no FP8 GEMMs (Ops::fp8_gemm)", x8.shape_str().c_str());
  }
  // Per value head over dv: out = w · (o · rsqrt(mean(o²) + eps)) · silu(z); w f32 [1, dv] shared by heads.
  virtual void gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads,
                             int dv, float eps) = 0;
};

// Plans backend memory once: runs `layout` (which carves tensors out of the arena it gets) against a counting
// arena, allocates one block of that size plus `extra_bytes`, and runs `layout` again into it. Returns the
// block (free it with Ops::free_bytes); `arena` then hands out the rest of the block (the extra bytes).
inline void* ops_alloc_planned(Ops& ops, const std::function<void(Arena&)>& layout, size_t extra_bytes,
                               Arena& arena) {
  Arena plan(nullptr, 0, ops.device());
  layout(plan);
  const size_t bytes = plan.high_water() + extra_bytes;
  void* block = ops.alloc_bytes(bytes);
  arena = Arena(block, bytes, ops.device());
  layout(arena);
  return block;
}

}  // namespace df
