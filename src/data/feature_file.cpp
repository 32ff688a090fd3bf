// HDF5 writer for extracted features; see feature_file.h for the layout and the atomic-rename contract.
#include "data/feature_file.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#include "core/file_util.h"

namespace df {

FeatureFileWriter::FeatureFileWriter(const std::string& path, const std::vector<std::string>& names, int64_t rows,
                                     int64_t cols)
    : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())), rows_(rows), cols_(cols) {
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  DF_CHECK(file_ >= 0, "cannot create %s; HINT: does the directory exist and is it writable?", tmp_.c_str());
  hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
  hid_t space = H5Screate_simple(2, dims, nullptr);
  for (const std::string& n : names) {
    hid_t d = H5Dcreate2(file_, n.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    DF_CHECK(d >= 0, "%s: cannot create dataset %s", tmp_.c_str(), n.c_str());
    sets_.push_back(d);
  }
  H5Sclose(space);
}

FeatureFileWriter::~FeatureFileWriter() {
  for (hid_t d : sets_) H5Dclose(d);
  if (file_ >= 0) H5Fclose(file_);
  if (!finished_) std::remove(tmp_.c_str());
}

void FeatureFileWriter::write_rows(size_t index, int64_t row0, int64_t n, const float* values) {
  DF_CHECK(index < sets_.size() && row0 >= 0 && row0 + n <= rows_, "feature rows [%lld, %lld) out of range",
           (long long)row0, (long long)(row0 + n));
  if (n == 0) return;
  hid_t space = H5Dget_space(sets_[index]);
  hsize_t start[2] = {static_cast<hsize_t>(row0), 0}, count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(cols_)};
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t mem = H5Screate_simple(2, count, nullptr);
  herr_t st = H5Dwrite(sets_[index], H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, values);
  H5Sclose(mem);
  H5Sclose(space);
  DF_CHECK(st >= 0, "%s: writing rows failed; HINT: is the disk full?", tmp_.c_str());
}

void FeatureFileWriter::write_offsets(const std::vector<int64_t>& offsets) {
  hsize_t dims[1] = {offsets.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t d = H5Dcreate2(file_, "offsets", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t st = d >= 0 ? H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) : -1;
  if (d >= 0) H5Dclose(d);
  H5Sclose(space);
  DF_CHECK(st >= 0, "%s: writing offsets failed", tmp_.c_str());
}

void FeatureFileWriter::finish() {
  for (hid_t d : sets_) H5Dclose(d);
  sets_.clear();
  herr_t st = H5Fclose(file_);
  file_ = -1;
  DF_CHECK(st >= 0, "%s: closing failed; HINT: is the disk full?", tmp_.c_str());
  file_fsync(tmp_, false);
  DF_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename %s to %s", tmp_.c_str(), path_.c_str());
  finished_ = true;
  file_fsync(file_dir_of(path_), true);  // the rename is durable once the directory entry is
}

}  // namespace df
