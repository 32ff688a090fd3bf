// Building the shared training plan; see train_plan.h.
#include "pipeline/train_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/count_noun.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/feature_file.h"
#include "topo/plan_vram.h"
#include "train/checkpoint.h"

namespace df {

namespace {

// run.dir must be a folder we can write, or creatable under one: found before a job waits hours for step 1.
void check_run_dir(const Config& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = cfg.run.dir.empty() ? fs::path(".") : fs::path(cfg.run.dir);
  if (fs::exists(p, ec)) {
    DF_CHECK(fs::is_directory(p, ec), "%s: 'run.dir' = \"%s\" is a file, not a folder; HINT: point run.dir at a "
             "folder (checkpoints and metrics.jsonl go there)", cfg.path.c_str(), cfg.run.dir.c_str());
    DF_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, "%s: 'run.dir' = \"%s\" is not writable: %s; HINT: fix its "
             "permissions or choose another run.dir", cfg.path.c_str(), cfg.run.dir.c_str(), std::strerror(errno));
    return;
  }
  fs::path up = fs::absolute(p, ec).parent_path();
  while (!up.empty() && !fs::exists(up, ec) && up != up.root_path()) up = up.parent_path();
  DF_CHECK(fs::is_directory(up, ec) && ::access(up.c_str(), W_OK | X_OK) == 0, "%s: 'run.dir' = \"%s\" cannot be "
           "created: %s is %s; HINT: choose a run.dir under a writable folder", cfg.path.c_str(), cfg.run.dir.c_str(),
           up.c_str(), fs::is_directory(up, ec) ? "not writable" : "not a folder");
}

// Offline: every feature file holds every tap of the drafter config, the target's hidden size, final_norm
// when the loss is soft-KL, and (when data.train is also given) the tokens of the token file at the same
// position; throws naming the file and the field that disagrees.
void check_feature_files(const TrainPlan& plan) {
  const Config& cfg = plan.cfg;
  DF_CHECK(cfg.data.train.empty() || cfg.data.train.size() == cfg.data.features.size(),
           "%s: data.train lists %zu token files and data.features %zu feature files; with features, data.train is "
           "optional and, when given, names the token file each feature file was extracted from, in the same order",
           cfg.path.c_str(), cfg.data.train.size(), cfg.data.features.size());
  for (size_t i = 0; i < cfg.data.features.size(); ++i) {
    const std::string& path = cfg.data.features[i];
    FeatureFileReader rd(path);
    DF_CHECK(rd.hidden() == plan.target.hidden, "%s: features have hidden size %lld but the target (%s) has %d; "
             "HINT: were they extracted from another model?", path.c_str(), (long long)rd.hidden(),
             cfg.target.architecture().c_str(), plan.target.hidden);
    for (int l : plan.drafter.target_layer_ids)
      DF_CHECK(std::find(rd.layer_ids().begin(), rd.layer_ids().end(), l) != rd.layer_ids().end(),
               "%s: holds no tap of layer %d, which drafter.target_layer_ids needs; HINT: dflash_mpi extract "
               "--for-config %s", path.c_str(), l, cfg.path.c_str());
    DF_CHECK(!plan.final_hidden || rd.has_final_norm(),
             "%s: this run's loss (soft-KL or DSpark) needs final_norm, which the file lacks; "
             "HINT: dflash_mpi extract --for-config %s",
             path.c_str(), cfg.path.c_str());
    if (!cfg.data.train.empty())
      DF_CHECK(token_data_fingerprint(token_file_read(cfg.data.train[i])) == rd.tokens_fingerprint(),
               "%s: its tokens are not those of data.train[%zu] = %s; HINT: extract from that file, or drop "
               "data.train (the feature file holds its tokens)", path.c_str(), i, cfg.data.train[i].c_str());
  }
}

}  // namespace

