// `dflash_mpi extract`: runs the target over a token file, each sequence independently from position 0,
// and writes its hidden states (DESIGN.md "Interfaces"): bf16 by default, float32 with --dtype f32 (what the
// Hugging Face golden tests compare). Also offline feature extraction: --for-config writes exactly the taps
// (and, for the soft-KL loss, the final norm) a drafter run config needs.
#include <algorithm>
#include <chrono>
#include <sstream>

#include "cli/commands.h"
#include "core/config.h"
#include "core/file_util.h"
#include "core/log.h"
#include "data/feature_file.h"
#include "data/token_file.h"
#include "model/drafter.h"
#include "model/target.h"
#include "ops/ops_factory.h"

namespace df {

namespace {

struct ExtractArgs {
  std::string model, tokens, out, layers = "all", device = "cpu", dtype = "bf16", for_config;
  std::string target_dtype;  // "bf16" | "fp8" (target.dtype); empty: --for-config's target.dtype, else bf16
  int gpu = 0;
  int64_t token_budget = 8192;
  bool force = false;
};

// What to write: decoder-layer taps plus, optionally, the embeddings and the final norm.
struct LayerSelection {
  std::vector<int> layers;
  bool embeddings = false, final_norm = false;
  std::string target_dtype;  // the run config's target.dtype (--for-config), else empty
};

LayerSelection parse_layers(const std::string& spec, int num_layers) {
  LayerSelection out;
  if (spec == "all") {
    for (int l = 0; l < num_layers; ++l) out.layers.push_back(l);
    out.embeddings = out.final_norm = true;
    return out;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "embeddings" || item == "final_norm") {
      (item == "embeddings" ? out.embeddings : out.final_norm) = true;
      continue;
    }
    char* end = nullptr;
    long l = std::strtol(item.c_str(), &end, 10);
    DF_CHECK(!item.empty() && *end == '\0', "--layers: '%s' is not a layer number (use 'all' or e.g. 1,16,31, "
             "plus embeddings / final_norm)", item.c_str());
    DF_CHECK(l >= 0 && l < num_layers, "--layers: layer %ld does not exist (the model has layers 0..%d)", l,
             num_layers - 1);
    DF_CHECK(std::find(out.layers.begin(), out.layers.end(), int(l)) == out.layers.end(),
             "--layers: layer %ld is listed twice", l);
    out.layers.push_back(static_cast<int>(l));
  }
  return out;
}

// The taps a drafter run config trains on (drafter.target_layer_ids or the default), and the final norm when
// its loss reads it (soft-KL, DSpark): exactly what offline training of that config reads.
LayerSelection layers_for_config(const std::string& path, const QwenConfig& target) {
  Config cfg = config_load(path);
  LayerSelection out;
  out.layers = drafter_config_from_run(cfg, target).target_layer_ids;
  out.final_norm = drafter_streams_final_hidden(cfg);
  out.target_dtype = cfg.target.dtype;
  return out;
}

void validate_ids(const TokenData& data, int vocab, const std::string& path) {
  for (int64_t s = 0; s < data.num_sequences(); ++s)
    for (int64_t i = data.offsets[s]; i < data.offsets[s + 1]; ++i) {
      int32_t id = data.tokens[i];
      DF_CHECK(id >= 0 && id < vocab,
               "%s: token id %d (sequence %lld, position %lld) is outside the model's vocabulary [0, %d); HINT: "
               "were these tokens made with another tokenizer?",
               path.c_str(), id, (long long)s, (long long)(i - data.offsets[s]), vocab);
    }
}

void run_extract(const ExtractArgs& a) {
  file_check_output(a.out, {a.model, a.tokens, a.for_config}, a.force);
  TokenData data = token_file_read(a.tokens);
  std::unique_ptr<Ops> ops = ops_create(a.device, a.gpu);
  QwenConfig cfg = qwen_config_load(a.model);
  validate_ids(data, cfg.vocab, a.tokens);
  const LayerSelection sel = a.for_config.empty() ? parse_layers(a.layers, cfg.layers)
                                                  : layers_for_config(a.for_config, cfg);
  const std::vector<int>& layers = sel.layers;
  const bool bf16 = a.dtype == "bf16";
  // The target's compute: the flag, else what the run config trains from, so offline features carry the same
  // FP8 rounding as the run's online ones.
  const std::string target_dtype = !a.target_dtype.empty() ? a.target_dtype
                                   : sel.target_dtype.empty() ? "bf16"
                                                              : sel.target_dtype;
  log_info("extract: %s on %s (%s, target %s), %lld sequences, %lld tokens, %zu layer taps",
           qwen_config_summary(cfg).c_str(), a.device.c_str(), ops->name(), target_dtype.c_str(),
           (long long)data.num_sequences(), (long long)data.num_tokens(), layers.size());

  int64_t max_len = 1;
  for (int64_t s = 0; s < data.num_sequences(); ++s) max_len = std::max(max_len, data.sequence_length(s));
  const int64_t budget = std::max(a.token_budget, max_len);
  TargetLoadOptions load;
  load.fp8 = target_dtype == "fp8";
  std::unique_ptr<TargetModel> model = target_load(a.model, *ops, load);
  TargetForward fwd(*model, budget);

  // Output tensors and the per-batch ids/offsets/positions, planned once for the budget.
  TargetOutputs outs;
  outs.tap_layers = layers;
  outs.want_embeddings = sel.embeddings;
  outs.want_final_norm = sel.final_norm;
  Tensor ids_all;
  auto layout = [&](Arena& ar) {
    if (sel.embeddings) outs.embeddings = ar.alloc(ops->act_dtype(), budget, cfg.hidden);
    if (sel.final_norm) outs.final_norm = ar.alloc(ops->act_dtype(), budget, cfg.hidden);
    outs.taps.clear();
    for (size_t i = 0; i < layers.size(); ++i) outs.taps.push_back(ar.alloc(ops->act_dtype(), budget, cfg.hidden));
    ids_all = ar.alloc(DType::i32, 1, budget);
  };
  // Per-batch sequence layout after the planned tensors: offsets and positions, i32, each 256-aligned.
  const size_t batch_meta = (budget + data.num_sequences() + 2) * 4 + 4 * Arena::kAlign;
  Arena arena;
  void* block = ops_alloc_planned(*ops, layout, batch_meta, arena);
  const size_t meta_mark = arena.mark();

  std::vector<std::string> names;
  if (sel.embeddings) names.push_back("embeddings");
  if (sel.final_norm) names.push_back("final_norm");
  for (int l : layers) names.push_back("layer_" + std::to_string(l));
  FeatureFileWriter writer(a.out, names, data, cfg.hidden, bf16, layers);
  std::vector<float> host(bf16 && ops->act_dtype() == DType::bf16 ? 0 : budget * cfg.hidden);
  std::vector<uint16_t> host_bf16(bf16 && ops->act_dtype() == DType::bf16 ? budget * cfg.hidden : 0);
  auto t0 = std::chrono::steady_clock::now();
  auto last_print = t0;
  int64_t s = 0;
  while (s < data.num_sequences()) {
    std::vector<int32_t> lengths;
    int64_t first = s, tokens = 0;
    while (s < data.num_sequences() && tokens + data.sequence_length(s) <= budget) {
      if (data.sequence_length(s) > 0) lengths.push_back(static_cast<int32_t>(data.sequence_length(s)));
      tokens += data.sequence_length(s++);
    }
    if (tokens == 0) continue;  // only empty sequences: nothing to compute, nothing to write
    arena.reset(meta_mark);
    SeqLayout seqs = seq_layout_make(lengths, *ops, arena);
    Tensor ids = ids_all.cols_view(0, tokens);
    ops->upload_raw(ids, data.tokens.data() + data.offsets[first]);
    auto rows = [&](const Tensor& t) { return t.empty() ? t : t.rows_view(0, tokens); };
    TargetOutputs batch_outs = outs;
    batch_outs.embeddings = rows(outs.embeddings);
    batch_outs.final_norm = rows(outs.final_norm);
    for (auto& t : batch_outs.taps) t = rows(t);
    fwd.run(ids, seqs, batch_outs);
    const int64_t row0 = data.offsets[first];
    // bf16 activations go to a bf16 file as they are (no f32 round trip); anything else through f32.
    auto put = [&](size_t index, const Tensor& t) {
      if (!host_bf16.empty()) {
        ops->download_raw(t, host_bf16.data());
        writer.write_rows_bf16(index, row0, tokens, host_bf16.data());
      } else {
        ops->download_f32(t, host.data());
        writer.write_rows(index, row0, tokens, host.data());
      }
    };
    size_t index = 0;
    if (sel.embeddings) put(index++, batch_outs.embeddings);
    if (sel.final_norm) put(index++, batch_outs.final_norm);
    for (size_t i = 0; i < layers.size(); ++i) put(index++, batch_outs.taps[i]);

    auto now = std::chrono::steady_clock::now();
    if (now - last_print > std::chrono::seconds(5) || s == data.num_sequences()) {
      double secs = std::chrono::duration<double>(now - t0).count();
      int64_t done = data.offsets[s];
      log_info("extract: %lld / %lld tokens (%.1f%%), %.0f tok/s", (long long)done, (long long)data.num_tokens(),
               100.0 * done / std::max<int64_t>(1, data.num_tokens()), done / std::max(secs, 1e-9));
      last_print = now;
    }
  }
  writer.finish();
  ops->free_bytes(block);
  log_info("extract: wrote %s (%zu datasets of [%lld, %d] %s + tokens, loss_mask, offsets)", a.out.c_str(),
           names.size(), (long long)data.num_tokens(), cfg.hidden, bf16 ? "bf16" : "float32");
}

}  // namespace

