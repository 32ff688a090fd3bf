// The VRAM planner's arithmetic. Every component is one line with its formula in `detail`; the counts follow
// the data path of DESIGN.md (targets: backbone forward up to the last tap, buffers reused layer to layer;
// drafters: one optimizer's state over flat buffers plus what one micro-batch keeps for its backward).
#include "topo/plan_vram.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/fp8.h"
#include "core/strfmt.h"
#include "kernels/gdn/gdn_workspace.h"
#include "kernels/train/loss_slots.h"
#include "kernels/train/train_workspace.h"
#include "model/fp8_weights.h"
#include "ops/dspark_shape.h"
#include "ops/ops.h"
#include "ops/wire_pool.h"
#include "topo/plan_vram_moe.h"
#include "topo/topo.h"

namespace df {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kBf16 = 2, kF32 = 4;
// CUDA context, NCCL channel buffers and allocator rounding: ~0.5 GiB context plus NCCL's per-peer
// buffers; 1 GiB keeps the verdict on the safe side without a device to measure on.
constexpr double kRuntimeReserve = kGiB;

void add(VramRole& r, std::string name, double bytes, std::string detail) {
  r.items.push_back({std::move(name), bytes, std::move(detail)});
  r.total += bytes;
}

// Bytes of one target->drafter payload: token ids (i32), loss mask (u8), taps [T, k·H] bf16 and, where the
// loss reads it (soft-KL, DSpark), the final-norm output [T, H] bf16 (the header travels separately and is
// negligible).
double payload_bytes(int64_t tokens, int taps, int hidden, bool final_hidden) {
  return double(tokens) * (4 + 1 + kBf16 * taps * hidden + (final_hidden ? kBf16 * hidden : 0));
}

}  // namespace

double plan_vram_target_layer_params(const QwenConfig& t, int layer) {
  const double h = t.hidden;
  const LayerKind kind = t.layer_types[size_t(layer)];
  // The MLP (an MoE layer's router, every expert and the gated shared expert) and the two layer norms.
  const double shared = t.shared_intermediate > 0 ? 3.0 * h * t.shared_intermediate + h : 0.0;
  const double mlp = t.layer_is_moe(layer)
                         ? h * t.num_experts + 3.0 * h * t.moe_intermediate * t.num_experts + shared
                         : 3.0 * h * t.intermediate;
  const double common = mlp + 2.0 * h;
  if (kind == LayerKind::full_attention) {
    const double q_rows = double(t.heads) * t.head_dim * (t.attn_output_gate ? 2 : 1);
    return common + h * q_rows + 2.0 * h * t.kv_heads * t.head_dim + double(t.heads) * t.head_dim * h +
           2.0 * t.head_dim;
  }
  const double key_dim = double(t.lin_nk) * t.lin_dk, value_dim = double(t.lin_nv) * t.lin_dv;
  const double conv_ch = 2.0 * key_dim + value_dim;
  return common + h * conv_ch + h * value_dim + 2.0 * h * t.lin_nv  // in_proj_qkv, in_proj_z, in_proj_b/a
         + conv_ch * t.conv_kernel + 2.0 * t.lin_nv + t.lin_dv      // conv1d, A_log + dt_bias, norm
         + value_dim * h;                                           // out_proj
}

