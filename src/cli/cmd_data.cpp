// `dflash_mpi data convert|synth|info`: make and inspect HDF5 token files. Single-process tools: they
// never start MPI, so they run on a login node.
#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "core/file_util.h"
#include "core/log.h"
#include "data/jsonl_convert.h"
#include "data/synth.h"
#include "data/token_file.h"

namespace df {

namespace {

struct ConvertArgs {
  std::string in, out;
  int64_t vocab = 0;
  bool force = false;
};

struct SynthArgs {
  std::string out;
  SynthOptions options;
  bool force = false;
};

void data_print_summary(const std::string& path, const TokenData& d) {
  int64_t lo = d.num_tokens(), hi = 0, trained = 0;
  for (int64_t s = 0; s < d.num_sequences(); ++s) {
    lo = std::min(lo, d.sequence_length(s));
    hi = std::max(hi, d.sequence_length(s));
  }
  for (uint8_t m : d.loss_mask) trained += m;
  if (d.loss_mask.empty()) trained = d.num_tokens();
  log_info("%s: %lld sequences, %lld tokens, length min %lld mean %.1f max %lld, %.1f%% of tokens in the loss, "
           "vocab_size %s", path.c_str(), static_cast<long long>(d.num_sequences()),
           static_cast<long long>(d.num_tokens()), static_cast<long long>(lo),
           static_cast<double>(d.num_tokens()) / static_cast<double>(std::max<int64_t>(1, d.num_sequences())),
           static_cast<long long>(hi),
           100.0 * static_cast<double>(trained) / static_cast<double>(std::max<int64_t>(1, d.num_tokens())),
           d.vocab_size > 0 ? std::to_string(d.vocab_size).c_str() : "unknown");
}

}  // namespace

void cmd_data_register(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Make and inspect HDF5 token files (tokens, offsets, loss_mask)");
  data->require_subcommand(1);

  auto conv = std::make_shared<ConvertArgs>();
  CLI::App* c = data->add_subcommand("convert", "JSONL ({\"input_ids\": [...], \"loss_mask\": [...]} per line) "
                                                "to an HDF5 token file");
  c->add_option("--in", conv->in, "input JSONL file")->required();
  c->add_option("--out", conv->out, "output HDF5 token file (written atomically)")->required();
  c->add_option("--vocab", conv->vocab, "vocabulary size; every id must lie in [0, vocab)")->required();
  c->add_flag("--force", conv->force, "replace an existing non-empty output (never an input)");
  c->callback([conv] {
    file_check_output(conv->out, {conv->in}, conv->force);
    TokenData d = jsonl_convert_file(conv->in, conv->out, conv->vocab);
    data_print_summary(conv->out, d);
  });

  auto syn = std::make_shared<SynthArgs>();
  CLI::App* s = data->add_subcommand("synth", "Write a learnable synthetic corpus (sparse Markov chain + motifs)");
  s->add_option("--out", syn->out, "output HDF5 token file")->required();
  s->add_option("--vocab", syn->options.vocab_size, "vocabulary size")->required();
  s->add_option("--sequences", syn->options.sequences, "number of sequences")->required();
  s->add_option("--min-len", syn->options.min_len, "shortest sequence (tokens, >= 2)")->required();
  s->add_option("--max-len", syn->options.max_len, "longest sequence (tokens)")->required();
  s->add_option("--seed", syn->options.seed, "seed; the same seed gives the same file")->capture_default_str();
  s->add_flag("--force", syn->force, "replace an existing non-empty output (never an input)");
  s->callback([syn] {
    file_check_output(syn->out, {}, syn->force);
    TokenData d = synth_generate(syn->options);
    token_file_write(syn->out, d);
    data_print_summary(syn->out, d);
  });

  auto info_path = std::make_shared<std::string>();
  CLI::App* i = data->add_subcommand("info", "Validate a token file and print its shape");
  i->add_option("file", *info_path, "HDF5 token file")->required();
  i->callback([info_path] { data_print_summary(*info_path, token_file_read(*info_path)); });
}

}  // namespace df
