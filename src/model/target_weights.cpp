// Target weights: one layout routine places every tensor in one backend block (run first against a
// counting arena to size it), and one fill routine pulls each Hugging Face tensor from a source — a
// safetensors checkpoint or the counter-based RNG — into its (possibly fused) place.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "core/file_util.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/fp8_weights.h"
#include "model/safetensors.h"
#include "model/target.h"
#include "model/target_moe.h"

namespace df {

namespace {

// n rows that move from row src_row of an HF tensor to row dst_row of ours.
struct RowRun {
  int64_t dst_row, src_row, n;
};

// Where the weights come from: a checkpoint (host copies, uploaded) or the counter-based RNG (drawn in
// place by the backend, so a 27 B-parameter random model never exists as host floats).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Writes HF tensor `name`, of HF shape `shape`, into dst (its rows in order, flattened to dst's 2-D shape).
  virtual void fill(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape) = 0;
  // HF tensor `name` regrouped: each run moves n rows from HF row src_row to dst row dst_row (the runs cover
  // both exactly once: row_runs_*).
  virtual void fill_runs(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape,
                         const std::vector<RowRun>& runs) = 0;
  // Whether the MoE layer under `mp` holds its experts as the two fused tensors (else one triple per expert). A
  // checkpoint that holds both namings, or an expert past the config's num_experts, is refused naming the tensor.
  virtual bool fused_experts(const std::string& mp) const = 0;
  // A 128x128 block checkpoint's FP8 tensor `name` as it is: its codes into `codes` (f8_e4m3 rows, a multiple of
  // 128) and its block scales into `scales` (one row per 128 rows, fp8_block_scale_ld columns); with runs,
  // regrouped as fill_runs does (every run whole 128-row blocks: fp8_check_blocks).
  virtual void fill_fp8_blocks(const Tensor& codes, const Tensor& /*scales*/, const std::string& name,
                               const std::vector<int64_t>& /*shape*/, const std::vector<RowRun>& /*runs*/) {
    DF_FAIL("'%s' -> %s: this weight source has no FP8 blocks", name.c_str(), codes.shape_str().c_str());
  }
};

// A gated q_proj [2·heads·hd, H]: HF rows per head are [q (hd) | gate (hd)]; ours are all q heads, then all
// gate heads.
std::vector<RowRun> row_runs_q_gate(int heads, int64_t hd) {
  std::vector<RowRun> runs;
  for (int64_t h = 0; h < heads; ++h) {
    runs.push_back({h * hd, 2 * h * hd, hd});
    runs.push_back({heads * hd + h * hd, 2 * h * hd + hd, hd});
  }
  return runs;
}

// qwen3_next's in_proj_qkvz: for each key head g, [q_g (dk) | k_g (dk) | v (r·dv) | z (r·dv)] with r value heads
// per key head (transformers' fix_query_key_value_ordering); ours are every q, every k, every v (the conv's
// channels), then every z.
std::vector<RowRun> row_runs_qkvz(const QwenConfig& c) {
  const int64_t nk = c.lin_nk, dk = c.lin_dk, rv = int64_t(c.lin_nv / c.lin_nk) * c.lin_dv;
  const int64_t conv_ch = 2 * nk * dk + nk * rv;
  std::vector<RowRun> runs;
  for (int64_t g = 0; g < nk; ++g) {
    const int64_t base = g * (2 * dk + 2 * rv);
    runs.push_back({g * dk, base, dk});
    runs.push_back({nk * dk + g * dk, base + dk, dk});
    runs.push_back({2 * nk * dk + g * rv, base + 2 * dk, rv});
    runs.push_back({conv_ch + g * rv, base + 2 * dk + rv, rv});
  }
  return runs;
}

// qwen3_next's in_proj_ba: for each key head g, [b (r) | a (r)]; ours are every b, then every a.
std::vector<RowRun> row_runs_ba(const QwenConfig& c) {
  const int64_t nk = c.lin_nk, r = c.lin_nv / c.lin_nk;
  std::vector<RowRun> runs;
  for (int64_t g = 0; g < nk; ++g) {
    runs.push_back({g * r, 2 * g * r, r});
    runs.push_back({c.lin_nv + g * r, 2 * g * r + r, r});
  }
  return runs;
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void layout_model(TargetModel& m, Arena& a, const TargetLoadOptions& opt) {
  const QwenConfig& c = m.cfg;
  DType act = m.ops->act_dtype();
  // The projections: act dtype, or e4m3 codes with a scale per row where the backend multiplies codes; a
  // 128x128 block checkpoint's codes keep its block scales instead, one row of them per 128 FP8 rows.
  const DType pdt = m.fp8_codes ? DType::f8_e4m3 : act;
  auto scales = [&](const Tensor& w, int64_t fp8_rows) {
    if (!m.fp8_codes) return Tensor();
    if (m.fp8_group > 0) return a.alloc(DType::f32, (fp8_rows + 127) / 128, fp8_block_scale_ld(w.cols));
    return a.alloc(DType::f32, 1, w.rows);
  };
  const int64_t H = c.hidden;
  m.embed = a.alloc(act, c.vocab, H);
  m.final_norm = a.alloc(DType::f32, 1, H);
  if (opt.need_lm_head) m.lm_head = c.tie_word_embeddings ? m.embed : a.alloc(act, c.vocab, H);
  m.layers.assign(m.num_loaded_layers, TargetLayer{});
  for (int i = 0; i < m.num_loaded_layers; ++i) {
    TargetLayer& L = m.layers[i];
    L.kind = c.layer_types[i];
    L.ln1 = a.alloc(DType::f32, 1, H);
    L.ln2 = a.alloc(DType::f32, 1, H);
    if (L.kind == LayerKind::full_attention) {
      int64_t q = int64_t(c.heads) * c.head_dim, kv = int64_t(c.kv_heads) * c.head_dim;
      L.w_qkv = a.alloc(pdt, q * (c.attn_output_gate ? 2 : 1) + 2 * kv, H);
      L.w_o = a.alloc(pdt, H, q);
      L.s_qkv = scales(L.w_qkv, L.w_qkv.rows);
      L.s_o = scales(L.w_o, L.w_o.rows);
      L.q_norm = a.alloc(DType::f32, 1, c.head_dim);
      L.k_norm = a.alloc(DType::f32, 1, c.head_dim);
    } else {
      int64_t conv_ch = 2 * int64_t(c.lin_nk) * c.lin_dk + int64_t(c.lin_nv) * c.lin_dv;
      int64_t vdim = int64_t(c.lin_nv) * c.lin_dv;
      L.w_in = a.alloc(pdt, conv_ch + vdim + 2 * c.lin_nv, H);
      L.s_in = scales(L.w_in, conv_ch + vdim);
      if (m.fp8_codes) L.w_in_ba = a.alloc(act, 2 * c.lin_nv, H);
      L.conv_w = a.alloc(DType::f32, conv_ch, c.conv_kernel);
      L.A_log = a.alloc(DType::f32, 1, c.lin_nv);
      L.dt_bias = a.alloc(DType::f32, 1, c.lin_nv);
      L.gdn_norm = a.alloc(DType::f32, 1, c.lin_dv);
      L.w_out = a.alloc(pdt, H, vdim);
      L.s_out = scales(L.w_out, L.w_out.rows);
    }
    if (c.layer_is_moe(i)) {
      target_moe_layout(m, L, a, act);
      continue;
    }
    L.w_gate_up = a.alloc(pdt, 2 * int64_t(c.intermediate), H);
    L.w_down = a.alloc(pdt, H, c.intermediate);
    L.s_gate_up = scales(L.w_gate_up, L.w_gate_up.rows);
    L.s_down = scales(L.w_down, L.w_down.rows);
  }
}

// Where a model holds FP8 codes, each projection is drawn or read into `staging` (act dtype, at least as large
// as the largest HF projection) and quantised per row into its codes and scales; rows are quantised
// independently, so a fused weight filled piece by piece gets the scales the whole would.
void fill_model(TargetModel& m, const std::string& p, WeightSource& src, const Tensor& staging) {
  const QwenConfig& c = m.cfg;
  const int64_t H = c.hidden;
  auto whole = [&](const Tensor& dst, const std::string& name, std::vector<int64_t> shape) {
    src.fill(dst, name, shape);
  };
  // Rows [r0, r0 + n) of projection w (scales s) from HF tensor `name` of HF shape `shape` ({n, w.cols} when
  // empty; the MoE experts' fused tensors are 3-D); runs: the HF tensor's regrouping (none: rows in order).
  const std::vector<RowRun> in_order;
  auto proj_as = [&](const Tensor& w, const Tensor& s, int64_t r0, int64_t n, const std::string& name,
                     const std::vector<RowRun>& runs, std::vector<int64_t> shape) {
    if (shape.empty()) shape = {n, w.cols};
    if (m.fp8_codes && m.fp8_group > 0) {  // rows in whole blocks: fp8_check_blocks
      src.fill_fp8_blocks(w.rows_view(r0, n), s.rows_view(r0 / 128, n / 128), name, shape, runs);
      return;
    }
    const Tensor dst = m.fp8_codes ? Tensor{staging.data, staging.dtype, staging.device, n, w.cols, w.cols}
                                    : w.rows_view(r0, n);
    if (runs.empty())
      src.fill(dst, name, shape);
    else
      src.fill_runs(dst, name, shape, runs);
    if (m.fp8_codes) m.ops->fp8_quantize_rows(dst, w.rows_view(r0, n), s.cols_view(r0, n), false);
  };
  auto proj = [&](const Tensor& w, const Tensor& s, int64_t r0, int64_t n, const std::string& name,
                  const std::vector<RowRun>& runs) { proj_as(w, s, r0, n, name, runs, {}); };
  const std::vector<RowRun> q_gate = c.attn_output_gate ? row_runs_q_gate(c.heads, c.head_dim) : in_order;
  whole(m.embed, p + "embed_tokens.weight", {c.vocab, H});
  whole(m.final_norm, p + "norm.weight", {H});
  if (!m.lm_head.empty() && !c.tie_word_embeddings) whole(m.lm_head, "lm_head.weight", {c.vocab, H});
  for (int i = 0; i < m.num_loaded_layers; ++i) {
    const TargetLayer& L = m.layers[i];
    std::string lp = p + "layers." + std::to_string(i) + ".";
    whole(L.ln1, lp + "input_layernorm.weight", {H});
    whole(L.ln2, lp + "post_attention_layernorm.weight", {H});
    if (L.kind == LayerKind::full_attention) {
      const int64_t hd = c.head_dim, q = int64_t(c.heads) * hd, kv = int64_t(c.kv_heads) * hd;
      std::string ap = lp + "self_attn.";
      const int64_t k0 = q * (c.attn_output_gate ? 2 : 1);
      proj(L.w_qkv, L.s_qkv, 0, k0, ap + "q_proj.weight", q_gate);
      proj(L.w_qkv, L.s_qkv, k0, kv, ap + "k_proj.weight", in_order);
      proj(L.w_qkv, L.s_qkv, k0 + kv, kv, ap + "v_proj.weight", in_order);
      proj(L.w_o, L.s_o, 0, H, ap + "o_proj.weight", in_order);
      whole(L.q_norm, ap + "q_norm.weight", {hd});
      whole(L.k_norm, ap + "k_norm.weight", {hd});
    } else {
      std::string gp = lp + "linear_attn.";
      const int64_t conv_ch = L.conv_w.rows, vdim = int64_t(c.lin_nv) * c.lin_dv, nv = c.lin_nv;
      // With codes, b / a live in bf16 in w_in_ba; their rows of codes stay zero with scale 1 (never read).
      const Tensor& ba = m.fp8_codes ? L.w_in_ba : L.w_in.rows_view(conv_ch + vdim, 2 * nv);
      if (c.per_key_head_gdn_proj()) {
        proj(L.w_in, L.s_in, 0, conv_ch + vdim, gp + "in_proj_qkvz.weight", row_runs_qkvz(c));
        src.fill_runs(ba, gp + "in_proj_ba.weight", {2 * nv, H}, row_runs_ba(c));
      } else {
        proj(L.w_in, L.s_in, 0, conv_ch, gp + "in_proj_qkv.weight", in_order);
        proj(L.w_in, L.s_in, conv_ch, vdim, gp + "in_proj_z.weight", in_order);
        whole(ba.rows_view(0, nv), gp + "in_proj_b.weight", {nv, H});
        whole(ba.rows_view(nv, nv), gp + "in_proj_a.weight", {nv, H});
      }
      if (m.fp8_codes) {
        const std::vector<uint8_t> zero(size_t(2 * nv * H), 0);
        const std::vector<float> one(size_t(2 * nv), 1.0f);
        m.ops->upload_raw(L.w_in.rows_view(conv_ch + vdim, 2 * nv), zero.data());
        if (m.fp8_group == 0) m.ops->upload_f32(L.s_in.cols_view(conv_ch + vdim, 2 * nv), one.data());
      }
      whole(L.conv_w, gp + "conv1d.weight", {conv_ch, 1, c.conv_kernel});
      whole(L.A_log, gp + "A_log", {nv});
      whole(L.dt_bias, gp + "dt_bias", {nv});
      whole(L.gdn_norm, gp + "norm.weight", {c.lin_dv});
      proj(L.w_out, L.s_out, 0, H, gp + "out_proj.weight", in_order);
    }
    std::string mp = lp + "mlp.";
    if (c.layer_is_moe(i)) {
      target_moe_fill(
          c, L, mp, src.fused_experts(mp),
          [&](const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape) {
            src.fill(dst, name, shape);
          },
          [&](const Tensor& w, const Tensor& s, int64_t r0, int64_t n, const std::string& name,
              const std::vector<int64_t>& shape) { proj_as(w, s, r0, n, name, in_order, shape); });
      continue;
    }
    const int64_t I = c.intermediate;
    proj(L.w_gate_up, L.s_gate_up, 0, I, mp + "gate_proj.weight", in_order);
    proj(L.w_gate_up, L.s_gate_up, I, I, mp + "up_proj.weight", in_order);
    proj(L.w_down, L.s_down, 0, H, mp + "down_proj.weight", in_order);
  }
}

// Hopper's FP8 GEMMs read K in 16-byte steps: every projection's input width a multiple of 16; its FP8 rows
// (w_in's without b / a) too, as PyTorch's _scaled_mm also demands of N. Refused at load time with the tensor
// named rather than in the first forward. Every Qwen3 / Qwen3.5 / Qwen3.6 release passes.
void fp8_check_shapes(const TargetModel& m) {
  const char* names[] = {"q|k|v_proj", "o_proj", "in_proj_qkv|z", "out_proj", "gate|up_proj", "down_proj"};
  const int64_t ba = 2 * int64_t(m.cfg.lin_nv);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const TargetLayer& L = m.layers[l];
    const auto ws = L.projections();
    for (size_t i = 0; i < ws.size(); ++i) {
      const int64_t rows = ws[i]->rows - (ws[i] == &L.w_in ? ba : 0);
      DF_CHECK(ws[i]->empty() || (ws[i]->cols % 16 == 0 && rows % 16 == 0),
               "target.dtype = \"fp8\": layer %zu %s.weight %s: the FP8 GEMMs need its %lld inputs and %lld FP8 "
               "rows to be multiples of 16; HINT: target.dtype = \"bf16\" for this model",
               l, names[i], ws[i]->shape_str().c_str(), (long long)ws[i]->cols, (long long)rows);
    }
    for (const MoeProjection& p : target_moe_projections(L))
      DF_CHECK(
          p.w->empty() || (p.w->cols % 16 == 0 && p.w->rows % 16 == 0),
          "target.dtype = \"fp8\": layer %zu %s %s: the FP8 expert GEMMs need its %lld inputs and %lld rows "
          "to be multiples of 16 (moe_intermediate_size, shared_expert_intermediate_size, hidden_size); "
          "HINT: "
          "target.dtype = \"bf16\" for this model",
          l, p.name, p.w->shape_str().c_str(), (long long)p.w->cols, (long long)p.w->rows);
  }
}

// A block-scaled GEMM multiplies each weight with one scale per 128x128 block, so every HF projection fused into
// one of ours must start and end on a block row (and a gated q_proj's heads too, which are regrouped). Refused at
// load time with the tensor named. Qwen3.6-27B: q_proj 12288 (heads of 256), k/v 1024, in_proj_qkv 10240, z
// 6144, gate/up 17408, and 5120 for the outputs: all whole blocks.
void fp8_check_blocks(const TargetModel& m) {
  const QwenConfig& c = m.cfg;
  const int64_t hd = c.head_dim, q = int64_t(c.heads) * hd * (c.attn_output_gate ? 2 : 1);
  const int64_t kv = int64_t(c.kv_heads) * hd, vdim = int64_t(c.lin_nv) * c.lin_dv;
  const int64_t conv_ch = 2 * int64_t(c.lin_nk) * c.lin_dk + vdim;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    std::vector<std::pair<const char*, int64_t>> parts;
    if (c.layer_is_moe(int(l))) {  // each expert's gate, up and down its own whole blocks
      parts = {{"mlp.experts.gate_proj (moe_intermediate_size)", c.moe_intermediate},
               {"mlp.experts.down_proj (hidden_size)", c.hidden}};
      if (c.shared_intermediate > 0)
        parts.push_back(
            {"mlp.shared_expert.gate_proj (shared_expert_intermediate_size)", c.shared_intermediate});
    } else {
      parts = {
          {"mlp.gate_proj", c.intermediate}, {"mlp.up_proj", c.intermediate}, {"mlp.down_proj", c.hidden}};
    }
    if (m.layers[l].kind == LayerKind::full_attention) {
      parts.insert(parts.end(), {{"self_attn.q_proj", q}, {"self_attn.k_proj", kv}, {"self_attn.v_proj", kv},
                                 {"self_attn.o_proj", c.hidden}});
      if (c.attn_output_gate) parts.push_back({"self_attn.q_proj (per head)", hd});
    } else if (c.per_key_head_gdn_proj()) {  // in_proj_qkvz's per key head pieces move whole: row_runs_qkvz
      parts.insert(parts.end(), {{"linear_attn.in_proj_qkvz (q and k per key head)", c.lin_dk},
                                 {"linear_attn.in_proj_qkvz (v and z per key head)",
                                  int64_t(c.lin_nv / c.lin_nk) * c.lin_dv},
                                 {"linear_attn.out_proj", c.hidden}});
    } else {
      parts.insert(parts.end(), {{"linear_attn.in_proj_qkv", conv_ch}, {"linear_attn.in_proj_z", vdim},
                                 {"linear_attn.out_proj", c.hidden}});
    }
    for (const auto& [name, rows] : parts)
      DF_CHECK(rows % 128 == 0,
               "target.dtype = \"fp8\" with the checkpoint's 128x128 blocks: layer %zu %s.weight has %lld rows; the "
               "block-scaled GEMM of a fused projection needs whole 128-row blocks; HINT: target.dtype = \"bf16\"",
               l, name, (long long)rows);
  }
}