void cmd_extract_register(CLI::App& root) {
  auto args = std::make_shared<ExtractArgs>();
  CLI::App* c = root.add_subcommand("extract", "Run the target over a token file and write its hidden states "
                                               "(embeddings, layer_<l>, final_norm) with the tokens: a feature "
                                               "file that offline training reads ([data] features)");
  c->add_option("--model", args->model, "Hugging Face checkpoint directory (config.json + safetensors)")
      ->required();
  c->add_option("--tokens", args->tokens, "HDF5 token file (tokens int32, offsets int64)")->required();
  c->add_option("--out", args->out, "output HDF5 file (written atomically)")->required();
  c->add_option("--layers", args->layers, "'all' (embeddings, every layer, final_norm) or a comma list of 0-based "
                "decoder layers and embeddings / final_norm")
      ->capture_default_str();
  c->add_option("--for-config", args->for_config, "a run config: write exactly the drafter's taps (drafter."
                "target_layer_ids) and final_norm when train.loss = \"kl\"")
      ->excludes("--layers");
  c->add_option("--dtype", args->dtype, "bf16 (what training uses) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  c->add_option("--target-dtype", args->target_dtype,
                "the target's compute, as target.dtype: bf16, or fp8 (e4m3 linear layers, per-channel weight and "
                "per-token activation scales). Default: --for-config's target.dtype, else bf16")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  c->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--gpu", args->gpu, "CUDA device index")->capture_default_str();
  c->add_option("--token-budget", args->token_budget, "tokens per forward batch (sequences are packed)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_flag("--force", args->force, "replace an existing non-empty output (never an input)");
  c->callback([args] { run_extract(*args); });
}

}  // namespace df
