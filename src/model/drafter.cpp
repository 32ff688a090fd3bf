// DrafterConfig validation, the parameter table (names, shapes, offsets in the flat buffers) and the model's
// memory: the one place that decides where every trainable tensor lives.
#include "model/drafter.h"

#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"

namespace df {

void drafter_config_validate(const DrafterConfig& c) {
  auto positive = [](int v, const char* key) { DF_CHECK(v > 0, "drafter config: %s = %d must be > 0", key, v); };
  positive(c.hidden, "hidden_size");
  positive(c.layers, "num_hidden_layers");
  positive(c.heads, "num_attention_heads");
  positive(c.kv_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  positive(c.intermediate, "intermediate_size");
  positive(c.vocab, "vocab_size");
  positive(c.num_anchors, "num_anchors");
  DF_CHECK(c.heads % c.kv_heads == 0, "drafter config: num_attention_heads %d must be a multiple of num_key_value_heads %d",
           c.heads, c.kv_heads);
  DF_CHECK(c.head_dim % 2 == 0, "drafter config: head_dim %d must be even (rotate-half RoPE)", c.head_dim);
  DF_CHECK(c.rope_theta > 0, "drafter config: rope_theta %g must be > 0", double(c.rope_theta));
  DF_CHECK(c.rms_eps > 0, "drafter config: rms_norm_eps %g must be > 0", double(c.rms_eps));
  DF_CHECK(c.block_size >= 2, "drafter config: block_size %d must be ≥ 2 (the anchor plus one prediction)",
           c.block_size);
  DF_CHECK(c.mask_token_id >= 0 && c.mask_token_id < c.vocab,
           "drafter config: mask_token_id %d outside the vocabulary [0, %d)", c.mask_token_id, c.vocab);
  DF_CHECK(!c.target_layer_ids.empty(), "drafter config: target_layer_ids is empty; list the tapped target layers");
  for (int l : c.target_layer_ids) DF_CHECK(l >= 0, "drafter config: target_layer_ids entry %d must be ≥ 0", l);
  DF_CHECK(int(c.layer_types.size()) == c.layers,
           "drafter config: layer_types has %zu entries but num_hidden_layers is %d", c.layer_types.size(), c.layers);
  for (auto t : c.layer_types)
    if (t == DrafterLayerType::sliding)
      DF_CHECK(c.sliding_window >= c.block_size,
               "drafter config: sliding_window %d must be ≥ block_size %d (a block must see itself)",
               c.sliding_window, c.block_size);
  if (c.kind == DrafterKind::domino) {
    positive(c.emb_dim, "emb_dim");
    positive(c.gru_hidden_dim, "gru_hidden_dim");
    const int suffix_start = c.pure_draft_prefix_len + (c.shift_label ? 0 : 1);
    DF_CHECK(c.pure_draft_prefix_len >= 0 && suffix_start < c.block_size,
             "drafter config: pure_draft_prefix_len %d (shift_label %s) leaves no slot of block_size %d to "
             "correct",
             c.pure_draft_prefix_len, c.shift_label ? "true" : "false", c.block_size);
  } else {
    DF_CHECK(c.pure_draft_prefix_len == 0 && c.emb_dim == 0 && c.gru_hidden_dim == 0 && !c.shift_label,
             "drafter config: kind %s has no Domino head, but pure_draft_prefix_len/emb_dim/gru_hidden_dim/"
             "shift_label are set",
             drafter_kind_name(c.kind));
  }
  if (c.kind == DrafterKind::dflash2) {
    // SpecForge DFlashGroupedConv / CandidateSelector's own checks.
    DF_CHECK(c.conv_kernel_size >= 1 && c.conv_kernel_size <= c.block_size,
             "drafter config: conv_kernel_size %d must be in [1, block_size %d]", c.conv_kernel_size,
             c.block_size);
    DF_CHECK(c.conv_group_size >= 1 && c.hidden % c.conv_group_size == 0,
             "drafter config: conv_group_size %d must divide hidden_size %d", c.conv_group_size, c.hidden);
    positive(c.selector_rank, "selector_rank");
    DF_CHECK(c.selector_top_k >= 1 && c.selector_top_k <= c.vocab,
             "drafter config: selector_top_k %d must be in [1, vocab_size %d]", c.selector_top_k, c.vocab);
    DF_CHECK(std::isfinite(c.output_multiplier) && c.output_multiplier > 0,
             "drafter config: output_multiplier %g must be > 0", double(c.output_multiplier));
    DF_CHECK(std::isfinite(c.final_logit_softcapping) && c.final_logit_softcapping >= 0,
             "drafter config: final_logit_softcapping %g must be ≥ 0 (0: none)",
             double(c.final_logit_softcapping));
  } else {
    DF_CHECK(c.conv_kernel_size == 0 && c.conv_group_size == 0 && c.selector_rank == 0 &&
                 c.selector_top_k == 0 && c.output_multiplier == 0.0f && c.final_logit_softcapping == 0.0f,
             "drafter config: kind %s has no DFlash2 convolutions or selector, but conv_kernel_size/"
             "conv_group_size/selector_rank/selector_top_k/output_multiplier/final_logit_softcapping are set",
             drafter_kind_name(c.kind));
  }
  if (c.kind == DrafterKind::dspark) {
    DF_CHECK(c.markov_rank >= 0, "drafter config: markov_rank %d must be ≥ 0 (0: no Markov head)",
             c.markov_rank);
    DF_CHECK(!c.confidence_head_with_markov || c.markov_rank > 0,
             "drafter config: confidence_head_with_markov needs a Markov head (markov_rank > 0)");
    DF_CHECK(c.confidence_head_alpha >= 0, "drafter config: confidence_head_alpha %g must be ≥ 0",
             double(c.confidence_head_alpha));
  } else {
    DF_CHECK(c.markov_rank == 0 && c.markov_head_type == DrafterMarkovHead::vanilla &&
                 !c.enable_confidence_head && !c.confidence_head_with_markov &&
                 c.confidence_head_alpha == 0.0f,
             "drafter config: kind %s has no DSpark head, but markov_rank/markov_head_type/"
             "enable_confidence_head/confidence_head_with_markov/confidence_head_alpha are set",
             drafter_kind_name(c.kind));
  }
}

void drafter_check_kind_trainable(const DrafterConfig& c, const std::string& backend) {
  DF_CHECK(c.kind != DrafterKind::dflash2 || backend == "cpu" || backend == "cuda",
           "drafter.kind = \"dflash2\": the %s backend has no dflash2 convolutions, selector and loss (their "
           "ops are built on the CPU and CUDA backends); HINT: drafter.device = \"cpu\" or \"cuda\"",
           backend.c_str());
}

namespace {
// The head dims of a kind are only asked of a drafter of that kind.
void require_kind(const DrafterConfig& c, DrafterKind kind, const char* what) {
  DF_CHECK(c.kind == kind, "%s: the drafter's kind is %s, not %s", what, drafter_kind_name(c.kind),
           drafter_kind_name(kind));
}
}  // namespace

DominoHeadDims domino_head_dims(const DrafterConfig& c) {
  require_kind(c, DrafterKind::domino, "domino head");
  return {.hidden = c.hidden, .gru_hidden = c.gru_hidden_dim, .emb_dim = c.emb_dim, .vocab = c.vocab,
          .block_size = c.block_size, .pure_draft_prefix_len = c.pure_draft_prefix_len,
          .shift_label = c.shift_label};
}

Dflash2ConvDims dflash2_conv_dims(const DrafterConfig& c) {
  require_kind(c, DrafterKind::dflash2, "dflash2 conv");
  return {.hidden = c.hidden, .block_size = c.block_size, .taps = c.conv_kernel_size,
          .group_size = c.conv_group_size};
}

Dflash2SelectorDims dflash2_selector_dims(const DrafterConfig& c) {
  require_kind(c, DrafterKind::dflash2, "dflash2 selector");
  return {.hidden = c.hidden, .vocab = c.vocab, .rank = c.selector_rank, .top_k = c.selector_top_k,
          .block_size = c.block_size, .output_multiplier = c.output_multiplier,
          .softcap = c.final_logit_softcapping};
}

DSparkHeadDims dspark_head_dims(const DrafterConfig& c) {
  require_kind(c, DrafterKind::dspark, "dspark head");
  return {.hidden = c.hidden, .vocab = c.vocab, .block_size = c.block_size, .markov_rank = c.markov_rank,
          .markov_head_type = c.markov_head_type, .confidence = c.enable_confidence_head,
          .confidence_with_markov = c.confidence_head_with_markov};
}

std::vector<int> drafter_default_target_layer_ids(int target_layers, int n) {
  DF_CHECK(n >= 1 && target_layers >= 4, "default target_layer_ids: need ≥ 1 tap (got %d) and ≥ 4 target layers (got %d)",
           n, target_layers);
  if (n == 1) return {1};
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int(std::lround(1.0 + double(i) * (target_layers - 4) / (n - 1))));
  return ids;
}

const DrafterParamEntry& DrafterParamTable::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return e;
  DF_FAIL("drafter parameter '%s' does not exist (names follow the HF export: fc.weight, layers.{i}.self_attn...)",
          name.c_str());
}

