// The checkpoint as the truth for what was trained, and its save path's memory bound: the header reads back
// the drafter config; a resume config that changes the architecture, loss or LR schedule is refused naming
// the key unless allowed; a save of a ~200 MB checkpoint grows the peak RSS by at most 64 MiB + one chunk.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "test_data_util.h"
#include "test_drafter_util.h"
#include "train/checkpoint.h"

using namespace df;
using df::testing::tiny_dflash2_config;
using df::testing::tiny_domino_config;
using df::testing::tiny_drafter_config;
using df_test::error_of;
using df_test::ScratchDir;

namespace {

const char* kRun = R"(
[target]
random_config = "t.json"
device = "cpu"
[drafter]
mask_token_id = 36
[train]
lr = 3e-4
)";

// "VmRSS" / "VmHWM" of this process in bytes.
int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key) + 1)) * 1024;
  return -1;
}

std::string saved_checkpoint(const ScratchDir& d, const DrafterConfig& c, const std::string& config_text) {
  CpuTrainOps ops;
  DrafterModel m(c, ops);
  drafter_init_params(m, 3);
  CheckpointState st;
  st.step = 5;
  st.batch_cursor = 10;
  st.config_text = config_text;
  return checkpoint_save(d.file("ck"), m, st, 2);
}

}  // namespace

TEST(CheckpointTruth, HeaderHoldsTheTrainedDrafter) {
  ScratchDir d;
  DrafterConfig c = tiny_drafter_config();
  c.mask_token_id = 7;
  const std::string path = saved_checkpoint(d, c, kRun);
  CheckpointHeader h = checkpoint_read_header(path);
  EXPECT_EQ(h.state.step, 5);
  EXPECT_EQ(h.state.batch_cursor, 10);
  EXPECT_EQ(h.drafter.mask_token_id, 7);
  EXPECT_EQ(h.drafter.target_layer_ids, c.target_layer_ids);
  EXPECT_EQ(h.drafter.block_size, c.block_size);
  EXPECT_EQ(h.drafter.layer_types, c.layer_types);
  EXPECT_EQ(h.drafter.intermediate, c.intermediate);
}

