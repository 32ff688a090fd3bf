// Byte-level BPE as Hugging Face `tokenizers` runs it for Qwen: split the raw text on added tokens (leftmost,
// longest), NFC-normalise the rest (libunistring), split it with the pre-tokenizer regex (PCRE2 with UTF and
// Unicode properties, "Isolated": matches and the gaps between them are pieces), map every byte to its
// ByteLevel character and apply the merges by rank, lowest first, leftmost first among equals.
#include "data/tokenizer.h"

#include <uninorm.h>
#include <unistr.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/strfmt.h"

namespace df {

namespace {

using json = nlohmann::json;

// GPT-2's byte → character table: printable bytes map to themselves, the other 68 to U+0100 onwards.
std::vector<std::string> byte_level_alphabet() {
  std::vector<int> cp(256, -1);
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) cp[size_t(b)] = b;
  int next = 256;
  for (int b = 0; b < 256; ++b)
    if (cp[size_t(b)] < 0) cp[size_t(b)] = next++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    uint8_t buf[6];
    int n = u8_uctomb(buf, ucs4_t(cp[size_t(b)]), 6);
    out[size_t(b)].assign(reinterpret_cast<char*>(buf), size_t(n));
  }
  return out;
}

// The pre-tokenizer regex, compiled once (JIT where PCRE2 has it).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      DF_FAIL("%s: the pre-tokenizer regex does not compile at offset %zu: %s", where.c_str(), size_t(off),
              reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter serves where it fails
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits s into pieces "Isolated": every match is a piece and so is every non-empty gap between matches.
  void split(const std::string& s, std::vector<std::pair<size_t, size_t>>& pieces) const {
    pieces.clear();
    size_t pos = 0, gap = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, match_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      DF_CHECK(rc >= 0, "tokenizer: PCRE2 match failed with code %d", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match splits nothing: step one character on
        if (b >= s.size()) break;
        pos = b + 1;
        while (pos < s.size() && (uint8_t(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > gap) pieces.emplace_back(gap, b);
      pieces.emplace_back(b, e);
      gap = pos = e;
    }
    if (gap < s.size()) pieces.emplace_back(gap, s.size());
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
};

// GPT-2's own split, used when a ByteLevel pre-tokenizer has use_regex = true.
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string json_type(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

bool json_flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

}  // namespace

struct BpeTokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) → (rank, merged id)
  std::vector<std::pair<std::string, int32_t>> added;                 // longest first
  std::vector<std::unique_ptr<Regex>> splits;                         // applied in order
  bool nfc = false, ignore_merges = false;
  int64_t size = 0;
  std::vector<int32_t> byte_id;  // vocabulary id of each byte's ByteLevel character
  bool added_first[256] = {};    // bytes an added token starts with
  std::vector<std::string> alphabet;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece → ids (encode is not thread-safe)

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    auto hit = cache.find(piece);
    if (hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    std::vector<int32_t> sym;
    std::string mapped;
    for (unsigned char c : piece) {
      sym.push_back(byte_id[c]);
      mapped += alphabet[c];
    }
    auto whole = ignore_merges ? vocab.find(mapped) : vocab.end();
    if (whole != vocab.end()) {
      sym.assign(1, whole->second);
    } else {
      while (sym.size() > 1) {
        int32_t best_rank = INT32_MAX, best_id = -1;
        size_t best = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto m = merges.find(key(sym[i], sym[i + 1]));
          if (m != merges.end() && m->second.first < best_rank) {
            best_rank = m->second.first;
            best_id = m->second.second;
            best = i;
          }
        }
        if (best_id < 0) break;
        const int32_t l = sym[best], r = sym[best + 1];
        std::vector<int32_t> next;
        next.reserve(sym.size());
        for (size_t i = 0; i < sym.size(); ++i) {
          if (i + 1 < sym.size() && i >= best && sym[i] == l && sym[i + 1] == r) {
            next.push_back(best_id);
            ++i;
          } else {
            next.push_back(sym[i]);
          }
        }
        sym.swap(next);
      }
    }
    if (cache.size() > (size_t(1) << 18)) cache.clear();
    cache.emplace(piece, sym);
    out.insert(out.end(), sym.begin(), sym.end());
  }

  // Input bytes each vocabulary token stands for (one per ByteLevel character).
  std::vector<int64_t> token_bytes;

  void encode_plain(const std::string& text, int64_t base, std::vector<TokenSpan>& out) const;
};

