// `dflash_mpi extract`: runs the target over a token file, each sequence independently from position 0,
// and writes float32 hidden states (DESIGN.md "Interfaces"). Also offline feature extraction.
#include <chrono>
#include <sstream>

#include "cli/commands.h"
#include "core/file_util.h"
#include "core/log.h"
#include "data/feature_file.h"
#include "data/token_file.h"
#include "model/target.h"
#include "ops/ops_factory.h"

namespace df {

namespace {

struct ExtractArgs {
  std::string model, tokens, out, layers = "all", device = "cpu";
  int gpu = 0;
  int64_t token_budget = 8192;
  bool force = false;
};

std::vector<int> parse_layers(const std::string& spec, int num_layers) {
  std::vector<int> out;
  if (spec == "all") {
    for (int l = 0; l < num_layers; ++l) out.push_back(l);
    return out;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long l = std::strtol(item.c_str(), &end, 10);
    DF_CHECK(!item.empty() && *end == '\0', "--layers: '%s' is not a layer number (use 'all' or e.g. 1,16,31)",
             item.c_str());
    DF_CHECK(l >= 0 && l < num_layers, "--layers: layer %ld does not exist (the model has layers 0..%d)", l,
             num_layers - 1);
    out.push_back(static_cast<int>(l));
  }
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
  file_check_output(a.out, {a.model, a.tokens}, a.force);
  TokenData data = token_file_read(a.tokens);
  std::unique_ptr<Ops> ops = ops_create(a.device, a.gpu);
  QwenConfig cfg = qwen_config_load(a.model);
  validate_ids(data, cfg.vocab, a.tokens);
  std::vector<int> layers = parse_layers(a.layers, cfg.layers);
  log_info("extract: %s on %s (%s), %lld sequences, %lld tokens, %zu layer taps", qwen_config_summary(cfg).c_str(),
           a.device.c_str(), ops->name(), (long long)data.num_sequences(), (long long)data.num_tokens(),
           layers.size());

  int64_t max_len = 1;
  for (int64_t s = 0; s < data.num_sequences(); ++s) max_len = std::max(max_len, data.sequence_length(s));
  const int64_t budget = std::max(a.token_budget, max_len);
  std::unique_ptr<TargetModel> model = target_load(a.model, *ops, TargetLoadOptions{});
  TargetForward fwd(*model, budget);

  // Output tensors and the per-batch ids/offsets/positions, planned once for the budget.
  TargetOutputs outs;
  outs.tap_layers = layers;
  outs.want_embeddings = outs.want_final_norm = true;
  Tensor ids_all;
  auto layout = [&](Arena& ar) {
    outs.embeddings = ar.alloc(ops->act_dtype(), budget, cfg.hidden);
    outs.final_norm = ar.alloc(ops->act_dtype(), budget, cfg.hidden);
    outs.taps.clear();
    for (size_t i = 0; i < layers.size(); ++i) outs.taps.push_back(ar.alloc(ops->act_dtype(), budget, cfg.hidden));
    ids_all = ar.alloc(DType::i32, 1, budget);
  };
  // Per-batch sequence layout after the planned tensors: offsets and positions, i32, each 256-aligned.
  const size_t batch_meta = (budget + data.num_sequences() + 2) * 4 + 4 * Arena::kAlign;
  Arena arena;
  void* block = ops_alloc_planned(*ops, layout, batch_meta, arena);
  const size_t meta_mark = arena.mark();

  std::vector<std::string> names{"embeddings", "final_norm"};
  for (int l : layers) names.push_back("layer_" + std::to_string(l));
  FeatureFileWriter writer(a.out, names, data.num_tokens(), cfg.hidden);
  std::vector<float> host(budget * cfg.hidden);
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
    auto rows = [&](const Tensor& t) { return t.rows_view(0, tokens); };
    TargetOutputs batch_outs = outs;
    batch_outs.embeddings = rows(outs.embeddings);
    batch_outs.final_norm = rows(outs.final_norm);
    for (auto& t : batch_outs.taps) t = rows(t);
    fwd.run(ids, seqs, batch_outs);
    const int64_t row0 = data.offsets[first];
    auto put = [&](size_t index, const Tensor& t) {
      ops->download_f32(t, host.data());
      writer.write_rows(index, row0, tokens, host.data());
    };
    put(0, batch_outs.embeddings);
    put(1, batch_outs.final_norm);
    for (size_t i = 0; i < layers.size(); ++i) put(2 + i, batch_outs.taps[i]);

    auto now = std::chrono::steady_clock::now();
    if (now - last_print > std::chrono::seconds(5) || s == data.num_sequences()) {
      double secs = std::chrono::duration<double>(now - t0).count();
      int64_t done = data.offsets[s];
      log_info("extract: %lld / %lld tokens (%.1f%%), %.0f tok/s", (long long)done, (long long)data.num_tokens(),
               100.0 * done / std::max<int64_t>(1, data.num_tokens()), done / std::max(secs, 1e-9));
      last_print = now;
    }
  }
  writer.write_offsets(data.offsets);
  writer.finish();
  ops->free_bytes(block);
  log_info("extract: wrote %s (%zu datasets of [%lld, %d] float32 + offsets)", a.out.c_str(), names.size(),
           (long long)data.num_tokens(), cfg.hidden);
}

}  // namespace

void cmd_extract_register(CLI::App& root) {
  auto args = std::make_shared<ExtractArgs>();
  CLI::App* c = root.add_subcommand("extract", "Run the target over a token file and write its hidden states "
                                               "(float32 embeddings, layer_<l>, final_norm, offsets)");
  c->add_option("--model", args->model, "Hugging Face checkpoint directory (config.json + safetensors)")
      ->required();
  c->add_option("--tokens", args->tokens, "HDF5 token file (tokens int32, offsets int64)")->required();
  c->add_option("--out", args->out, "output HDF5 file (written atomically)")->required();
  c->add_option("--layers", args->layers, "'all' or a comma list of 0-based decoder layers")
      ->capture_default_str();
  c->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--gpu", args->gpu, "CUDA device index")->capture_default_str();
  c->add_option("--token-budget", args->token_budget, "tokens per forward batch (sequences are packed)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_flag("--force", args->force, "replace an existing non-empty output (never an input)");
  c->callback([args] { run_extract(*args); });
}

}  // namespace df
