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
#include <set>

#include "core/error.h"
#include "core/file_util.h"
#include "core/h5_util.h"
#include "core/log.h"
#include "train/checkpoint_io.h"

namespace df {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRootObjects[5] = {"params", "adam_m", "adam_v", "config_text", "drafter_config"};

const Tensor& flat_buffer(const DrafterModel& m, int g) {
  return g == 0 ? m.params : g == 1 ? m.adam_m : m.adam_v;
}

// The step files of lineage `run_id`; a file whose run id cannot be read belongs to nobody and is kept.
std::map<int64_t, std::string> checkpoint_list_lineage(const std::string& ckpt_dir, const std::string& run_id) {
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

std::string checkpoint_path_for_step(const std::string& ckpt_dir, int64_t step) {
  return ckpt_dir + strfmt("/step_%08lld.h5", (long long)step);
}

namespace {

// The tensors straight off the model's backend, one slab at a time.
class BackendSource : public CheckpointSource {
 public:
  explicit BackendSource(const DrafterModel& m) : m_(m) {}
  void read(int g, const DrafterParamEntry& e, int64_t r0, int64_t n, float* dst) const override {
    m_.ops().download_raw(m_.entry_view(flat_buffer(m_, g), e.name).rows_view(r0, n), dst);
  }

 private:
  const DrafterModel& m_;
};

}  // namespace

std::string checkpoint_save(const std::string& ckpt_dir, const DrafterModel& model,
                            const CheckpointState& state, int keep_last) {
  return checkpoint_save_from(ckpt_dir, model.config(), model.table(), BackendSource(model), state, keep_last);
}

std::string checkpoint_save_from(const std::string& ckpt_dir, const DrafterConfig& cfg,
                                 const DrafterParamTable& table, const CheckpointSource& src,
                                 const CheckpointState& state, int keep_last) {
  DF_CHECK(keep_last >= 1, "checkpoint.keep_last is %d; it must be at least 1", keep_last);
  DF_CHECK(state.step >= 0, "checkpoint step %lld is negative", (long long)state.step);
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  DF_CHECK(!ec, "cannot create the checkpoint folder %s: %s (check run.dir and permissions)",
           ckpt_dir.c_str(), ec.message().c_str());
  const std::string path = checkpoint_path_for_step(ckpt_dir, state.step);
  const std::string name = fs::path(path).filename().string();
  checkpoint_write_file(path, cfg, table, src, state);  // temp name, fsync, rename, fsync the folder
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

hid_t checkpoint_open(const std::string& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  DF_CHECK(file >= 0,
           "%s: cannot open as HDF5 (missing, truncated or not a checkpoint); HINT: resume from an "
           "older step_*.h5 or set checkpoint.resume",
           path.c_str());
  try {
    const int32_t version = h5_read_attr<int32_t>(file, "format_version", H5T_NATIVE_INT32, path);
    DF_CHECK(version == kCheckpointFormatVersion,
             "%s: checkpoint format_version is %d but this build reads version "
             "%d; use the dflash_mpi that wrote it",
             path.c_str(), version, kCheckpointFormatVersion);
  } catch (...) {
    H5Fclose(file);
    throw;
  }
  return file;
}

CheckpointState checkpoint_read_state(const std::string& path) { return checkpoint_read_header(path).state; }

CheckpointState checkpoint_load(const std::string& path, DrafterModel& model) {
  H5Quiet quiet;
  H5Handle file(checkpoint_open(path), H5Fclose);

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
  for (const char* gname : kCheckpointGroups) {
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
               path.c_str(), kCheckpointGroups[g], e.name.c_str());
    }
  }
  CheckpointState st;
  st.step = h5_read_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, path);
  st.batch_cursor = h5_read_attr<int64_t>(file.get(), "batch_cursor", H5T_NATIVE_INT64, path);
  st.tokens_seen = h5_read_attr<int64_t>(file.get(), "tokens_seen", H5T_NATIVE_INT64, path);
  st.data_fingerprint = h5_read_attr<uint64_t>(file.get(), "data_fingerprint", H5T_NATIVE_UINT64, path);
  st.config_text = h5_read_string_dataset(file.get(), "config_text", path);
  st.run_id = h5_read_string_attr_or_empty(file.get(), "run_id", path);

  // Every check passed: only now does the model change.
  for (int g = 0; g < 3; ++g) model.ops().upload_raw(flat_buffer(model, g), stage[g].data());
  return st;
}

}  // namespace df
