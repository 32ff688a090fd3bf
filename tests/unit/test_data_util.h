// Helpers shared by the data-layer and file-writing tests: the message of an expected error, a per-test scratch
// directory, a file-size limit
// that stands in for a full disk, and a raw HDF5 writer that can produce the malformed token files the
// validating writer refuses to create.
#pragma once
#include <hdf5.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace df_test {

// The message of the df::Error that `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const df::Error& e) {
    return e.what();
  }
  return "";
}

// A fresh directory named after the running test, removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("df_data_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// While alive, files this process writes may not grow past `bytes` (RLIMIT_FSIZE): a write past it fails
// with EFBIG the way a full disk fails with ENOSPC (tests run as root, so permissions cannot make writes
// fail). SIGXFSZ is ignored meanwhile; both are restored at the end of the scope, early returns included.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = getrlimit(RLIMIT_FSIZE, &old_) == 0;
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = ok_ && setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }  // the limit is in force

 private:
  struct rlimit old_ {};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

// Writes one 1-D dataset of `mem_type` values (no validation) into an open file.
template <class T>
void raw_write(hid_t file, const char* name, hid_t mem_type, const std::vector<T>& v) {
  hsize_t dims[1] = {v.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t d = H5Dcreate2(file, name, mem_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (!v.empty()) H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(d);
  H5Sclose(space);
}

// A token file exactly as given: empty `mask` leaves the dataset out.
inline void raw_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                           const std::vector<int64_t>& offsets, const std::vector<uint8_t>& mask = {}) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  raw_write(f, "tokens", H5T_NATIVE_INT32, tokens);
  raw_write(f, "offsets", H5T_NATIVE_INT64, offsets);
  if (!mask.empty()) raw_write(f, "loss_mask", H5T_NATIVE_UINT8, mask);
  H5Fclose(f);
}

}  // namespace df_test
