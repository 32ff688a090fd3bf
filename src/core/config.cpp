// TOML config parsing with toml++ (kept out of nvcc's sight). Each section is read through a Reader that
// remembers which keys it consumed, so anything left over is reported as unknown by its full name.
#include "core/config.h"

#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"

namespace df {

namespace {

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return "\"" + v + "\"";
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return strfmt("%g", v);
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + value_text(v[i]);
    return s + "]";
  }
}

class Reader {
 public:
  Reader(const toml::table* t, std::string section, std::string where, Config& cfg)
      : t_(t), section_(std::move(section)), where_(std::move(where)), cfg_(cfg) {}

  template <class T>
  void get(const char* key, T& out) {
    std::string full = section_ + "." + key;
    if (t_) {
      if (const toml::node* n = t_->get(key)) {
        seen_.insert(key);
        read(*n, full, out);
      }
    }
    cfg_.values.emplace_back(full, value_text(out));
  }

  // A key that belongs to drafter.kind `owner` only: read (and shown in the table) under that kind, refused
  // naming the key under any other.
  template <class T>
  void get_for_kind(const char* owner, const std::string& kind, const char* key, T& out) {
    if (kind == owner) return get(key, out);
    DF_CHECK(
        !t_ || !t_->get(key),
        "%s: '%s.%s' belongs to drafter.kind = \"%s\", but drafter.kind is \"%s\"; HINT: remove it or set "
        "drafter.kind = \"%s\"",
        where_.c_str(), section_.c_str(), key, owner, kind.c_str(), owner);
  }

  // Call after all get()s: anything not consumed is an unknown key.
  void finish() {
    if (!t_) return;
    for (const auto& [k, v] : *t_) {
      std::string key(k.str());
      DF_CHECK(seen_.count(key), "%s: unknown key '%s.%s'; HINT: check the spelling against configs/tiny.toml",
               where_.c_str(), section_.c_str(), key.c_str());
    }
  }

 private:
  [[noreturn]] void type_error(const std::string& full, const char* want, const toml::node& n) {
    DF_FAIL("%s: '%s' must be %s (line %u)", where_.c_str(), full.c_str(), want, n.source().begin.line);
  }
  void read(const toml::node& n, const std::string& full, std::string& out) {
    if (!n.is_string()) type_error(full, "a string", n);
    out = *n.value<std::string>();
  }
  void read(const toml::node& n, const std::string& full, bool& out) {
    if (!n.is_boolean()) type_error(full, "true or false", n);
    out = *n.value<bool>();
  }
  void read(const toml::node& n, const std::string& full, double& out) {
    if (!n.is_number()) type_error(full, "a number", n);
    out = *n.value<double>();
  }
  template <class I>
    requires std::is_integral_v<I>
  void read(const toml::node& n, const std::string& full, I& out) {
    if (!n.is_integer()) type_error(full, "an integer", n);
    int64_t v = *n.value<int64_t>();
    if constexpr (std::is_unsigned_v<I>) DF_CHECK(v >= 0, "%s: '%s' must not be negative", where_.c_str(), full.c_str());
    DF_CHECK(static_cast<int64_t>(static_cast<I>(v)) == v, "%s: '%s' = %lld is out of range", where_.c_str(),
             full.c_str(), (long long)v);
    out = static_cast<I>(v);
  }
  template <class E>
  void read(const toml::node& n, const std::string& full, std::vector<E>& out) {
    const toml::array* arr = n.as_array();
    if (!arr) type_error(full, "an array", n);
    out.clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      E e{};
      read((*arr)[i], full + "[" + std::to_string(i) + "]", e);
      out.push_back(e);
    }
  }

  const toml::table* t_;
  std::string section_, where_;
  Config& cfg_;
  std::set<std::string> seen_;
};

const toml::table* section(const toml::table& root, const char* name, const std::string& where) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  DF_CHECK(n->is_table(), "%s: '%s' must be a table ([%s])", where.c_str(), name, name);
  return n->as_table();
}

// data.token_budget bound: 2^30 tokens per micro-batch is far past any GPU's memory (even a tiny target's
// activations are kilobytes a token; the start-up VRAM check names what does not fit) and keeps every size
// derived from it (4 x for drafter.max_block_rows, x columns x bytes for workspaces) far inside int64.
constexpr int64_t kMaxTokenBudget = int64_t(1) << 30;

