// Internals shared by the checkpoint reader (checkpoint.cpp), writer (checkpoint_write.cpp) and the resume /
// export comparison (checkpoint_compat.cpp); not for other modules, which use train/checkpoint.h.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/drafter.h"
#include "train/checkpoint.h"

namespace df {

// A chunk holds at most 4 Mi elements (16 MiB): large enough that the per-chunk Fletcher-32 and B-tree costs
// vanish, small enough to stay far below HDF5's 4 GiB chunk limit; it is also the writer's host staging size.
constexpr int64_t kCheckpointChunkElems = int64_t(4) << 20;

// The groups holding one dataset per parameter tensor: the fp32 master weights and AdamW's two moments.
constexpr const char* kCheckpointGroups[3] = {"params", "adam_m", "adam_v"};

// A fixed-length, NUL-padded UTF-8 string type of n bytes (HDF5 refuses size 0, so empty text gets one NUL).
hid_t h5_string_type(size_t n);

// A root attribute of a scalar type; throws naming the file when it is missing or unreadable.
template <class T>
T h5_read_attr(hid_t file, const char* name, hid_t mem_type, const std::string& path) {
  DF_CHECK(H5Aexists(file, name) > 0,
           "%s: root attribute '%s' is missing (not a dflash_mpi checkpoint, or corrupt)", path.c_str(),
           name);
  const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  T v{};
  const bool ok = attr >= 0 && H5Aread(attr, mem_type, &v) >= 0;
  if (attr >= 0) H5Aclose(attr);
  DF_CHECK(ok, "%s: cannot read root attribute '%s'", path.c_str(), name);
  return v;
}

// Opens a checkpoint read-only after checking its format version; throws naming the file. The caller closes it.
hid_t checkpoint_open(const std::string& path);

// A fixed-length string dataset at the root; throws naming the file and the dataset.
std::string h5_read_string_dataset(hid_t file, const char* name, const std::string& path);
// A fixed-length string root attribute, "" when the file has none (written before the attribute existed).
std::string h5_read_string_attr_or_empty(hid_t file, const char* name, const std::string& path);

// Where the writer pulls the three flat buffers from, one slab of rows of one table entry at a time: the
// model's backend (download_raw) or a host snapshot of it (checkpoint_saver.h). g: 0 params, 1 adam_m,
// 2 adam_v. Called from the writing thread only.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // Rows [r0, r0 + n) of entry `e` of flat buffer g into dst (n · e.cols floats).
  virtual void read(int g, const DrafterParamEntry& e, int64_t r0, int64_t n, float* dst) const = 0;
};

// Writes the whole checkpoint file at `path` atomically (temp name, fsync, rename), streaming the tensors.
void checkpoint_write_file(const std::string& path, const DrafterConfig& cfg, const DrafterParamTable& table,
                           const CheckpointSource& src, const CheckpointState& st);

// checkpoint_save (checkpoint.h) with the tensors from `src`: the file, then `latest`, then pruning.
std::string checkpoint_save_from(const std::string& ckpt_dir, const DrafterConfig& cfg,
                                 const DrafterParamTable& table, const CheckpointSource& src,
                                 const CheckpointState& state, int keep_last);

}  // namespace df
