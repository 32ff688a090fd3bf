// What keeps a run dir's checkpoints safe: one run at a time (a lock with its holder written in it), a
// lineage id tying every checkpoint to the run that began its chain (rotation removes only its own), and the
// rule for what a start may do with checkpoints already there (refuse, or move them aside on --fresh-start;
// never delete).
#pragma once
#include <cstdint>
#include <string>

#include "train/checkpoint.h"

namespace df {

// A new lineage id: UTC time, host and pid, and random bits, e.g. "20261201T084012Z-node3-4711-9f3a1c2e".
std::string run_id_new();

// `<run_dir>/run.lock`, held with flock(LOCK_EX) for the lifetime of the object; the holder's host, pid,
// start time and run id are written in it. flock is released by the kernel when the process dies, so a file
// that still names a holder while nobody holds the lock is the trace of a run that did not end cleanly
// (killed, crashed, aborted): that is said (stale_holder) and the lock taken over.
class RunLock {
 public:
  // Creates run_dir when missing. Throws naming the holder when another process holds the lock.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();  // empties the file, then releases: a clean end leaves no stale holder behind
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Rewrites the holder line once the run id is known (after the resume decision).
  void set_run_id(const std::string& run_id);
  // What the file said when the lock was taken over from a dead run ("" when it was free and empty).
  const std::string& stale_holder() const { return stale_; }
  const std::string& path() const { return path_; }

 private:
  void write_holder(const std::string& run_id);

  std::string path_;
  std::string stale_;
  int fd_ = -1;
};

// Where a run starts, decided on the checkpoint owner while it holds the RunLock.
struct RunStart {
  std::string resume_path;  // "" : step 0
  CheckpointState state;  // step, batch cursor and run id of resume_path (step 0 and run_id_new() otherwise)
  std::string moved_to;   // --fresh-start: the folder the earlier checkpoints went to ("" if none)
};

// `resume` is checkpoint.resume: "auto" (the `latest` pointer, if any), "none" or a checkpoint path. A start
// never overwrites or rotates away checkpoints it does not continue: a fresh start refuses a ckpt_dir that
// holds any step file or `latest`; a resume of step S refuses step files above S (it would write those names
// again). The message lists them and says what to do. With fresh_start the whole ckpt_dir is first renamed to
// `<run_dir>/checkpoints.old-<UTC time>/` (a checkpoint.resume path inside it follows it there) and `auto`
// finds nothing, so the run starts at step 0 with a new lineage or resumes the named file.
RunStart run_start_decide(const std::string& run_dir, const std::string& ckpt_dir, const std::string& resume,
                          bool fresh_start);

}  // namespace df
