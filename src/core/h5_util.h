// Small RAII helpers over the HDF5 C API shared by every module that reads or writes HDF5 files (token files,
// checkpoints): a handle that closes itself and a guard that silences HDF5's own error-stack printing,
// because every failure is turned into a df::Error that names the file and the object instead.
#pragma once
#include <hdf5.h>

namespace df {

// Turns off HDF5's own stderr dump for the lifetime of the guard (per thread in thread-safe builds).
class H5Quiet {
 public:
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5Quiet(const H5Quiet&) = delete;
  H5Quiet& operator=(const H5Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// Owns one hid_t and closes it with the matching H5*close.
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~H5Handle() {
    if (id_ >= 0) closer_(id_);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  // Closes now and reports whether the close succeeded (a file close is where buffered writes land).
  bool close() {
    herr_t rc = closer_(id_);
    id_ = -1;
    return rc >= 0;
  }

 private:
  hid_t id_;
  herr_t (*closer_)(hid_t);
};

}  // namespace df