BpeTokenizer::BpeTokenizer(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::filesystem::is_directory(dir) ? (std::filesystem::path(dir) / "tokenizer.json").string() : dir;
  std::ifstream f(m.path);
  DF_CHECK(f.is_open(), "%s: cannot open (is --tokenizer the model directory holding tokenizer.json?)",
           m.path.c_str());
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    DF_FAIL("%s: not valid JSON (%s)", m.path.c_str(), e.what());
  }
  const char* p = m.path.c_str();
  try {
    const json& model = j.at("model");
    DF_CHECK(json_type(model) == "BPE", "%s: model.type is '%s'; only byte-level BPE (Qwen) is implemented", p,
             json_type(model).c_str());
    DF_CHECK(!model.contains("dropout") || model["dropout"].is_null(), "%s: model.dropout is set; unsupported", p);
    DF_CHECK(!json_flag(model, "byte_fallback"), "%s: model.byte_fallback = true is not implemented", p);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      DF_CHECK(!model.contains(k) || model[k].is_null() || model[k].get<std::string>().empty(),
               "%s: model.%s is set; only plain byte-level BPE is implemented", p, k);
    m.ignore_merges = json_flag(model, "ignore_merges");
    for (const auto& [tok, id] : model.at("vocab").items()) {
      m.vocab[tok] = id.get<int32_t>();
      m.size = std::max<int64_t>(m.size, int64_t(id.get<int32_t>()) + 1);
    }
    int32_t rank = 0;
    for (const json& mg : model.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        DF_CHECK(sp != std::string::npos, "%s: model.merges[%d] = '%s' is not 'left right'", p, rank, s.c_str());
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        DF_CHECK(mg.is_array() && mg.size() == 2, "%s: model.merges[%d] must be a pair", p, rank);
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      }
      auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
      DF_CHECK(ia != m.vocab.end() && ib != m.vocab.end() && iab != m.vocab.end(),
               "%s: model.merges[%d] ('%s' '%s') names a token missing from model.vocab", p, rank, a.c_str(),
               b.c_str());
      m.merges.emplace(Impl::key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }
    if (j.contains("added_tokens"))
      for (const json& t : j["added_tokens"]) {
        const std::string content = t.at("content").get<std::string>();
        for (const char* k : {"lstrip", "rstrip", "single_word"})
          DF_CHECK(!json_flag(t, k), "%s: added token '%s' has %s = true, which is not implemented", p,
                   content.c_str(), k);
        const int32_t id = t.at("id").get<int32_t>();
        m.added.emplace_back(content, id);
        m.size = std::max<int64_t>(m.size, int64_t(id) + 1);
      }
    std::stable_sort(m.added.begin(), m.added.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

    const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
    if (!norm.is_null()) {
      DF_CHECK(json_type(norm) == "NFC", "%s: normalizer.type '%s' is not implemented (only NFC or null)", p,
               json_type(norm).c_str());
      m.nfc = true;
    }
    const json& pre = j.at("pre_tokenizer");
    std::vector<json> steps;
    if (json_type(pre) == "Sequence")
      for (const json& s : pre.at("pretokenizers")) steps.push_back(s);
    else
      steps.push_back(pre);
    bool byte_level = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = steps[i];
      const std::string where = strfmt("%s: pre_tokenizer step %zu", p, i);
      if (json_type(s) == "Split") {
        DF_CHECK(!byte_level, "%s: a Split after ByteLevel is not implemented", where.c_str());
        DF_CHECK(s.value("behavior", "") == "Isolated" && !json_flag(s, "invert"),
                 "%s: Split behavior '%s' (invert %d) is not implemented; only Isolated", where.c_str(),
                 s.value("behavior", "").c_str(), int(json_flag(s, "invert")));
        const json& pat = s.at("pattern");
        DF_CHECK(pat.contains("Regex"), "%s: only a Regex pattern is implemented", where.c_str());
        m.splits.push_back(std::make_unique<Regex>(pat["Regex"].get<std::string>(), where));
      } else if (json_type(s) == "ByteLevel") {
        DF_CHECK(!json_flag(s, "add_prefix_space"), "%s: ByteLevel add_prefix_space = true is not implemented",
                 where.c_str());
        if (!s.contains("use_regex") || json_flag(s, "use_regex"))
          m.splits.push_back(std::make_unique<Regex>(kGpt2Pattern, where));
        byte_level = true;
      } else {
        DF_FAIL("%s: type '%s' is not implemented (Split and ByteLevel are)", where.c_str(), json_type(s).c_str());
      }
    }
    DF_CHECK(byte_level, "%s: pre_tokenizer has no ByteLevel step; only byte-level BPE is implemented", p);
  } catch (const json::exception& e) {
    DF_FAIL("%s: unexpected layout (%s)", p, e.what());
  }
  m.alphabet = byte_level_alphabet();
  m.byte_id.resize(256);
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab.find(m.alphabet[size_t(b)]);
    DF_CHECK(it != m.vocab.end(), "%s: model.vocab lacks the ByteLevel character of byte 0x%02x", p, b);
    m.byte_id[size_t(b)] = it->second;
  }
  m.token_bytes.assign(size_t(m.size), 0);
  std::unordered_map<std::string, int> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[m.alphabet[size_t(b)]] = b;
  for (const auto& [tok, id] : m.vocab) {
    int64_t n = 0;
    for (size_t i = 0; i < tok.size();) {
      size_t l = 1;
      while (i + l < tok.size() && (uint8_t(tok[i + l]) & 0xC0) == 0x80) ++l;
      DF_CHECK(byte_of.count(tok.substr(i, l)), "%s: vocabulary token '%s' (id %d) is not ByteLevel-encoded", p,
               tok.c_str(), id);
      i += l;
      ++n;
    }
    m.token_bytes[size_t(id)] = n;
  }
  for (const auto& a : m.added) m.added_first[uint8_t(a.first.empty() ? 0 : a.first[0])] = true;
}