DrafterParamTable drafter_param_table(const DrafterConfig& c) {
  drafter_config_validate(c);
  DrafterParamTable t;
  const int64_t H = c.hidden, qd = int64_t(c.heads) * c.head_dim, kvd = int64_t(c.kv_heads) * c.head_dim;
  // DFlash2 (ops/dflash2_conv.h, dflash2_selector.h): two convolutions per layer and the selector.
  const bool dflash2 = c.kind == DrafterKind::dflash2;
  const int64_t conv_coeffs = dflash2 ? 2 * int64_t(c.conv_kernel_size) * (H / c.conv_group_size) : 0;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, bool decay) {
    t.entries.push_back({name, rows, cols, t.total, decay});
    t.total += (rows * cols + 63) / 64 * 64;
    if (decay) t.n_decay = t.total;
  };
  add("fc.weight", H, H * c.num_taps(), true);
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "self_attn.q_proj.weight", qd, H, true);
    add(p + "self_attn.k_proj.weight", kvd, H, true);
    add(p + "self_attn.v_proj.weight", kvd, H, true);
    add(p + "self_attn.o_proj.weight", H, qd, true);
    add(p + "mlp.gate_proj.weight", c.intermediate, H, true);
    add(p + "mlp.up_proj.weight", c.intermediate, H, true);
    add(p + "mlp.down_proj.weight", H, c.intermediate, true);
    if (dflash2) {
      add(p + "attention_conv.kernel_projection.weight", conv_coeffs, H, true);
      add(p + "mlp_conv.kernel_projection.weight", conv_coeffs, H, true);
    }
  }
  if (dflash2) {
    add("candidate_selector.predecessor_codebook", c.vocab, c.selector_rank, true);
    add("candidate_selector.successor_codebook", c.vocab, c.selector_rank, true);
    add("candidate_selector.hidden_projection.weight", c.selector_rank, H, true);
  }
  // A head's matrices join the decayed prefix, its bias vectors the rest.
  const std::vector<DSparkHeadParam> dspark = c.kind == DrafterKind::dspark
                                                  ? dspark_head_params(dspark_head_dims(c))
                                                  : std::vector<DSparkHeadParam>{};
  for (const DSparkHeadParam& h : dspark)
    if (h.matrix) add(h.name, h.rows, h.cols, true);
  if (c.kind == DrafterKind::domino) {
    // SpecForge DominoDraftModel's names: nn.GRU (bias-free, gates r, z, n) and embed_proj = Sequential(
    // Linear(H + G, E), SiLU, Linear(E, V)).
    const int64_t G = c.gru_hidden_dim, E = c.emb_dim;
    add("prefix_gru.weight_ih_l0", 3 * G, H, true);
    add("prefix_gru.weight_hh_l0", 3 * G, G, true);
    add("embed_proj.0.weight", E, H + G, true);
    add("embed_proj.2.weight", c.vocab, E, true);
  }
  add("hidden_norm.weight", 1, H, false);
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", 1, H, false);
    add(p + "post_attention_layernorm.weight", 1, H, false);
    add(p + "self_attn.q_norm.weight", 1, c.head_dim, false);
    add(p + "self_attn.k_norm.weight", 1, c.head_dim, false);
    if (dflash2) {
      add(p + "attention_conv.base_kernel", 2 * c.conv_kernel_size, H, false);
      add(p + "mlp_conv.base_kernel", 2 * c.conv_kernel_size, H, false);
    }
  }
  add("norm.weight", 1, H, false);
  for (const DSparkHeadParam& h : dspark)
    if (!h.matrix) add(h.name, h.rows, h.cols, false);
  return t;
}

