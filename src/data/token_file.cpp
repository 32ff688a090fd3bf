// HDF5 token files: atomic writing, validated reading, and several files joined into one corpus.
// All HDF5 calls go through the C API; the automatic HDF5 error-stack printing is silenced in here because
// every failure is turned into a df::Error that names the file and the dataset.
#include "data/token_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/file_util.h"
#include "core/h5_util.h"

namespace df {

namespace {

// Length of a 1-D integer dataset; throws naming the file and dataset otherwise.
int64_t h5_dataset_length(hid_t dset, const std::string& path, const char* name) {
  H5Handle space(H5Dget_space(dset), H5Sclose);
  DF_CHECK(space.get() >= 0, "%s: cannot read the dataspace of dataset '%s'", path.c_str(), name);
  int rank = H5Sget_simple_extent_ndims(space.get());
  DF_CHECK(rank == 1, "%s: dataset '%s' has %d dimensions, expected 1 (a flat array)", path.c_str(), name, rank);
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  H5Handle type(H5Dget_type(dset), H5Tclose);
  DF_CHECK(type.get() >= 0 && H5Tget_class(type.get()) == H5T_INTEGER,
           "%s: dataset '%s' must hold integers (tokens int32, offsets int64, loss_mask uint8)", path.c_str(), name);
  return static_cast<int64_t>(dims[0]);
}

hid_t h5_open_dataset(hid_t file, const std::string& path, const char* name, bool required) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) {
    DF_CHECK(!required, "%s: dataset '%s' is missing; a token file needs 'tokens' and 'offsets' "
             "(make one with `dflash_mpi data convert`)", path.c_str(), name);
    return -1;
  }
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  DF_CHECK(d >= 0, "%s: cannot open dataset '%s'", path.c_str(), name);
  return d;
}

// Reads elements [start, start+count) of a 1-D dataset, converting to `mem_type`.
void h5_read_range(hid_t dset, hid_t mem_type, int64_t start, int64_t count, void* out, const std::string& path,
                   const char* name) {
  if (count == 0) return;
  H5Handle fspace(H5Dget_space(dset), H5Sclose);
  hsize_t off[1] = {static_cast<hsize_t>(start)}, cnt[1] = {static_cast<hsize_t>(count)};
  herr_t rc = H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, off, nullptr, cnt, nullptr);
  H5Handle mspace(H5Screate_simple(1, cnt, nullptr), H5Sclose);
  DF_CHECK(rc >= 0 && fspace.get() >= 0 && mspace.get() >= 0 &&
               H5Dread(dset, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, out) >= 0,
           "%s: reading dataset '%s' elements [%lld, %lld) failed (file truncated or corrupt?)", path.c_str(), name,
           static_cast<long long>(start), static_cast<long long>(start + count));
}

template <class T>
std::vector<T> h5_read_all(hid_t dset, hid_t mem_type, const std::string& path, const char* name) {
  std::vector<T> out(static_cast<size_t>(h5_dataset_length(dset, path, name)));
  h5_read_range(dset, mem_type, 0, static_cast<int64_t>(out.size()), out.data(), path, name);
  return out;
}

int64_t h5_read_vocab_attr(hid_t file, const std::string& path) {
  if (H5Aexists(file, "vocab_size") <= 0) return 0;
  H5Handle attr(H5Aopen(file, "vocab_size", H5P_DEFAULT), H5Aclose);
  int64_t v = 0;
  DF_CHECK(attr.get() >= 0 && H5Aread(attr.get(), H5T_NATIVE_INT64, &v) >= 0,
           "%s: cannot read the root attribute 'vocab_size'", path.c_str());
  DF_CHECK(v > 0, "%s: root attribute 'vocab_size' is %lld, must be positive", path.c_str(), static_cast<long long>(v));
  return v;
}

