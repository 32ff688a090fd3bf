// Helpers shared by the golden tests (tests/unit/test_golden.cpp on the CPU, tests/gpu/test_golden_cuda.cpp
// on CUDA): run the real dflash_mpi binary, read and write HDF5 datasets, list the golden models, and compare
// with |a − b| <= atol + rtol·|b|. Header-only; each test executable includes it once.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace df::golden {

namespace fs = std::filesystem;

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `cmd` with stdout and stderr into `log`; returns the exit status (or -1 if it did not exit).
inline int run_logged(const std::string& cmd, const fs::path& log) {
  int rc = std::system((cmd + " > " + shell_quote(log.string()) + " 2>&1").c_str());
  return (rc != -1 && WIFEXITED(rc)) ? WEXITSTATUS(rc) : -1;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A folder under the system temp dir, removed when the test passes (kept for a look when it fails).
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("df_golden_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    if (!::testing::Test::HasFailure()) fs::remove_all(path);
  }
};

struct H5File {
  hid_t id = -1;
  H5File(const fs::path& p, unsigned flags) {
    id = flags == H5F_ACC_TRUNC ? H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                                : H5Fopen(p.c_str(), flags, H5P_DEFAULT);
  }
  ~H5File() {
    if (id >= 0) H5Fclose(id);
  }
};

struct Dataset {
  std::vector<hsize_t> dims;
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t type_size = 0;
  std::vector<double> values;  // converted by HDF5 from whatever is stored
  bool ok = false;
};

inline Dataset read_dataset(hid_t file, const std::string& name) {
  Dataset d;
  hid_t set = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (set < 0) return d;
  hid_t space = H5Dget_space(set), type = H5Dget_type(set);
  int rank = H5Sget_simple_extent_ndims(space);
  d.dims.resize(std::max(rank, 0));
  H5Sget_simple_extent_dims(space, d.dims.data(), nullptr);
  d.type_class = H5Tget_class(type);
  d.type_size = H5Tget_size(type);
  hsize_t n = 1;
  for (hsize_t x : d.dims) n *= x;
  d.values.resize(n);
  d.ok = rank >= 1 && H5Dread(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.values.data()) >= 0;
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(set);
  return d;
}

inline bool write_1d(hid_t file, const char* name, hid_t file_type, hid_t mem_type, hsize_t n, const void* data) {
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t set = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  bool ok = set >= 0 && H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
  if (set >= 0) H5Dclose(set);
  H5Sclose(space);
  return ok;
}

inline herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

inline std::vector<std::string> dataset_names(hid_t file) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Literate(file, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, &names);
  return names;
}

// Every folder of DF_TEST_DATA that holds an expected.h5: one test instance each.
inline std::vector<std::string> golden_models() {
  std::vector<std::string> models;
  if (!fs::is_directory(DF_TEST_DATA)) return models;
  for (const auto& e : fs::directory_iterator(DF_TEST_DATA))
    if (fs::exists(e.path() / "expected.h5")) models.push_back(e.path().filename().string());
  std::sort(models.begin(), models.end());
  return models;
}

struct Errors {
  double max_abs = 0, max_rel = 0, worst_ratio = 0;  // worst_ratio: max |a-b| / (atol + rtol|b|), <= 1 passes
  int64_t bad = 0, nan = 0;
};

inline Errors compare(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol,
                      double rel_floor) {
  Errors e;
  for (size_t i = 0; i < want.size(); ++i) {
    double a = got[i], b = want[i];
    if (!std::isfinite(a)) {
      ++e.nan;
      continue;
    }
    double diff = std::fabs(a - b), tol = atol + rtol * std::fabs(b);
    e.max_abs = std::max(e.max_abs, diff);
    if (std::fabs(b) >= rel_floor) e.max_rel = std::max(e.max_rel, diff / std::fabs(b));
    e.worst_ratio = std::max(e.worst_ratio, diff / tol);
    if (!(diff <= tol)) ++e.bad;
  }
  return e;
}

// The extract command line for a golden model's tokens on `device`.
// `extra`: more options (e.g. --target-dtype fp8).
inline std::string extract_command(const fs::path& model, const fs::path& tokens, const fs::path& out,
                                   const std::string& device = "cpu", const std::string& extra = "") {
  return shell_quote(DF_BINARY_DIR "/dflash_mpi") + " extract --model " + shell_quote(model.string()) +
         " --tokens " + shell_quote(tokens.string()) + " --out " + shell_quote(out.string()) +
         " --layers all --dtype f32 --device " + device + (extra.empty() ? "" : " " + extra);
}

// Runs extract on golden model `model` into `tmp`, opens expected.h5 and the output and lists the datasets to
// compare. A step that does not work fails the test (callers check HasFatalFailure()).
inline void golden_extract_and_open(const std::string& model, const std::string& device, const ScratchDir& tmp,
                                    std::unique_ptr<H5File>& want, std::unique_ptr<H5File>& got,
                                    std::vector<std::string>& names, const std::string& extra = "") {
  const fs::path dir = fs::path(DF_TEST_DATA) / model;
  const fs::path out = tmp.path / "out.h5", log = tmp.path / "extract.log";
  const std::string cmd = extract_command(dir, dir / "tokens.h5", out, device, extra);
  int rc = run_logged(cmd, log);
  ASSERT_EQ(rc, 0) << cmd << "\nfailed; its output:\n" << read_text(log);
  want = std::make_unique<H5File>(dir / "expected.h5", H5F_ACC_RDONLY);
  got = std::make_unique<H5File>(out, H5F_ACC_RDONLY);
  ASSERT_GE(want->id, 0) << dir / "expected.h5";
  ASSERT_GE(got->id, 0) << out << " (extract exited 0 but wrote no readable HDF5 file)";
  names = dataset_names(want->id);
  ASSERT_GE(names.size(), 4u) << "expected.h5 has too few datasets; regenerate with make_golden.py";
}

}  // namespace df::golden