// The dimensions the backend's kernels have limits on (Ops::check_target).
TargetShape target_shape(const QwenConfig& c) {
  TargetShape s;
  s.full_layers = c.num_full_layers();
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.linear_layers = c.num_linear_layers();
  s.gdn = {c.lin_nk, c.lin_nv, c.lin_dk, c.lin_dv};
  s.conv_kernel = c.conv_kernel;
  s.experts = c.is_moe() ? c.num_experts : 0;
  return s;
}

// fp8_group > 0: the source holds a block-scaled FP8 checkpoint whose weights are kept as they are
// (TargetModel::fp8_group).
std::unique_ptr<TargetModel> build_model(const QwenConfig& cfg, Ops& ops, const TargetLoadOptions& opt,
                                         const std::string& prefix, WeightSource& src,
                                         int64_t fp8_group = 0) {
  ops.check_target(target_shape(cfg));
  auto m = std::make_unique<TargetModel>();
  m->cfg = cfg;
  m->ops = &ops;
  m->num_loaded_layers = opt.num_layers < 0 ? cfg.layers : opt.num_layers;
  DF_CHECK(m->num_loaded_layers <= cfg.layers, "asked for %d layers but the model has %d", m->num_loaded_layers,
           cfg.layers);
  m->fp8 = opt.fp8;
  m->fp8_codes = opt.fp8 && ops.fp8_gemm();
  m->fp8_group = fp8_group;
  Arena arena;
  m->block = ops_alloc_planned(ops, [&](Arena& a) { layout_model(*m, a, opt); }, 0, arena);
  m->block_bytes = arena.capacity();
  Tensor staging;  // one projection in act dtype, quantised into codes as it is filled (per-row codes only)
  if (m->fp8_codes) fp8_check_shapes(*m);
  if (m->fp8_codes && m->fp8_group > 0) fp8_check_blocks(*m);
  if (m->fp8_codes && m->fp8_group == 0) {
    int64_t most = 0;
    for (const TargetLayer& L : m->layers) {
      for (const Tensor* w : L.projections()) most = std::max(most, w->numel());
      for (const MoeProjection& p : target_moe_projections(L)) most = std::max(most, p.w->numel());
    }
    staging = Tensor{ops.alloc_bytes(size_t(most) * dtype_size(ops.act_dtype())), ops.act_dtype(), ops.device(),
                     1, most, most};
  }
  fill_model(*m, prefix, src, staging);
  if (!staging.empty()) {
    ops.synchronize();  // the last quantisation reads the staging buffer
    ops.free_bytes(staging.data);
  }
  if (opt.fp8 && !m->fp8_codes && m->fp8_group == 0) {
    const int64_t b_rows = 2 * int64_t(cfg.lin_nv);  // in_proj_b and in_proj_a, the last rows of w_in
    for (const TargetLayer& L : m->layers) {
      for (const Tensor* w : L.projections())
        if (!w->empty()) ops.fp8_round_rows(w == &L.w_in ? w->rows_view(0, w->rows - b_rows) : *w);
      for (const MoeProjection& p : target_moe_projections(L))
        if (!p.w->empty()) ops.fp8_round_rows(*p.w);
    }
  }
  return m;
}

