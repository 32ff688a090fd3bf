// Drafter checkpoint files (layout in checkpoint.h): atomic save with `latest` and pruning, and a load that
// checks everything before it touches the model. HDF5 through the C API; its own error printing is silenced
// because every failure becomes a df::Error naming the file and the tensor.
#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_util.h"
#include "core/h5_util.h"
#include "core/log.h"
#include "train/export_hf.h"

namespace df {

namespace fs = std::filesystem;

namespace {

constexpr const char* kGroups[3] = {"params", "adam_m", "adam_v"};
constexpr const char* kRootObjects[6] = {"params",    "adam_m",      "adam_v",
                                         "rng_state", "config_text", "drafter_config"};
// A chunk holds at most 4 Mi elements (16 MiB): large enough that the per-chunk
// Fletcher-32 and B-tree costs vanish, small enough to stay far below HDF5's 4 GiB chunk limit.
constexpr int64_t kChunkElems = int64_t(4) << 20;

const Tensor& flat_buffer(const DrafterModel& m, int g) {
  return g == 0 ? m.params : g == 1 ? m.adam_m : m.adam_v;
}

std::string drafter_config_json(const DrafterConfig& c) {
  nlohmann::json j;
  j["hidden"] = c.hidden;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["kv_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate"] = c.intermediate;
  j["rope_theta"] = c.rope_theta;
  j["rms_eps"] = c.rms_eps;
  j["block_size"] = c.block_size;
  j["mask_token_id"] = c.mask_token_id;
  j["target_layer_ids"] = c.target_layer_ids;
  nlohmann::json types = nlohmann::json::array();
  for (DrafterLayerType t : c.layer_types) types.push_back(drafter_layer_type_hf_name(t));
  j["layer_types"] = types;
  j["sliding_window"] = c.sliding_window;
  j["num_anchors"] = c.num_anchors;
  j["vocab"] = c.vocab;
  return j.dump();
}

// A fixed-length, NUL-padded UTF-8 string type of n bytes (HDF5 refuses size 0, so empty text gets one NUL).
hid_t h5_string_type(size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, std::max<size_t>(n, 1));
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

// ---- writing -------------------------------------------------------------------------------------------

void h5_write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value,
                   const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DF_CHECK(attr.get() >= 0 && H5Awrite(attr.get(), mem_type, value) >= 0,
           "%s: writing attribute '%s' failed (disk full?)", path.c_str(), name);
}

void h5_write_string_attr(hid_t obj, const char* name, const std::string& text, const std::string& path) {
  H5Handle type(h5_string_type(text.size()), H5Tclose);
  std::string buf = text.empty() ? std::string(1, '\0') : text;
  h5_write_attr(obj, name, type.get(), type.get(), buf.data(), path);
}

void h5_write_string_dataset(hid_t file, const char* name, const std::string& text, const std::string& path) {
  H5Handle type(h5_string_type(text.size()), H5Tclose);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle dset(H5Dcreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
  std::string buf = text.empty() ? std::string(1, '\0') : text;
  DF_CHECK(
      dset.get() >= 0 && H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
      "%s: writing dataset '%s' failed (disk full?)", path.c_str(), name);
  DF_CHECK(dset.close(), "%s: closing dataset '%s' failed (disk full?)", path.c_str(), name);
}

void h5_write_u64_dataset(hid_t file, const char* name, const std::vector<uint64_t>& v,
                          const std::string& path) {
  hsize_t dims[1] = {hsize_t(v.size())};
  H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(file, name, H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
  DF_CHECK(dset.get() >= 0, "%s: cannot create dataset '%s' (disk full?)", path.c_str(), name);
  if (!v.empty())
    DF_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0,
             "%s: writing dataset '%s' failed (disk full?)", path.c_str(), name);
  DF_CHECK(dset.close(), "%s: closing dataset '%s' failed (disk full?)", path.c_str(), name);
}

void h5_write_matrix(hid_t group, const std::string& where, const std::string& name, const float* data,
                     int64_t rows, int64_t cols, const std::string& path) {
  hsize_t dims[2] = {hsize_t(rows), hsize_t(cols)};
  // Equal chunks: HDF5 stores a partial edge chunk at full size, so rows are split evenly, not greedily.
  const int64_t n_chunks = std::max<int64_t>(1, (rows * cols + kChunkElems - 1) / kChunkElems);
  hsize_t chunk[2] = {hsize_t((rows + n_chunks - 1) / n_chunks), hsize_t(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  DF_CHECK(H5Pset_chunk(dcpl.get(), 2, chunk) >= 0 && H5Pset_fletcher32(dcpl.get()) >= 0,
           "%s: cannot set up chunking for tensor '%s'", path.c_str(), where.c_str());
  H5Handle dset(
      H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose);
  DF_CHECK(
      dset.get() >= 0 && H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
      "%s: writing tensor '%s' failed (disk full?)", path.c_str(), where.c_str());
  DF_CHECK(dset.close(), "%s: closing tensor '%s' failed (disk full?)", path.c_str(), where.c_str());
}

// The complete checkpoint file as bytes. HDF5 builds it in memory (core driver, no backing store) and plain
// POSIX writes put it on disk: HDF5 1.10 cannot recover from a failed write (a full disk leaves a half-closed
// file that crashes the library at exit), so HDF5 itself never touches the disk here. `path` is for messages.
std::vector<char> checkpoint_file_image(const std::string& path, const DrafterModel& model,
                                        const CheckpointState& st) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  DF_CHECK(H5Pset_fapl_core(fapl.get(), size_t(64) << 20, 0) >= 0, "%s: cannot set up the in-memory HDF5 file",
           path.c_str());
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  DF_CHECK(file.get() >= 0, "%s: cannot create the in-memory HDF5 file (out of host memory?)", path.c_str());
  const int32_t version = kCheckpointFormatVersion;
  h5_write_attr(file.get(), "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, &version, path);
  h5_write_attr(file.get(), "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.step, path);
  h5_write_attr(file.get(), "batch_cursor", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.batch_cursor, path);
  h5_write_attr(file.get(), "tokens_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.tokens_seen, path);
  h5_write_attr(file.get(), "data_fingerprint", H5T_STD_U64LE, H5T_NATIVE_UINT64, &st.data_fingerprint, path);
  h5_write_string_attr(file.get(), "created", utc_now("%Y-%m-%dT%H:%M:%SZ"), path);
  h5_write_string_attr(file.get(), "run_id", st.run_id, path);
  h5_write_u64_dataset(file.get(), "rng_state", st.rng_state, path);
  h5_write_string_dataset(file.get(), "config_text", st.config_text, path);
  h5_write_string_dataset(file.get(), "drafter_config", drafter_config_json(model.config()), path);

  // One entry at a time through a host scratch buffer: the flat buffers may live on the GPU and may be large.
  const DrafterParamTable& table = model.table();
  int64_t largest = 0;
  for (const auto& e : table.entries) largest = std::max(largest, e.rows * e.cols);
  std::vector<float> scratch(static_cast<size_t>(largest));
  for (int g = 0; g < 3; ++g) {
    H5Handle group(H5Gcreate2(file.get(), kGroups[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    DF_CHECK(group.get() >= 0, "%s: cannot create group '%s' (disk full?)", path.c_str(), kGroups[g]);
    for (const auto& e : table.entries) {
      model.ops().download_raw(model.entry_view(flat_buffer(model, g), e.name), scratch.data());
      h5_write_matrix(group.get(), std::string(kGroups[g]) + "/" + e.name, e.name, scratch.data(), e.rows,
                      e.cols, path);
    }
  }
  DF_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "%s: flushing the in-memory file failed", path.c_str());
  const ssize_t size = H5Fget_file_image(file.get(), nullptr, 0);
  DF_CHECK(size > 0, "%s: cannot size the in-memory HDF5 image", path.c_str());
  std::vector<char> image(static_cast<size_t>(size));
  DF_CHECK(H5Fget_file_image(file.get(), image.data(), image.size()) == size, "%s: cannot copy the HDF5 image",
           path.c_str());
  DF_CHECK(file.close(), "%s: closing the in-memory file failed", path.c_str());
  return image;
}

// The step files of lineage `run_id`; a file whose run id cannot be read belongs to nobody and is kept.
std::map<int64_t, std::string> checkpoint_list_lineage(const std::string& ckpt_dir,
                                                       const std::string& run_id) {
  std::map<int64_t, std::string> out;
  for (const auto& [step, name] : checkpoint_list_steps(ckpt_dir)) {
    try {
      if (checkpoint_read_state(ckpt_dir + "/" + name).run_id == run_id) out[step] = name;
    } catch (const Error&) {
    }
  }
  return out;
}

void checkpoint_prune(const std::string& ckpt_dir, int keep_last, const std::string& keep_name,
                      const std::string& run_id) {
  std::map<int64_t, std::string> steps = checkpoint_list_lineage(ckpt_dir, run_id);
  int64_t excess = int64_t(steps.size()) - keep_last;
  for (auto it = steps.begin(); it != steps.end() && excess > 0; ++it) {
    if (it->second == keep_name) continue;
    const std::string p = ckpt_dir + "/" + it->second;
    // A failed removal costs disk space, not correctness: the run continues and says so.
    if (std::remove(p.c_str()) != 0)
      log_warn("checkpoint: cannot remove the old checkpoint %s: %s", p.c_str(), std::strerror(errno));
    --excess;
  }
}

// The first line of `<ckpt_dir>/latest`, trimmed; "" when the pointer does not exist.
std::string checkpoint_read_pointer(const std::string& ckpt_dir) {
  std::ifstream in(ckpt_dir + "/latest");
  if (!in) return "";
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  return line;
}

// ---- reading -------------------------------------------------------------------------------------------

std::vector<std::string> h5_list_links(hid_t group) {
  std::vector<std::string> names;
  // Generic in the info type: H5Literate takes H5L_info_t in HDF5 1.10 and H5L_info2_t from 1.12 on.
  auto cb = [](hid_t, const char* name, const auto*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, cb, &names);
  return names;
}

template <class T>
T h5_read_attr(hid_t file, const char* name, hid_t mem_type, const std::string& path) {
  DF_CHECK(H5Aexists(file, name) > 0,
           "%s: root attribute '%s' is missing (not a dflash_mpi checkpoint, or corrupt)", path.c_str(),
           name);
  H5Handle attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  T v{};
  DF_CHECK(attr.get() >= 0 && H5Aread(attr.get(), mem_type, &v) >= 0, "%s: cannot read root attribute '%s'",
           path.c_str(), name);
  return v;
}

// A fixed-length string root attribute, "" when the file has none (written before the attribute existed).
std::string h5_read_string_attr_or_empty(hid_t file, const char* name, const std::string& path) {
  if (H5Aexists(file, name) <= 0) return "";
  H5Handle attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  H5Handle ftype(H5Aget_type(attr.get()), H5Tclose);
  DF_CHECK(attr.get() >= 0 && H5Tget_class(ftype.get()) == H5T_STRING && H5Tis_variable_str(ftype.get()) == 0,
           "%s: root attribute '%s' must be a fixed-length string", path.c_str(), name);
  const size_t n = H5Tget_size(ftype.get());
  H5Handle mtype(h5_string_type(n), H5Tclose);
  std::string buf(n, '\0');
  DF_CHECK(H5Aread(attr.get(), mtype.get(), buf.data()) >= 0, "%s: cannot read root attribute '%s'",
           path.c_str(), name);
  buf.resize(strnlen(buf.data(), n));
  return buf;
}

std::string h5_read_string_dataset(hid_t file, const char* name, const std::string& path) {
  H5Handle dset(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  DF_CHECK(dset.get() >= 0, "%s: cannot open dataset '%s'", path.c_str(), name);
  H5Handle ftype(H5Dget_type(dset.get()), H5Tclose);
  DF_CHECK(H5Tget_class(ftype.get()) == H5T_STRING && H5Tis_variable_str(ftype.get()) == 0,
           "%s: dataset '%s' must be a fixed-length string", path.c_str(), name);
  const size_t n = H5Tget_size(ftype.get());
  H5Handle mtype(h5_string_type(n), H5Tclose);
  std::string buf(n, '\0');
  DF_CHECK(H5Dread(dset.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
           "%s: reading dataset '%s' failed (file corrupt?)", path.c_str(), name);
  buf.resize(strnlen(buf.data(), n));
  return buf;
}

std::vector<uint64_t> h5_read_u64_dataset(hid_t file, const char* name, const std::string& path) {
  H5Handle dset(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  DF_CHECK(dset.get() >= 0, "%s: cannot open dataset '%s'", path.c_str(), name);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  DF_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, "%s: dataset '%s' must be 1-D", path.c_str(), name);
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  std::vector<uint64_t> v(static_cast<size_t>(dims[0]));
  if (!v.empty())
    DF_CHECK(H5Dread(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0,
             "%s: reading dataset '%s' failed (file corrupt?)", path.c_str(), name);
  return v;
}

// Checks one tensor's presence, element type and shape; returns "" or a description of what is wrong.
std::string tensor_problem(hid_t group, const char* gname, const DrafterParamEntry& e,
                           const std::set<std::string>& present) {
  const std::string where = std::string(gname) + "/" + e.name;
  if (!present.count(e.name))
    return strfmt("'%s' is missing (the model expects [%lld, %lld])", where.c_str(), (long long)e.rows,
                  (long long)e.cols);
  H5Handle dset(H5Dopen2(group, e.name.c_str(), H5P_DEFAULT), H5Dclose);
  if (dset.get() < 0) return strfmt("'%s' is not a dataset", where.c_str());
  H5Handle type(H5Dget_type(dset.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4)
    return strfmt("'%s' is not float32", where.c_str());
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t dims[H5S_MAX_RANK] = {};
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > H5S_MAX_RANK) return strfmt("'%s' has an unreadable shape", where.c_str());
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  if (rank == 2 && int64_t(dims[0]) == e.rows && int64_t(dims[1]) == e.cols) return "";
  std::string shape = "[";
  for (int i = 0; i < rank; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
  shape += "]";
  return strfmt("'%s' is %s in the file but the model expects [%lld, %lld]", where.c_str(), shape.c_str(),
                (long long)e.rows, (long long)e.cols);
}

}  // namespace

std::string checkpoint_path_for_step(const std::string& ckpt_dir, int64_t step) {
  return ckpt_dir + strfmt("/step_%08lld.h5", (long long)step);
}

std::string checkpoint_save(const std::string& ckpt_dir, const DrafterModel& model,
                            const CheckpointState& state, int keep_last) {
  DF_CHECK(keep_last >= 1, "checkpoint.keep_last is %d; it must be at least 1", keep_last);
  DF_CHECK(state.step >= 0, "checkpoint step %lld is negative", (long long)state.step);
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  DF_CHECK(!ec, "cannot create the checkpoint folder %s: %s (check run.dir and permissions)",
           ckpt_dir.c_str(), ec.message().c_str());
  const std::string path = checkpoint_path_for_step(ckpt_dir, state.step);
  const std::string name = fs::path(path).filename().string();
  {
    H5Quiet quiet;
    std::vector<char> image = checkpoint_file_image(path, model, state);
    file_write_atomic(path, image.data(), image.size());  // temp name, fsync, rename, fsync the folder
  }
  const std::string previous = checkpoint_read_pointer(ckpt_dir);
  try {
    file_write_text_atomic(ckpt_dir + "/latest", name + "\n");
  } catch (...) {
    // `latest` still names the previous checkpoint; a new file it does not name would only confuse a resume.
    if (previous != name) std::remove(path.c_str());
    throw;
  }
  checkpoint_prune(ckpt_dir, keep_last, name, state.run_id);
  return path;
}

std::string checkpoint_find_latest(const std::string& ckpt_dir) {
  const std::string pointer = ckpt_dir + "/latest";
  std::error_code ec;
  if (!fs::exists(pointer, ec)) return "";
  const std::string name = checkpoint_read_pointer(ckpt_dir);
  DF_CHECK(!name.empty(),
           "%s is empty; it must name a checkpoint file (e.g. step_00001000.h5). Write the name of "
           "an existing step_*.h5 into it, or delete it to start fresh",
           pointer.c_str());
  const std::string path = name[0] == '/' ? name : ckpt_dir + "/" + name;
  DF_CHECK(fs::is_regular_file(path, ec),
           "%s points at %s, which does not exist; the checkpoint was deleted or "
           "the folder copied partially. Point it at an existing step_*.h5, or set checkpoint.resume",
           pointer.c_str(), path.c_str());
  return path;
}

CheckpointState checkpoint_load(const std::string& path, DrafterModel& model) {
  H5Quiet quiet;
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DF_CHECK(file.get() >= 0,
           "%s: cannot open as HDF5 (missing, truncated or not a checkpoint); resume from an "
           "older step_*.h5 or set checkpoint.resume",
           path.c_str());
  const int32_t version = h5_read_attr<int32_t>(file.get(), "format_version", H5T_NATIVE_INT32, path);
  DF_CHECK(version == kCheckpointFormatVersion,
           "%s: checkpoint format_version is %d but this build reads version "
           "%d; use the dflash_mpi that wrote it",
           path.c_str(), version, kCheckpointFormatVersion);

  const std::set<std::string> known(std::begin(kRootObjects), std::end(kRootObjects));
  std::vector<std::string> root = h5_list_links(file.get());
  for (const auto& n : root)
    DF_CHECK(known.count(n),
             "%s: unknown object '%s' at the root of the checkpoint (written by another tool or "
             "version?)",
             path.c_str(), n.c_str());
  for (const char* n : kRootObjects)
    DF_CHECK(std::find(root.begin(), root.end(), n) != root.end(),
             "%s: '%s' is missing; the checkpoint is "
             "incomplete or corrupt, resume from an older step_*.h5",
             path.c_str(), n);
  const std::string stored_cfg = h5_read_string_dataset(file.get(), "drafter_config", path);

  // Pass 1: every tensor of every group, names and shapes only; all problems are collected, then reported.
  const DrafterParamTable& table = model.table();
  std::set<std::string> table_names;
  for (const auto& e : table.entries) table_names.insert(e.name);
  std::vector<std::string> problems;
  std::vector<std::unique_ptr<H5Handle>> group_handles;
  for (const char* gname : kGroups) {
    group_handles.push_back(std::make_unique<H5Handle>(H5Gopen2(file.get(), gname, H5P_DEFAULT), H5Gclose));
    const hid_t g = group_handles.back()->get();
    DF_CHECK(g >= 0, "%s: '%s' is not a group (file corrupt?)", path.c_str(), gname);
    std::vector<std::string> names = h5_list_links(g);
    for (const auto& n : names)
      if (!table_names.count(n))
        problems.push_back(strfmt("'%s/%s' is not a tensor of this model", gname, n.c_str()));
    const std::set<std::string> present(names.begin(), names.end());
    for (const auto& e : table.entries) {
      std::string p = tensor_problem(g, gname, e, present);
      if (!p.empty()) problems.push_back(p);
    }
  }
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 4; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > 4) list += strfmt("; and %zu more", problems.size() - 4);
    DF_FAIL(
        "%s: the checkpoint does not fit the model: %s. HINT: it was written for another drafter config "
        "(did [drafter] or the target change?); the checkpoint's drafter config is %s and the model's is %s. "
        "Resume with the config it was written with, or set checkpoint.resume = \"none\" to start fresh",
        path.c_str(), list.c_str(), stored_cfg.c_str(), drafter_config_json(model.config()).c_str());
  }

  // Pass 2: all data into host staging (checksums verified by HDF5 on read), then the scalars.
  std::vector<std::vector<float>> stage(3);
  for (int g = 0; g < 3; ++g) {
    stage[g].assign(size_t(table.total), 0.0f);
    for (const auto& e : table.entries) {
      H5Handle dset(H5Dopen2(group_handles[g]->get(), e.name.c_str(), H5P_DEFAULT), H5Dclose);
      DF_CHECK(dset.get() >= 0 && H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                          stage[g].data() + e.offset) >= 0,
               "%s: reading tensor '%s/%s' failed (checksum mismatch or truncated file: the checkpoint is "
               "corrupt; "
               "resume from an older step_*.h5)",
               path.c_str(), kGroups[g], e.name.c_str());
    }
  }
  CheckpointState st;
  st.step = h5_read_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, path);
  st.batch_cursor = h5_read_attr<int64_t>(file.get(), "batch_cursor", H5T_NATIVE_INT64, path);
  st.tokens_seen = h5_read_attr<int64_t>(file.get(), "tokens_seen", H5T_NATIVE_INT64, path);
  st.data_fingerprint = h5_read_attr<uint64_t>(file.get(), "data_fingerprint", H5T_NATIVE_UINT64, path);
  st.rng_state = h5_read_u64_dataset(file.get(), "rng_state", path);
  st.config_text = h5_read_string_dataset(file.get(), "config_text", path);
  st.run_id = h5_read_string_attr_or_empty(file.get(), "run_id", path);

  // Every check passed: only now does the model change.
  for (int g = 0; g < 3; ++g) model.ops().upload_raw(flat_buffer(model, g), stage[g].data());
  return st;
}

CheckpointState checkpoint_read_state(const std::string& path) {
  H5Quiet quiet;
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DF_CHECK(file.get() >= 0, "%s: cannot open as HDF5 (missing, truncated or not a checkpoint); HINT: resume from an "
           "older step_*.h5 or set checkpoint.resume", path.c_str());
  CheckpointState st;
  st.step = h5_read_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, path);
  st.batch_cursor = h5_read_attr<int64_t>(file.get(), "batch_cursor", H5T_NATIVE_INT64, path);
  st.run_id = h5_read_string_attr_or_empty(file.get(), "run_id", path);
  return st;
}

std::map<int64_t, std::string> checkpoint_list_steps(const std::string& ckpt_dir) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  for (const auto& ent : fs::directory_iterator(ckpt_dir, ec)) {
    const std::string n = ent.path().filename().string();
    if (n.size() <= 8 || n.compare(0, 5, "step_") != 0 || n.compare(n.size() - 3, 3, ".h5") != 0) continue;
    const std::string digits = n.substr(5, n.size() - 8);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out[std::stoll(digits)] = n;
  }
  return out;
}

}  // namespace df