TEST(CheckpointTruth, ResumeRefusesChangesNamingTheKeyUnlessAllowed) {
  ScratchDir d;
  const DrafterConfig trained = tiny_drafter_config();
  const std::string path = saved_checkpoint(d, trained, kRun);
  const CheckpointHeader h = checkpoint_read_header(path);
  const Config same = config_parse(kRun, "run.toml");
  EXPECT_TRUE(checkpoint_config_changes(h, path, same, trained).empty());
  EXPECT_NO_THROW(checkpoint_check_resume_config(h, path, same, trained, {}));

  // The LR: refused naming train.lr and both values, accepted with --allow-change train.lr.
  const Config lr = config_parse(std::string(kRun) + "epochs = 6\nloss = \"ce\"\n", "run.toml");
  Config lr2 = config_parse(std::string(kRun).replace(std::string(kRun).find("3e-4"), 4, "1e-3"), "run.toml");
  std::string msg = error_of([&] { checkpoint_check_resume_config(h, path, lr2, trained, {}); });
  EXPECT_NE(msg.find("'train.lr' is 0.001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trained with 0.0003"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--allow-change train.lr"), std::string::npos) << msg;
  EXPECT_NO_THROW(checkpoint_check_resume_config(h, path, lr2, trained, {"train.lr"}));
  EXPECT_TRUE(checkpoint_config_changes(h, path, lr, trained).empty());  // explicit defaults are no change

  // Loss settings and the drafter's mask id / taps / block size.
  for (const char* extra : {"gamma = 4.0\n", "streak = true\n", "noise_std = 0.1\n", "loss = \"kl\"\n"}) {
    const Config c = config_parse(std::string(kRun) + extra, "run.toml");
    EXPECT_EQ(checkpoint_config_changes(h, path, c, trained).size(), 1u) << extra;
  }
  DrafterConfig other = trained;
  other.mask_token_id = 5;
  other.target_layer_ids = {0, 2};
  other.block_size = 8;
  msg = error_of([&] { checkpoint_check_resume_config(h, path, same, other, {"drafter.mask_token_id"}); });
  EXPECT_NE(msg.find("'drafter.block_size' is 8"), std::string::npos) << msg;
  EXPECT_EQ(checkpoint_config_changes(h, path, same, other).size(), 3u);

  msg = error_of([&] { checkpoint_check_resume_config(h, path, same, trained, {"train.lrr"}); });
  EXPECT_NE(msg.find("--allow-change train.lrr: not a setting"), std::string::npos) << msg;
}

TEST(CheckpointTruth, KindIsRecordedAndAnotherKindNeverResumes) {
  ScratchDir d;
  const DrafterConfig trained = tiny_drafter_config();
  const std::string path = saved_checkpoint(d, trained, kRun);
  const CheckpointHeader h = checkpoint_read_header(path);
  EXPECT_EQ(h.drafter.kind, DrafterKind::dflash);
  const Config cfg = config_parse(kRun, "run.toml");
  for (const std::vector<std::string>& allowed :
       {std::vector<std::string>{},
        std::vector<std::string>{"drafter.kind", "drafter.emb_dim", "drafter.gru_hidden_dim",
                                 "drafter.pure_draft_prefix_len", "drafter.shift_label"}}) {
    const std::string msg =
        error_of([&] { checkpoint_check_resume_config(h, path, cfg, tiny_domino_config(), allowed); });
    EXPECT_NE(msg.find("'drafter.kind' is \"domino\" but " + path + " trained a \"dflash\" drafter"),
              std::string::npos)
        << msg;
  }
  // The kind and its head fields round-trip through the checkpoint's JSON.
  const DrafterConfig back = drafter_config_from_json(drafter_config_json(tiny_domino_config()), "json");
  EXPECT_EQ(back.kind, DrafterKind::domino);
  EXPECT_EQ(back.emb_dim, 7);
  EXPECT_EQ(back.gru_hidden_dim, 5);
  EXPECT_EQ(back.pure_draft_prefix_len, 1);
  EXPECT_TRUE(back.shift_label);
}

TEST(CheckpointTruth, DrafterConfigWithoutKindReadsAsDflash) {
  nlohmann::json j = nlohmann::json::parse(drafter_config_json(tiny_drafter_config()));
  for (const char* key : {"kind", "pure_draft_prefix_len", "emb_dim", "gru_hidden_dim", "shift_label"})
    j.erase(key);
  const DrafterConfig c = drafter_config_from_json(j.dump(), "old.h5");
  EXPECT_EQ(c.kind, DrafterKind::dflash);
  EXPECT_EQ(c.emb_dim, 0);
  // With a kind, every key is required.
  j["kind"] = "domino";
  EXPECT_NE(error_of([&] {
              drafter_config_from_json(j.dump(), "new.h5");
            }).find("'pure_draft_prefix_len' is missing"),
            std::string::npos);
}

TEST(CheckpointTruth, ADominoCheckpointHoldsItsHeadAndResumesOnlyAsDomino) {
  ScratchDir d;
  const std::string path = saved_checkpoint(d, tiny_domino_config(), kRun);
  const CheckpointHeader h = checkpoint_read_header(path);
  EXPECT_EQ(h.drafter.kind, DrafterKind::domino);
  EXPECT_EQ(h.drafter.gru_hidden_dim, 5);
  // The head's weights come back with the rest.
  CpuTrainOps ops;
  DrafterModel saved(tiny_domino_config(), ops), loaded(tiny_domino_config(), ops);
  drafter_init_params(saved, 3);
  drafter_init_params(loaded, 4);
  checkpoint_load(path, loaded);
  for (const char* name :
       {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"}) {
    const Tensor a = saved.entry_view(saved.params, name), b = loaded.entry_view(loaded.params, name);
    ASSERT_EQ(a.numel(), b.numel()) << name;
    EXPECT_EQ(std::memcmp(a.data, b.data, size_t(a.numel()) * sizeof(float)), 0) << name;
  }
  const Config cfg = config_parse(kRun, "run.toml");
  const std::string msg = error_of(
      [&] { checkpoint_check_resume_config(h, path, cfg, tiny_drafter_config(), {"drafter.kind"}); });
  EXPECT_NE(msg.find("'drafter.kind' is \"dflash\" but " + path + " trained a \"domino\" drafter"),
            std::string::npos)
      << msg;
  DrafterModel dflash(tiny_drafter_config(), ops);
  EXPECT_THROW(checkpoint_load(path, dflash), Error);
}

TEST(CheckpointTruth, BothBackendsTrainADominoDrafter) {
  EXPECT_NO_THROW(drafter_check_kind_trainable(tiny_domino_config(), "cpu"));
  EXPECT_NO_THROW(drafter_check_kind_trainable(tiny_domino_config(), "cuda"));
  EXPECT_NO_THROW(drafter_check_kind_trainable(tiny_drafter_config(), "cuda"));
}

// A DSpark drafter config: an RNN Markov head of rank 4, a recorded confidence_head_alpha of 0.5.
DrafterConfig rnn_dspark_config() {
  DrafterConfig c = df::testing::tiny_dspark_config(DrafterMarkovHead::rnn, 4, true);
  c.confidence_head_alpha = 0.5f;
  return c;
}

TEST(CheckpointTruth, DSparkHeadRoundTripsAndEarlierFilesReadWithoutIt) {
  const DrafterConfig back = drafter_config_from_json(drafter_config_json(rnn_dspark_config()), "json");
  EXPECT_EQ(back.kind, DrafterKind::dspark);
  EXPECT_EQ(back.markov_rank, 4);
  EXPECT_EQ(back.markov_head_type, DrafterMarkovHead::rnn);
  EXPECT_TRUE(back.enable_confidence_head);
  EXPECT_TRUE(back.confidence_head_with_markov);
  EXPECT_FLOAT_EQ(back.confidence_head_alpha, 0.5f);
  const std::vector<const char*> dspark_keys = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                                "confidence_head_with_markov", "confidence_head_alpha"};
  // Written before DSpark existed: a kind, no DSpark keys; the head reads as unset.
  nlohmann::json j = nlohmann::json::parse(drafter_config_json(tiny_domino_config()));
  for (const char* key : dspark_keys) j.erase(key);
  const DrafterConfig c = drafter_config_from_json(j.dump(), "domino.h5");
  EXPECT_EQ(c.kind, DrafterKind::domino);
  EXPECT_EQ(c.markov_rank, 0);
  EXPECT_FALSE(c.enable_confidence_head);
  // A DSpark file must hold its keys.
  j = nlohmann::json::parse(drafter_config_json(rnn_dspark_config()));
  j.erase("markov_head_type");
  EXPECT_NE(error_of([&] {
              drafter_config_from_json(j.dump(), "dspark.h5");
            }).find("'markov_head_type' is missing"),
            std::string::npos);
  // A DFlash file holding a DSpark head is refused by validation.
  j = nlohmann::json::parse(drafter_config_json(tiny_drafter_config()));
  j["markov_rank"] = 8;
  EXPECT_NE(
      error_of([&] { drafter_config_from_json(j.dump(), "odd.h5"); }).find("kind dflash has no DSpark head"),
      std::string::npos);
}

TEST(CheckpointTruth, BothBackendsTrainADSparkDrafter) {
  EXPECT_NO_THROW(drafter_check_kind_trainable(rnn_dspark_config(), "cuda"));
  EXPECT_NO_THROW(drafter_check_kind_trainable(rnn_dspark_config(), "cpu"));
}

// A DSpark drafter's checkpoint holds its head and its kind: it loads back bit for bit into a DSpark drafter
// of the same head, and a DFlash drafter or another head type refuses it.
TEST(CheckpointTruth, DSparkCheckpointRoundTripsAndAnotherHeadIsRefused) {
  ScratchDir d;
  const std::string path = saved_checkpoint(d, rnn_dspark_config(), kRun);
  EXPECT_EQ(checkpoint_read_header(path).drafter.kind, DrafterKind::dspark);
  CpuTrainOps ops;
  DrafterModel saved(rnn_dspark_config(), ops), loaded(rnn_dspark_config(), ops);
  drafter_init_params(saved, 3);
  drafter_init_params(loaded, 4);
  checkpoint_load(path, loaded);
  EXPECT_EQ(std::memcmp(saved.params.data, loaded.params.data, size_t(saved.table().total) * sizeof(float)),
            0);
  DrafterModel dflash(tiny_drafter_config(), ops);
  EXPECT_THROW(checkpoint_load(path, dflash), Error);
  DrafterModel vanilla(df::testing::tiny_dspark_config(DrafterMarkovHead::vanilla, 4, true), ops);
  EXPECT_THROW(checkpoint_load(path, vanilla), Error);
}

// The writer streams: a ~200 MB checkpoint (17 M parameters x params, m, v) must not be built in memory.
// Peak RSS growth during the save is bounded by 64 MiB + one 16 MiB chunk (the staging slab, HDF5's
// checksum buffer and its metadata); the in-memory image it replaced grew it by the whole file.
TEST(CheckpointTruth, SaveGrowsPeakMemoryByLessThan64MiBPlusAChunk) {
#if defined(__SANITIZE_ADDRESS__) || defined(DF_SANITIZE_BUILD)
  GTEST_SKIP()
      << "the peak-RSS bound is measured in the plain build: ASan's shadow memory and its quarantine of "
         "freed blocks add to the RSS";
#endif
  ScratchDir d;
  DrafterConfig c = tiny_drafter_config();
  c.hidden = 1024;
  c.layers = 1;
  c.heads = 8;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.intermediate = 2816;
  c.vocab = 64;
  c.mask_token_id = 1;
  c.target_layer_ids = {0, 1, 2, 3, 4};
  c.layer_types = {DrafterLayerType::full};
  CpuTrainOps ops;
  DrafterModel m(c, ops);
  drafter_init_params(m, 1);
  const size_t n = size_t(m.table().total);
  std::memset(m.adam_m.data, 0x11, n * 4);  // touch every page, so the baseline RSS holds the whole model
  std::memset(m.adam_v.data, 0x22, n * 4);
  const int64_t file_bytes = 3 * 4 * int64_t(n);
  ASSERT_GT(file_bytes, 190ll << 20);

  {  // reset the peak to the current RSS (Linux >= 4.0)
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
  }
  const int64_t before = proc_status_bytes("VmRSS:");
  ASSERT_GT(before, 0);
  ASSERT_LE(proc_status_bytes("VmHWM:") - before, 8ll << 20) << "cannot reset the peak RSS (clear_refs)";
  CheckpointState st;
  st.step = 1;
  const std::string path = checkpoint_save(d.file("ck"), m, st, 1);
  const int64_t growth = proc_status_bytes("VmHWM:") - before;
  EXPECT_LE(growth, (64ll << 20) + (16ll << 20))
      << "peak RSS grew by " << (growth >> 20) << " MiB while saving a " << (file_bytes >> 20)
      << " MiB checkpoint";
  std::printf("checkpoint save of %lld MiB: peak RSS +%lld MiB\n", (long long)(file_bytes >> 20),
              (long long)(growth >> 20));
  DrafterModel back(c, ops);
  checkpoint_load(path, back);
  EXPECT_EQ(std::memcmp(back.adam_v.data, m.adam_v.data, n * 4), 0);
}

TEST(CheckpointTruth, Dflash2IsRecordedTrainableOnCpuAndCudaAndCountedInTheTable) {
  const DrafterConfig back = drafter_config_from_json(drafter_config_json(tiny_dflash2_config(5)), "json");
  EXPECT_EQ(back.kind, DrafterKind::dflash2);
  EXPECT_EQ(back.conv_group_size, 4);
  EXPECT_EQ(back.selector_top_k, 5);
  // A checkpoint written before DFlash2 existed has none of its keys: a DFlash drafter.
  nlohmann::json j = nlohmann::json::parse(drafter_config_json(tiny_drafter_config()));
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
                          "output_multiplier", "final_logit_softcapping"})
    j.erase(key);
  EXPECT_EQ(drafter_config_json(drafter_config_from_json(j.dump(), "old.h5")),
            drafter_config_json(tiny_drafter_config()));
  // With kind dflash2 every key is required.
  j["kind"] = "dflash2";
  EXPECT_NE(
      error_of([&] { drafter_config_from_json(j.dump(), "new.h5"); }).find("'conv_kernel_size' is missing"),
      std::string::npos);

  // The CPU and CUDA backends train it; any other refuses it naming the key and the way out.
  CpuTrainOps ops;
  EXPECT_NO_THROW(DrafterModel m(tiny_dflash2_config(5), ops));
  EXPECT_NO_THROW(drafter_check_kind_trainable(tiny_dflash2_config(5), "cuda"));
  const std::string msg = error_of([&] { drafter_check_kind_trainable(tiny_dflash2_config(5), "rocm"); });
  EXPECT_NE(msg.find("drafter.kind = \"dflash2\": the rocm backend has no dflash2 convolutions"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("HINT: drafter.device = \"cpu\" or \"cuda\""), std::string::npos) << msg;

  // plan vram and the plan summary count the table: two convolutions per layer and the selector on top of
  // DFlash's tensors, under the peer's names.
  const DrafterParamTable base = drafter_param_table(tiny_drafter_config()),
                          d2 = drafter_param_table(tiny_dflash2_config(5));
  const auto count = [](const DrafterParamTable& t) {
    int64_t n = 0;
    for (const DrafterParamEntry& e : t.entries) n += e.rows * e.cols;
    return n;
  };
  const int64_t H = 16, V = 37, R = 3, taps = 2, G = 4, layers = 2;
  const int64_t per_conv = 2 * taps * H + 2 * taps * G * H;
  EXPECT_EQ(count(d2) - count(base), layers * 2 * per_conv + 2 * V * R + R * H);
  EXPECT_EQ(d2.find("layers.1.mlp_conv.kernel_projection.weight").rows, 2 * taps * G);
  EXPECT_EQ(d2.find("layers.0.attention_conv.base_kernel").rows, 2 * taps);
  EXPECT_FALSE(d2.find("layers.0.attention_conv.base_kernel").decay);
  EXPECT_EQ(d2.find("candidate_selector.successor_codebook").cols, R);
  EXPECT_EQ(d2.find("candidate_selector.hidden_projection.weight").cols, H);
}