// Init scale by tensor role: projections ~ 1/sqrt(fan_in) keeps every layer's output O(1); norm weights
// are drawn around their neutral value (0 for zero-centred, 1 for plain) so tests see non-trivial norms.
// Each HF tensor draws from its own stream (a hash of its name), element i of the tensor at counter i, on
// the backend that holds it. A_log (nv values per layer) is log(1 + 15u), u uniform: decay rates spread
// over (0, 15] as in trained models, computed on the host because it is tiny and not normal.
class RandomSource final : public WeightSource {
 public:
  RandomSource(const QwenConfig& c, uint64_t seed, Ops& ops) : c_(c), seed_(seed), ops_(ops) {}

  void fill(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape) override {
    DF_CHECK(dst.numel() == numel_of(shape), "random weights: '%s' %s does not fit its destination %s",
             name.c_str(), st_shape_text(shape).c_str(), dst.shape_str().c_str());
    const uint64_t stream = std::hash<std::string>{}(name);
    auto ends_with = [&](const char* s) {
      std::string suf(s);
      return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (ends_with("A_log")) {
      std::vector<float> v(size_t(dst.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::log(1.0f + 15.0f * rng_uniform_at(seed_, stream, i));
      ops_.upload_f32(dst, v.data());
      return;
    }
    float mean = 0.0f, std = 0.0f;
    bool is_norm = ends_with("norm.weight") || ends_with("layernorm.weight");
    if (ends_with("dt_bias")) {
      std = 0.5f;
    } else if (ends_with("conv1d.weight")) {
      std = 0.4f;
    } else if (ends_with("linear_attn.norm.weight")) {  // gated RMSNorm is plain w·x̂ in both families
      mean = 1.0f, std = 0.1f;
    } else if (is_norm) {
      mean = c_.family == ModelFamily::qwen3_5 ? 0.0f : 1.0f, std = 0.1f;
    } else if (ends_with("embed_tokens.weight")) {
      std = 1.0f;
    } else {
      std = 1.0f / std::sqrt(static_cast<float>(shape.back()));
    }
    ops_.fill_normal(dst, seed_, stream, mean, std);
  }
  // Rows are i.i.d., so drawing a regrouped tensor in our row order is the same distribution; the HF order is
  // restored by target_save_hf.
  void fill_runs(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape,
                 const std::vector<RowRun>& /*runs*/) override {
    fill(dst, name, shape);
  }
  // Each fused expert tensor is one stream; target_save_hf writes the naming of the model type's releases.
  bool fused_experts(const std::string& /*mp*/) const override { return true; }

 private:
  const QwenConfig& c_;
  uint64_t seed_;
  Ops& ops_;
};

// Checkpoint tensors: converted to host f32 (FP8 ones dequantised with their block scales), checked against
// the expected shape, uploaded. One tensor's host copy at a time, so a 27 B model never sits twice in memory.
class CheckpointSource final : public WeightSource {
 public:
  // own_blocks: the FP8 target computes with the checkpoint's blocks, so every projection must be FP8 in it.
  CheckpointSource(const SafetensorsIndex& st, const std::string& dir, const QwenConfig& cfg, Ops& ops,
                   bool own_blocks)
      : st_(st), dir_(dir), cfg_(cfg), ops_(ops), own_blocks_(own_blocks) {}

  void fill(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape) override {
    std::vector<float> v = get(name, shape);
    ops_.upload_f32(dst, v.data());
  }
  void fill_fp8_blocks(const Tensor& codes, const Tensor& scales, const std::string& name,
                       const std::vector<int64_t>& shape, const std::vector<RowRun>& runs) override {
    const StTensor* t = find(name, shape);
    check_fp8(*t, name);
    std::vector<float> s;
    const uint8_t* q = fp8_block_codes(st_, *t, 128, 128, s);
    // A fused experts tensor [E, rows, K] is E matrices of whole 128-row blocks (fp8_check_blocks): as
    // [E·rows, K] its blocks' scales are those of one matrix after another.
    const int64_t K = shape.back(), N = numel_of(shape) / K, kb = (K + 127) / 128, ld = scales.cols;
    std::vector<float> padded(size_t(scales.rows * ld), 0.0f);
    // n HF rows from src_row to our dst_row, all three multiples of 128.
    auto place = [&](int64_t dst_row, int64_t src_row, int64_t n) {
      ops_.upload_raw(codes.rows_view(dst_row, n), q + src_row * K);
      for (int64_t b = 0; b < n / 128; ++b)
        std::copy_n(s.data() + (src_row / 128 + b) * kb, kb, padded.data() + (dst_row / 128 + b) * ld);
    };
    if (runs.empty()) place(0, 0, N);
    for (const RowRun& r : runs) place(r.dst_row, r.src_row, r.n);
    ops_.upload_f32(scales, padded.data());
  }
  void fill_runs(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape,
                 const std::vector<RowRun>& runs) override {
    std::vector<float> w = get(name, shape);
    const int64_t K = shape.back();
    for (const RowRun& r : runs) ops_.upload_f32(dst.rows_view(r.dst_row, r.n), w.data() + r.src_row * K);
  }
  bool fused_experts(const std::string& mp) const override {
    const std::string fused = target_moe_fused_name(mp), first = mp + "experts.0.gate_proj.weight";
    const bool is_fused = st_.find(fused) != nullptr;
    DF_CHECK(!is_fused || st_.find(first) == nullptr,
             "%s: tensors '%s' and '%s' are both in the checkpoint: one layer's experts in two namings; HINT: keep "
             "the fused or the per-expert tensors, not both",
             dir_.c_str(), fused.c_str(), first.c_str());
    const std::string beyond = mp + "experts." + std::to_string(cfg_.num_experts) + ".gate_proj.weight";
    DF_CHECK(st_.find(beyond) == nullptr,
             "%s: tensor '%s' is an expert past num_experts (%d); HINT: config.json and the weights do not "
             "belong together",
             dir_.c_str(), beyond.c_str(), cfg_.num_experts);
    return is_fused;
  }

 private:
  // Tensor `name`, present and of the expected shape.
  const StTensor* find(const std::string& name, const std::vector<int64_t>& shape) const {
    const StTensor* t = st_.find(name);
    DF_CHECK(t != nullptr, "%s: tensor '%s' (expected shape %s) is missing from the checkpoint", dir_.c_str(),
             name.c_str(), st_shape_text(shape).c_str());
    DF_CHECK(t->shape == shape,
             "%s: tensor '%s' has shape %s but the config needs %s; HINT: config.json and the "
             "weights do not belong together",
             dir_.c_str(), name.c_str(), st_shape_text(t->shape).c_str(), st_shape_text(shape).c_str());
    return t;
  }
  // With own_blocks every decoder projection must be FP8 in the file.
  void check_fp8(const StTensor& t, const std::string& name) const {
    DF_CHECK(!own_blocks_ || t.dtype == DType::f8_e4m3 || !fp8_quantized_weight(name),
             "%s: tensor '%s' is %s, but target.dtype = \"fp8\" computes this %dx%d block-scaled checkpoint with "
             "its own blocks, which needs every decoder projection stored as F8_E4M3; HINT: the checkpoint as "
             "published, or target.dtype = \"bf16\"",
             t.file.c_str(), name.c_str(), dtype_name(t.dtype), cfg_.fp8_block_n, cfg_.fp8_block_k);
  }
  std::vector<float> get(const std::string& name, const std::vector<int64_t>& shape) const {
    const StTensor* t = find(name, shape);
    check_fp8(*t, name);
    std::vector<float> v(numel_of(shape));
    if (t->dtype == DType::f8_e4m3) {
      DF_CHECK(cfg_.fp8_block_n > 0,
               "%s: tensor '%s' is F8_E4M3 but %s/config.json has no quantization_config; HINT: use the "
               "config.json that came with the FP8 weights (it gives weight_block_size)",
               t->file.c_str(), name.c_str(), dir_.c_str());
      fp8_dequantize(st_, *t, cfg_.fp8_block_n, cfg_.fp8_block_k, v.data());
    } else {
      st_to_f32(*t, v.data());
    }
    return v;
  }
  const SafetensorsIndex& st_;
  const std::string& dir_;
  const QwenConfig& cfg_;
  Ops& ops_;
  bool own_blocks_;
};

std::string find_prefix(const SafetensorsIndex& st, const std::string& dir) {
  for (const char* p : {"model.", "model.language_model."})
    if (st.find(std::string(p) + "embed_tokens.weight")) return p;
  DF_FAIL("%s: no embed_tokens.weight under 'model.' or 'model.language_model.'; HINT: is this a Qwen3 / "
          "Qwen3.5 causal-LM checkpoint?",
          dir.c_str());
}

}  // namespace

TargetModel::~TargetModel() {
  if (block && ops) ops->free_bytes(block);
}

std::unique_ptr<TargetModel> target_load(const std::string& dir, Ops& ops, const TargetLoadOptions& opt) {
  QwenConfig cfg = qwen_config_load(dir);
  SafetensorsIndex st = SafetensorsIndex::open(dir);
  std::string prefix = find_prefix(st, dir);
  // 128x128 blocks with 1x128 input groups is how these releases are meant to run: with FP8 GEMMs the file's
  // codes and block scales are uploaded as they are; where FP8 is emulated (the CPU, the oracle) their
  // dequantised values are exactly the checkpoint's.
  const int64_t group = opt.fp8 && cfg.fp8_block_n == 128 && cfg.fp8_block_k == 128 ? 128 : 0;
  if (group > 0)
    log_info("target: FP8 with %s's own 128x128 weight blocks, inputs per token per 128 columns",
             dir.c_str());
  CheckpointSource src(st, dir, cfg, ops, group > 0);
  return build_model(cfg, ops, opt, prefix, src, group);
}

std::unique_ptr<TargetModel> target_random(const QwenConfig& cfg, uint64_t seed, Ops& ops,
                                           const TargetLoadOptions& opt) {
  RandomSource src(cfg, seed, ops);
  return build_model(cfg, ops, opt, "model.", src);
}

std::unique_ptr<TargetModel> target_load_for_run(const TargetSection& t, const QwenConfig& arch, Ops& ops,
                                                 int num_layers, bool need_lm_head) {
  TargetLoadOptions opt;
  opt.num_layers = num_layers;
  opt.need_lm_head = need_lm_head;
  opt.fp8 = t.dtype == "fp8";
  if (!t.model.empty()) return target_load(t.model, ops, opt);
  return target_random(arch, t.random_seed, ops, opt);
}

namespace {

// The HF tensor that `runs` regroup into our rows `ours` (K columns): fill_runs undone.
std::vector<float> hf_rows(const float* ours, int64_t K, const std::vector<RowRun>& runs) {
  int64_t n = 0;
  for (const RowRun& r : runs) n += r.n;
  std::vector<float> hf(size_t(n * K));
  for (const RowRun& r : runs) std::copy_n(ours + r.dst_row * K, r.n * K, hf.begin() + r.src_row * K);
  return hf;
}

}  // namespace

void target_save_hf(const TargetModel& m, const std::string& dir, const TargetSaveOptions& opt) {
  const QwenConfig& c = m.cfg;
  DF_CHECK((opt.fp8_block_n > 0) == (opt.fp8_block_k > 0),
           "target_save_hf: FP8 block %dx%d must be both positive or both 0", opt.fp8_block_n,
           opt.fp8_block_k);
  DF_CHECK(m.num_loaded_layers == c.layers, "only a fully loaded model can be saved (%d of %d layers loaded)",
           m.num_loaded_layers, c.layers);
  DF_CHECK(!m.fp8_codes, "target_save_hf: this FP8 target holds e4m3 codes with per-row scales; HINT: save the "
           "model from a target.dtype = \"bf16\" load");
  Ops& ops = *m.ops;
  std::vector<std::vector<float>> keep;  // owns the host copies until the file is written
  std::vector<std::vector<uint8_t>> codes;
  std::vector<StWriteTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    if (opt.fp8_block_n > 0 && fp8_quantized_weight(name)) {
      // A fused experts tensor [E, N, K] is E matrices, each in its own blocks: scales [E, nb, kb].
      const int64_t mats = shape.size() == 3 ? shape[0] : 1, N = shape[shape.size() - 2], K = shape.back();
      std::vector<int64_t> sshape = fp8_scale_shape(N, K, opt.fp8_block_n, opt.fp8_block_k);
      const int64_t per = sshape[0] * sshape[1];
      if (shape.size() == 3) sshape.insert(sshape.begin(), mats);
      codes.emplace_back(v.size());
      keep.emplace_back(size_t(mats * per));
      for (int64_t e = 0; e < mats; ++e)
        fp8_quantize(v.data() + e * N * K, N, K, opt.fp8_block_n, opt.fp8_block_k,
                     codes.back().data() + e * N * K, keep.back().data() + e * per);
      out.push_back({name, DType::f8_e4m3, std::move(shape), codes.back().data()});
      out.push_back({fp8_scale_name(name), DType::f32, std::move(sshape), keep.back().data()});
      return;
    }
    keep.push_back(std::move(v));
    out.push_back({name, DType::f32, std::move(shape), keep.back().data()});
  };
  auto get = [&](const Tensor& t) {
    std::vector<float> v(t.numel());
    ops.download_f32(t, v.data());
    return v;
  };
  keep.reserve(16 * (c.layers + 2));
  const int64_t H = c.hidden;
  add("model.embed_tokens.weight", {c.vocab, H}, get(m.embed));
  add("model.norm.weight", {H}, get(m.final_norm));
  for (int i = 0; i < c.layers; ++i) {
    const TargetLayer& L = m.layers[i];
    std::string lp = "model.layers." + std::to_string(i) + ".";
    add(lp + "input_layernorm.weight", {H}, get(L.ln1));
    add(lp + "post_attention_layernorm.weight", {H}, get(L.ln2));
    if (L.kind == LayerKind::full_attention) {
      const int64_t hd = c.head_dim, q = int64_t(c.heads) * hd, kv = int64_t(c.kv_heads) * hd;
      std::vector<float> w = get(L.w_qkv);
      std::string ap = lp + "self_attn.";
      if (c.attn_output_gate) {
        add(ap + "q_proj.weight", {2 * q, H}, hf_rows(w.data(), H, row_runs_q_gate(c.heads, hd)));
      } else {
        add(ap + "q_proj.weight", {q, H}, std::vector<float>(w.begin(), w.begin() + q * H));
      }
      int64_t k0 = q * (c.attn_output_gate ? 2 : 1);
      add(ap + "k_proj.weight", {kv, H}, std::vector<float>(w.begin() + k0 * H, w.begin() + (k0 + kv) * H));
      add(ap + "v_proj.weight", {kv, H},
          std::vector<float>(w.begin() + (k0 + kv) * H, w.begin() + (k0 + 2 * kv) * H));
      add(ap + "o_proj.weight", {H, q}, get(L.w_o));
      add(ap + "q_norm.weight", {hd}, get(L.q_norm));
      add(ap + "k_norm.weight", {hd}, get(L.k_norm));
    } else {
      std::string gp = lp + "linear_attn.";
      const int64_t conv_ch = L.conv_w.rows, vdim = int64_t(c.lin_nv) * c.lin_dv, nv = c.lin_nv;
      std::vector<float> w = get(L.w_in);
      auto rows = [&](int64_t r0, int64_t n) {
        return std::vector<float>(w.begin() + r0 * H, w.begin() + (r0 + n) * H);
      };
      if (c.per_key_head_gdn_proj()) {
        add(gp + "in_proj_qkvz.weight", {conv_ch + vdim, H}, hf_rows(w.data(), H, row_runs_qkvz(c)));
        add(gp + "in_proj_ba.weight", {2 * nv, H}, hf_rows(w.data() + (conv_ch + vdim) * H, H, row_runs_ba(c)));
      } else {
        add(gp + "in_proj_qkv.weight", {conv_ch, H}, rows(0, conv_ch));
        add(gp + "in_proj_z.weight", {vdim, H}, rows(conv_ch, vdim));
        add(gp + "in_proj_b.weight", {nv, H}, rows(conv_ch + vdim, nv));
        add(gp + "in_proj_a.weight", {nv, H}, rows(conv_ch + vdim + nv, nv));
      }
      add(gp + "conv1d.weight", {conv_ch, 1, c.conv_kernel}, get(L.conv_w));
      add(gp + "A_log", {nv}, get(L.A_log));
      add(gp + "dt_bias", {nv}, get(L.dt_bias));
      add(gp + "norm.weight", {c.lin_dv}, get(L.gdn_norm));
      add(gp + "out_proj.weight", {H, vdim}, get(L.w_out));
    }
    if (c.layer_is_moe(i)) {
      target_moe_save(c, L, lp + "mlp.", get, add);
      continue;
    }
    const int64_t I = c.intermediate;
    std::vector<float> gu = get(L.w_gate_up);
    add(lp + "mlp.gate_proj.weight", {I, H}, std::vector<float>(gu.begin(), gu.begin() + I * H));
    add(lp + "mlp.up_proj.weight", {I, H}, std::vector<float>(gu.begin() + I * H, gu.end()));
    add(lp + "mlp.down_proj.weight", {H, I}, get(L.w_down));
  }
  if (!c.tie_word_embeddings) {
    DF_CHECK(!m.lm_head.empty(), "saving an untied model needs lm_head loaded (TargetLoadOptions::need_lm_head)");
    add("lm_head.weight", {c.vocab, H}, get(m.lm_head));
  }
  std::filesystem::create_directories(dir);
  safetensors_write(dir + "/model.safetensors", out, {{"format", "pt"}});
  QwenConfig written = c;  // a model loaded from FP8 and saved as f32 must not claim FP8 weights
  written.fp8_block_n = opt.fp8_block_n;
  written.fp8_block_k = opt.fp8_block_k;
  file_write_text_atomic(dir + "/config.json", qwen_config_to_json(written).dump(2) + "\n");
}

}  // namespace df
