// The token file every stage reads (HDF5): `tokens` int32 [N], `offsets` int64 [S+1] with sequence s at
// tokens[offsets[s], offsets[s+1]), optional `loss_mask` uint8 [N] (absent = train on every token) and an
// optional root attribute `vocab_size`. Writes are atomic; reads validate; TokenCorpus joins several files.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace df {

struct TokenData {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};  // S+1 entries, offsets[0] == 0, offsets[S] == tokens.size()
  std::vector<uint8_t> loss_mask;   // empty, or one 0/1 per token
  int64_t vocab_size = 0;           // 0 = unknown (not stored)

  int64_t num_sequences() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t sequence_length(int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

// The prompt `eval` decodes from sequence s, as its length from the sequence's first token: the tokens before
// the first 0→1 step of its loss_mask, where a response starts after its prompt (`data tokenize`'s first
// assistant turn, `eval --generate`'s continuation); the whole sequence when its mask has no 0→1 step (no mask,
// all ones, all zeros: a file of prompts, or plain text trained whole). The one home of this rule: eval and
// `data info` both ask it.
int64_t token_data_prompt_length(const TokenData& data, int64_t s);

// Throws naming `where` (a file name) and the dataset when offsets/mask/token ids are inconsistent.
void token_data_validate(const TokenData& data, const std::string& where);

// Writes to "<path>.tmp.<pid>", flushes, fsyncs and renames over `path`: a crash or a full disk leaves
// either the old file or the new one, never half of one. Throws naming the path on any failure.
void token_file_write(const std::string& path, const TokenData& data);

// The datasets and attribute of a token file, written into an open HDF5 file (token files, feature files).
void token_data_write_datasets(hid_t file, const TokenData& data, const std::string& path);

// Reads and validates a whole file into memory.
TokenData token_file_read(const std::string& path);

// Several token files seen as one corpus: global sequence g runs through file 0's sequences, then
// file 1's, ... Only offsets are held in memory; token and mask ranges are read on demand (hyperslabs).
// Reading from several threads at once needs a thread-safe HDF5 build (Debian's is).
class TokenCorpus {
 public:
  explicit TokenCorpus(const std::vector<std::string>& paths);
  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }  // 0 when no file records it
  int64_t sequence_length(int64_t seq) const;
  const std::vector<int64_t>& sequence_lengths() const { return lengths_; }
  // "file.h5 sequence 17" for messages about global sequence `seq`.
  std::string describe(int64_t seq) const;
  // Where global sequence `seq` lives: the index of its file (in the order given) and its first row there.
  struct Location {
    size_t file = 0;
    int64_t row = 0;
  };
  Location locate(int64_t seq) const;
  size_t num_files() const { return files_.size(); }
  const std::string& file_path(size_t i) const { return files_[i].path; }

  // Copies tokens [start, start+len) of global sequence `seq` into `tokens` and its loss mask into `mask`
  // (all ones when the file has none). Checks mask values are 0/1 and, when the vocabulary is known,
  // that token ids lie in [0, vocab_size).
  void read(int64_t seq, int64_t start, int64_t len, int32_t* tokens, uint8_t* mask) const;

  // One pass over every token and mask byte, in blocks: a hash of the content (a resume on edited data must
  // refuse even when every length is the same), the positions a drafter can anchor at (loss_mask[a] and
  // loss_mask[a+1] both 1 within the first `max_len` tokens of a sequence: what training truncates to), and
  // every token id checked against `vocab` (> 0) with an error that names the file and sequence.
  struct Scan {
    uint64_t content_hash = 0;
    int64_t anchor_positions = 0;
  };
  Scan scan(int64_t vocab, int64_t max_len) const;

 private:
  struct File {
    std::string path;
    hid_t file = -1, tokens = -1, mask = -1;
    int64_t first_seq = 0;         // global index of its sequence 0
    std::vector<int64_t> offsets;  // its own offsets
  };
  size_t file_of(int64_t seq) const;
  void close_all();

  std::vector<File> files_;
  std::vector<int64_t> lengths_;
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
};

}  // namespace df
