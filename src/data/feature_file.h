// The feature file `extract` writes (HDF5) and offline training reads: hidden-state datasets `embeddings`,
// `layer_<l>` (output of decoder layer l), `final_norm`, each [N, H] float32 or bf16 (stored as uint16 with the
// attribute dtype = "bfloat16": HDF5 has no bf16 type and a 16-bit float would read as IEEE half), chunked and
// compressed; plus `tokens` int32 [N], `loss_mask` uint8 [N] and `offsets` int64 [S+1], so the file is also a
// token file (data/token_file.h) of the sequences it holds. Root attributes: hidden, layer_ids (the layer_<l>
// present), feature_dtype, tokens_fingerprint (a content hash of tokens + loss_mask + offsets). Datasets are
// filled row range by row range, so a long corpus is never held in memory; the file appears under its name
// only when complete.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace df {

// Content hash of a token corpus (ids, mask, offsets): what ties features to the tokens they came from.
uint64_t token_data_fingerprint(const TokenData& d);

class FeatureFileWriter {
 public:
  // Creates "<path>.tmp.<pid>" with one [rows, cols] dataset per name (bf16 or float32) and stores `tokens`
  // (their ids, mask and offsets) and the attributes. layer_ids: the l of every layer_<l> name.
  FeatureFileWriter(const std::string& path, const std::vector<std::string>& names, const TokenData& tokens,
                    int64_t cols, bool bf16, const std::vector<int>& layer_ids);
  ~FeatureFileWriter();  // an unfinished file is deleted
  FeatureFileWriter(const FeatureFileWriter&) = delete;
  FeatureFileWriter& operator=(const FeatureFileWriter&) = delete;

  // Writes rows [row0, row0+n) of dataset `index` (in the order of `names`) from contiguous values, converted
  // to the file's dtype (f32 → bf16 rounds to nearest even).
  void write_rows(size_t index, int64_t row0, int64_t n, const float* values);
  void write_rows_bf16(size_t index, int64_t row0, int64_t n, const uint16_t* values);
  // Closes, fsyncs and renames to the final path.
  void finish();

 private:
  void write_hyperslab(size_t index, int64_t row0, int64_t n, hid_t mem_type, const void* values);
  std::string path_, tmp_;
  hid_t file_ = -1;
  std::vector<hid_t> sets_;
  int64_t rows_ = 0, cols_ = 0;
  bool bf16_ = true, finished_ = false;
  std::vector<uint16_t> staging_;
};

// Reads taps of one feature file for offline training. Every check names the file.
class FeatureFileReader {
 public:
  explicit FeatureFileReader(const std::string& path);
  ~FeatureFileReader();
  FeatureFileReader(const FeatureFileReader&) = delete;
  FeatureFileReader& operator=(const FeatureFileReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t hidden() const { return hidden_; }
  int64_t rows() const { return rows_; }
  const std::vector<int>& layer_ids() const { return layer_ids_; }
  bool has_final_norm() const { return final_ >= 0; }
  uint64_t tokens_fingerprint() const { return fingerprint_; }

  // Rows [row0, row0+n) of the taps `layers` (each must be stored), concatenated per row into bf16
  // out[n, layers.size()·H] with row stride ld (elements).
  void read_taps(const std::vector<int>& layers, int64_t row0, int64_t n, uint16_t* out, int64_t ld) const;
  // Rows of final_norm into bf16 out[n, H] (row stride ld).
  void read_final_norm(int64_t row0, int64_t n, uint16_t* out, int64_t ld) const;

 private:
  void read_into(hid_t set, int64_t row0, int64_t n, uint16_t* out, int64_t ld, int64_t col0) const;
  std::string path_;
  hid_t file_ = -1;
  std::vector<int> layer_ids_;
  std::vector<hid_t> layer_sets_;
  hid_t final_ = -1;
  int64_t hidden_ = 0, rows_ = 0;
  bool bf16_ = true;
  uint64_t fingerprint_ = 0;
  mutable std::vector<float> f32_;
};

}  // namespace df
