// Drafter checkpoints (DESIGN.md "Checkpoint"): one HDF5 file per saved step with the fp32 weights, both Adam
// moments and what a resume needs to continue bit-identically (step, global batch cursor, data fingerprint,
// the config text). Written atomically next to a `latest` pointer; only the last N are kept. There is no RNG
// state: every random draw of training is keyed by (run.seed, global batch index), so the cursor is the state.
//
// File layout (format_version 2; version 1 also stored an unused /rng_state), every table entry under its
// Hugging Face export name:
//   /params/<name>, /adam_m/<name>, /adam_v/<name>   f32 [rows, cols], chunked with Fletcher-32 checksums
//   /config_text     string       the run's TOML
//   /drafter_config  string       the DrafterConfig as JSON (shown when shapes do not match)
//   root attributes: format_version (int32), step, batch_cursor, tokens_seen (int64), data_fingerprint
//                    (uint64), created (UTC time, ISO 8601), run_id (string: the lineage, see run_dir.h;
//                    absent in files written before lineage ids, read as "")
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/drafter.h"

namespace df {

struct Config;

constexpr int kCheckpointFormatVersion = 2;

struct CheckpointState {
  int64_t step = 0;                 // optimizer steps completed
  int64_t batch_cursor = 0;         // global batch index to resume from (in-flight batches are redone)
  uint64_t data_fingerprint = 0;    // batch order and token content (train_plan); other data must refuse
  int64_t tokens_seen = 0;
  std::string config_text;  // the TOML the run started from
  std::string run_id;       // lineage: the id of the run that began this chain of checkpoints
};

// "<ckpt_dir>/step_<%08lld>.h5".
std::string checkpoint_path_for_step(const std::string& ckpt_dir, int64_t step);

// Writes model.params, adam_m, adam_v and `state` to checkpoint_path_for_step(ckpt_dir, state.step) through a
// temp name in the same folder (flush, close, fsync, rename, fsync the folder), then points
// `<ckpt_dir>/latest` at it the same way, then deletes the oldest step files of the same lineage
// (state.run_id) so that `keep_last` of it remain (never the new one; files of another run, or unreadable
// ones, are never deleted). The folder is created when missing. The file is streamed to disk one chunk of rows
// at a time: the save needs about one chunk (16 MiB) of host staging plus HDF5's buffers, never a copy of the
// model. On any failure: df::Error naming the path, the temp file removed, `latest` and the existing
// checkpoints untouched. Returns the path written.
std::string checkpoint_save(const std::string& ckpt_dir, const DrafterModel& model,
                            const CheckpointState& state, int keep_last);

// Step files in the folder by step number: exact "step_<digits>.h5" names only (temp files never match).
std::map<int64_t, std::string> checkpoint_list_steps(const std::string& ckpt_dir);

// The checkpoint `<ckpt_dir>/latest` names, as a path; "" when the folder or the pointer does not exist.
// Throws when the pointer names a file that is missing.
std::string checkpoint_find_latest(const std::string& ckpt_dir);

// Checks the whole file first (format version, every table entry present with exactly [rows, cols] in all
// three groups, no unknown objects, all data readable and checksums correct), then fills model.params,
// adam_m and adam_v bit-exactly. On any error the model is left as it was. Stages the three buffers in host
// memory (3 · 4 bytes per parameter) so that a read failure half-way cannot leave a half-loaded model.
CheckpointState checkpoint_load(const std::string& path, DrafterModel& model);

// The step, batch cursor and run id of a checkpoint without reading its tensors: where a resume starts.
CheckpointState checkpoint_read_state(const std::string& path);

// What a checkpoint says about itself without its tensors: the state and the drafter it trained.
struct CheckpointHeader {
  CheckpointState state;
  DrafterConfig drafter;
};
CheckpointHeader checkpoint_read_header(const std::string& path);

// A setting of the run config (by TOML key, e.g. "train.lr") that differs from what the checkpoint trained.
struct CheckpointChange {
  std::string key, checkpoint, now;
};
// Compares the drafter architecture (resolved: taps, mask id, block size, shapes), the loss settings (kind,
// gamma, streak, noise) and the LR schedule (lr, warmup, epochs, max_steps) of `cfg` / `now` against the
// checkpoint's stored config text and drafter config.
std::vector<CheckpointChange> checkpoint_config_changes(const CheckpointHeader& h, const std::string& path,
                                                        const Config& cfg, const DrafterConfig& now);
// Resume: throws naming the first changed key unless it is listed in `allowed` (--allow-change KEY).
void checkpoint_check_resume_config(const CheckpointHeader& h, const std::string& path, const Config& cfg,
                                    const DrafterConfig& now, const std::vector<std::string>& allowed);

}  // namespace df