TrainPlan train_plan_build(const Config& cfg, int num_targets, int num_drafters) {
  TrainPlan p;
  p.cfg = cfg;
  p.target = qwen_config_load(cfg.target.architecture());
  p.drafter = drafter_config_from_run(cfg, p.target);
  p.final_hidden = drafter_streams_final_hidden(cfg);
  p.num_targets = num_targets;
  p.num_drafters = num_drafters;
  p.grad_accum = cfg.train.grad_accum;
  p.batches_per_step = int64_t(p.num_drafters) * p.grad_accum;
  check_run_dir(cfg);

  DF_CHECK(!cfg.data.train.empty() || cfg.topology.offline, "%s: 'data.train' lists no token files; HINT: make one "
           "with `dflash_mpi data synth`, `data convert` or `data tokenize` (or train offline from `extract` output "
           "with data.features)",
           cfg.path.c_str());
  // Offline, the feature files are the corpus: each holds the tokens its taps were extracted from.
  p.corpus = std::make_unique<TokenCorpus>(cfg.topology.offline ? cfg.data.features : cfg.data.train);
  if (cfg.topology.offline) check_feature_files(p);
  if (p.corpus->vocab_size() > 0)
    DF_CHECK(p.corpus->vocab_size() <= p.target.vocab, "the token files were made for a vocabulary of %lld but the "
             "target has %d",
             (long long)p.corpus->vocab_size(), p.target.vocab);
  BatcherOptions bo;
  bo.seed = cfg.run.seed;
  bo.token_budget = cfg.data.token_budget;
  bo.bucket_bounds = cfg.data.buckets;
  p.batcher = std::make_unique<Batcher>(p.corpus->sequence_lengths(), bo);
  const TokenCorpus::Scan scan = p.corpus->scan(p.target.vocab, cfg.data.token_budget);
  p.data_fingerprint = rng_mix(p.batcher->fingerprint(), scan.content_hash);
  p.anchor_positions = scan.anchor_positions;
  DF_CHECK(p.anchor_positions > 0, "%s: the token files of 'data.train' (%lld sequences, %lld tokens) have no "
           "position to train on: a block anchors at a token whose loss_mask and next token's loss_mask are both 1, "
           "so every sequence is shorter than 2 tokens or its loss_mask has no two 1s in a row; HINT: check the "
           "files with `dflash_mpi data info` (was the mask inverted, or the chat template not matched?)",
           cfg.path.c_str(), (long long)p.corpus->num_sequences(), (long long)p.corpus->num_tokens());

  const int64_t full = int64_t(std::floor(cfg.train.epochs));
  const double frac = cfg.train.epochs - double(full);
  int64_t total_batches =
      p.batcher->epoch_start(full) + int64_t(std::llround(frac * p.batcher->batches_in_epoch(full)));
  p.total_steps = cfg.run.max_steps > 0 ? cfg.run.max_steps : total_batches / p.batches_per_step;
  DF_CHECK(p.total_steps > 0, "%lld batches in %.3g epochs make no optimizer step of %lld batches (%d drafters x "
           "grad_accum %d); HINT: more data, more epochs, a smaller data.token_budget or run.max_steps",
           (long long)total_batches, cfg.train.epochs, (long long)p.batches_per_step, p.num_drafters, p.grad_accum);
  return p;
}

std::string train_plan_find_resume(const TrainPlan& plan) {
  const std::string& r = plan.cfg.checkpoint.resume;
  if (r == "none") return "";
  return r == "auto" ? checkpoint_find_latest(plan.ckpt_dir()) : r;
}

void train_plan_check_resume(TrainPlan& plan, const std::string& path, const std::vector<std::string>& allow_change) {
  const CheckpointHeader h = checkpoint_read_header(path);
  checkpoint_check_resume_config(h, path, plan.cfg, plan.drafter, allow_change);
  // The step → batch mapping is step · drafters · grad_accum: a checkpoint resumes exactly only with the same
  // product (the number of targets may change freely).
  const int64_t step = h.state.step, cursor = h.state.batch_cursor;
  DF_CHECK(cursor == step * plan.batches_per_step,
           "%s is at step %lld with batch cursor %lld, i.e. %lld batches per step, but this run has %lld (%d drafters "
           "x grad_accum %d); HINT: resume with drafters x train.grad_accum = %lld",
           path.c_str(), (long long)step, (long long)cursor, (long long)(step > 0 ? cursor / step : 0),
           (long long)plan.batches_per_step, plan.num_drafters, plan.grad_accum,
           (long long)(step > 0 ? cursor / step : 0));
  DF_CHECK(h.state.data_fingerprint == plan.data_fingerprint,
           "%s was written for another corpus or batching (fingerprint %016llx, now %016llx: the token content, "
           "sequence lengths, data.token_budget, data.buckets or run.seed differ); HINT: resume with the same "
           "data.train files, token_budget, buckets and seed, or set checkpoint.resume = \"none\"",
           path.c_str(), (unsigned long long)h.state.data_fingerprint, (unsigned long long)plan.data_fingerprint);
  plan.resume_path = path;
  plan.start_step = step;
}

