// The background checkpoint saver (train/checkpoint_saver.h), forced on the CPU backend: the file written
// from the host snapshot loads bit-identically to a synchronous save, holds the state as of the save call
// while the model keeps changing, and a failed write surfaces at the next wait naming the path, with
// `latest` still on the previous complete checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "test_data_util.h"
#include "test_drafter_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_saver.h"

namespace fs = std::filesystem;
using namespace df;
using df::testing::normal_vec;
using df::testing::tiny_drafter_config;
using df_test::ScratchDir;

namespace {

// Weights from the seed, random moments: three buffers a mix-up between them would show. Only inside the
// table entries: the alignment padding (not in the file) stays zero, as it does in training.
void fill(DrafterModel& m, uint64_t seed) {
  drafter_init_params(m, seed);
  const size_t n = size_t(m.table().total);
  std::vector<float> mv = normal_vec(n, 1e-3f, seed + 10), vv = normal_vec(n, 1e-4f, seed + 11);
  for (const auto& e : m.table().entries) {
    std::memcpy(m.adam_m.ptr<float>() + e.offset, mv.data() + e.offset, size_t(e.rows * e.cols) * 4);
    std::memcpy(m.adam_v.ptr<float>() + e.offset, vv.data() + e.offset, size_t(e.rows * e.cols) * 4);
  }
}

std::vector<char> bytes(const DrafterModel& m) {
  std::vector<char> out;
  for (const Tensor* t : {&m.params, &m.adam_m, &m.adam_v})
    out.insert(out.end(), static_cast<const char*>(t->data), static_cast<const char*>(t->data) + t->nbytes());
  return out;
}

CheckpointState state_at(int64_t step) {
  CheckpointState s;
  s.step = step;
  s.batch_cursor = 2 * step;
  s.data_fingerprint = 0x1234u + uint64_t(step);
  s.tokens_seen = 11 * step;
  s.config_text = "[run]\n";
  s.run_id = "run-a";
  return s;
}

// What checkpoint_load puts into a fresh model, as bytes.
std::vector<char> loaded(const std::string& path, CheckpointState* st = nullptr) {
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill(m, 12345);  // anything but the saved values
  CheckpointState s = checkpoint_load(path, m);
  if (st) *st = s;
  return bytes(m);
}

}  // namespace

TEST(CheckpointSaver, DefaultsToSynchronousOnTheCpu) {
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  EXPECT_FALSE(CheckpointSaver(m).background());
}

TEST(CheckpointSaver, SnapshotFileLoadsLikeTheSynchronousSave) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill(m, 3);
  const std::vector<char> at_save = bytes(m);
  const std::string sync_path = checkpoint_save(d.file("sync"), m, state_at(5), 2);

  CheckpointSaver saver(m, true);
  saver.save(d.file("async"), state_at(5), 2);
  fill(m, 4);  // training goes on while the file is written: the file must not see it
  ASSERT_NE(bytes(m), at_save);
  saver.wait();

  const std::string async_path = checkpoint_find_latest(d.file("async"));
  EXPECT_EQ(async_path, d.file("async") + "/step_00000005.h5");
  CheckpointState st;
  EXPECT_EQ(loaded(async_path, &st), loaded(sync_path));
  EXPECT_EQ(loaded(async_path), at_save);
  EXPECT_EQ(st.step, 5);
  EXPECT_EQ(st.batch_cursor, 10);
  EXPECT_EQ(st.tokens_seen, 55);
  EXPECT_EQ(st.run_id, "run-a");

  // The snapshot is reused: a second save writes the new state, pruning keeps the lineage at keep_last.
  const std::vector<char> second = bytes(m);
  saver.save(d.file("async"), state_at(6), 1);
  saver.save(d.file("async"), state_at(7), 1);  // waits for step 6 first: one write in flight
  saver.wait();
  EXPECT_EQ(checkpoint_find_latest(d.file("async")), d.file("async") + "/step_00000007.h5");
  EXPECT_EQ(loaded(d.file("async") + "/step_00000007.h5"), second);
  EXPECT_EQ(checkpoint_list_steps(d.file("async")).size(), 1u);
}

TEST(CheckpointSaver, FailedWriteSurfacesAtTheNextWaitAndLatestStays) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill(m, 5);
  const std::string dir = d.file("ck");
  CheckpointSaver saver(m, true);
  saver.save(dir, state_at(1), 3);
  saver.wait();
  const std::string first = dir + "/step_00000001.h5";
  ASSERT_EQ(checkpoint_find_latest(dir), first);
  ASSERT_GT(fs::file_size(first), 48u * 1024);  // the limit below must cut the next file short

  std::string msg;
  {  // a full disk while the writer thread streams step 2
    df_test::FileSizeLimit limit(32 * 1024);
    ASSERT_TRUE(limit.ok());
    saver.save(dir, state_at(2), 3);  // returns before the write ends; the error waits for us
    try {
      saver.wait();
    } catch (const Error& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("background checkpoint save of " + dir + "/step_00000002.h5 failed"), std::string::npos)
      << msg;
  EXPECT_EQ(checkpoint_find_latest(dir), first);  // `latest` moves only after a complete file
  EXPECT_EQ(checkpoint_list_steps(dir).size(), 1u);
  EXPECT_NO_THROW(saver.wait());  // reported once; the saver stays usable

  // The next save also reports a failure before it starts: here the failure is the save before it.
  fs::create_directories(d.file("ck2") + "/latest/x");  // `latest` cannot be replaced
  saver.save(d.file("ck2"), state_at(4), 2);
  msg.clear();
  try {
    saver.save(dir, state_at(3), 3);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(d.file("ck2") + "/step_00000004.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d.file("ck2") + "/latest"), std::string::npos) << msg;
  EXPECT_EQ(checkpoint_list_steps(d.file("ck2")).size(), 0u);  // the file `latest` could not name is gone
  EXPECT_EQ(checkpoint_find_latest(dir), first);                // the refused save did not start
}