namespace {

// One layer's projections as an FP8 target holds them (model/target.h TargetLayer): their elements (1 B e4m3
// codes each, w_in's b / a rows included as unused zero codes), their rows (one f32 scale each), and the
// DeltaNet b / a rows' bf16 copy.
// A layer's FP8 projections: weights, rows (one channel scale each), and the 128x128 block scales a block
// checkpoint keeps instead (model/target.h TargetLayer, rows padded to fp8_block_scale_ld).
struct Fp8LayerProj {
  double elems = 0, rows = 0, ba_bf16 = 0, block_scales = 0;
};

double fp8_blocks_of(double rows, double K) {
  return std::ceil(rows / 128) * double(fp8_block_scale_ld(int64_t(K)));
}

// An MoE layer's MLP is not among them (plan_vram_moe_fp8_weights counts its experts).
Fp8LayerProj fp8_layer_proj(const QwenConfig& t, int layer) {
  const LayerKind kind = t.layer_types[layer];
  const double h = t.hidden, I = t.layer_is_moe(layer) ? 0 : t.intermediate;
  Fp8LayerProj p;
  if (I > 0) {
    p.rows = 2 * I + h;  // gate|up, down
    p.elems = 3 * h * I;
    p.block_scales = fp8_blocks_of(2 * I, h) + fp8_blocks_of(h, I);
  }
  if (kind == LayerKind::full_attention) {
    const double q = double(t.heads) * t.head_dim;
    const double qkv = q * (t.attn_output_gate ? 2 : 1) + 2.0 * t.kv_heads * t.head_dim;
    p.rows += qkv + h;
    p.elems += qkv * h + q * h;
    p.block_scales += fp8_blocks_of(qkv, h) + fp8_blocks_of(h, q);
  } else {
    const double value_dim = double(t.lin_nv) * t.lin_dv;
    const double in = 2.0 * t.lin_nk * t.lin_dk + 2 * value_dim + 2.0 * t.lin_nv;  // qkv, z, b, a
    p.rows += in + h;
    p.elems += in * h + value_dim * h;
    p.block_scales += fp8_blocks_of(in - 2.0 * t.lin_nv, h) + fp8_blocks_of(h, value_dim);
    p.ba_bf16 = 2.0 * t.lin_nv * h;
  }
  return p;
}

}  // namespace