void check(bool ok, const std::string& where, const char* key, const std::string& why) {
  DF_CHECK(ok, "%s: '%s' %s", where.c_str(), key, why.c_str());
}

void validate(const Config& c, const std::string& w) {
  check(c.run.log_interval > 0, w, "run.log_interval", "must be positive (seconds)");
  check(c.run.max_steps >= 0, w, "run.max_steps", "must be >= 0");
  check(c.run.watchdog_s >= 0 || c.run.watchdog_s == -1, w, "run.watchdog_s",
        "must be >= 0 (seconds; 0 = off), or -1 / left out for the automatic bound");
  check(c.target.model.empty() != c.target.random_config.empty(), w, "target.model",
        "or 'target.random_config' must be set, exactly one of them");
  check(c.target.device == "cpu" || c.target.device == "cuda", w, "target.device", "must be \"cpu\" or \"cuda\"");
  check(c.target.dtype == "bf16" || c.target.dtype == "fp8", w, "target.dtype", "must be \"bf16\" or \"fp8\"");
  const DrafterSection& d = c.drafter;
  check(d.layers > 0, w, "drafter.layers", "must be positive");
  check(d.heads > 0 && d.kv_heads > 0 && d.heads % d.kv_heads == 0, w, "drafter.heads",
        "must be a positive multiple of drafter.kv_heads");
  check(d.head_dim > 0 && d.head_dim % 2 == 0, w, "drafter.head_dim", "must be positive and even (RoPE pairs)");
  check(d.intermediate >= 0, w, "drafter.intermediate", "must be >= 0 (0 = the target's)");
  check(d.block_size >= 2, w, "drafter.block_size", "must be at least 2");
  check(d.mask_token_id >= 0, w, "drafter.mask_token_id", "is required (the target tokenizer's mask token id)");
  check(d.num_taps > 0, w, "drafter.num_taps", "must be positive");
  check(d.target_layer_ids.empty() || int(d.target_layer_ids.size()) == d.num_taps, w, "drafter.target_layer_ids",
        "must have drafter.num_taps entries");
  for (int l : d.target_layer_ids) check(l >= 0, w, "drafter.target_layer_ids", "must hold layer ids >= 0");
  check(d.layer_types.empty() || int(d.layer_types.size()) == d.layers, w, "drafter.layer_types",
        "must have drafter.layers entries");
  for (const std::string& t : d.layer_types)
    check(t == "sliding_attention" || t == "full_attention", w, "drafter.layer_types",
          "entries must be \"sliding_attention\" or \"full_attention\" (got \"" + t + "\")");
  check(d.sliding_window > 0, w, "drafter.sliding_window", "must be positive");
  check(d.rope_theta > 0, w, "drafter.rope_theta", "must be positive");
  check(d.rms_norm_eps > 0, w, "drafter.rms_norm_eps", "must be positive");
  check(d.num_anchors > 0, w, "drafter.num_anchors", "must be positive");
  check(d.device == "cpu" || d.device == "cuda", w, "drafter.device", "must be \"cpu\" or \"cuda\"");
  check(d.max_block_rows == 0 || (d.max_block_rows >= d.block_size && d.max_block_rows <= 4 * kMaxTokenBudget), w,
        "drafter.max_block_rows",
        strfmt("must be 0 (no cap) or in [drafter.block_size (%d): one block, %lld]", d.block_size,
               (long long)(4 * kMaxTokenBudget)));
  check(c.data.token_budget > 0 && c.data.token_budget <= kMaxTokenBudget, w, "data.token_budget",
        strfmt("must be in [1, %lld] (tokens per micro-batch)", (long long)kMaxTokenBudget));
  for (int64_t b : c.data.buckets) check(b > 0, w, "data.buckets", "must hold positive lengths");
  check(c.data.prefetch_depth > 0, w, "data.prefetch_depth", "must be positive");
  const TrainSection& t = c.train;
  check(t.epochs > 0, w, "train.epochs", "must be positive");
  check(t.lr > 0, w, "train.lr", "must be positive");
  check(t.warmup_ratio >= 0 && t.warmup_ratio < 1, w, "train.warmup_ratio", "must be in [0, 1)");
  check(t.weight_decay >= 0, w, "train.weight_decay", "must be >= 0");
  check(t.beta1 >= 0 && t.beta1 < 1, w, "train.beta1", "must be in [0, 1)");
  check(t.beta2 >= 0 && t.beta2 < 1, w, "train.beta2", "must be in [0, 1)");
  check(t.eps > 0, w, "train.eps", "must be positive");
  check(t.clip >= 0, w, "train.clip", "must be >= 0 (0 = no clipping)");
  check(t.grad_accum > 0, w, "train.grad_accum", "must be positive");
  // DSpark alone takes 0: SpecForge's loss_decay_gamma unset (its Qwen3-8B recipe), every slot weighted 1.
  check(t.gamma > 0 || (d.kind == "dspark" && t.gamma == 0), w, "train.gamma",
        d.kind == "dspark" ? "must be >= 0 (0: no decay)" : "must be positive");
  check(t.loss == "ce" || t.loss == "kl" || t.loss == "dpace" || t.loss == "dpace-cumulative-confidence-only" ||
            t.loss == "dpace-continuation-value-only",
        w, "train.loss",
        "must be \"ce\", \"kl\", \"dpace\", \"dpace-cumulative-confidence-only\" or "
        "\"dpace-continuation-value-only\"");
  check(t.dpace_alpha >= 0 && t.dpace_alpha <= 1, w, "train.dpace_alpha", "must be in [0, 1]");
  check(!(t.streak && t.loss.rfind("dpace", 0) == 0), w, "train.streak",
        "cannot be combined with a dpace loss (both set the block's row weights); choose one");
  check(!(d.device == "cuda" && t.loss.rfind("dpace", 0) == 0), w, "train.loss",
        "= \"" + t.loss + "\": dpace is implemented on the CPU drafter only; HINT: drafter.device = \"cpu\"");
  check(t.streak_alpha > 0, w, "train.streak_alpha", "must be positive");
  // The kinds that train SpecForge's own objective for them: train.loss names its CE base and no streak
  // weighting, since KL, D-PACE and streak weights are not defined on those objectives there. Domino: plain
  // CE on both terms (loss_type "dflash"); DFlash2: "candidate selection currently requires
  // loss_type='dflash'"; DSpark: its own objective (loss_type "dspark").
  struct OwnLoss {
    const char* kind;
    const char* loss;    // what train.loss = "ce" means for the kind
    const char* streak;  // why streak weighting is refused
  };
  for (const OwnLoss& o :
       {OwnLoss{"domino",
                "trains with CE only (its loss is (1-λ)·CE(final) + λ·CE(base), as SpecForge's); HINT: "
                "train.loss "
                "= \"ce\"",
                "CE only, as SpecForge's"},
        OwnLoss{
            "dflash2",
            "trains with CE only (its loss is CE + α·CE of the selector, as SpecForge's); HINT: train.loss = "
            "\"ce\"",
            "CE only, as SpecForge's"},
        OwnLoss{"dspark",
                "trains its own loss (dspark_ce_loss_alpha·CE + dspark_l1_loss_alpha·L1 + "
                "dspark_confidence_head_alpha·BCE, as SpecForge's); HINT: train.loss = \"ce\" and the "
                "train.dspark_*_alpha weights",
                "its own loss, as SpecForge's"}}) {
    if (d.kind != o.kind) continue;
    check(t.loss == "ce", w, "train.loss",
          "= \"" + t.loss + "\": drafter.kind = \"" + d.kind + "\" " + o.loss);
    check(!t.streak, w, "train.streak",
          "cannot be combined with drafter.kind = \"" + d.kind + "\" (" + o.streak + ")");
  }
  if (d.kind == "domino") {
    check(d.emb_dim > 0, w, "drafter.emb_dim", "must be positive");
    check(d.gru_hidden_dim > 0, w, "drafter.gru_hidden_dim", "must be positive");
    const int suffix_start = d.pure_draft_prefix_len + (d.shift_label ? 0 : 1);
    check(d.pure_draft_prefix_len >= 0 && suffix_start < d.block_size, w, "drafter.pure_draft_prefix_len",
          strfmt("must be >= 0 and leave a corrected slot: pure_draft_prefix_len%s < drafter.block_size (%d)",
                 d.shift_label ? "" : " + 1", d.block_size));
    check(t.lambda_base_start >= 0 && t.lambda_base_start <= 1, w, "train.lambda_base_start",
          "must be in [0, 1]");
    check(t.lambda_base_decay_ratio >= 0 && t.lambda_base_decay_ratio <= 1, w,
          "train.lambda_base_decay_ratio", "must be in [0, 1]");
  }
  if (d.kind == "dflash2") {
    check(
        d.conv_kernel_size >= 1 && d.conv_kernel_size <= d.block_size, w, "drafter.conv_kernel_size",
        strfmt("must be in [1, drafter.block_size (%d)]: a tap reads a row of the same block", d.block_size));
    check(d.conv_group_size >= 1, w, "drafter.conv_group_size",
          "must be positive (and divide the target's hidden size)");
    check(d.selector_rank >= 1, w, "drafter.selector_rank", "must be positive");
    check(d.selector_top_k >= 1, w, "drafter.selector_top_k",
          "must be positive (and at most the target's vocabulary)");
    check(std::isfinite(d.output_multiplier) && d.output_multiplier > 0, w, "drafter.output_multiplier",
          "must be positive: it scales the logits whose top-K the selector re-ranks");
    check(std::isfinite(d.final_logit_softcapping) && d.final_logit_softcapping >= 0, w,
          "drafter.final_logit_softcapping", "must be >= 0 (0: no softcapping)");
    check(t.dflash2_selector_loss_alpha >= 0 && std::isfinite(t.dflash2_selector_loss_alpha), w,
          "train.dflash2_selector_loss_alpha", "must be >= 0 (0: the selector is not trained)");
    check(t.dflash2_selector_warmup_ratio >= 0 && t.dflash2_selector_warmup_ratio <= 1, w,
          "train.dflash2_selector_warmup_ratio", "must be in [0, 1]");
    check(t.dflash2_selector_ramp_ratio >= 0 && t.dflash2_selector_ramp_ratio <= 1, w,
          "train.dflash2_selector_ramp_ratio", "must be in [0, 1]");
  }
  if (d.kind == "dspark") {
    check(d.markov_rank >= 0, w, "drafter.markov_rank", "must be >= 0 (0: no Markov head)");
    check(d.markov_head_type == "vanilla" || d.markov_head_type == "gated" || d.markov_head_type == "rnn", w,
          "drafter.markov_head_type", "must be \"vanilla\", \"gated\" or \"rnn\"");
    check(d.confidence_head_alpha >= 0, w, "drafter.confidence_head_alpha", "must be >= 0");
    check(!(d.confidence_head_with_markov && d.markov_rank == 0), w, "drafter.confidence_head_with_markov",
          "= true needs a Markov head (drafter.markov_rank > 0), as SpecForge requires");
    check(d.attention_mode == "gqa" || d.attention_mode == "mha", w, "drafter.attention_mode",
          "must be \"gqa\" or \"mha\"");
    check(d.attention_mode != "gqa" || d.kv_heads < d.heads, w, "drafter.attention_mode",
          strfmt("= \"gqa\" needs drafter.kv_heads (%d) < drafter.heads (%d); HINT: attention_mode = \"mha\" "
                 "for equal counts (SpecForge's DSpark rule)",
                 d.kv_heads, d.heads));
    check(d.attention_mode != "mha" || d.kv_heads == d.heads, w, "drafter.attention_mode",
          strfmt("= \"mha\" needs drafter.kv_heads (%d) == drafter.heads (%d)", d.kv_heads, d.heads));
    for (const auto& [key, alpha] :
         {std::pair<const char*, double>{"train.dspark_ce_loss_alpha", t.dspark_ce_loss_alpha},
          {"train.dspark_l1_loss_alpha", t.dspark_l1_loss_alpha},
          {"train.dspark_confidence_head_alpha", t.dspark_confidence_head_alpha}})
      check(std::isfinite(alpha) && alpha >= 0, w, key, "must be >= 0");
  }
  check(t.noise_std >= 0, w, "train.noise_std", "must be >= 0");
  check(c.eval.interval >= 0, w, "eval.interval", "must be >= 0 (steps; 0 = no held-out evaluation)");
  check(c.eval.interval == 0 || !c.eval.data.empty(), w, "eval.data",
        "must name feature files when eval.interval > 0 (HINT: dflash_mpi extract --for-config)");
  check(c.eval.max_sequences >= 0, w, "eval.max_sequences", "must be >= 0 (0 = all)");
  check(c.pipeline.hs_queue_depth > 0, w, "pipeline.hs_queue_depth", "must be positive");
  check(c.checkpoint.interval > 0, w, "checkpoint.interval", "must be positive (steps)");
  check(c.checkpoint.keep_last > 0, w, "checkpoint.keep_last", "must be positive");
  check(c.topology.targets >= 0 && c.topology.drafters >= 0, w, "topology.targets", "and drafters must be >= 0");
  check(c.pipeline.transport == "auto" || c.pipeline.transport == "nccl" || c.pipeline.transport == "mpi", w,
        "pipeline.transport", "must be \"auto\", \"nccl\" or \"mpi\"");
  const PipelineSection& pl = c.pipeline;
  check(pl.rebalance == "off" || pl.rebalance == "advise" || pl.rebalance == "auto", w, "pipeline.rebalance",
        "must be \"off\", \"advise\" or \"auto\"");
  check(pl.rebalance_warmup_steps >= 0, w, "pipeline.rebalance_warmup_steps", "must be >= 0 (steps)");
  check(pl.rebalance_window_steps >= 1, w, "pipeline.rebalance_window_steps", "must be >= 1 (steps)");
  check(pl.rebalance_dwell_steps >= pl.rebalance_warmup_steps + pl.rebalance_window_steps, w,
        "pipeline.rebalance_dwell_steps",
        strfmt("must be >= rebalance_warmup_steps + rebalance_window_steps (%lld): a move needs a full window of "
               "rates measured after the warm-up",
               (long long)(pl.rebalance_warmup_steps + pl.rebalance_window_steps)));
  check(std::isfinite(pl.rebalance_margin) && pl.rebalance_margin > 0 && pl.rebalance_margin <= 10, w,
        "pipeline.rebalance_margin", "must be in (0, 10] (0.10: the better split must be predicted 10 % faster)");
  for (size_t i = 0; i < pl.rebalance_pinned.size(); ++i) {
    check(pl.rebalance_pinned[i] >= 0, w, "pipeline.rebalance_pinned", "must hold world ranks (>= 0)");
    for (size_t j = 0; j < i; ++j)
      check(pl.rebalance_pinned[i] != pl.rebalance_pinned[j], w, "pipeline.rebalance_pinned",
            strfmt("names rank %d twice", pl.rebalance_pinned[i]));
  }
  check(std::isfinite(pl.test_target_delay_s) && pl.test_target_delay_s >= 0 && pl.test_target_delay_s <= 60, w,
        "pipeline.test_target_delay_s", "must be in [0, 60] seconds (a test knob: 0 in real runs)");
  check(!c.topology.offline || c.topology.targets == 0, w, "topology.targets",
        "must be 0 (or unset) with data.features: offline training reads the taps from files, it has no targets");
}

}  // namespace

