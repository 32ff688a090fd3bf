// `dflash_mpi data convert|tokenize|synth|info`: make and inspect HDF5 token files. Single-process tools: they
// never start MPI, so they run on a login node.
#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "core/file_util.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strfmt.h"
#include "data/jsonl_convert.h"
#ifdef DF_HAVE_TOKENIZER
#include "data/chat_tokenize.h"
#endif
#include "data/synth.h"
#include "data/token_file.h"

namespace df {

namespace {

struct ConvertArgs {
  std::string in, out;
  int64_t vocab = 0;
  bool force = false;
};

struct TokenizeArgs {
  std::string tokenizer, in, out, chat_template = "auto", enable_thinking, tools;
  std::vector<std::string> template_vars;
  int64_t max_len = 0;
  bool add_generation_prompt = false, force = false;
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
  const std::string mask =
      d.loss_mask.empty()
          ? std::string("no loss_mask (training: every token in the loss)")
          : strfmt("%.1f%% of tokens in the loss",
                   100.0 * static_cast<double>(trained) / static_cast<double>(std::max<int64_t>(1, d.num_tokens())));
  log_info("%s: %lld sequences, %lld tokens, length min %lld mean %.1f max %lld, %s, vocab_size %s", path.c_str(),
           static_cast<long long>(d.num_sequences()), static_cast<long long>(d.num_tokens()),
           static_cast<long long>(lo),
           static_cast<double>(d.num_tokens()) / static_cast<double>(std::max<int64_t>(1, d.num_sequences())),
           static_cast<long long>(hi), mask.c_str(),
           d.vocab_size > 0 ? std::to_string(d.vocab_size).c_str() : "unknown");
}

// Prompts or training data? A loss_mask 0→1 step marks a response after its prompt (`data tokenize`, `eval
// --generate`); a file where no sequence has one (no mask, masks of all ones or all zeros) holds nothing but
// whole sequences, which is what a file of prompts is, though a mask of all ones is also text trained whole. What
// eval does is token_data_prompt_length's answer, counted here, not a second copy of the rule.
void data_print_layout(const TokenData& d) {
  int64_t split = 0, whole = 0, empty = 0, first_empty = -1, prompt_tokens = 0;
  for (int64_t s = 0; s < d.num_sequences(); ++s) {
    const int64_t len = d.sequence_length(s), p = token_data_prompt_length(d, s);
    if (len == 0) {
      if (empty++ == 0) first_empty = s;
      continue;
    }
    (p < len ? split : whole) += 1;
    prompt_tokens += p;
  }
  if (empty > 0)
    log_info("layout: %lld sequences are empty (the first is sequence %lld): eval refuses them", (long long)empty,
             (long long)first_empty);
  if (split + whole == 0) return;
  const double mean_prompt = double(prompt_tokens) / double(split + whole);
  const bool any_trained =
      d.loss_mask.empty() || std::find(d.loss_mask.begin(), d.loss_mask.end(), uint8_t{1}) != d.loss_mask.end();
  if (split == 0)
    log_info("layout: looks like prompts: no sequence has a loss_mask 0->1 step (%s), so eval takes every sequence "
             "whole as its prompt (%.1f tokens on average); as training data %s",
             d.loss_mask.empty() ? "the file has no loss_mask" : "each mask is all ones or all zeros", mean_prompt,
             d.loss_mask.empty() ? "every token is in the loss (text trained whole)"
             : any_trained       ? "its tokens with loss_mask 1 are in the loss (text trained whole)"
                                 : "it has no token in the loss");
  else if (whole == 0)
    log_info("layout: looks like training data: every sequence has a prompt (loss_mask 0) followed by a response "
             "(loss_mask 1), so eval takes the tokens before the first response as the prompt (%.1f tokens on "
             "average)", mean_prompt);
  else
    log_info("layout: mixed: %lld sequences have a prompt followed by a response (a loss_mask 0->1 step), eval's "
             "prompt is the part before it; %lld have no such step, eval takes them whole (%.1f prompt tokens on "
             "average)", (long long)split, (long long)whole, mean_prompt);
}

// `data info`: the summary, then how lengths, the loss mask and the vocabulary are used.
void data_print_details(const std::string& path, const TokenData& d) {
  data_print_summary(path, d);
  std::vector<int64_t> bucket(64, 0);  // sequences with length in [2^b, 2^(b+1))
  int top = 0, bottom = 63;
  for (int64_t s = 0; s < d.num_sequences(); ++s) {
    int b = 0;
    while ((int64_t(2) << b) <= d.sequence_length(s)) ++b;
    ++bucket[size_t(b)];
    top = std::max(top, b);
    bottom = std::min(bottom, b);
  }
  const int64_t most = *std::max_element(bucket.begin(), bucket.end());
  log_info("length histogram (sequences per length range):");
  for (int b = bottom; b <= top; ++b) {
    const int bar = int(40 * bucket[size_t(b)] / std::max<int64_t>(1, most));
    log_info("  [%7lld, %7lld) %9lld %s", (long long)(int64_t(1) << b), (long long)(int64_t(2) << b),
             (long long)bucket[size_t(b)], std::string(size_t(bar), '#').c_str());
  }
  int64_t masked_seqs = 0, trainable = 0;
  for (int64_t s = 0; s < d.num_sequences() && !d.loss_mask.empty(); ++s) {
    int64_t on = 0;
    for (int64_t t = d.offsets[size_t(s)]; t < d.offsets[size_t(s) + 1]; ++t) on += d.loss_mask[size_t(t)];
    masked_seqs += on == 0;
    trainable += on >= 2;  // an anchor needs loss_mask[a] and loss_mask[a+1]
  }
  if (!d.loss_mask.empty())
    log_info("loss mask: %lld sequences have no token in the loss, %lld have at least 2 (can hold an anchor)",
             (long long)masked_seqs, (long long)trainable);
  data_print_layout(d);
  int32_t max_id = 0;
  for (int32_t t : d.tokens) max_id = std::max(max_id, t);
  std::vector<int64_t> count(size_t(max_id) + 1, 0);
  for (int32_t t : d.tokens) ++count[size_t(t)];
  const int64_t distinct = std::count_if(count.begin(), count.end(), [](int64_t c) { return c > 0; });
  std::vector<int32_t> order(count.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  const size_t k = std::min<size_t>(5, order.size());
  std::partial_sort(order.begin(), order.begin() + long(k), order.end(),
                    [&](int32_t a, int32_t b) { return count[size_t(a)] > count[size_t(b)]; });
  std::string most_used;
  for (size_t i = 0; i < k; ++i)
    most_used += strfmt("%s%d (%.1f%%)", i ? ", " : "", order[i],
                        100.0 * double(count[size_t(order[i])]) / double(std::max<int64_t>(1, d.num_tokens())));
  log_info("vocabulary use: %lld distinct ids (%s), largest id %d; most used: %s", (long long)distinct,
           d.vocab_size > 0 ? strfmt("%.1f%% of %lld", 100.0 * double(distinct) / double(d.vocab_size),
                                     (long long)d.vocab_size).c_str() : "vocab_size unknown",
           max_id, most_used.c_str());
}

}  // namespace

void cmd_data_register(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Make and inspect HDF5 token files (tokens, offsets, loss_mask)");
  data->require_subcommand(1);

  auto conv = std::make_shared<ConvertArgs>();
  CLI::App* c = data->add_subcommand("convert", "JSONL ({\"input_ids\": [...], \"loss_mask\": [...]} per line) "
                                                "to an HDF5 token file; loss_mask is optional (in no record: the "
                                                "file gets none, e.g. a file of prompts for eval)");
  c->add_option("--in", conv->in, "input JSONL file")->required();
  c->add_option("--out", conv->out, "output HDF5 token file (written atomically)")->required();
  c->add_option("--vocab", conv->vocab, "vocabulary size; every id must lie in [0, vocab)")->required();
  c->add_flag("--force", conv->force, "replace an existing non-empty output (never an input)");
  c->callback([conv] {
    file_check_output(conv->out, {conv->in}, conv->force);
    JsonlReport rep;
    TokenData d = jsonl_convert_file(conv->in, conv->out, conv->vocab, &rep);
    data_print_summary(conv->out, d);
    if (d.loss_mask.empty())
      log_info("no record has a loss_mask, so none is written: training puts every token in the loss, eval takes "
               "each sequence whole as its prompt");
    else if (rep.unmasked > 0)
      log_info("%lld of %lld records have no loss_mask: written as loss_mask 1 (in the loss; eval takes such a "
               "sequence whole as its prompt)", (long long)rep.unmasked, (long long)d.num_sequences());
  });

  auto tk = std::make_shared<TokenizeArgs>();
  CLI::App* t = data->add_subcommand("tokenize", "Conversation JSONL (OpenAI 'messages', ShareGPT 'conversations' "
                                                 "or 'text' per line) to an HDF5 token file, assistant-only loss");
  t->add_option("--tokenizer", tk->tokenizer, "the target's Hugging Face directory (or its tokenizer.json)")
      ->required();
  t->add_option("--in", tk->in, "input JSONL file")->required();
  t->add_option("--out", tk->out, "output HDF5 token file (written atomically, nothing on any error)")->required();
  t->add_option("--chat-template", tk->chat_template,
                "auto: the template the model ships (chat_template.jinja beside --tokenizer, else chat_template in "
                "tokenizer_config.json), rendered as Hugging Face apply_chat_template does; a .jinja file; or none: "
                "the contents only")
      ->capture_default_str();
  t->add_option("--enable-thinking", tk->enable_thinking,
                "true|false: the template's enable_thinking (unset: the template's own default)")
      ->check(CLI::IsMember({"true", "false"}));
  t->add_option(
       "--template-var", tk->template_vars,
       "KEY=VALUE (repeatable): one more variable for the template, as apply_chat_template's keyword "
       "arguments; VALUE is JSON (true, 3, \"text\") or else a string. E.g. preserve_thinking=true: "
       "Qwen3.6 keeps the think block of every assistant turn, not only of those after the last user "
       "message. A KEY the template never reads is refused")
      ->allow_extra_args(false);
  t->add_option("--tools", tk->tools, "JSON file: an array of tool schemas for records without their own 'tools'");
  t->add_flag("--add-generation-prompt", tk->add_generation_prompt,
              "prompt files (eval): end each record with the assistant header the model continues from; no "
              "loss_mask is written");
  t->add_option("--max-len", tk->max_len, "cut longer sequences to N tokens (0: keep whole)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  t->add_flag("--force", tk->force, "replace an existing --out (never one of the inputs)");
  t->callback([tk] {
#ifdef DF_HAVE_TOKENIZER
    std::vector<std::string> inputs = {tk->in, tk->tokenizer};
    if (!tk->tools.empty()) inputs.push_back(tk->tools);
    if (tk->chat_template != "auto" && tk->chat_template != "none") inputs.push_back(tk->chat_template);
    file_check_output(tk->out, inputs, tk->force);
    TokenizeOptions o;
    o.chat_template = tk->chat_template;
    if (!tk->enable_thinking.empty()) o.chat.enable_thinking = tk->enable_thinking == "true";
    for (const std::string& v : tk->template_vars) chat_template_var_add(o.chat.template_vars, v);
    o.chat.add_generation_prompt = tk->add_generation_prompt;
    o.tools_file = tk->tools;
    o.max_len = tk->max_len;
    TokenizeReport rep;
    TokenData d = chat_tokenize_file(tk->in, tk->out, tk->tokenizer, o, &rep);
    log_info("chat template: %s", rep.template_source.c_str());
    data_print_summary(tk->out, d);
    if (rep.truncated) log_info("%lld sequences were cut to --max-len %lld", (long long)rep.truncated,
                                (long long)tk->max_len);
    if (rep.untrained) log_info("%lld sequences have no assistant token in the loss", (long long)rep.untrained);
#else
    DF_FAIL("this dflash_mpi was built without PCRE2/libunistring, so `data tokenize` is not in it; HINT: apt "
            "install libpcre2-dev libunistring-dev and rebuild");
#endif
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
  CLI::App* i = data->add_subcommand("info", "Validate a token file; print its shape, length histogram, loss-mask "
                                             "use and vocabulary use");
  i->add_option("file", *info_path, "HDF5 token file")->required();
  i->callback([info_path] { data_print_details(*info_path, token_file_read(*info_path)); });
}

}  // namespace df
