// The VRAM planner's arithmetic. Every component is one line with its formula in `detail`; the counts follow
// the data path of DESIGN.md (targets: backbone forward up to the last tap, buffers reused layer to layer;
// drafters: one optimizer's state over flat buffers plus what one micro-batch keeps for its backward).
#include "topo/plan_vram.h"

#include <algorithm>

#include "core/error.h"
#include "core/strfmt.h"
#include "kernels/gdn_workspace.h"
#include "topo/topo.h"

namespace df {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kBf16 = 2, kF32 = 4;
// cuBLASLt workspace: what kernels/gemm.cu allocates (split-K / stream-K kernels on Hopper ask for it).
constexpr double kCublasWorkspace = 64.0 * 1024 * 1024;
// CUDA context, NCCL channel buffers and allocator rounding: ~0.5 GiB context plus NCCL's per-peer
// buffers; 1 GiB keeps the verdict on the safe side without a device to measure on.
constexpr double kRuntimeReserve = kGiB;

void add(VramRole& r, std::string name, double bytes, std::string detail) {
  r.items.push_back({std::move(name), bytes, std::move(detail)});
  r.total += bytes;
}

// Bytes of one target->drafter payload: token ids (i32), loss mask (u8), taps [T, k·H] bf16 and, for the
// soft-KL loss, the final-norm output [T, H] bf16 (the header travels separately and is negligible).
double payload_bytes(int64_t tokens, int taps, int hidden, bool kl) {
  return double(tokens) * (4 + 1 + kBf16 * taps * hidden + (kl ? kBf16 * hidden : 0));
}

}  // namespace