void check_offsets(const std::vector<int64_t>& offsets, int64_t num_tokens, const std::string& path) {
  DF_CHECK(!offsets.empty(), "%s: dataset 'offsets' is empty; it needs S+1 entries starting at 0", path.c_str());
  DF_CHECK(offsets.front() == 0, "%s: dataset 'offsets' starts at %lld, must start at 0", path.c_str(),
           static_cast<long long>(offsets.front()));
  for (size_t i = 1; i < offsets.size(); ++i)
    DF_CHECK(offsets[i] >= offsets[i - 1], "%s: dataset 'offsets' decreases at entry %zu (%lld after %lld); "
             "offsets must be non-decreasing", path.c_str(), i, static_cast<long long>(offsets[i]),
             static_cast<long long>(offsets[i - 1]));
  DF_CHECK(offsets.back() == num_tokens, "%s: dataset 'offsets' ends at %lld but 'tokens' holds %lld tokens",
           path.c_str(), static_cast<long long>(offsets.back()), static_cast<long long>(num_tokens));
}

void check_mask_values(const uint8_t* mask, int64_t n, const std::string& where) {
  for (int64_t i = 0; i < n; ++i)
    DF_CHECK(mask[i] <= 1, "%s: dataset 'loss_mask' holds %d at a token; only 0 and 1 are allowed", where.c_str(),
             static_cast<int>(mask[i]));
}

void check_token_range(const int32_t* tokens, int64_t n, int64_t vocab, const std::string& where) {
  for (int64_t i = 0; i < n; ++i)
    DF_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "%s: token id %d is outside the vocabulary [0, %lld)",
             where.c_str(), tokens[i], static_cast<long long>(vocab));
}

void h5_write_dataset(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const void* data, int64_t n,
                      const std::string& path) {
  hsize_t dims[1] = {static_cast<hsize_t>(n)};
  H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  DF_CHECK(dset.get() >= 0, "%s: cannot create dataset '%s' (disk full or no write permission?)", path.c_str(), name);
  if (n > 0)
    DF_CHECK(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
             "%s: writing dataset '%s' failed (disk full?)", path.c_str(), name);
  DF_CHECK(dset.close(), "%s: closing dataset '%s' failed (disk full?)", path.c_str(), name);
}

void write_to(const std::string& tmp, const std::string& path, const TokenData& data) {
  H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  DF_CHECK(file.get() >= 0, "%s: cannot create the temporary file %s (missing directory or no write permission?)",
           path.c_str(), tmp.c_str());
  token_data_write_datasets(file.get(), data, path);
  DF_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "%s: flushing failed (disk full?)", path.c_str());
  DF_CHECK(file.close(), "%s: closing the file failed (disk full?)", path.c_str());
}

}  // namespace