BpeTokenizer::~BpeTokenizer() = default;

int32_t BpeTokenizer::token_id(const std::string& token) const {
  for (const auto& [s, id] : impl_->added)
    if (s == token) return id;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

int64_t BpeTokenizer::vocab_size() const { return impl_->size; }
const std::string& BpeTokenizer::path() const { return impl_->path; }

// Text with no added token in it: NFC, regex pieces, BPE. Offsets are exact wherever NFC changed nothing; a run
// it rewrote (an ASCII character and the non-ASCII ones after it, which NFC treats independently of the rest)
// gives its tokens that run's whole extent.
void BpeTokenizer::Impl::encode_plain(const std::string& text, int64_t base, std::vector<TokenSpan>& out) const {
  std::string norm;
  std::vector<int64_t> begin_of, end_of;  // normalised byte → original offset of a token starting / ending there
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return uint8_t(c) < 0x80; });
  if (!nfc || ascii) {
    norm = text;
  } else {
    begin_of.reserve(text.size());
    end_of.reserve(text.size() + 1);
    end_of.push_back(0);
    size_t r0 = 0;
    while (r0 < text.size()) {
      size_t r1 = r0 + 1;
      while (r1 < text.size() && uint8_t(text[r1]) >= 0x80) ++r1;
      size_t n = 0;
      uint8_t* q = u8_normalize(UNINORM_NFC, reinterpret_cast<const uint8_t*>(text.data() + r0), r1 - r0, nullptr, &n);
      DF_CHECK(q != nullptr, "tokenizer: NFC normalisation failed at byte %lld", (long long)(base + int64_t(r0)));
      const std::string run(reinterpret_cast<char*>(q), n);
      std::free(q);
      const bool same = run == text.substr(r0, r1 - r0);
      for (size_t i = 0; i < n; ++i) {
        begin_of.push_back(same ? int64_t(r0 + i) : int64_t(r0));
        end_of.push_back(same ? int64_t(r0 + i + 1) : int64_t(r1));
      }
      norm += run;
      r0 = r1;
    }
  }
  // Pieces of every split step, in order: each step splits the pieces of the one before.
  std::vector<std::pair<size_t, size_t>> pieces{{0, norm.size()}}, next, sub;
  for (const auto& re : splits) {
    next.clear();
    for (auto [b, e] : pieces) {
      re->split(norm.substr(b, e - b), sub);
      for (auto [sb, se] : sub) next.emplace_back(b + sb, b + se);
    }
    pieces.swap(next);
  }
  std::vector<int32_t> ids;
  for (auto [b, e] : pieces) {
    ids.clear();
    bpe(norm.substr(b, e - b), ids);
    size_t at = b;
    for (int32_t id : ids) {
      const size_t len = size_t(token_bytes[size_t(id)]);
      const int64_t ob = begin_of.empty() ? int64_t(at) : begin_of[at];
      const int64_t oe = end_of.empty() ? int64_t(at + len) : end_of[at + len];
      out.push_back({id, base + ob, base + oe});
      at += len;
    }
  }
}

std::vector<TokenSpan> BpeTokenizer::encode(const std::string& text) const {
  const Impl& m = *impl_;
  if (const uint8_t* bad = u8_check(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
    DF_FAIL("tokenizer: the text is not valid UTF-8 at byte %lld",
            (long long)(bad - reinterpret_cast<const uint8_t*>(text.data())));
  std::vector<TokenSpan> out;
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    if (m.added_first[uint8_t(text[i])])
      for (const auto& a : m.added)
        if (!a.first.empty() && text.compare(i, a.first.size(), a.first) == 0) {
          hit = &a;  // longest first: the first match is the longest at this position
          break;
        }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > seg) m.encode_plain(text.substr(seg, i - seg), int64_t(seg), out);
    out.push_back({hit->second, int64_t(i), int64_t(i + hit->first.size())});
    i += hit->first.size();
    seg = i;
  }
  if (seg < text.size()) m.encode_plain(text.substr(seg), int64_t(seg), out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_ids(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const TokenSpan& t : encode(text)) ids.push_back(t.id);
  return ids;
}

}  // namespace df
