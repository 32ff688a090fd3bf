// Durable file replacement helpers (see file_util.h): the one place that knows how to make a rename stick,
// and the one output-versus-input check every command uses.
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"

namespace df {

std::string file_dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool path_is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void file_fsync(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC));
  DF_CHECK(fd >= 0, "%s: cannot open for fsync: %s", path.c_str(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DF_CHECK(rc == 0 || (directory && err == EINVAL), "%s: fsync failed: %s (disk full or I/O error)",
           path.c_str(), std::strerror(err));
}

void file_write_atomic_fd(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DF_CHECK(fd >= 0, "cannot write %s: creating %s failed: %s (missing directory or no write permission?)",
           path.c_str(), tmp.c_str(), std::strerror(errno));
  try {
    fill(fd, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    DF_FAIL("cannot write %s: fsync failed: %s (the old file is untouched; free space or check the directory)",
            path.c_str(), std::strerror(e));
  }
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    DF_FAIL("cannot write %s: close failed: %s", path.c_str(), std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    DF_FAIL("cannot write %s: renaming %s into place failed: %s", path.c_str(), tmp.c_str(),
            std::strerror(e));
  }
  file_fsync(file_dir_of(path), true);
}

void file_check_output(const std::string& out, const std::vector<std::string>& inputs, bool force,
                       const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out_real = fs::weakly_canonical(fs::absolute(out, ec), ec);
  for (const std::string& in : inputs) {
    if (in.empty() || !fs::exists(in, ec)) continue;
    const fs::path in_real = fs::weakly_canonical(fs::absolute(in, ec), ec);
    // equivalent(): the same inode, which also catches a hard link under another name.
    const bool same = in_real == out_real || (fs::exists(out, ec) && fs::equivalent(in, out, ec));
    const fs::path rel = in_real.lexically_relative(out_real);
    const bool inside = !rel.empty() && *rel.begin() != ".." && rel != ".";
    DF_CHECK(!same && !inside,
             "%s %s would overwrite the input %s%s; HINT: write the output to another path (--force does not "
             "override this)",
             flag, out.c_str(), in.c_str(), same ? "" : " (it lies inside that folder)");
  }
  if (force || !fs::exists(out, ec)) return;
  if (fs::is_directory(out, ec)) {
    DF_CHECK(fs::is_empty(out, ec),
             "%s %s is a folder that already holds files; HINT: choose a new %s, or pass "
             "--force to write into it (files of the same name are replaced)",
             flag, out.c_str(), flag);
  } else {
    const auto size = fs::file_size(out, ec);
    DF_CHECK(ec || size == 0,
             "%s %s already exists (%llu bytes); HINT: choose a new %s, or pass --force to "
             "replace it",
             flag, out.c_str(), (unsigned long long)size, flag);
  }
}

void file_write_atomic(const std::string& path, const std::vector<FilePart>& parts) {
  file_write_atomic_fd(path, [&](int fd, const std::string&) {
    for (const FilePart& part : parts) {
      size_t done = 0;
      while (done < part.size) {
        ssize_t n = ::write(fd, static_cast<const char*>(part.data) + done, part.size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) errno = ENOSPC;
        DF_CHECK(n > 0, "cannot write %s: %s failed: %s (the old file is untouched; free space or check the "
                 "directory)", path.c_str(), part.what.empty() ? "write" : ("writing " + part.what).c_str(),
                 std::strerror(errno));
        done += size_t(n);
      }
    }
  });
}

}  // namespace df
