// libFuzzer target: safetensors files (the 8-byte length, the JSON header, offsets against the file size) and
// model.safetensors.index.json (weight_map against the shards). The first byte picks which one the rest is.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "fuzz_util.h"
#include "model/safetensors.h"

namespace {

// A directory with one valid shard, so that an index naming it gets as far as the tensors.
const std::string& index_dir() {
  static const std::string dir = [] {
    const std::string d = df_fuzz::scratch_dir() + "/model";
    std::filesystem::create_directories(d);
    const float w[6] = {1, 2, 3, 4, 5, 6};
    df::safetensors_write(d + "/model-00001-of-00001.safetensors",
                          {{"model.embed_tokens.weight", df::DType::f32, {2, 3}, w}});
    return d;
  }();
  return dir;
}

void touch_all(const df::SafetensorsIndex& idx) {
  for (const std::string& n : idx.names()) {
    const df::StTensor* t = idx.find(n);
    if (!t || t->nbytes > (size_t(1) << 20)) continue;
    std::vector<float> out(size_t(t->numel()));
    df::st_to_f32(*t, out.data());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    const std::string dir = index_dir();
    df_fuzz::write_file("model/model.safetensors.index.json", data + 1, size - 1);
    df_fuzz::expect_clean([&] { touch_all(df::SafetensorsIndex::open(dir)); });
  } else {
    const std::string path = df_fuzz::write_file("fuzz.safetensors", data + 1, size - 1);
    df_fuzz::expect_clean([&] { touch_all(df::SafetensorsIndex::open(path)); });
  }
  return 0;
}
