// Reading and writing safetensors files: a single file or a sharded checkpoint through
// model.safetensors.index.json. Files are memory-mapped; tensors are handed out as typed byte ranges.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace df {

struct StTensor {
  std::string name;
  DType dtype = DType::f32;       // F32, BF16, F16, F8_E4M3 (and I32/I64/U8 for completeness)
  std::vector<int64_t> shape;
  const void* data = nullptr;     // inside the mapped file
  size_t nbytes = 0;
  std::string file;               // which shard it came from (for messages)
  int64_t numel() const;
};

// "[N, K]": how messages print a tensor shape.
std::string st_shape_text(const std::vector<int64_t>& shape);

class StMapping;  // one mapped file (private)

// All tensors of a checkpoint directory (or of one .safetensors file).
class SafetensorsIndex {
 public:
  // path: a directory holding model.safetensors or model.safetensors.index.json, or one .safetensors file.
  static SafetensorsIndex open(const std::string& path);
  const StTensor* find(const std::string& name) const;  // nullptr when absent
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }

  SafetensorsIndex();
  ~SafetensorsIndex();
  SafetensorsIndex(SafetensorsIndex&&) noexcept;
  SafetensorsIndex& operator=(SafetensorsIndex&&) noexcept;

 private:
  std::vector<std::unique_ptr<StMapping>> files_;
  std::map<std::string, StTensor> tensors_;
};

// Copies a tensor's values into f32 (converting BF16/F16); F8_E4M3 is refused (it needs its block scale).
void st_to_f32(const StTensor& t, float* out);

struct StWriteTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // nbytes = numel · dtype_size
};

// Writes one safetensors file atomically (temp name, fsync, rename).
void safetensors_write(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace df