double plan_vram_target_layer_params(const QwenConfig& t, LayerKind kind) {
  const double h = t.hidden;
  const double common = 3.0 * h * t.intermediate + 2.0 * h;  // MLP and the two layer norms
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
  const bool kl = cfg.train.loss == "kl";
  const int64_t T = cfg.data.token_budget;
  const double H = t.hidden, V = t.vocab;
  const DrafterConfig dc = drafter_config_from_run(cfg, t);
  const DrafterParamTable table = drafter_param_table(dc);
  const std::vector<int>& taps = dc.target_layer_ids;
  const int k = int(taps.size());
  const int depth = cfg.pipeline.hs_queue_depth;
  const double payload = payload_bytes(T, k, t.hidden, kl);
  p.payload_bytes = payload;

  // ---- target: backbone up to the last tap (all layers + final norm for the soft-KL loss) ----
  p.target_layers_run = kl ? t.layers : *std::max_element(taps.begin(), taps.end()) + 1;
  int n_lin = 0, n_full = 0;
  double layer_params = 0;
  for (int l = 0; l < p.target_layers_run; ++l) {
    const LayerKind kind = t.layer_types[l];
    (kind == LayerKind::linear_attention ? n_lin : n_full)++;
    layer_params += plan_vram_target_layer_params(t, kind);
  }
  VramRole& tr = p.target;
  tr.role = "target";
  const double tw = V * H + layer_params + (kl ? H : 0);
  // An FP8 checkpoint is dequantised at load (model/fp8_weights.h): its weights take bf16 room, not 1 B each.
  add(tr, "weights bf16", kBf16 * tw,
      strfmt("2 B x (embed %.0fx%.0f + %d layers (%d linear, %d full)%s) = %.4g params%s", V, H,
             p.target_layers_run, n_lin, n_full, kl ? " + final norm" : "", tw,
             t.fp8_block_n > 0 ? " (FP8 checkpoint, held as bf16 after dequantisation)" : ""));
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
    // Exactly what TargetForward plans for the CUDA prefill (kernels/gdn_workspace.h); the state itself
    // lives in registers, one (sequence, head) at a time, so no per-chunk state is kept.
    const int D = gdn_prefill_tile_dim(t.lin_dk, t.lin_dv);
    add(tr, "DeltaNet prefill workspace",
        double(gdn_prefill_workspace_bytes(T, t.lin_nv, t.lin_dk, t.lin_dv)),
        strfmt("%lld tokens x %d heads x (W, U 2 x 2 B x %d + scores 2 B x %d + scalars %zu B)", (long long)T,
               t.lin_nv, D, kGdnChunk, kGdnRowScalarBytes));
  }
  add(tr, "MLP intermediate [T,I] bf16", kBf16 * T * t.intermediate,
      strfmt("2 B x %lld x %d", (long long)T, t.intermediate));
  add(tr, "tap outputs [T,k*H] bf16", kBf16 * T * k * H,
      strfmt("2 B x %lld x %d x %.0f", (long long)T, k, H));
  if (kl) add(tr, "final hidden [T,H] bf16", kBf16 * T * H, strfmt("2 B x %lld x %.0f", (long long)T, H));
  add(tr, "cuBLASLt workspace", kCublasWorkspace, "64 MiB");
  add(tr, "send buffers", depth * payload,
      strfmt("hs_queue_depth %d x payload %.4g B (ids, mask, taps%s)", depth, payload,
             kl ? ", final hidden" : ""));
  add(tr, "CUDA context, NCCL, slack", kRuntimeReserve, "1 GiB reserve");

  // ---- drafter ----
  const DrafterSection& d = cfg.drafter;
  for (const DrafterParamEntry& e : table.entries) p.drafter_params += e.rows * e.cols;
  p.drafter_flat = table.total;
  const double P = double(table.total);
  const int64_t L = assume.seq_len > 0 ? std::min(assume.seq_len, T) : T;
  const int64_t seqs = (T + L - 1) / L;
  p.anchors = std::min<int64_t>(std::min<int64_t>(d.num_anchors, std::max<int64_t>(L - 1, 1)) * seqs, T);
  VramRole& dr = p.drafter;
  dr.role = "drafter";
  // What DrafterModel, the drafter loop and CudaTrainOps allocate (model/drafter.cpp,
  // pipeline/drafter_loop.cpp): one flat block of f32 master weights, gradients, Adam m and v plus the bf16
  // shadow, the frozen tables uploaded once as bf16, the staging of one received batch, and the activation
  // workspace planned for drafter_limits_from_run — the exact bytes drafter_workspace_bytes computes, not a
  // per-row estimate.
  add(dr, "weights bf16 copy", kBf16 * P, strfmt("2 B x %.4g params (the GEMM weight shadow)", P));
  add(dr, "master weights fp32", kF32 * P, strfmt("4 B x %.4g", P));
  add(dr, "gradients fp32", kF32 * P, strfmt("4 B x %.4g", P));
  add(dr, "Adam m, v fp32", 2 * kF32 * P, strfmt("2 x 4 B x %.4g", P));
  add(dr, "frozen embedding [V,H] bf16", kBf16 * V * H, strfmt("2 B x %.0f x %.0f", V, H));
  if (t.tie_word_embeddings)
    add(dr, "frozen lm_head", 0, "tied: the embedding serves as lm_head");
  else
    add(dr, "frozen lm_head [V,H] bf16", kBf16 * V * H, strfmt("2 B x %.0f x %.0f", V, H));
  add(dr, "received payloads", double(assume.targets) * depth * payload,
      strfmt("%d targets x hs_queue_depth %d x %.4g B", assume.targets, depth, payload));
  add(dr, "batch staging bf16", kBf16 * double(T) * (k * H + (kl ? H : 0)),
      strfmt("2 B x %lld tokens x (taps %.0f%s)", (long long)T, k * H, kl ? " + final hidden" : ""));
  const DrafterLimits lim = drafter_limits_from_run(cfg);
  p.max_blocks = lim.max_blocks;
  add(dr, "activation workspace", double(drafter_workspace_bytes(dc, lim, DType::bf16)),
      strfmt("drafter_workspace_bytes: %lld tokens, %lld blocks of %d (drafter.max_block_rows %lld)%s%s",
             (long long)lim.max_tokens, (long long)lim.max_blocks, d.block_size, (long long)d.max_block_rows,
             lim.kl ? ", kl" : "", lim.noise ? ", noisy taps copy" : ""));
  const double R = double(lim.max_blocks) * d.block_size;
  // The attention backward's f32 softmax row terms, lse·log2 e and D per query row and head
  // (kernels/dflash_attention.cu dflash_attention_bwd_workspace_bytes), for the largest planned batch.
  add(dr, "attention bwd workspace f32", 2 * kF32 * R * d.heads,
      strfmt("2 x 4 B x %.0f block rows x %d heads", R, d.heads));
  const double chunk = double(std::min<int64_t>(assume.lm_chunk, int64_t(R)));
  const int n_logits = kl ? 3 : 2;
  add(dr, "logits chunks fp32", kF32 * n_logits * chunk * V,
      strfmt("%d x 4 B x [%.0f, %.0f] (logits, dlogits%s)", n_logits, chunk, V, kl ? ", target logits" : ""));
  add(dr, "cuBLASLt workspace", kCublasWorkspace, "64 MiB");
  add(dr, "CUDA context, NCCL, slack", kRuntimeReserve, "1 GiB reserve");

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
  if (kl)
    p.notes.push_back(
        "loss kl: targets run every layer and the final norm and send the final hidden; the drafter "
        "applies its frozen lm_head (no lm_head on targets)");
  return p;
}

void plan_vram_check(const VramPlan& p) {
  std::string bad;
  for (const VramRole* r : {&p.target, &p.drafter}) {
    if (r->total > p.gpu_bytes)
      bad += strfmt("%s%s needs %.2f GiB, %.2f GiB over", bad.empty() ? "" : "; ", r->role.c_str(),
                    r->total / kGiB, (r->total - p.gpu_bytes) / kGiB);
  }
  DF_CHECK(
      bad.empty(),
      "does not fit a %.2f GiB GPU (%s): %s. HINT: lower data.token_budget or pipeline.hs_queue_depth, use "
      "fewer targets per drafter, or run `dflash_mpi plan vram --config F` for the breakdown",
      p.gpu_bytes / kGiB, p.gpu_source.c_str(), bad.c_str());
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
                fits ? "fits" : "DOES NOT FIT", p.target.total / kGiB, p.drafter.total / kGiB,
                p.gpu_bytes / kGiB);
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