bool drafter_param_is_base_kernel(const std::string& name) {
  const std::string suffix = "_conv.base_kernel";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

float drafter_base_kernel_identity(int64_t i, int64_t cols, int taps) {
  return (i / cols) % taps == 0 ? 1.0f : 0.0f;
}

std::vector<int64_t> drafter_param_hf_shape(const DrafterConfig& c, const DrafterParamEntry& e) {
  if (drafter_param_is_base_kernel(e.name)) return {2, c.conv_kernel_size, e.cols};
  if (e.rows == 1 && !e.decay) return {e.cols};
  return {e.rows, e.cols};
}

namespace {

// Matrices (the decayed entries) are viewed in `mats`, norm vectors in `vecs`: the GEMM weights may be the
// bf16 shadow while norm weights stay f32.
DrafterTensors tensors_view(const DrafterModel& m, const Tensor& mats, const Tensor& vecs) {
  auto view = [&](const std::string& name) {
    return m.entry_view(m.table().find(name).decay ? mats : vecs, name);
  };
  DrafterTensors t;
  t.fc = view("fc.weight");
  t.hidden_norm = view("hidden_norm.weight");
  t.norm = view("norm.weight");
  for (int i = 0; i < m.config().layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    DrafterLayerTensors l;
    l.input_layernorm = view(p + "input_layernorm.weight");
    l.q_proj = view(p + "self_attn.q_proj.weight");
    l.k_proj = view(p + "self_attn.k_proj.weight");
    l.v_proj = view(p + "self_attn.v_proj.weight");
    l.o_proj = view(p + "self_attn.o_proj.weight");
    l.q_norm = view(p + "self_attn.q_norm.weight");
    l.k_norm = view(p + "self_attn.k_norm.weight");
    l.post_attention_layernorm = view(p + "post_attention_layernorm.weight");
    l.gate_proj = view(p + "mlp.gate_proj.weight");
    l.up_proj = view(p + "mlp.up_proj.weight");
    l.down_proj = view(p + "mlp.down_proj.weight");
    if (m.config().kind == DrafterKind::dflash2) {
      l.attention_conv = {view(p + "attention_conv.base_kernel"),
                          view(p + "attention_conv.kernel_projection.weight")};
      l.mlp_conv = {view(p + "mlp_conv.base_kernel"), view(p + "mlp_conv.kernel_projection.weight")};
    }
    t.layers.push_back(l);
  }
  if (m.config().kind == DrafterKind::domino)
    t.domino = {view("prefix_gru.weight_ih_l0"), view("prefix_gru.weight_hh_l0"), view("embed_proj.0.weight"),
                view("embed_proj.2.weight")};
  if (m.config().kind == DrafterKind::dflash2)
    t.selector = {view("candidate_selector.predecessor_codebook"),
                  view("candidate_selector.successor_codebook"),
                  view("candidate_selector.hidden_projection.weight")};
  if (m.config().kind == DrafterKind::dspark) {
    TrainOps::DSparkHeadWeights& d = t.dspark;
    const std::pair<const char*, Tensor*> parts[] = {
        {"markov_head.markov_w1.weight", &d.markov_w1}, {"markov_head.markov_w2.weight", &d.markov_w2},
        {"markov_head.gate_proj.weight", &d.gate_w},    {"markov_head.gate_proj.bias", &d.gate_b},
        {"markov_head.joint_proj.weight", &d.joint_w},  {"markov_head.joint_proj.bias", &d.joint_b},
        {"confidence_head.proj.weight", &d.conf_w},     {"confidence_head.proj.bias", &d.conf_b}};
    for (const DSparkHeadParam& p : dspark_head_params(dspark_head_dims(m.config())))
      for (const auto& [name, tensor] : parts)
        if (p.name == name) *tensor = view(name);
  }
  return t;
}

// FNV-1a of the tensor name: the init stream of a tensor does not depend on where the table puts it.
uint64_t name_stream(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

}  // namespace

DrafterModel::DrafterModel(const DrafterConfig& cfg, TrainOps& ops)
    : cfg_(cfg), table_(drafter_param_table(cfg)), ops_(&ops) {
  drafter_check_kind_trainable(cfg, ops.name());
  // One allocation: 4 f32 buffers, the bf16 shadow (bf16 backends), the statistics block. The table's total
  // is a multiple of 64 elements, so every part starts at least 128-byte aligned.
  const size_t bytes = size_t(table_.total) * sizeof(float);
  const bool shadow = ops.act_dtype() == DType::bf16;
  const size_t lp_bytes = shadow ? size_t(table_.total) * dtype_size(DType::bf16) : 0;
  const int64_t stat_bytes = int64_t(LossStatsSlots::size(cfg.block_size)) * int64_t(sizeof(double));
  flat_ = ops.alloc_bytes(4 * bytes + lp_bytes + size_t(stat_bytes));
  char* base = static_cast<char*>(flat_);
  Tensor* bufs[4] = {&params, &grads, &adam_m, &adam_v};
  for (int i = 0; i < 4; ++i)
    *bufs[i] = tensor_make(base + i * bytes, DType::f32, ops.device(), 1, table_.total);
  if (shadow) params_lp = tensor_make(base + 4 * bytes, DType::bf16, ops.device(), 1, table_.total);
  stats = tensor_make(base + 4 * bytes + lp_bytes, DType::u8, ops.device(), 1, stat_bytes);
  w = tensors_view(*this, shadow ? params_lp : params, params);
  g = tensors_view(*this, grads, grads);
}

DrafterModel::~DrafterModel() {
  ops_->free_bytes(flat_);
  if (workspace) ops_->free_bytes(workspace);
}

Tensor DrafterModel::entry_view(const Tensor& flat, const std::string& name) const {
  const DrafterParamEntry& e = table_.find(name);
  return flat.cols_view(e.offset, e.rows * e.cols).reshape(e.rows, e.cols);
}

void DrafterModel::set_frozen(const Tensor& embed_table, const Tensor& lm_head_table) {
  for (const Tensor* t : {&embed_table, &lm_head_table}) {
    DF_CHECK(t->rows == cfg_.vocab && t->cols == cfg_.hidden,
             "drafter: frozen target embedding/lm_head is %s, expected [vocab %d, hidden %d]; wrong target model?",
             t->shape_str().c_str(), cfg_.vocab, cfg_.hidden);
    DF_CHECK(
        t->dtype == ops_->act_dtype() && t->device == ops_->device(),
        "drafter: frozen target embedding/lm_head is %s on %s, but the %s backend trains in %s on its own "
        "memory; HINT: upload the tables as %s first",
        dtype_name(t->dtype), t->device == Device::cpu ? "the host" : "a GPU", ops_->name(),
        dtype_name(ops_->act_dtype()), dtype_name(ops_->act_dtype()));
  }
  embed = embed_table;
  lm_head = lm_head_table;
}

void drafter_init_params(DrafterModel& m, uint64_t seed) {
  // Counter-based draws computed on the host and uploaded: a value depends on (seed, name, index) only.
  std::vector<float> host(size_t(m.table().total), 0.0f);
  for (const auto& e : m.table().entries) {
    const uint64_t stream = name_stream(e.name);
    // Each element is a pure function of its index, so threads change nothing but the time (1.7 B draws for
    // the 27B drafter: a minute on one core). Norm weights start at 1, a head's biases at 0 (transformers'
    // _init_weights, which the peers use); a DFlash2 base kernel at the identity (tap 0 is 1 on both sides,
    // SpecForge DFlashGroupedConv).
    const bool bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
    const int taps = drafter_param_is_base_kernel(e.name) ? m.config().conv_kernel_size : 0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < e.rows * e.cols; ++i)
      host[size_t(e.offset + i)] = e.decay ? 0.02f * rng_normal_at(seed, stream, uint64_t(i))
                                   : bias  ? 0.0f
                                   : taps  ? drafter_base_kernel_identity(i, e.cols, taps)
                                           : 1.0f;
  }
  m.ops().upload_raw(m.params, host.data());
  m.ops().fill(m.adam_m, 0.0f);
  m.ops().fill(m.adam_v, 0.0f);
  drafter_zero_grads(m);
  drafter_refresh_shadow(m);
}

void drafter_zero_grads(DrafterModel& m) {
  m.ops().fill(m.grads, 0.0f);
  m.grads_stale = false;
}

void drafter_begin_step(DrafterModel& m) { m.grads_stale = true; }

void drafter_grads_ready(DrafterModel& m) {
  if (m.grads_stale) drafter_zero_grads(m);
}

void drafter_refresh_shadow(DrafterModel& m) {
  if (m.params_lp.empty()) return;
  std::vector<float> host(size_t(m.table().total));
  m.ops().download_raw(m.params, host.data());
  std::vector<uint16_t> lp(host.size());
  for (size_t i = 0; i < host.size(); ++i) lp[i] = f32_to_bf16(host[i]);
  m.ops().upload_raw(m.params_lp, lp.data());
}

}  // namespace df

namespace df {

DrafterLimits drafter_limits_from_run(const Config& cfg) {
  DrafterLimits l;
  l.max_tokens = cfg.data.token_budget;
  l.max_blocks = cfg.drafter.max_block_rows > 0 ? cfg.drafter.max_block_rows / cfg.drafter.block_size
                                                : cfg.data.token_budget;
  l.kl = cfg.train.loss == "kl";
  l.noise = cfg.train.noise_std > 0;
  return l;
}

bool drafter_streams_final_hidden(const Config& cfg) {
  if (cfg.train.loss == "kl") return true;
  if (cfg.drafter.kind != "dspark") return false;
  DSparkHeadDims d;
  d.confidence = cfg.drafter.enable_confidence_head;
  return dspark_needs_target_hidden(d, dspark_loss_alphas(cfg.train));
}

}  // namespace df