TrainPlan train_plan_make(const Config& cfg, const DistContext& ctx, bool fresh_start, int64_t stop_at_step,
                          const std::vector<std::string>& allow_change) {
  if (cfg.target.device == "cuda" && !cfg.topology.offline) {
    // Stop before loading anything when a role cannot fit its GPU (plan vram prints the same table).
    std::string gpu_source;
    VramAssumptions assume;
    assume.targets = ctx.num_targets();
    VramPlan vram = plan_vram_compute(cfg, qwen_config_load(cfg.target.architecture()),
                                      plan_vram_gpu_bytes(0, gpu_source), gpu_source, assume);
    if (ctx.rank == 0) log_here("%s", plan_vram_format(vram).c_str());
    plan_vram_check(vram);
  }
  TrainPlan p = train_plan_build(cfg, ctx.num_targets(), ctx.num_drafters());

  // Drafter 0 owns the run dir: before anything is written it takes the lock, decides where the run starts
  // (refusing checkpoints it would overwrite), checks that the resumed checkpoint trained what this config
  // trains, and tells everyone. A refusal there ends the job through MPI_Abort (main), so nobody waits in the
  // broadcast.
  const int owner = ctx.roles.drafters[0];
  if (ctx.rank == owner) {
    p.lock = std::make_unique<RunLock>(cfg.run.dir);
    const RunStart rs = run_start_decide(cfg.run.dir, p.ckpt_dir(), cfg.checkpoint.resume, fresh_start);
    p.lock->set_run_id(rs.state.run_id);
    p.run_id = rs.state.run_id;
    p.moved_aside = rs.moved_to;
    if (!rs.resume_path.empty()) train_plan_check_resume(p, rs.resume_path, allow_change);
  }
  int64_t len = int64_t(p.resume_path.size());
  MPI_Bcast(&len, 1, MPI_INT64_T, owner, MPI_COMM_WORLD);
  p.resume_path.resize(size_t(len));
  MPI_Bcast(p.resume_path.data(), int(len), MPI_CHAR, owner, MPI_COMM_WORLD);
  MPI_Bcast(&p.start_step, 1, MPI_INT64_T, owner, MPI_COMM_WORLD);
  DF_CHECK(stop_at_step == 0 || stop_at_step > p.start_step,
           "--stop-at-step %lld is not after step %lld, where this run %s; HINT: give a step above %lld "
           "(it is the optimizer step after which the run checkpoints and exits), or leave it out",
           (long long)stop_at_step, (long long)p.start_step,
           p.start_step > 0 ? "resumes from its checkpoint" : "starts", (long long)p.start_step);
  p.stop_at_step = stop_at_step;
  return p;
}

void train_plan_check_loaded(const TrainPlan& plan, const CheckpointState& st) {
  DF_CHECK(st.step == plan.start_step && st.data_fingerprint == plan.data_fingerprint,
           "%s holds step %lld (data fingerprint %016llx) but the run was planned from step %lld (%016llx): the file "
           "changed after the plan was made; HINT: do not write into run.dir while a run starts",
           plan.resume_path.c_str(), (long long)st.step, (unsigned long long)st.data_fingerprint,
           (long long)plan.start_step, (unsigned long long)plan.data_fingerprint);
}