VramRole plan_vram_drafter(const Config& cfg, const DrafterConfig& dc, bool tied,
                           const VramAssumptions& assume) {
  const DrafterLimits lim = drafter_limits_from_run(cfg);
  const DrafterParamTable table = drafter_param_table(dc);
  const double P = double(table.total), H = dc.hidden, V = dc.vocab;
  const int64_t T = lim.max_tokens, nb = lim.max_blocks, N = nb * dc.block_size;
  const int k = dc.num_taps();
  VramRole dr;
  dr.role = "drafter";
  // DrafterModel's one allocation (model/drafter.cpp): four f32 flat buffers, the bf16 GEMM shadow, the f64
  // loss statistics.
  add(dr, "master weights fp32", kF32 * P, strfmt("4 B x %.4g (flat, entries 64-aligned)", P));
  add(dr, "gradients fp32", kF32 * P, strfmt("4 B x %.4g", P));
  add(dr, "Adam m, v fp32", 2 * kF32 * P, strfmt("2 x 4 B x %.4g", P));
  add(dr, "weights bf16 copy", kBf16 * P, strfmt("2 B x %.4g (the GEMM weight shadow)", P));
  const int slots = LossStatsSlots::size(dc.block_size);
  add(dr, "loss statistics f64", 8.0 * slots, strfmt("8 B x %d slots", slots));
  // DrafterMemory's one allocation (pipeline/drafter_memory.cpp): the frozen tables as bf16 and, where
  // host-built batches arrive (offline feature files; held-out data on drafter 0), their staging at the token
  // budget. A batch off the channel is trained from in its receive slot instead (drafter_loop.cpp).
  add(dr, "frozen embedding [V,H] bf16", kBf16 * V * H, strfmt("2 B x %.0f x %.0f", V, H));
  if (tied)
    add(dr, "frozen lm_head", 0, "tied: the embedding serves as lm_head");
  else
    add(dr, "frozen lm_head [V,H] bf16", kBf16 * V * H, strfmt("2 B x %.0f x %.0f", V, H));
  const bool offline = cfg.topology.offline, staged = offline || cfg.eval.interval > 0;
  const bool final_hidden = drafter_streams_final_hidden(cfg);
  const int64_t final_cols = final_hidden ? int64_t(H) : 0;
  const double slot = double(WireLayout::bytes(T, int64_t(k) * int64_t(H), final_cols));
  add(dr, "batch staging bf16", staged ? kBf16 * double(T) * (k * H + double(final_cols)) : 0,
      staged ? strfmt("2 B x %lld tokens x (taps %.0f%s): host-built batches (%s)", (long long)T, k * H,
                      final_hidden ? " + final hidden" : "",
                      offline ? "offline features" : "eval.data on drafter 0")
             : std::string("none: every batch comes off the feature channel"));
  add(dr, "receive slot bf16", offline ? 0 : slot,
      offline ? std::string("none: offline, no feature channel")
              : strfmt("one wire slot at the token budget (WireLayout: taps %.0f%s), trained from in place",
                       k * H, final_hidden ? " + final hidden" : ""));
  // The activation workspace planned once for drafter_limits_from_run: the bytes drafter_plan_workspace
  // takes.
  add(dr, "activation workspace", double(drafter_workspace_bytes(dc, lim, DType::bf16)),
      strfmt("drafter_workspace_bytes: %lld tokens, %lld blocks of %d (drafter.max_block_rows %lld)%s%s",
             (long long)T, (long long)nb, dc.block_size, (long long)cfg.drafter.max_block_rows,
             lim.kl ? ", kl" : "", lim.noise ? ", noisy taps copy" : ""));
  // CudaTrainOps' one scratch buffer serves every op in turn and only grows: the largest of the ops' own
  // workspaces at the planned sizes (kernels/train/train_workspace.h; N block rows, T context rows).
  DFlashAttnDims ad;
  ad.nb = nb;
  ad.block = dc.block_size;
  ad.hq = dc.heads;
  const std::pair<const char*, size_t> ops[] = {
      {"lm_head_loss", lm_head_loss_workspace_bytes(N, dc.hidden, dc.vocab, assume.lm_chunk, lim.kl)},
      {"dflash_attention_bwd", dflash_attention_bwd_workspace_bytes(ad)},
      {"rmsnorm_bwd", rmsnorm_bwd_workspace_bytes(std::max(N, T), dc.hidden)},
      {"qk_norm_rope_bwd", qk_norm_rope_bwd_workspace_bytes(T + N, dc.head_dim)},
      {"sum_squares", sizeof(double) + sum_squares_workspace_bytes(table.total)},
      {"domino_head_loss", dc.kind == DrafterKind::domino
                               ? domino_head_workspace_bytes(nb, dc.block_size, dc.hidden, dc.gru_hidden_dim,
                                                             dc.emb_dim, dc.vocab, assume.lm_chunk)
                               : 0},
      {"dspark_head_loss",
       dc.kind == DrafterKind::dspark
           ? dspark_head_workspace_bytes(dspark_head_shape(dspark_head_dims(dc), nb), assume.lm_chunk)
           : 0},
      {"dflash2_selector_loss", dc.kind == DrafterKind::dflash2
                                    ? dflash2_selector_layout(N, dc.block_size, dc.hidden, dc.vocab,
                                                              dc.selector_rank, dc.selector_top_k,
                                                              assume.lm_chunk)
                                          .bytes
                                    : 0},
      {"dflash2_conv_bwd", dc.kind == DrafterKind::dflash2
                               ? dflash2_conv_bwd_workspace_bytes(N, dc.hidden, dc.conv_kernel_size)
                               : 0}};
  const auto* big = std::max_element(std::begin(ops), std::end(ops),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  add(dr, "op scratch", double(big->second),
      strfmt("the largest op workspace: %s (%lld rows%s, logits chunk %lld)", big->first, (long long)N,
             lim.kl ? ", kl" : "", (long long)assume.lm_chunk));
  add(dr, "cuBLASLt workspace", double(kGemmWorkspaceBytes), "64 MiB (kernels/train/train_workspace.h)");
  // GEMM tuning times candidates of a beta != 0 product into a scratch of the output's size, kept and only
  // grown: the largest accumulated output is a weight gradient (f32) or dctx / a residual (bf16).
  size_t tune = std::max(gemm_tune_scratch_bytes(N, dc.hidden, dc.hidden, false),
                         gemm_tune_scratch_bytes(T, dc.hidden, dc.hidden, false));
  for (const DrafterParamEntry& e : table.entries)
    if (e.rows > 1) tune = std::max(tune, gemm_tune_scratch_bytes(e.rows, e.cols, e.cols, true));
  // DSpark's Markov bias u·W2ᵀ is added into a chunk of f32 draft logits [chunk, V] (dspark_head.cu).
  if (dc.kind == DrafterKind::dspark && dc.markov_rank > 0) {
    const DSparkLayout L = dspark_head_layout(dspark_head_shape(dspark_head_dims(dc), nb), assume.lm_chunk);
    tune = std::max(tune, gemm_tune_scratch_bytes(L.chunk, dc.vocab, L.ldv, true));
  }
  add(dr, "GEMM tuning output", double(tune),
      "the largest beta != 0 GEMM output (weight gradients f32, dctx / residuals bf16, DSpark's draft logits "
      "f32); 0 with DFLASH_KERNEL_VARIANTS=gemm=heuristic");
  add(dr, "receive slot's pinned mirror (host)", 0,
      offline ? std::string("none: offline")
              : strfmt("host RAM, not VRAM: %.4g B pinned (the MPI wire lands there, NCCL lands in the slot and "
                       "needs none; credits keep the rest of the %d targets' batches with them)", slot, assume.targets));
  add(dr, "CUDA context, NCCL, slack", kRuntimeReserve, "1 GiB reserve");
  return dr;
}

VramPlan plan_vram_compute(const Config& cfg, const QwenConfig& t, double gpu_bytes,
                           const std::string& gpu_source, const VramAssumptions& assume) {
  DF_CHECK(gpu_bytes > 0, "GPU memory to plan against must be positive (got %g bytes)", gpu_bytes);
  DF_CHECK(assume.targets > 0, "the number of targets per drafter must be positive (got %d)", assume.targets);
  DF_CHECK(assume.seq_len >= 0 && assume.lm_chunk > 0,
           "sequence length must be >= 0 and the logits chunk > 0");
  VramPlan p;
  p.gpu_bytes = gpu_bytes;
  p.gpu_source = gpu_source;
  p.assume = assume;
  const bool final_hidden = drafter_streams_final_hidden(cfg);
  const int64_t T = cfg.data.token_budget;
  const double H = t.hidden, V = t.vocab;
  const DrafterConfig dc = drafter_config_from_run(cfg, t);
  const DrafterParamTable table = drafter_param_table(dc);
  const std::vector<int>& taps = dc.target_layer_ids;
  const int k = int(taps.size());
  const int depth = cfg.pipeline.hs_queue_depth;
  const double payload = payload_bytes(T, k, t.hidden, final_hidden);
  p.payload_bytes = payload;

  // ---- target: backbone up to the last tap (all layers + final norm for the soft-KL loss) ----
  p.target_layers_run = final_hidden ? t.layers : *std::max_element(taps.begin(), taps.end()) + 1;
  int n_lin = 0, n_full = 0;
  double layer_params = 0;
  for (int l = 0; l < p.target_layers_run; ++l) {
    const LayerKind kind = t.layer_types[l];
    (kind == LayerKind::linear_attention ? n_lin : n_full)++;
    layer_params += plan_vram_target_layer_params(t, l);
  }
  VramRole& tr = p.target;
  tr.role = "target";
  // An MoE target's experts, router and shared expert are lines of their own (plan_vram_moe.h).
  const MoeParamCount moe = plan_vram_moe_params(t, p.target_layers_run);
  const double tw = V * H + layer_params - moe.total() + (final_hidden ? H : 0);
  const bool fp8 = cfg.target.dtype == "fp8";
  // A 128x128 block checkpoint keeps its block scales and quantises inputs per token per 128 columns.
  const bool blocks = fp8 && t.fp8_block_n == 128 && t.fp8_block_k == 128;
  if (fp8) {
    // target.dtype = "fp8" on CUDA: the projections are e4m3 codes + a scale per output channel (or a 128x128
    // block checkpoint's own codes and block scales), the rest bf16; each linear layer's input is quantised into
    // one planned [T, max K] code buffer with a scale per token (per token per 128 columns with blocks).
    Fp8LayerProj f;
    double max_k = H;
    for (int l = 0; l < p.target_layers_run; ++l) {
      const LayerKind kind = t.layer_types[l];
      const Fp8LayerProj x = fp8_layer_proj(t, l);
      f.elems += x.elems, f.rows += x.rows, f.ba_bf16 += x.ba_bf16, f.block_scales += x.block_scales;
      const double mixer_out = kind == LayerKind::full_attention ? double(t.heads) * t.head_dim  // o_proj's K
                                                                 : double(t.lin_nv) * t.lin_dv;  // out_proj's K
      max_k = std::max({max_k, t.layer_is_moe(l) ? 0.0 : double(t.intermediate), mixer_out});
    }
    add(tr, "weights bf16", kBf16 * (tw - f.elems + f.ba_bf16),
        strfmt("2 B x (embed %.0fx%.0f, norms, conv, DeltaNet b|a rows%s) = %.4g params", V, H,
               final_hidden ? ", final norm" : "", tw - f.elems + f.ba_bf16));
    const double wscales = blocks ? f.block_scales : f.rows, xscales = blocks ? double(fp8_group_scales_size(T, int64_t(std::ceil(max_k / 128)))) : T;
    add(tr, "weights FP8 e4m3 + scales", f.elems + kF32 * wscales,
        strfmt("1 B x %.4g projection weights of %d layers (%d linear, %d full) + 4 B x %.4g %s", f.elems,
               p.target_layers_run, n_lin, n_full, wscales,
               blocks ? "128x128 block scales (the checkpoint's)" : "channel scales"));
    for (const VramItem& it : plan_vram_moe_fp8_weights(t, moe, blocks))
      add(tr, it.name, it.bytes, it.detail);
    p.target_weight_bytes = tr.total;
    add(tr, "FP8 input codes + scales", double(T) * max_k + kF32 * xscales,
        strfmt("1 B x %lld x %.0f + 4 B x %.0f%s", (long long)T, max_k, xscales,
               blocks ? " (a scale per token per 128 columns)" : ""));
  } else {
    // An FP8 checkpoint is dequantised at load (model/fp8_weights.h): its weights take bf16 room, not 1 B each.
    add(tr, "weights bf16", kBf16 * tw,
        strfmt("2 B x (embed %.0fx%.0f + %d layers (%d linear, %d full)%s%s) = %.4g params%s", V, H,
               p.target_layers_run, n_lin, n_full, final_hidden ? " + final norm" : "",
               t.is_moe() ? ", MoE experts below" : "", tw,
               t.fp8_block_n > 0 ? " (FP8 checkpoint, held as bf16 after dequantisation)" : ""));
    for (const VramItem& it : plan_vram_moe_weights(t, moe)) add(tr, it.name, it.bytes, it.detail);
    p.target_weight_bytes = tr.total;
  }
  if (p.target_weight_bytes > gpu_bytes) p.target_too_big = plan_vram_target_too_big(cfg, t, p);
  add(tr, "residual [T,H] bf16", kBf16 * T * H, strfmt("2 B x %lld x %.0f", (long long)T, H));
  add(tr, "normed input [T,H] bf16", kBf16 * T * H, strfmt("2 B x %lld x %.0f", (long long)T, H));
  double proj = 2.0 * t.intermediate, mixer = 0;
  std::string proj_what = "mlp gate|up";
  if (n_full) {
    const double qkv =
        double(t.heads) * t.head_dim * (t.attn_output_gate ? 2 : 1) + 2.0 * t.kv_heads * t.head_dim;
    if (qkv > proj) proj = qkv, proj_what = "attention q|k|v";
    mixer = std::max(mixer, double(t.heads) * t.head_dim);
  }
  const double value_dim = double(t.lin_nv) * t.lin_dv, conv_ch = 2.0 * t.lin_nk * t.lin_dk + value_dim;
  if (n_lin) {
    const double fused = conv_ch + value_dim + 2.0 * t.lin_nv;
    if (fused > proj) proj = fused, proj_what = "DeltaNet qkv|z|b|a";
    mixer = std::max(mixer, conv_ch + value_dim);  // conv output and the core's output
  }
  add(tr, "largest fused projection bf16", kBf16 * T * proj,
      strfmt("2 B x %lld x %.0f (%s)", (long long)T, proj, proj_what.c_str()));
  add(tr, "attention/DeltaNet outputs bf16", kBf16 * T * mixer,
      strfmt("2 B x %lld x %.0f (%s)", (long long)T, mixer,
             n_lin ? "conv out + core out" : "heads x head_dim"));
  if (n_lin) {
    // Exactly what TargetForward plans for the CUDA prefill (kernels/gdn/gdn_workspace.h); the state itself
    // lives in registers, one (sequence, head) at a time, so no per-chunk state is kept.
    const int D = gdn_prefill_tile_dim(t.lin_dk, t.lin_dv);
    add(tr, "DeltaNet prefill workspace",
        double(gdn_prefill_workspace_bytes(T, t.lin_nv, t.lin_dk, t.lin_dv)),
        strfmt("%lld tokens x %d heads x (W, U 2 x 2 B x %d + scores 2 B x %d + scalars %zu B)", (long long)T,
               t.lin_nv, D, kGdnChunk, kGdnRowScalarBytes));
  }
  add(tr, "MLP intermediate [T,I] bf16", kBf16 * T * t.intermediate,
      strfmt("2 B x %lld x %d%s", (long long)T, t.intermediate, t.is_moe() ? " (dense layers only)" : ""));
  if (t.is_moe())
    for (const VramItem& it : plan_vram_moe_routing(t, T, fp8, blocks)) add(tr, it.name, it.bytes, it.detail);
  add(tr, "cuBLASLt workspace", double(kGemmWorkspaceBytes), "64 MiB (kernels/train/train_workspace.h)");
  const double slot = double(WireLayout::bytes(T, int64_t(k) * t.hidden, final_hidden ? t.hidden : 0));
  add(tr, "send buffers", depth * slot,
      strfmt("hs_queue_depth %d wire slots x %.4g B (taps%s, written by the forward in place; each with a "
             "pinned "
             "host mirror of the same size on the MPI wire, none on NCCL)",
             depth, slot, final_hidden ? ", final hidden" : ""));
  add(tr, "CUDA context, NCCL, slack", kRuntimeReserve, "1 GiB reserve");

  // ---- drafter ----
  const DrafterSection& d = cfg.drafter;
  for (const DrafterParamEntry& e : table.entries) p.drafter_params += e.rows * e.cols;
  p.drafter_flat = table.total;
  const int64_t L = assume.seq_len > 0 ? std::min(assume.seq_len, T) : T;
  const int64_t seqs = (T + L - 1) / L;
  p.anchors = std::min<int64_t>(std::min<int64_t>(d.num_anchors, std::max<int64_t>(L - 1, 1)) * seqs, T);
  p.max_blocks = drafter_limits_from_run(cfg).max_blocks;
  p.drafter = plan_vram_drafter(cfg, dc, t.tie_word_embeddings, assume);

  p.notes.push_back(
      strfmt("token budget %lld; sequences of %lld tokens -> %lld per micro-batch, %lld anchor "
             "blocks of %d (pass --seq-len for your data's typical length)",
             (long long)T, (long long)L, (long long)seqs, (long long)p.anchors, d.block_size));
  if (p.anchors > p.max_blocks)
    p.notes.push_back(
        strfmt("drafter.max_block_rows %lld keeps %lld of those %lld anchor blocks (the rest are "
               "dropped at random, metrics.jsonl anchors_dropped)",
               (long long)d.max_block_rows, (long long)p.max_blocks, (long long)p.anchors));
  p.notes.push_back(
      strfmt("each drafter receives from %d targets (hs_queue_depth credits per target)", assume.targets));
  if (final_hidden)
    p.notes.push_back(
        "the loss reads the target's final hidden (soft-KL, DSpark): targets run every layer and the final "
        "norm and send it; the drafter "
        "applies its frozen lm_head (no lm_head on targets)");
  return p;
}

void plan_vram_check(const VramPlan& p) {
  DF_CHECK(p.refused.empty(), "%s", p.refused.c_str());
  std::string bad;
  for (const VramRole* r : {&p.target, &p.drafter}) {
    if (r->total > p.gpu_bytes)
      bad += strfmt("%s%s needs %.2f GiB, %.2f GiB over", bad.empty() ? "" : "; ", r->role.c_str(),
                    r->total / kGiB, (r->total - p.gpu_bytes) / kGiB);
  }
  // When the target's weights alone are over, the budget and queue depth cannot help: say why instead.
  DF_CHECK(
      bad.empty(), "does not fit a %.2f GiB GPU (%s): %s. %s", p.gpu_bytes / kGiB, p.gpu_source.c_str(),
      bad.c_str(),
      !p.target_too_big.empty()
          ? p.target_too_big.c_str()
          : "HINT: lower data.token_budget or pipeline.hs_queue_depth, use fewer targets per drafter, or run "
            "`dflash_mpi plan vram --config F` for the breakdown");
}

std::string plan_vram_format(const VramPlan& p) {
  std::string out;
  for (const VramRole* r : {&p.target, &p.drafter}) {
    out +=
        strfmt("%s rank:\n  %-32s %16s %10s  %s\n", r->role.c_str(), "component", "bytes", "GiB", "formula");
    for (const VramItem& it : r->items)
      out += strfmt("  %-32s %16.0f %10.3f  %s\n", it.name.c_str(), it.bytes, it.bytes / kGiB,
                    it.detail.c_str());
    out += strfmt("  %-32s %16.0f %10.3f  (%.1f%% of the GPU)\n\n", "total", r->total, r->total / kGiB,
                  100 * r->total / p.gpu_bytes);
  }
  for (const std::string& n : p.notes) out += "note: " + n + "\n";
  out += strfmt("GPU memory: %.2f GiB (%s)\n", p.gpu_bytes / kGiB, p.gpu_source.c_str());
  const bool fits = p.target.total <= p.gpu_bytes && p.drafter.total <= p.gpu_bytes;
  out += strfmt("verdict: %s (target %.2f GiB, drafter %.2f GiB, GPU %.2f GiB)\n",
                !p.refused.empty() ? "REFUSED"
                : fits             ? "fits"
                                   : "DOES NOT FIT",
                p.target.total / kGiB, p.drafter.total / kGiB, p.gpu_bytes / kGiB);
  if (!p.refused.empty()) out += "refused: " + p.refused + "\n";
  if (!p.target_too_big.empty()) out += p.target_too_big + "\n";
  return out;
}

double plan_vram_gpu_bytes(double gib, std::string& source) {
  if (gib > 0) {
    source = "--gpu-mem";
    return gib * kGiB;
  }
  try {
    HostTopo topo = topo_discover_local(topo_local_hostname());
    if (!topo.gpus.empty() && topo.gpus[0].memory_bytes > 0) {
      source = strfmt("NVML, GPU 0 %s", topo.gpus[0].name.c_str());
      return double(topo.gpus[0].memory_bytes);
    }
  } catch (const Error&) {
    // No readable PCI tree either: fall through to the default like a machine without NVML.
  }
  source = "default 80 GiB: no GPU memory size from NVML; pass --gpu-mem GiB";
  return 80 * kGiB;
}

}  // namespace df
