// HDF5 writer and reader of extracted features; see feature_file.h for the layout and the atomic-rename contract.
#include "data/feature_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/h5_util.h"
#include "core/rng.h"

namespace df {

namespace {

// Rows per HDF5 chunk: ~1–10 MB chunks for H of 1k–5k, the unit of compression and of partial reads.
constexpr hsize_t kChunkRows = 1024;

void write_attr_i64(hid_t obj, const char* name, const std::vector<int64_t>& v, const std::string& where) {
  hsize_t n = std::max<size_t>(1, v.size());
  H5Handle space(v.size() == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DF_CHECK(a.get() >= 0 && (v.empty() || H5Awrite(a.get(), H5T_NATIVE_INT64, v.data()) >= 0),
           "%s: writing attribute '%s' failed", where.c_str(), name);
}

void write_attr_str(hid_t obj, const char* name, const std::string& s, const std::string& where) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, s.size()));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DF_CHECK(a.get() >= 0 && H5Awrite(a.get(), type.get(), s.c_str()) >= 0, "%s: writing attribute '%s' failed",
           where.c_str(), name);
}

std::vector<int64_t> read_attr_i64(hid_t obj, const char* name, const std::string& where) {
  DF_CHECK(H5Aexists(obj, name) > 0, "%s: attribute '%s' missing; HINT: features must come from this version's "
           "`dflash_mpi extract`", where.c_str(), name);
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Handle space(H5Aget_space(a.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::vector<int64_t> v(size_t(std::max<hssize_t>(0, n)));
  DF_CHECK(n >= 0 && (v.empty() || H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) >= 0),
           "%s: reading attribute '%s' failed", where.c_str(), name);
  return v;
}

std::string read_attr_str(hid_t obj, const char* name, const std::string& where) {
  DF_CHECK(H5Aexists(obj, name) > 0, "%s: attribute '%s' missing", where.c_str(), name);
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  const size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  DF_CHECK(H5Tget_class(type.get()) == H5T_STRING && H5Aread(a.get(), type.get(), s.data()) >= 0,
           "%s: attribute '%s' is not a string", where.c_str(), name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

}  // namespace

uint64_t token_data_fingerprint(const TokenData& d) {
  uint64_t h = rng_mix64(uint64_t(d.num_tokens()) ^ 0x66656174ull);
  for (int32_t t : d.tokens) h = rng_mix(h, uint64_t(uint32_t(t)));
  for (uint8_t m : d.loss_mask) h = rng_mix(h, m);
  for (int64_t o : d.offsets) h = rng_mix(h, uint64_t(o));
  return h;
}

FeatureFileWriter::FeatureFileWriter(const std::string& path, const std::vector<std::string>& names,
                                     const TokenData& tokens, int64_t cols, bool bf16, const std::vector<int>& layer_ids)
    : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())), rows_(tokens.num_tokens()), cols_(cols),
      bf16_(bf16) {
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  DF_CHECK(file_ >= 0, "cannot create %s; HINT: does the directory exist and is it writable?", tmp_.c_str());
  token_data_write_datasets(file_, tokens, tmp_);
  hsize_t dims[2] = {static_cast<hsize_t>(rows_), static_cast<hsize_t>(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (rows_ > 0 && cols > 0) {
    hsize_t chunk[2] = {std::min<hsize_t>(kChunkRows, hsize_t(rows_)), hsize_t(cols)};
    H5Pset_chunk(dcpl.get(), 2, chunk);
    H5Pset_shuffle(dcpl.get());  // bytes of equal significance together: what makes bf16 compress at all
    H5Pset_deflate(dcpl.get(), 1);
  }
  for (const std::string& n : names) {
    hid_t d = H5Dcreate2(file_, n.c_str(), bf16 ? H5T_STD_U16LE : H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                         dcpl.get(), H5P_DEFAULT);
    DF_CHECK(d >= 0, "%s: cannot create dataset %s", tmp_.c_str(), n.c_str());
    if (bf16) write_attr_str(d, "dtype", "bfloat16", tmp_);
    sets_.push_back(d);
  }
  write_attr_i64(file_, "hidden", {cols}, tmp_);
  std::vector<int64_t> ids(layer_ids.begin(), layer_ids.end());
  write_attr_i64(file_, "layer_ids", ids, tmp_);
  write_attr_str(file_, "feature_dtype", bf16 ? "bfloat16" : "float32", tmp_);
  write_attr_i64(file_, "tokens_fingerprint", {int64_t(token_data_fingerprint(tokens))}, tmp_);
}

FeatureFileWriter::~FeatureFileWriter() {
  for (hid_t d : sets_) H5Dclose(d);
  if (file_ >= 0) H5Fclose(file_);
  if (!finished_) std::remove(tmp_.c_str());
}

void FeatureFileWriter::write_hyperslab(size_t index, int64_t row0, int64_t n, hid_t mem_type, const void* values) {
  DF_CHECK(index < sets_.size() && row0 >= 0 && row0 + n <= rows_, "feature rows [%lld, %lld) out of range",
           (long long)row0, (long long)(row0 + n));
  if (n == 0) return;
  H5Handle space(H5Dget_space(sets_[index]), H5Sclose);
  hsize_t start[2] = {static_cast<hsize_t>(row0), 0}, count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(cols_)};
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  H5Handle mem(H5Screate_simple(2, count, nullptr), H5Sclose);
  DF_CHECK(H5Dwrite(sets_[index], mem_type, mem.get(), space.get(), H5P_DEFAULT, values) >= 0,
           "%s: writing rows failed; HINT: is the disk full?", tmp_.c_str());
}

void FeatureFileWriter::write_rows_bf16(size_t index, int64_t row0, int64_t n, const uint16_t* values) {
  DF_CHECK(bf16_, "%s: the file stores float32; write float values", tmp_.c_str());
  write_hyperslab(index, row0, n, H5T_NATIVE_UINT16, values);
}

void FeatureFileWriter::write_rows(size_t index, int64_t row0, int64_t n, const float* values) {
  if (!bf16_) return write_hyperslab(index, row0, n, H5T_NATIVE_FLOAT, values);
  staging_.resize(size_t(n * cols_));
  for (size_t i = 0; i < staging_.size(); ++i) staging_[i] = f32_to_bf16(values[i]);
  write_hyperslab(index, row0, n, H5T_NATIVE_UINT16, staging_.data());
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

FeatureFileReader::FeatureFileReader(const std::string& path) : path_(path) {
  H5Quiet quiet;
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  DF_CHECK(file_ >= 0, "%s: cannot open as HDF5 (missing, unreadable, or not what `dflash_mpi extract` writes)",
           path.c_str());
  hidden_ = read_attr_i64(file_, "hidden", path).at(0);
  for (int64_t l : read_attr_i64(file_, "layer_ids", path)) layer_ids_.push_back(int(l));
  const std::string dt = read_attr_str(file_, "feature_dtype", path);
  DF_CHECK(dt == "bfloat16" || dt == "float32", "%s: feature_dtype '%s' is neither bfloat16 nor float32",
           path.c_str(), dt.c_str());
  bf16_ = dt == "bfloat16";
  fingerprint_ = uint64_t(read_attr_i64(file_, "tokens_fingerprint", path).at(0));
  auto open_set = [&](const std::string& name) {
    hid_t d = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
    DF_CHECK(d >= 0, "%s: dataset '%s' missing", path.c_str(), name.c_str());
    H5Handle space(H5Dget_space(d), H5Sclose);
    hsize_t dims[2] = {0, 0};
    DF_CHECK(H5Sget_simple_extent_ndims(space.get()) == 2 && H5Sget_simple_extent_dims(space.get(), dims, nullptr) == 2
                 && int64_t(dims[1]) == hidden_ && (rows_ == 0 || int64_t(dims[0]) == rows_),
             "%s: dataset '%s' is not [rows, hidden %lld]", path.c_str(), name.c_str(), (long long)hidden_);
    rows_ = int64_t(dims[0]);
    return d;
  };
  for (int l : layer_ids_) layer_sets_.push_back(open_set("layer_" + std::to_string(l)));
  if (H5Lexists(file_, "final_norm", H5P_DEFAULT) > 0) final_ = open_set("final_norm");
}

FeatureFileReader::~FeatureFileReader() {
  for (hid_t d : layer_sets_) H5Dclose(d);
  if (final_ >= 0) H5Dclose(final_);
  if (file_ >= 0) H5Fclose(file_);
}

void FeatureFileReader::read_into(hid_t set, int64_t row0, int64_t n, uint16_t* out, int64_t ld, int64_t col0) const {
  DF_CHECK(row0 >= 0 && row0 + n <= rows_, "%s: feature rows [%lld, %lld) outside the file's %lld", path_.c_str(),
           (long long)row0, (long long)(row0 + n), (long long)rows_);
  if (n == 0) return;
  H5Handle space(H5Dget_space(set), H5Sclose);
  hsize_t start[2] = {hsize_t(row0), 0}, count[2] = {hsize_t(n), hsize_t(hidden_)};
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  if (bf16_) {
    // Straight into the caller's rows: the memory space is the whole [n, ld] block, the columns selected.
    hsize_t mdims[2] = {hsize_t(n), hsize_t(ld)}, mstart[2] = {0, hsize_t(col0)};
    H5Handle mem(H5Screate_simple(2, mdims, nullptr), H5Sclose);
    H5Sselect_hyperslab(mem.get(), H5S_SELECT_SET, mstart, nullptr, count, nullptr);
    DF_CHECK(H5Dread(set, H5T_NATIVE_UINT16, mem.get(), space.get(), H5P_DEFAULT, out) >= 0,
             "%s: reading feature rows [%lld, %lld) failed", path_.c_str(), (long long)row0, (long long)(row0 + n));
    return;
  }
  f32_.resize(size_t(n * hidden_));
  H5Handle mem(H5Screate_simple(2, count, nullptr), H5Sclose);
  DF_CHECK(H5Dread(set, H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, f32_.data()) >= 0,
           "%s: reading feature rows [%lld, %lld) failed", path_.c_str(), (long long)row0, (long long)(row0 + n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < hidden_; ++c) out[r * ld + col0 + c] = f32_to_bf16(f32_[size_t(r * hidden_ + c)]);
}

void FeatureFileReader::read_taps(const std::vector<int>& layers, int64_t row0, int64_t n, uint16_t* out,
                                  int64_t ld) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    auto it = std::find(layer_ids_.begin(), layer_ids_.end(), layers[i]);
    DF_CHECK(it != layer_ids_.end(), "%s: holds no layer_%d (it has the taps of layers %s); HINT: extract with "
             "--layers listing the drafter's target_layer_ids", path_.c_str(), layers[i],
             [&] {
               std::string s;
               for (int l : layer_ids_) s += (s.empty() ? "" : ",") + std::to_string(l);
               return s.empty() ? std::string("none") : s;
             }().c_str());
    read_into(layer_sets_[size_t(it - layer_ids_.begin())], row0, n, out, ld, int64_t(i) * hidden_);
  }
}

void FeatureFileReader::read_final_norm(int64_t row0, int64_t n, uint16_t* out, int64_t ld) const {
  DF_CHECK(final_ >= 0, "%s: has no final_norm dataset, which the soft-KL loss needs; HINT: extract with --layers "
           "including final_norm", path_.c_str());
  read_into(final_, row0, n, out, ld, 0);
}

}  // namespace df
