// The checkpoint writer: HDF5 streams the file to disk dataset by dataset, one chunk of rows at a time pulled
// from a CheckpointSource (the backend, or a host snapshot), so a save from the backend needs one chunk of
// host memory (plus HDF5's own buffers), not a second copy of the model.
// HDF5 1.10 cannot recover from a failed write (a full disk leaves a half-closed file that crashes the
// library at exit), so HDF5 writes through a small file driver of ours that never reports an I/O failure to
// it: the driver latches the first errno, skips every later write, and the writer turns the latch into a
// df::Error.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <new>

#include "core/error.h"
#include "core/log.h"
#include "core/file_util.h"
#include "core/h5_util.h"
#include "train/checkpoint_io.h"

#if H5_VERS_MAJOR != 1 || H5_VERS_MINOR != 10
#error "the checkpoint file driver is written against HDF5 1.10's H5FD_class_t (Debian 12); port it"
#endif

namespace df {

namespace {

// ---- the latching POSIX file driver ---------------------------------------------------------------------

struct LatchInfo {
  int fd;            // open read-write; owned by the caller
  int* first_errno;  // 0 until a write fails
};

struct LatchFile {
  H5FD_t pub;  // must be first: HDF5 hands the driver this pointer
  LatchInfo info;
  haddr_t eoa, eof;
};

LatchFile* latch(H5FD_t* f) {
  return reinterpret_cast<LatchFile*>(f);
}
const LatchFile* latch(const H5FD_t* f) {
  return reinterpret_cast<const LatchFile*>(f);
}

H5FD_t* latch_open(const char*, unsigned, hid_t fapl, haddr_t) {
  const auto* info = static_cast<const LatchInfo*>(H5Pget_driver_info(fapl));
  if (!info) return nullptr;
  auto* f = new (std::nothrow) LatchFile{};
  if (!f) return nullptr;
  f->info = *info;
  f->eoa = f->eof = 0;
  return &f->pub;
}

herr_t latch_close(H5FD_t* f) {
  delete latch(f);
  return 0;
}

int latch_cmp(const H5FD_t* a, const H5FD_t* b) {
  return latch(a)->info.fd - latch(b)->info.fd;
}

herr_t latch_query(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t latch_get_eoa(const H5FD_t* f, H5FD_mem_t) {
  return latch(f)->eoa;
}
herr_t latch_set_eoa(H5FD_t* f, H5FD_mem_t, haddr_t addr) {
  latch(f)->eoa = addr;
  return 0;
}
haddr_t latch_get_eof(const H5FD_t* f, H5FD_mem_t) {
  return latch(f)->eof;
}

// HDF5 re-reads metadata it wrote; bytes the failed (skipped) writes never stored read back as zeros, which
// is harmless because such a file is thrown away.
herr_t latch_read(H5FD_t* fh, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  LatchFile* f = latch(fh);
  char* out = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::pread(f->info.fd, out, size, off_t(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out += n;
    addr += haddr_t(n);
    size -= size_t(n);
  }
  std::memset(out, 0, size);
  return 0;
}

herr_t latch_write(H5FD_t* fh, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  LatchFile* f = latch(fh);
  f->eof = std::max(f->eof, addr + haddr_t(size));
  const char* in = static_cast<const char*>(buf);
  while (size > 0 && *f->info.first_errno == 0) {
    ssize_t n = ::pwrite(f->info.fd, in, size, off_t(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *f->info.first_errno = n == 0 ? ENOSPC : errno;
      break;
    }
    in += n;
    addr += haddr_t(n);
    size -= size_t(n);
  }
  return 0;
}

herr_t latch_truncate(H5FD_t* fh, hid_t, hbool_t) {
  LatchFile* f = latch(fh);
  if (f->eoa != f->eof && *f->info.first_errno == 0 && ::ftruncate(f->info.fd, off_t(f->eoa)) != 0)
    *f->info.first_errno = errno;
  f->eof = f->eoa;
  return 0;
}

hid_t latch_driver_id() {
  static hid_t id = -1;
  static std::once_flag once;
  std::call_once(once, [] {
    static H5FD_class_t cls{};
    cls.name = "dflash_latch";
    cls.maxaddr = (haddr_t(1) << 62) - 1;
    cls.fc_degree = H5F_CLOSE_WEAK;
    cls.fapl_size = sizeof(LatchInfo);
    cls.open = latch_open;
    cls.close = latch_close;
    cls.cmp = latch_cmp;
    cls.query = latch_query;
    cls.get_eoa = latch_get_eoa;
    cls.set_eoa = latch_set_eoa;
    cls.get_eof = latch_get_eof;
    cls.read = latch_read;
    cls.write = latch_write;
    cls.truncate = latch_truncate;
    const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
    std::copy(std::begin(map), std::end(map), std::begin(cls.fl_map));
    id = H5FDregister(&cls);
  });
  DF_CHECK(id >= 0, "cannot register the checkpoint file driver with HDF5");
  return id;
}

// ---- writing helpers ------------------------------------------------------------------------------------

void h5_write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value,
                   const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DF_CHECK(attr.get() >= 0 && H5Awrite(attr.get(), mem_type, value) >= 0, "%s: writing attribute '%s' failed",
           path.c_str(), name);
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
      "%s: writing dataset '%s' failed", path.c_str(), name);
  DF_CHECK(dset.close(), "%s: closing dataset '%s' failed", path.c_str(), name);
}

// One tensor, `slab_rows` rows at a time (a whole number of chunks per write, so HDF5 never reads a chunk
// back): each slab is pulled from `src` into `scratch` and handed to HDF5, which checksums and writes it.
void h5_write_matrix(hid_t group, int g, const DrafterParamEntry& e, const CheckpointSource& src,
                     std::vector<float>& scratch, const std::string& path) {
  const std::string where = std::string(kCheckpointGroups[g]) + "/" + e.name;
  const int64_t rows = e.rows, cols = e.cols;
  hsize_t dims[2] = {hsize_t(rows), hsize_t(cols)};
  // Equal chunks: HDF5 stores a partial edge chunk at full size, so rows are split evenly, not greedily.
  const int64_t n_chunks =
      std::max<int64_t>(1, (rows * cols + kCheckpointChunkElems - 1) / kCheckpointChunkElems);
  const int64_t chunk_rows = (rows + n_chunks - 1) / n_chunks;
  hsize_t chunk[2] = {hsize_t(chunk_rows), hsize_t(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  DF_CHECK(H5Pset_chunk(dcpl.get(), 2, chunk) >= 0 && H5Pset_fletcher32(dcpl.get()) >= 0,
           "%s: cannot set up chunking for tensor '%s'", path.c_str(), where.c_str());
  H5Handle dset(
      H5Dcreate2(group, e.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose);
  DF_CHECK(dset.get() >= 0, "%s: cannot create tensor '%s'", path.c_str(), where.c_str());
  scratch.resize(size_t(chunk_rows * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    src.read(g, e, r0, n, scratch.data());
    hsize_t start[2] = {hsize_t(r0), 0}, count[2] = {hsize_t(n), hsize_t(cols)};
    H5Handle mem(H5Screate_simple(2, count, nullptr), H5Sclose);
    DF_CHECK(
        H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
            H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, scratch.data()) >= 0,
        "%s: writing rows %lld..%lld of tensor '%s' failed", path.c_str(), (long long)r0, (long long)(r0 + n),
        where.c_str());
  }
  DF_CHECK(dset.close(), "%s: closing tensor '%s' failed", path.c_str(), where.c_str());
}

}  // namespace

hid_t h5_string_type(size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, std::max<size_t>(n, 1));
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

void checkpoint_write_file(const std::string& path, const DrafterConfig& cfg, const DrafterParamTable& table,
                           const CheckpointSource& src, const CheckpointState& st) {
  H5Quiet quiet;
  file_write_atomic_fd(path, [&](int fd, const std::string& tmp) {
    int first_errno = 0;
    // Checked after every object, so the error names the first thing that did not reach the disk.
    auto check_io = [&](const std::string& what) {
      DF_CHECK(first_errno == 0,
               "cannot write %s: writing %s to %s failed: %s (the old checkpoints and `latest` "
               "are untouched; HINT: free disk space under the run dir)",
               path.c_str(), what.c_str(), tmp.c_str(), std::strerror(first_errno));
    };
    const LatchInfo info{fd, &first_errno};
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    DF_CHECK(H5Pset_driver(fapl.get(), latch_driver_id(), &info) >= 0,
             "%s: cannot set up the HDF5 file driver", path.c_str());
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    DF_CHECK(file.get() >= 0, "%s: cannot create the HDF5 file %s", path.c_str(), tmp.c_str());
    const int32_t version = kCheckpointFormatVersion;
    h5_write_attr(file.get(), "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, &version, path);
    h5_write_attr(file.get(), "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.step, path);
    h5_write_attr(file.get(), "batch_cursor", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.batch_cursor, path);
    h5_write_attr(file.get(), "tokens_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, &st.tokens_seen, path);
    h5_write_attr(file.get(), "data_fingerprint", H5T_STD_U64LE, H5T_NATIVE_UINT64, &st.data_fingerprint,
                  path);
    h5_write_string_attr(file.get(), "created", utc_now("%Y-%m-%dT%H:%M:%SZ"), path);
    h5_write_string_attr(file.get(), "run_id", st.run_id, path);
    h5_write_string_dataset(file.get(), "config_text", st.config_text, path);
    h5_write_string_dataset(file.get(), "drafter_config", drafter_config_json(cfg), path);
    check_io("the header");

    std::vector<float> scratch;
    for (int g = 0; g < 3; ++g) {
      H5Handle group(H5Gcreate2(file.get(), kCheckpointGroups[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      DF_CHECK(group.get() >= 0, "%s: cannot create group '%s'", path.c_str(), kCheckpointGroups[g]);
      for (const auto& e : table.entries) {
        h5_write_matrix(group.get(), g, e, src, scratch, path);
        check_io("tensor '" + std::string(kCheckpointGroups[g]) + "/" + e.name + "'");
      }
    }
    DF_CHECK(file.close(), "%s: closing the HDF5 file %s failed", path.c_str(), tmp.c_str());
    check_io("the file's metadata");
  });
}

}  // namespace df
