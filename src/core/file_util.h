// Durable file replacement on POSIX: fsync of a file or of the directory holding a renamed entry, small text
// files written atomically (temp name in the same folder, fsync, rename, fsync the folder), and the one check
// every writing command makes first so that an output never replaces an input or earlier work by accident.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace df {

// The folder part of a path ("." when there is none).
std::string file_dir_of(const std::string& path);

// True when `path` names a directory (following symlinks).
bool path_is_dir(const std::string& path);

// fsync of a file or of a directory; throws naming the path. A directory fsync that the filesystem does not
// support (EINVAL) is accepted: the rename is then as durable as that filesystem allows.
void file_fsync(const std::string& path, bool directory);

// The atomic replacement itself: `fill` writes the content to `fd` (open read-write on the temp file `tmp`,
// for writers that seek) and throws on failure; then fsync, close, rename over `path`, fsync the folder. On
// any failure the temp file is removed, `path` is untouched, and the error names `path`.
void file_write_atomic_fd(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill);

// Replaces `path` with `size` bytes so that a crash or a full disk leaves the old content or the new one,
// never half of one. The temp file "<path>.tmp.<pid>" is removed on failure. Throws naming the path.
// The content is the concatenation of `parts` (pointer, size), written in order.
struct FilePart {
  const void* data;
  size_t size;
  std::string what;  // named in the error when writing this part fails, e.g. "tensor 'fc.weight'"
};
void file_write_atomic(const std::string& path, const std::vector<FilePart>& parts);
inline void file_write_atomic(const std::string& path, const void* data, size_t size) {
  file_write_atomic(path, std::vector<FilePart>{{data, size, ""}});
}
inline void file_write_text_atomic(const std::string& path, const std::string& text) {
  file_write_atomic(path, text.data(), text.size());
}

// Refuses (df::Error naming `flag`, the path and what to do) to write `out` when it is one of `inputs`, or
// holds one of them (a folder output), compared by real path so that symlinks, hard links and "./x" count;
// --force does not lift that. Also refuses an `out` that already exists non-empty (a file with bytes, a
// folder with entries) unless `force`. Inputs that do not exist are skipped: the command reports them itself.
void file_check_output(const std::string& out, const std::vector<std::string>& inputs, bool force,
                       const char* flag = "--out");

}  // namespace df
