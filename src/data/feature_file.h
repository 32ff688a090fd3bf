// The feature file `extract` writes (HDF5): float32 `embeddings`, `layer_<l>`, `final_norm` [N, H] and
// `offsets` int64 [S+1]. Datasets are created at full size up front and filled row range by row range, so
// the output of a long corpus is never held in memory; the file appears under its name only when complete.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace df {

class FeatureFileWriter {
 public:
  // Creates "<path>.tmp.<pid>" with one float32 [rows, cols] dataset per name.
  FeatureFileWriter(const std::string& path, const std::vector<std::string>& names, int64_t rows, int64_t cols);
  ~FeatureFileWriter();  // an unfinished file is deleted
  FeatureFileWriter(const FeatureFileWriter&) = delete;
  FeatureFileWriter& operator=(const FeatureFileWriter&) = delete;

  // Writes rows [row0, row0+n) of dataset `index` (in the order of `names`) from contiguous f32 values.
  void write_rows(size_t index, int64_t row0, int64_t n, const float* values);
  void write_offsets(const std::vector<int64_t>& offsets);
  // Closes, fsyncs and renames to the final path.
  void finish();

 private:
  std::string path_, tmp_;
  hid_t file_ = -1;
  std::vector<hid_t> sets_;
  int64_t rows_ = 0, cols_ = 0;
  bool finished_ = false;
};

}  // namespace df