Config config_parse(const std::string& text, const std::string& where) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    DF_FAIL("%s:%u:%u: TOML syntax error: %s", where.c_str(), e.source().begin.line, e.source().begin.column,
            std::string(e.description()).c_str());
  }
  Config c;
  c.path = where;
  c.text = text;
  static const std::set<std::string> kSections{"run",      "target",     "drafter",  "data", "train",
                                               "pipeline", "checkpoint", "topology", "eval"};
  for (const auto& [k, v] : root) {
    std::string name(k.str());
    DF_CHECK(kSections.count(name), "%s: unknown section or key '%s' (sections: run, target, drafter, data, train, "
             "pipeline, checkpoint, topology, eval)",
             where.c_str(), name.c_str());
  }
  {
    Reader r(section(root, "run", where), "run", where, c);
    r.get("dir", c.run.dir);
    r.get("seed", c.run.seed);
    r.get("log_interval", c.run.log_interval);
    r.get("max_steps", c.run.max_steps);
    r.get("watchdog_s", c.run.watchdog_s);
    r.finish();
  }
  {
    Reader r(section(root, "target", where), "target", where, c);
    r.get("model", c.target.model);
    r.get("random_config", c.target.random_config);
    r.get("random_seed", c.target.random_seed);
    r.get("device", c.target.device);
    r.get("dtype", c.target.dtype);
    r.finish();
  }
  {
    DrafterSection& d = c.drafter;
    Reader r(section(root, "drafter", where), "drafter", where, c);
    r.get("kind", d.kind);
    DF_CHECK(d.kind == "dflash" || d.kind == "domino" || d.kind == "dspark" || d.kind == "dflash2",
             "%s: 'drafter.kind' = \"%s\" must be \"dflash\", \"domino\", \"dspark\" or \"dflash2\"",
             where.c_str(), d.kind.c_str());
    r.get("layers", d.layers);
    r.get("heads", d.heads);
    r.get("kv_heads", d.kv_heads);
    r.get("head_dim", d.head_dim);
    r.get("intermediate", d.intermediate);
    r.get("block_size", d.block_size);
    r.get("mask_token_id", d.mask_token_id);
    r.get("target_layer_ids", d.target_layer_ids);
    r.get("num_taps", d.num_taps);
    r.get("layer_types", d.layer_types);
    r.get("sliding_window", d.sliding_window);
    r.get("rope_theta", d.rope_theta);
    r.get("rms_norm_eps", d.rms_norm_eps);
    r.get("num_anchors", d.num_anchors);
    r.get("init_seed", d.init_seed);
    r.get("init_from", d.init_from);
    d.device = c.target.device;
    r.get("device", d.device);
    r.get("max_block_rows", d.max_block_rows);
    r.get_for_kind("domino", d.kind, "pure_draft_prefix_len", d.pure_draft_prefix_len);
    r.get_for_kind("domino", d.kind, "emb_dim", d.emb_dim);
    r.get_for_kind("domino", d.kind, "gru_hidden_dim", d.gru_hidden_dim);
    r.get_for_kind("domino", d.kind, "shift_label", d.shift_label);
    r.get_for_kind("dflash2", d.kind, "conv_kernel_size", d.conv_kernel_size);
    r.get_for_kind("dflash2", d.kind, "conv_group_size", d.conv_group_size);
    r.get_for_kind("dflash2", d.kind, "selector_rank", d.selector_rank);
    r.get_for_kind("dflash2", d.kind, "selector_top_k", d.selector_top_k);
    r.get_for_kind("dflash2", d.kind, "output_multiplier", d.output_multiplier);
    r.get_for_kind("dflash2", d.kind, "final_logit_softcapping", d.final_logit_softcapping);
    r.get_for_kind("dspark", d.kind, "markov_rank", d.markov_rank);
    r.get_for_kind("dspark", d.kind, "markov_head_type", d.markov_head_type);
    r.get_for_kind("dspark", d.kind, "confidence_head_alpha", d.confidence_head_alpha);
    d.enable_confidence_head = d.confidence_head_alpha > 0;  // SpecForge's default where the key is absent
    r.get_for_kind("dspark", d.kind, "enable_confidence_head", d.enable_confidence_head);
    r.get_for_kind("dspark", d.kind, "confidence_head_with_markov", d.confidence_head_with_markov);
    r.get_for_kind("dspark", d.kind, "attention_mode", d.attention_mode);
    r.finish();
  }
  {
    Reader r(section(root, "data", where), "data", where, c);
    r.get("train", c.data.train);
    r.get("features", c.data.features);
    r.get("token_budget", c.data.token_budget);
    r.get("buckets", c.data.buckets);
    r.get("prefetch_depth", c.data.prefetch_depth);
    r.finish();
  }
  if (c.drafter.max_block_rows < 0) {
    // Unset: derived from the token budget; the table shows the value in force. An out-of-range budget derives
    // nothing (validate() names it); it must not overflow here first.
    const bool budget_ok = c.data.token_budget > 0 && c.data.token_budget <= kMaxTokenBudget;
    c.drafter.max_block_rows = budget_ok ? 4 * c.data.token_budget : 0;
    for (auto& [key, value] : c.values)
      if (key == "drafter.max_block_rows")
        value = std::to_string(c.drafter.max_block_rows) + " (4 x data.token_budget)";
  }
  {
    TrainSection& t = c.train;
    Reader r(section(root, "train", where), "train", where, c);
    r.get("epochs", t.epochs);
    r.get("lr", t.lr);
    r.get("warmup_ratio", t.warmup_ratio);
    r.get("weight_decay", t.weight_decay);
    r.get("beta1", t.beta1);
    r.get("beta2", t.beta2);
    r.get("eps", t.eps);
    r.get("clip", t.clip);
    r.get("grad_accum", t.grad_accum);
    r.get("gamma", t.gamma);
    r.get("loss", t.loss);
    r.get("streak", t.streak);
    r.get("streak_alpha", t.streak_alpha);
    r.get("dpace_alpha", t.dpace_alpha);
    r.get("noise_std", t.noise_std);
    r.get_for_kind("domino", c.drafter.kind, "lambda_base_start", t.lambda_base_start);
    r.get_for_kind("domino", c.drafter.kind, "lambda_base_decay_ratio", t.lambda_base_decay_ratio);
    r.get_for_kind("dflash2", c.drafter.kind, "dflash2_selector_loss_alpha", t.dflash2_selector_loss_alpha);
    r.get_for_kind("dflash2", c.drafter.kind, "dflash2_selector_warmup_ratio",
                   t.dflash2_selector_warmup_ratio);
    r.get_for_kind("dflash2", c.drafter.kind, "dflash2_selector_ramp_ratio", t.dflash2_selector_ramp_ratio);
    r.get_for_kind("dflash2", c.drafter.kind, "dflash2_selector_stop_gradient",
                   t.dflash2_selector_stop_gradient);
    r.get_for_kind("dspark", c.drafter.kind, "dspark_ce_loss_alpha", t.dspark_ce_loss_alpha);
    r.get_for_kind("dspark", c.drafter.kind, "dspark_l1_loss_alpha", t.dspark_l1_loss_alpha);
    r.get_for_kind("dspark", c.drafter.kind, "dspark_confidence_head_alpha", t.dspark_confidence_head_alpha);
    r.finish();
  }
  {
    Reader r(section(root, "pipeline", where), "pipeline", where, c);
    r.get("hs_queue_depth", c.pipeline.hs_queue_depth);
    r.get("transport", c.pipeline.transport);
    r.get("rebalance", c.pipeline.rebalance);
    r.get("rebalance_warmup_steps", c.pipeline.rebalance_warmup_steps);
    r.get("rebalance_window_steps", c.pipeline.rebalance_window_steps);
    r.get("rebalance_dwell_steps", c.pipeline.rebalance_dwell_steps);
    r.get("rebalance_margin", c.pipeline.rebalance_margin);
    r.get("rebalance_pinned", c.pipeline.rebalance_pinned);
    r.get("test_target_delay_s", c.pipeline.test_target_delay_s);
    r.finish();
  }
  {
    Reader r(section(root, "checkpoint", where), "checkpoint", where, c);
    r.get("interval", c.checkpoint.interval);
    r.get("keep_last", c.checkpoint.keep_last);
    r.get("resume", c.checkpoint.resume);
    r.finish();
  }
  {
    Reader r(section(root, "topology", where), "topology", where, c);
    r.get("targets", c.topology.targets);
    r.get("drafters", c.topology.drafters);
    r.finish();
  }
  c.topology.offline = !c.data.features.empty();
  {
    Reader r(section(root, "eval", where), "eval", where, c);
    r.get("data", c.eval.data);
    r.get("interval", c.eval.interval);
    r.get("max_sequences", c.eval.max_sequences);
    r.finish();
  }
  validate(c, where);
  return c;
}

