// The run configuration (TOML), parsed once into plain structs. Every key is checked: an unknown key, a
// wrong type or an invalid value is an error that names `section.key` and the file. Rank 0 prints it as a
// table; checkpoints store the text so a resume can tell what it continues.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace df {

struct RunSection {
  std::string dir = "runs/default";  // checkpoints, metrics.jsonl
  uint64_t seed = 0;
  double log_interval = 10.0;  // seconds between metric lines
  int64_t max_steps = 0;       // 0: as many as `train.epochs` give
  // A rank with no progress for this long ends the job (0: off, also for silent ranks (comm/host_watch.h);
  // -1: automatic, see comm/watchdog.h).
  double watchdog_s = -1;
};

struct TargetSection {
  std::string model;          // Hugging Face checkpoint directory, or
  std::string random_config;  // a config.json to draw random weights from (demo, tests)
  uint64_t random_seed = 1;
  std::string device = "cuda";  // cpu | cuda
  // bf16 | fp8: FP8 rounds the linear layers' weights per output channel at load and their inputs per token
  // to e4m3 (model/target.h target_linear): cuBLASLt FP8 GEMMs on CUDA (sm_90), emulated on the CPU.
  std::string dtype = "bf16";
  // Where the target's config.json comes from: the checkpoint directory, else the random-weights config.
  const std::string& architecture() const { return model.empty() ? random_config : model; }
};

struct DrafterSection {
  // dflash | domino | dspark | dflash2 (MODELS.md "Drafter kinds beyond DFlash"): one backbone, the kind's
  // head and loss terms.
  std::string kind = "dflash";
  int layers = 5;
  int heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int intermediate = 0;  // 0: the target's intermediate size
  int block_size = 16;
  int64_t mask_token_id = -1;          // required
  std::vector<int> target_layer_ids;   // empty: round(1 + i·(L−4)/(n−1)) for n = num_taps
  int num_taps = 5;
  std::vector<std::string> layer_types;  // "sliding_attention" | "full_attention"; empty: all full
  int sliding_window = 2048;
  double rope_theta = 1e7;
  double rms_norm_eps = 1e-6;
  int num_anchors = 512;
  uint64_t init_seed = 0;
  std::string init_from;  // a Hugging Face DFlash drafter folder to start from (empty: random init)
  std::string device;  // cpu | cuda: the drafter's backend; unset: target.device
  // Per micro-batch cap on block rows (anchors · block_size); anchors over it are dropped at random. Unset:
  // 4 · data.token_budget; 0: no cap (the workspace is then planned for an anchor at every token).
  int64_t max_block_rows = -1;
  // kind = "domino" only, under SpecForge's dflash_config names (configs/qwen3-8b-domino.json): the GRU
  // correction applies from block slot pure_draft_prefix_len on (shift_label) or one later; the GRU (hidden
  // gru_hidden_dim) reads the target embeddings of the previous block tokens; the correction MLP is
  // [H + gru_hidden_dim] -> emb_dim -> SiLU -> vocab; shift_label: slot k predicts x[a+k+1].
  int pure_draft_prefix_len = 1;
  int emb_dim = 256;
  int gru_hidden_dim = 1024;
  bool shift_label = true;
  // kind = "dflash2" only, under SpecForge's dflash_config names; defaults are its published recipe's
  // (configs/qwen3.6-27b-dflash2.json), output_multiplier and final_logit_softcapping its absent-key values.
  // Around every attention and MLP sublayer a grouped dynamic depthwise convolution inside the block:
  // conv_kernel_size taps (tap t reads block row r−t), conv_group_size channels share one dynamic
  // coefficient. The candidate selector re-ranks the lm_head's selector_top_k best tokens with a
  // rank-selector_rank transition score; its unary logits are output_multiplier·logits, then c·tanh(·/c) with
  // c = final_logit_softcapping (0: none).
  int conv_kernel_size = 2;
  int conv_group_size = 16;
  int selector_rank = 256;
  int selector_top_k = 16;
  double output_multiplier = 1.0;
  double final_logit_softcapping = 0.0;
  // kind = "dspark" only, under SpecForge's dflash_config names; the defaults are its published recipes'
  // (configs/qwen3-8b-dspark.json). markov_rank R (0: no Markov head): the logits get the low-rank bias
  // W2·f(W1[previous token]) with f per markov_head_type (vanilla | gated | rnn); the confidence head is
  // Linear([h ; W1[prev] if confidence_head_with_markov]) -> 1. enable_confidence_head unset: on when
  // confidence_head_alpha > 0 (SpecForge's rule; that alpha is otherwise only recorded, train.dspark_*
  // weigh the loss). attention_mode: "gqa" needs kv_heads < heads, "mha" kv_heads == heads (as SpecForge).
  int markov_rank = 256;
  std::string markov_head_type = "vanilla";
  bool enable_confidence_head = true;
  bool confidence_head_with_markov = true;
  double confidence_head_alpha = 1.0;
  std::string attention_mode = "gqa";
};