std::string train_plan_summary(const TrainPlan& p) {
  const DrafterParamTable table = drafter_param_table(p.drafter);
  int64_t trainable = 0;
  for (const auto& e : table.entries) trainable += e.rows * e.cols;
  std::string taps;
  for (int l : p.drafter.target_layer_ids) taps += (taps.empty() ? "" : ",") + std::to_string(l);
  std::string s;
  s += strfmt("roles: %s, %s (mpirun -np %d), grad_accum %d -> %lld batches per step\n",
              count_noun(p.num_targets, "target").c_str(), count_noun(p.num_drafters, "drafter").c_str(),
              p.num_targets + p.num_drafters, p.grad_accum, (long long)p.batches_per_step);
  s += strfmt("target: %s (%d layers, hidden %d, vocab %d) on %s\n", p.cfg.target.architecture().c_str(),
              p.target.layers, p.target.hidden, p.target.vocab, p.cfg.target.device.c_str());
  if (p.target.is_moe())
    s += strfmt("target %s: %s\n", p.target.model_type.c_str(), qwen_config_moe_summary(p.target).c_str());
  s += strfmt(
      "drafter: kind %s, %d layers, %lld trainable parameters, taps %s, block %d, mask id %d, loss %s\n",
      drafter_kind_name(p.drafter.kind), p.drafter.layers, (long long)trainable, taps.c_str(),
      p.drafter.block_size, p.drafter.mask_token_id, p.cfg.train.loss.c_str());
  if (p.drafter.kind == DrafterKind::domino)
    s += strfmt(
        "domino head: GRU hidden %d over the previous tokens' embeddings, MLP %d -> %d -> vocab from slot "
        "%d, shift_label %s; lambda_base %g -> 0 over the first %g of the steps\n",
        p.drafter.gru_hidden_dim, p.drafter.hidden + p.drafter.gru_hidden_dim, p.drafter.emb_dim,
        p.drafter.pure_draft_prefix_len + (p.drafter.shift_label ? 0 : 1),
        p.drafter.shift_label ? "true" : "false", p.cfg.train.lambda_base_start,
        p.cfg.train.lambda_base_decay_ratio);
  if (p.drafter.kind == DrafterKind::dflash2)
    s += strfmt(
        "dflash2: %d-tap convolutions in groups of %d channels around every sublayer; selector rank %d over "
        "the top %d (logits x %g, softcap %s); selector loss alpha %g (warmup %g, ramp %g of the steps%s)\n",
        p.drafter.conv_kernel_size, p.drafter.conv_group_size, p.drafter.selector_rank,
        p.drafter.selector_top_k, double(p.drafter.output_multiplier),
        p.drafter.final_logit_softcapping > 0
            ? strfmt("%g", double(p.drafter.final_logit_softcapping)).c_str()
            : "none",
        p.cfg.train.dflash2_selector_loss_alpha, p.cfg.train.dflash2_selector_warmup_ratio,
        p.cfg.train.dflash2_selector_ramp_ratio,
        p.cfg.train.dflash2_selector_stop_gradient ? ", stop-gradient" : "");
  if (p.drafter.kind == DrafterKind::dspark) {
    const DrafterConfig& d = p.drafter;
    const std::string markov =
        d.markov_rank > 0
            ? strfmt("%s Markov bias of rank %d", drafter_markov_head_name(d.markov_head_type), d.markov_rank)
            : std::string("no Markov bias");
    const std::string conf =
        d.enable_confidence_head
            ? strfmt("confidence head over [h%s]", d.confidence_head_with_markov ? " ; W1[prev]" : "")
            : std::string("no confidence head");
    s += strfmt(
        "dspark head: %s, %s; loss %g·CE + %g·L1(p_draft - p_target) + %g·BCE(confidence), weight %s "
        "from slot 0, labels shifted\n",
        markov.c_str(), conf.c_str(), p.cfg.train.dspark_ce_loss_alpha, p.cfg.train.dspark_l1_loss_alpha,
        p.cfg.train.dspark_confidence_head_alpha,
        p.cfg.train.gamma > 0 ? strfmt("exp(-k/%g)", p.cfg.train.gamma).c_str() : "1 (no decay)");
    if (p.final_hidden)
      s += strfmt(
          "dspark p_target: softmax(frozen lm_head x target final-norm output), computed on the drafter rank "
          "from the final hidden the targets stream beside the taps (+%d bf16 per token)\n",
          p.target.hidden);
  }
  s += strfmt("data: %lld sequences, %lld tokens, %lld anchorable positions, %lld batches per epoch\n",
              (long long)p.corpus->num_sequences(), (long long)p.corpus->num_tokens(), (long long)p.anchor_positions,
              (long long)p.batcher->batches_in_epoch(0));
  s += strfmt("steps: %lld..%lld%s%s\n", (long long)p.start_step, (long long)p.total_steps,
              p.resume_path.empty() ? " (fresh start)" : ", resuming from ", p.resume_path.c_str());
  return s;
}

}  // namespace df