Config config_load(const std::string& path) {
  std::ifstream f(path);
  DF_CHECK(f.good(), "cannot open config file '%s'; HINT: pass --config with a path to a .toml file (see "
           "configs/tiny.toml)",
           path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  Config c = config_parse(ss.str(), path);
  config_resolve_paths(c, std::filesystem::path(path).parent_path().string());
  return c;
}

void config_resolve_paths(Config& c, const std::string& base_dir) {
  namespace fs = std::filesystem;
  auto fix = [&](std::string& p) {
    if (!p.empty() && fs::path(p).is_relative() && !fs::exists(p) && fs::exists(fs::path(base_dir) / p))
      p = (fs::path(base_dir) / p).lexically_normal().string();
  };
  fix(c.target.model);
  fix(c.target.random_config);
  fix(c.drafter.init_from);
  for (std::string& p : c.data.train) fix(p);
  for (std::string& p : c.data.features) fix(p);
  for (std::string& p : c.eval.data) fix(p);
}

std::string config_table(const Config& c) {
  size_t w = 0;
  for (const auto& [k, v] : c.values) w = std::max(w, k.size());
  std::string out = "config " + c.path + ":\n";
  for (const auto& [k, v] : c.values) out += strfmt("  %-*s = %s\n", int(w), k.c_str(), v.c_str());
  return out;
}

}  // namespace df
