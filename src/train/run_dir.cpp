// The run dir's lock, lineage ids and start rule; see run_dir.h. Everything here runs on the checkpoint owner
// (drafter 0) before the run writes anything; its errors end the job through the usual MPI_Abort path.
#include "train/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"

namespace df {

namespace fs = std::filesystem;

namespace {

std::string utc_stamp() {
  return utc_now("%Y%m%dT%H%M%SZ");
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string read_fd(int fd) {
  std::string text;
  char buf[512];
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    text.append(buf, size_t(n));
    off += n;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The value of `key=` in a holder line ("" when absent).
std::string holder_field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 1;
  return line.substr(begin, line.find(' ', begin) - begin);
}

// Why a holder that no longer holds the lock is not running: said so the user knows the old run is over.
std::string stale_reason(const std::string& holder) {
  const std::string host = holder_field(holder, "host"), pid = holder_field(holder, "pid");
  if (host == host_name() && !pid.empty()) {
    const bool gone = ::kill(pid_t(std::atol(pid.c_str())), 0) != 0 && errno == ESRCH;
    if (gone) return strfmt("process %s on this host no longer exists", pid.c_str());
  }
  return "it no longer holds the lock";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 6; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 6) out += strfmt(" and %zu more", names.size() - 6);
  return out;
}

// Renames the whole checkpoint folder out of the way; returns the new name ("" when there was nothing).
std::string move_aside(const std::string& run_dir, const std::string& ckpt_dir) {
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec) || fs::is_empty(ckpt_dir, ec)) return "";
  const std::string base = run_dir + "/checkpoints.old-" + utc_stamp();
  std::string dest = base;
  for (int i = 2; fs::exists(dest, ec); ++i) dest = base + "-" + std::to_string(i);
  fs::rename(ckpt_dir, dest, ec);
  DF_CHECK(
      !ec,
      "--fresh-start: cannot move %s to %s: %s; HINT: check permissions of run.dir, or use a new run.dir",
      ckpt_dir.c_str(), dest.c_str(), ec.message().c_str());
  file_fsync(run_dir, true);
  log_here("--fresh-start: moved the earlier checkpoints %s to %s (nothing was deleted)", ckpt_dir.c_str(),
           dest.c_str());
  return dest;
}

}  // namespace

std::string run_id_new() {
  std::random_device rd;
  return strfmt("%s-%s-%d-%08x", utc_stamp().c_str(), host_name().c_str(), int(::getpid()), unsigned(rd()));
}

RunLock::RunLock(const std::string& run_dir) : path_(run_dir + "/run.lock") {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  DF_CHECK(!ec, "cannot create run.dir %s: %s; HINT: check the path and its permissions", run_dir.c_str(),
           ec.message().c_str());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  DF_CHECK(fd_ >= 0, "cannot open the run lock %s: %s; HINT: is run.dir writable?", path_.c_str(),
           std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_fd(fd_);
    ::close(fd_);
    fd_ = -1;
    DF_CHECK(err == EWOULDBLOCK,
             "cannot lock %s: %s; HINT: run.dir must be on a filesystem with flock support", path_.c_str(),
             std::strerror(err));
    DF_FAIL(
        "run.dir %s is in use by another run (%s holds %s); HINT: wait for that run to end or stop it, or "
        "give this run its own run.dir",
        run_dir.c_str(), holder.empty() ? "a process that has not written its name yet" : holder.c_str(),
        path_.c_str());
  }
  stale_ = read_fd(fd_);
  if (!stale_.empty())
    log_warn(
        "run.dir %s: taking over a stale lock: %s held it and ended without releasing it (%s: killed, "
        "crashed or aborted); its checkpoints are kept",
        run_dir.c_str(), stale_.c_str(), stale_reason(stale_).c_str());
  write_holder("");
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // Best effort: a failure here only leaves a holder line that the next run reports as stale.
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::close(fd_);
}

void RunLock::set_run_id(const std::string& run_id) {
  write_holder(run_id);
}

void RunLock::write_holder(const std::string& run_id) {
  std::string line =
      strfmt("host=%s pid=%d started=%s", host_name().c_str(), int(::getpid()), utc_stamp().c_str());
  if (!run_id.empty()) line += " run_id=" + run_id;
  line += "\n";
  DF_CHECK(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, line.data(), line.size(), 0) == ssize_t(line.size()) &&
               ::fsync(fd_) == 0,
           "cannot write the run lock %s: %s (disk full?)", path_.c_str(), std::strerror(errno));
}

RunStart run_start_decide(const std::string& run_dir, const std::string& ckpt_dir, const std::string& resume,
                          bool fresh_start) {
  RunStart out;
  std::string path = resume == "none" || (resume == "auto" && fresh_start) ? ""
                     : resume == "auto"                                    ? checkpoint_find_latest(ckpt_dir)
                                                                           : resume;
  if (fresh_start) {
    std::error_code ec;
    const fs::path rel =
        fs::weakly_canonical(path, ec).lexically_relative(fs::weakly_canonical(ckpt_dir, ec));
    out.moved_to = move_aside(run_dir, ckpt_dir);
    if (!path.empty() && !out.moved_to.empty() && !rel.empty() && *rel.begin() != "..")
      path = (fs::path(out.moved_to) / rel).string();
  }
  if (!path.empty()) {
    out.resume_path = path;
    out.state = checkpoint_read_state(path);
    if (out.state.run_id.empty()) {
      out.state.run_id = run_id_new();
      log_here("%s was written before lineage ids: its chain continues as run %s", path.c_str(),
               out.state.run_id.c_str());
    }
  } else {
    out.state.run_id = run_id_new();
  }

  std::vector<std::string> in_way;
  for (const auto& [step, name] : checkpoint_list_steps(ckpt_dir))
    if (path.empty() || step > out.state.step) in_way.push_back(name);
  std::error_code ec;
  if (path.empty() && fs::exists(ckpt_dir + "/latest", ec)) in_way.push_back("`latest`");
  if (in_way.empty()) return out;
  const std::string why =
      !path.empty()      ? strfmt("resumes step %lld from %s and would write those step numbers again",
                                  (long long)out.state.step, path.c_str())
      : resume == "none" ? std::string("starts fresh (checkpoint.resume = \"none\")")
                         : std::string("starts fresh: there is no `latest` pointer to resume from");
  const bool named = resume != "auto" && resume != "none";  // a named checkpoint.resume follows the move
  const std::string then =
      named ? strfmt("the run then resumes step %lld from there", (long long)out.state.step)
            : std::string("the run then starts at step 0");
  DF_FAIL(
      "%s holds checkpoints that this run would overwrite or rotate away: %s. This run %s. HINT: give "
      "this run a new run.dir; or resume the newest of them (checkpoint.resume = \"auto\" with `latest` "
      "naming it); or pass --fresh-start to move all of %s to %s/checkpoints.old-<UTC time>/ first "
      "(nothing is deleted; %s)",
      ckpt_dir.c_str(), join_names(in_way).c_str(), why.c_str(), ckpt_dir.c_str(), run_dir.c_str(),
      then.c_str());
}

}  // namespace df