void token_data_write_datasets(hid_t file, const TokenData& data, const std::string& path) {
  h5_write_dataset(file, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, data.tokens.data(), data.num_tokens(), path);
  h5_write_dataset(file, "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, data.offsets.data(),
                   static_cast<int64_t>(data.offsets.size()), path);
  if (!data.loss_mask.empty())
    h5_write_dataset(file, "loss_mask", H5T_STD_U8LE, H5T_NATIVE_UINT8, data.loss_mask.data(),
                     static_cast<int64_t>(data.loss_mask.size()), path);
  if (data.vocab_size > 0) {
    H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    H5Handle attr(H5Acreate2(file, "vocab_size", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    DF_CHECK(attr.get() >= 0 && H5Awrite(attr.get(), H5T_NATIVE_INT64, &data.vocab_size) >= 0,
             "%s: writing attribute 'vocab_size' failed", path.c_str());
  }
}

int64_t token_data_prompt_length(const TokenData& data, int64_t s) {
  const int64_t b = data.offsets[size_t(s)], e = data.offsets[size_t(s) + 1];
  if (!data.loss_mask.empty())
    for (int64_t i = b + 1; i < e; ++i)
      if (!data.loss_mask[size_t(i) - 1] && data.loss_mask[size_t(i)]) return i - b;
  return e - b;
}

void token_data_validate(const TokenData& data, const std::string& where) {
  check_offsets(data.offsets, data.num_tokens(), where);
  DF_CHECK(data.loss_mask.empty() || data.loss_mask.size() == data.tokens.size(),
           "%s: dataset 'loss_mask' has %zu entries but 'tokens' has %zu; they must match", where.c_str(),
           data.loss_mask.size(), data.tokens.size());
  check_mask_values(data.loss_mask.data(), static_cast<int64_t>(data.loss_mask.size()), where);
  if (data.vocab_size > 0) check_token_range(data.tokens.data(), data.num_tokens(), data.vocab_size, where);
}

void token_file_write(const std::string& path, const TokenData& data) {
  token_data_validate(data, path);
  H5Quiet quiet;
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_to(tmp, path, data);
    file_fsync(tmp, false);
    DF_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "%s: renaming %s into place failed: %s", path.c_str(),
             tmp.c_str(), std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  file_fsync(file_dir_of(path), true);
}

TokenData token_file_read(const std::string& path) {
  H5Quiet quiet;
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DF_CHECK(file.get() >= 0, "%s: cannot open as HDF5 (missing, unreadable or not an HDF5 token file)", path.c_str());
  TokenData data;
  {
    H5Handle t(h5_open_dataset(file.get(), path, "tokens", true), H5Dclose);
    data.tokens = h5_read_all<int32_t>(t.get(), H5T_NATIVE_INT32, path, "tokens");
  }
  {
    H5Handle o(h5_open_dataset(file.get(), path, "offsets", true), H5Dclose);
    data.offsets = h5_read_all<int64_t>(o.get(), H5T_NATIVE_INT64, path, "offsets");
  }
  H5Handle m(h5_open_dataset(file.get(), path, "loss_mask", false), H5Dclose);
  if (m.get() >= 0) data.loss_mask = h5_read_all<uint8_t>(m.get(), H5T_NATIVE_UINT8, path, "loss_mask");
  data.vocab_size = h5_read_vocab_attr(file.get(), path);
  token_data_validate(data, path);
  return data;
}

TokenCorpus::TokenCorpus(const std::vector<std::string>& paths) {
  DF_CHECK(!paths.empty(), "no token files given; pass at least one HDF5 token file");
  H5Quiet quiet;
  try {
    for (const std::string& path : paths) {
      files_.emplace_back();
      File& f = files_.back();
      f.path = path;
      f.first_seq = num_sequences();
      f.file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      DF_CHECK(f.file >= 0, "%s: cannot open as HDF5 (missing, unreadable or not an HDF5 token file)", path.c_str());
      f.tokens = h5_open_dataset(f.file, path, "tokens", true);
      int64_t n = h5_dataset_length(f.tokens, path, "tokens");
      {
        H5Handle o(h5_open_dataset(f.file, path, "offsets", true), H5Dclose);
        f.offsets = h5_read_all<int64_t>(o.get(), H5T_NATIVE_INT64, path, "offsets");
      }
      check_offsets(f.offsets, n, path);
      f.mask = h5_open_dataset(f.file, path, "loss_mask", false);
      if (f.mask >= 0) {
        int64_t m = h5_dataset_length(f.mask, path, "loss_mask");
        DF_CHECK(m == n, "%s: dataset 'loss_mask' has %lld entries but 'tokens' has %lld; they must match",
                 path.c_str(), static_cast<long long>(m), static_cast<long long>(n));
      }
      int64_t v = h5_read_vocab_attr(f.file, path);
      if (v > 0) {
        DF_CHECK(vocab_size_ == 0 || vocab_size_ == v, "%s: vocab_size %lld differs from %lld in an earlier file; "
                 "all token files of a corpus must use one tokenizer", path.c_str(), static_cast<long long>(v),
                 static_cast<long long>(vocab_size_));
        vocab_size_ = v;
      }
      for (size_t s = 0; s + 1 < f.offsets.size(); ++s) lengths_.push_back(f.offsets[s + 1] - f.offsets[s]);
      num_tokens_ += n;
    }
  } catch (...) {
    close_all();
    throw;
  }
}

TokenCorpus::~TokenCorpus() { close_all(); }

void TokenCorpus::close_all() {
  for (File& f : files_) {
    if (f.mask >= 0) H5Dclose(f.mask);
    if (f.tokens >= 0) H5Dclose(f.tokens);
    if (f.file >= 0) H5Fclose(f.file);
    f.mask = f.tokens = f.file = -1;
  }
}

size_t TokenCorpus::file_of(int64_t seq) const {
  DF_CHECK(seq >= 0 && seq < num_sequences(), "sequence %lld is outside the corpus of %lld sequences",
           static_cast<long long>(seq), static_cast<long long>(num_sequences()));
  auto it = std::upper_bound(files_.begin(), files_.end(), seq,
                             [](int64_t s, const File& f) { return s < f.first_seq; });
  return static_cast<size_t>(it - files_.begin()) - 1;
}

int64_t TokenCorpus::sequence_length(int64_t seq) const {
  file_of(seq);
  return lengths_[static_cast<size_t>(seq)];
}

TokenCorpus::Location TokenCorpus::locate(int64_t seq) const {
  const size_t i = file_of(seq);
  return {i, files_[i].offsets[size_t(seq - files_[i].first_seq)]};
}

std::string TokenCorpus::describe(int64_t seq) const {
  const File& f = files_[file_of(seq)];
  return strfmt("%s sequence %lld", f.path.c_str(), static_cast<long long>(seq - f.first_seq));
}

void TokenCorpus::read(int64_t seq, int64_t start, int64_t len, int32_t* tokens, uint8_t* mask) const {
  const File& f = files_[file_of(seq)];
  int64_t local = seq - f.first_seq;
  int64_t seq_len = f.offsets[local + 1] - f.offsets[local];
  DF_CHECK(start >= 0 && len >= 0 && start + len <= seq_len,
           "%s: range [%lld, %lld) is outside the sequence of length %lld", describe(seq).c_str(),
           static_cast<long long>(start), static_cast<long long>(start + len), static_cast<long long>(seq_len));
  H5Quiet quiet;
  int64_t at = f.offsets[local] + start;
  h5_read_range(f.tokens, H5T_NATIVE_INT32, at, len, tokens, f.path, "tokens");
  if (f.mask >= 0) {
    h5_read_range(f.mask, H5T_NATIVE_UINT8, at, len, mask, f.path, "loss_mask");
    check_mask_values(mask, len, describe(seq));
  } else {
    std::fill(mask, mask + len, uint8_t{1});
  }
  if (vocab_size_ > 0) check_token_range(tokens, len, vocab_size_, describe(seq));
}

TokenCorpus::Scan TokenCorpus::scan(int64_t vocab, int64_t max_len) const {
  constexpr int64_t kBlock = int64_t(1) << 20;  // tokens per read: 5 MiB of buffers, few HDF5 calls
  H5Quiet quiet;
  Scan out;
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<int32_t> tok;
  std::vector<uint8_t> mask;
  for (const File& f : files_) {
    int64_t lo = 0, hi = 0;  // [lo, hi) of the file's tokens held in the buffers
    for (size_t s = 0; s + 1 < f.offsets.size(); ++s) {
      const int64_t a = f.offsets[s], b = f.offsets[s + 1];
      if (a == b) continue;
      if (a < lo || b > hi) {
        lo = a;
        hi = std::min(f.offsets.back(), std::max(b, a + kBlock));
        tok.resize(size_t(hi - lo));
        mask.assign(size_t(hi - lo), uint8_t{1});
        h5_read_range(f.tokens, H5T_NATIVE_INT32, lo, hi - lo, tok.data(), f.path, "tokens");
        if (f.mask >= 0) h5_read_range(f.mask, H5T_NATIVE_UINT8, lo, hi - lo, mask.data(), f.path, "loss_mask");
      }
      const int32_t* t = tok.data() + (a - lo);
      const uint8_t* m = mask.data() + (a - lo);
      bool bad = false;  // the message (file and sequence) is built only for a bad sequence
      for (int64_t i = 0; i < b - a; ++i) bad |= m[i] > 1 || (vocab > 0 && (t[i] < 0 || t[i] >= vocab));
      if (bad) {
        check_mask_values(m, b - a, describe(f.first_seq + int64_t(s)));
        check_token_range(t, b - a, vocab, describe(f.first_seq + int64_t(s)));
      }
      const int64_t n = std::min(b - a, max_len);
      for (int64_t i = 0; i + 1 < n; ++i) out.anchor_positions += m[i] & m[i + 1];
      // FNV-1a over 64-bit words (token id | mask << 32): one multiply per token.
      for (int64_t i = 0; i < b - a; ++i)
        h = (h ^ (uint64_t(uint32_t(t[i])) | uint64_t(m[i]) << 32)) * 0x100000001b3ull;
    }
  }
  out.content_hash = h;
  return out;
}

}  // namespace df