struct DataSection {
  std::vector<std::string> train;     // HDF5 token files
  std::vector<std::string> features;  // offline training: feature files from `extract` (no target ranks)
  int64_t token_budget = 32768;
  std::vector<int64_t> buckets;    // length bucket upper bounds; empty: one bucket
  int prefetch_depth = 4;          // q_pre capacity
};

struct TrainSection {
  double epochs = 6;
  double lr = 6e-4;
  double warmup_ratio = 0.04;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip = 1.0;
  int grad_accum = 1;          // micro-batches per drafter per optimizer step
  double gamma = 7.0;          // loss weight decay over block positions
  std::string loss = "ce";     // ce | kl | dpace | dpace-cumulative-confidence-only | dpace-continuation-value-only
  double dpace_alpha = 0.5;    // D-PACE confidence smoothing α (MODELS.md "D-PACE loss")
  bool streak = false;         // streak-aware weighting
  double streak_alpha = 1.0;
  double noise_std = 0.0;      // context-feature noise at step 0, cosine to 0
  // drafter.kind = "domino" only: loss (1−λ)·CE(final) + λ·CE(base), λ linear from lambda_base_start to 0
  // over the first lambda_base_decay_ratio of the steps (SpecForge linear_lambda_base).
  double lambda_base_start = 1.0;
  double lambda_base_decay_ratio = 0.5;
  // drafter.kind = "dflash2" only (SpecForge training.dflash2_selector_*): the loss is
  // (Σ w·CE + α·Σ w·CE_selector) / Σ w with α = 0 for the first ⌊warmup_ratio·steps⌋ optimizer steps, then
  // linear to loss_alpha over ⌊ramp_ratio·steps⌋; stop_gradient: the selector term trains the selector's own
  // weights only.
  double dflash2_selector_loss_alpha = 1.0;
  double dflash2_selector_warmup_ratio = 0.0;
  double dflash2_selector_ramp_ratio = 0.0;
  bool dflash2_selector_stop_gradient = false;
  // drafter.kind = "dspark" only (SpecForge training.dspark_*): the loss is
  // (ce·Σ w·CE + l1·Σ w·‖p_draft − p_target‖₁ + confidence·Σ w·BCE) / Σ w.
  double dspark_ce_loss_alpha = 0.1;
  double dspark_l1_loss_alpha = 0.9;
  double dspark_confidence_head_alpha = 1.0;
};

struct PipelineSection {
  int hs_queue_depth = 2;         // credits per target on each drafter
  std::string transport = "auto";  // auto | nccl | mpi (comm/transport.h): carries payloads, gradients
  // Role rebalancing (pipeline/rebalance.h): "off" | "advise" (log and record the better split) | "auto"
  // (checkpoint and re-form the roles in process when the better split is predicted faster by the margin).
  std::string rebalance = "advise";
  int64_t rebalance_warmup_steps = 20;   // steps after every (re)start whose rates are not measured
  int64_t rebalance_window_steps = 50;   // measured steps the rates are averaged over
  int64_t rebalance_dwell_steps = 200;   // at least this many steps after a (re)start before a move
  double rebalance_margin = 0.10;        // the better split must predict > (1 + margin) x the current rate
  std::vector<int> rebalance_pinned;     // world ranks whose role never moves (also `pinned` in a rankfile)
  // TEST KNOB, not for real runs: every target sleeps this long per batch (counted in its busy time), so a
  // test can make the targets the bottleneck whatever the machine. 0 = off.
  double test_target_delay_s = 0;
};

struct CheckpointSection {
  int64_t interval = 1000;  // steps
  int keep_last = 3;
  std::string resume = "auto";  // auto | none | a checkpoint path
};

struct TopologySection {
  int targets = 0;   // 0: unset (roles from the rankfile or the default)
  int drafters = 0;
  bool offline = false;  // derived: data.features is set, so every rank is a drafter and there are no targets
};

// Held-out evaluation during training: loss and teacher-forced τ on feature files (as `extract --for-config`
// writes them for this run) every `interval` steps, forward only, on drafter 0.
struct EvalSection {
  std::vector<std::string> data;  // feature files (taps + tokens + loss_mask)
  int64_t interval = 0;           // steps; 0 = off
  int64_t max_sequences = 0;      // evaluate only the first N sequences (0 = all)
};

struct Config {
  std::string path;  // where it came from
  std::string text;  // the file's text, stored in checkpoints
  std::vector<std::pair<std::string, std::string>> values;  // every "section.key" with its effective value
  RunSection run;
  TargetSection target;
  DrafterSection drafter;
  DataSection data;
  TrainSection train;
  PipelineSection pipeline;
  CheckpointSection checkpoint;
  TopologySection topology;
  EvalSection eval;
};

// Parses TOML text; `where` names the source in messages. Throws df::Error naming section.key.
Config config_parse(const std::string& text, const std::string& where);
Config config_load(const std::string& path);
// Relative paths in the file are resolved against `base_dir` (the file's folder); call after parsing.
void config_resolve_paths(Config& c, const std::string& base_dir);
// "section.key = value" lines for the start-up table.
std::string config_table(const Config& c);

}  // namespace df
