// Checkpoints and HF export of the drafter: bit-exact save/load of weights and Adam moments, `latest` and
// pruning, refusal of checkpoints that do not fit the model (leaving it untouched), corrupt and truncated
// files, failed saves that must leave the previous state intact, and the exported config.json/safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "model/safetensors.h"
#include "test_data_util.h"
#include "test_drafter_util.h"
#include "train/checkpoint.h"
#include "train/export_hf.h"

namespace fs = std::filesystem;
using namespace df;
using df::testing::normal_vec;
using df::testing::tiny_drafter_config;
using df_test::ScratchDir;

namespace {

float* buf(const Tensor& t) {
  return t.ptr<float>();
}

// Weights from the seed, moments random (v positive like a real second moment), plus values that a lossy path
// would change: -0, a denormal, the largest float, and a NaN with a payload.
void fill_model(DrafterModel& m, uint64_t seed) {
  drafter_init_params(m, seed);
  const size_t n = size_t(m.table().total);
  std::vector<float> mv = normal_vec(n, 1e-3f, seed + 10), vv = normal_vec(n, 1e-4f, seed + 11);
  for (auto& x : vv) x = x * x;
  // Only inside the table entries: the alignment padding stays zero, as it does in training.
  std::memset(buf(m.adam_m), 0, n * 4);
  std::memset(buf(m.adam_v), 0, n * 4);
  for (const auto& e : m.table().entries) {
    std::memcpy(buf(m.adam_m) + e.offset, mv.data() + e.offset, size_t(e.rows * e.cols) * 4);
    std::memcpy(buf(m.adam_v) + e.offset, vv.data() + e.offset, size_t(e.rows * e.cols) * 4);
  }
  float* p = buf(m.entry_view(m.params, "layers.1.mlp.down_proj.weight"));
  p[0] = -0.0f;
  p[1] = std::numeric_limits<float>::denorm_min();
  p[2] = std::numeric_limits<float>::max();
  const uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&p[3], &nan_bits, 4);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// A copy of the three buffers, to show that a refused load changed nothing.
struct Snapshot {
  std::vector<char> p, m, v;
  explicit Snapshot(const DrafterModel& d) : p(bytes(d.params)), m(bytes(d.adam_m)), v(bytes(d.adam_v)) {}
  static std::vector<char> bytes(const Tensor& t) {
    return std::vector<char>(static_cast<char*>(t.data), static_cast<char*>(t.data) + t.nbytes());
  }
  bool equals(const DrafterModel& d) const {
    return p == bytes(d.params) && m == bytes(d.adam_m) && v == bytes(d.adam_v);
  }
};

CheckpointState sample_state(int64_t step) {
  CheckpointState s;
  s.step = step;
  s.batch_cursor = 3 * step + 1;
  s.data_fingerprint = 0xfedcba9876543210ull ^ uint64_t(step);
  s.tokens_seen = 19 * step;
  s.config_text = "[run]\ndir = \"runs/x\"  # ünïcode\n";
  return s;
}

std::string load_error(const std::string& path, DrafterModel& m) {
  try {
    checkpoint_load(path, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::set<std::string> dir_entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), std::streamsize(s.size()));
}

}  // namespace

TEST(Checkpoint, RoundTripIsBitExact) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops);
  fill_model(a, 7);
  fill_model(b, 99);
  ASSERT_FALSE(same_bits(a.params, b.params));  // the load below must have something to do
  const CheckpointState st = sample_state(1234);
  const std::string path = checkpoint_save(d.file("ck"), a, st, 3);
  EXPECT_EQ(path, d.file("ck") + "/step_00001234.h5");

  CheckpointState got = checkpoint_load(path, b);
  EXPECT_TRUE(same_bits(a.params, b.params));
  EXPECT_TRUE(same_bits(a.adam_m, b.adam_m));
  EXPECT_TRUE(same_bits(a.adam_v, b.adam_v));
  uint32_t nan_bits;
  std::memcpy(&nan_bits, buf(b.entry_view(b.params, "layers.1.mlp.down_proj.weight")) + 3, 4);
  EXPECT_EQ(nan_bits, 0x7fc01234u);
  EXPECT_EQ(got.step, st.step);
  EXPECT_EQ(got.batch_cursor, st.batch_cursor);
  EXPECT_EQ(got.data_fingerprint, st.data_fingerprint);
  EXPECT_EQ(got.tokens_seen, st.tokens_seen);
  EXPECT_EQ(got.config_text, st.config_text);
}

TEST(Checkpoint, EmptyConfigText) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops);
  fill_model(a, 1);
  CheckpointState st;
  st.step = 0;
  CheckpointState got = checkpoint_load(checkpoint_save(d.path().string(), a, st, 1), b);
  EXPECT_EQ(got.config_text, "");
  EXPECT_TRUE(same_bits(a.params, b.params));
}

TEST(Checkpoint, KeepLastPrunesOldestButNeverTheNewFile) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill_model(m, 3);
  const std::string dir = d.file("ck");
  for (int64_t s : {1, 2, 3, 4, 5}) checkpoint_save(dir, m, sample_state(s), 3);
  EXPECT_EQ(dir_entries(dir),
            (std::set<std::string>{"latest", "step_00000003.h5", "step_00000004.h5", "step_00000005.h5"}));
  EXPECT_EQ(read_text(dir + "/latest"), "step_00000005.h5\n");
  EXPECT_EQ(checkpoint_find_latest(dir), dir + "/step_00000005.h5");

  // Resumed from an older step: the file just written is the oldest by number but must survive.
  checkpoint_save(dir, m, sample_state(2), 3);
  EXPECT_EQ(dir_entries(dir),
            (std::set<std::string>{"latest", "step_00000002.h5", "step_00000004.h5", "step_00000005.h5"}));
  EXPECT_EQ(checkpoint_find_latest(dir), dir + "/step_00000002.h5");

  // Files that only look like checkpoints are not touched.
  write_text(dir + "/step_12.h5.tmp.99", "x");
  write_text(dir + "/notes.txt", "x");
  checkpoint_save(dir, m, sample_state(6), 1);
  EXPECT_EQ(dir_entries(dir),
            (std::set<std::string>{"latest", "step_00000006.h5", "step_12.h5.tmp.99", "notes.txt"}));
}

TEST(Checkpoint, FindLatest) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill_model(m, 3);
  EXPECT_EQ(checkpoint_find_latest(d.file("absent")), "");
  EXPECT_EQ(checkpoint_find_latest(d.path().string()), "");
  const std::string path = checkpoint_save(d.path().string(), m, sample_state(7), 2);
  EXPECT_EQ(checkpoint_find_latest(d.path().string()), path);

  fs::remove(path);
  try {
    checkpoint_find_latest(d.path().string());
    ADD_FAILURE() << "a pointer to a missing file must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000007.h5, which does not exist"), std::string::npos)
        << e.what();
  }
  write_text(d.file("latest"), "\n");
  EXPECT_THROW(checkpoint_find_latest(d.path().string()), Error);
}

TEST(Checkpoint, ShapeMismatchNamesTensorAndLeavesModelUnchanged) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops);
  fill_model(a, 5);
  const std::string path = checkpoint_save(d.path().string(), a, sample_state(1), 2);

  DrafterConfig wider = tiny_drafter_config();
  wider.intermediate = 25;
  DrafterModel b(wider, ops);
  fill_model(b, 6);
  Snapshot before(b);
  std::string msg = load_error(path, b);
  EXPECT_NE(
      msg.find(
          "params/layers.0.mlp.gate_proj.weight' is [24, 16] in the file but the model expects [25, 16]"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"intermediate\":24"), std::string::npos) << msg;  // the checkpoint's own config
  EXPECT_TRUE(before.equals(b));

  DrafterConfig deeper = tiny_drafter_config();
  deeper.layers = 3;
  deeper.layer_types.push_back(DrafterLayerType::full);
  DrafterModel c(deeper, ops);
  fill_model(c, 8);
  Snapshot before_c(c);
  msg = load_error(path, c);
  EXPECT_NE(msg.find("'params/layers.2.self_attn.q_proj.weight' is missing (the model expects [32, 16])"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(before_c.equals(c));

  DrafterConfig shallower = tiny_drafter_config();
  shallower.layers = 1;
  shallower.layer_types.pop_back();
  DrafterModel s(shallower, ops);
  msg = load_error(path, s);
  EXPECT_NE(msg.find("'params/layers.1.input_layernorm.weight' is not a tensor of this model"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("and 29 more"), std::string::npos) << msg;  // 11 tensors of layer 1 in each of 3 groups
}

TEST(Checkpoint, UnknownObjectsAndWrongVersionAreRefused) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops);
  fill_model(a, 5);
  fill_model(b, 6);
  Snapshot before(b);
  const std::string path = checkpoint_save(d.path().string(), a, sample_state(1), 2);

  const std::string extra = d.file("extra.h5"), root = d.file("root.h5"), ver = d.file("ver.h5");
  fs::copy_file(path, extra);
  fs::copy_file(path, root);
  fs::copy_file(path, ver);
  {
    hid_t f = H5Fopen(extra.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "adam_v", H5P_DEFAULT);
    df_test::raw_write(g, "bogus", H5T_NATIVE_FLOAT, std::vector<float>{1, 2, 3});
    H5Gclose(g);
    H5Fclose(f);
    f = H5Fopen(root.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    df_test::raw_write(f, "grads", H5T_NATIVE_FLOAT, std::vector<float>{1});
    H5Fclose(f);
    f = H5Fopen(ver.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t attr = H5Aopen(f, "format_version", H5P_DEFAULT);
    const int32_t v2 = 3;
    H5Awrite(attr, H5T_NATIVE_INT32, &v2);
    H5Aclose(attr);
    H5Fclose(f);
  }
  std::string msg = load_error(extra, b);
  EXPECT_NE(msg.find("'adam_v/bogus' is not a tensor of this model"), std::string::npos) << msg;
  msg = load_error(root, b);
  EXPECT_NE(msg.find("unknown object 'grads'"), std::string::npos) << msg;
  msg = load_error(ver, b);
  EXPECT_NE(msg.find("format_version is 3"), std::string::npos) << msg;
  EXPECT_TRUE(before.equals(b));
}

TEST(Checkpoint, CorruptOrTruncatedFilesAreErrors) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops);
  fill_model(a, 5);
  fill_model(b, 6);
  Snapshot before(b);
  const std::string path = checkpoint_save(d.path().string(), a, sample_state(1), 2);
  const std::string bytes = read_text(path);

  write_text(d.file("half.h5"), bytes.substr(0, bytes.size() / 2));
  std::string msg = load_error(d.file("half.h5"), b);
  EXPECT_NE(msg.find("half.h5"), std::string::npos) << msg;

  write_text(d.file("text.h5"), "not a checkpoint\n");
  msg = load_error(d.file("text.h5"), b);
  EXPECT_NE(msg.find("cannot open as HDF5"), std::string::npos) << msg;

  // One flipped bit inside the stored q_proj weights: only the checksum can notice it.
  const float* q = buf(a.entry_view(a.params, "layers.0.self_attn.q_proj.weight"));
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(q), 64));
  ASSERT_NE(at, std::string::npos);
  std::string flipped = bytes;
  flipped[at + 21] ^= 0x10;
  write_text(d.file("flip.h5"), flipped);
  msg = load_error(d.file("flip.h5"), b);
  EXPECT_NE(msg.find("reading tensor 'params/layers.0.self_attn.q_proj.weight' failed"), std::string::npos)
      << msg;
  EXPECT_TRUE(before.equals(b));
}

TEST(Checkpoint, FailedSaveKeepsPreviousState) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops);
  fill_model(a, 5);
  const std::string dir = d.file("ck");
  const std::string first = checkpoint_save(dir, a, sample_state(1), 2);
  const std::string first_bytes = read_text(first);
  ASSERT_GT(first_bytes.size(), 48u * 1024);  // the limit below must cut the next file short

  std::string msg;
  {  // a full disk
    df_test::FileSizeLimit limit(32 * 1024);
    ASSERT_TRUE(limit.ok());
    try {
      checkpoint_save(dir, a, sample_state(2), 2);
    } catch (const Error& e) {
      msg = e.what();
    }
  }

  EXPECT_NE(msg.find(dir + "/step_00000002.h5"), std::string::npos) << msg;
  EXPECT_EQ(dir_entries(dir), (std::set<std::string>{"latest", "step_00000001.h5"}));
  EXPECT_EQ(checkpoint_find_latest(dir), first);
  EXPECT_EQ(read_text(first), first_bytes);
  checkpoint_load(first, b);
  EXPECT_TRUE(same_bits(a.params, b.params));

  // The checkpoint lands but `latest` cannot be replaced (a directory is in its way): the new step file is
  // taken back, so nothing points past what `latest` names.
  const std::string dir2 = d.file("ck2");
  fs::create_directories(dir2 + "/latest/x");
  msg.clear();
  try {
    checkpoint_save(dir2, a, sample_state(4), 2);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(dir2 + "/latest"), std::string::npos) << msg;
  EXPECT_EQ(dir_entries(dir2), (std::set<std::string>{"latest"}));

  // A folder that cannot exist: its parent is a regular file.
  write_text(d.file("plain"), "x");
  msg.clear();
  try {
    checkpoint_save(d.file("plain") + "/ck", a, sample_state(3), 2);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(d.file("plain") + "/ck"), std::string::npos) << msg;
  EXPECT_EQ(read_text(d.file("plain")), "x");
}

TEST(ExportHf, ConfigKeysAndBf16Weights) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  fill_model(m, 11);
  // Ties between two bf16 values must round to even: 1 + 2^-8 goes down to 1, 1 + 3·2^-8 up to 1 + 2^-6.
  float* fc = buf(m.entry_view(m.params, "fc.weight"));
  const uint32_t tie_down = 0x3f808000u, tie_up = 0x3f818000u;
  std::memcpy(&fc[0], &tie_down, 4);
  std::memcpy(&fc[1], &tie_up, 4);
  const std::string dir = d.file("hf");
  drafter_export_hf(dir, m, 6, 40960);

  nlohmann::json j = nlohmann::json::parse(read_text(dir + "/config.json"));
  std::set<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
  EXPECT_EQ(keys, (std::set<std::string>{"architectures",
                                         "model_type",
                                         "block_size",
                                         "dflash_config",
                                         "hidden_size",
                                         "intermediate_size",
                                         "num_hidden_layers",
                                         "num_attention_heads",
                                         "num_key_value_heads",
                                         "head_dim",
                                         "num_target_layers",
                                         "rms_norm_eps",
                                         "rope_theta",
                                         "layer_types",
                                         "sliding_window",
                                         "use_sliding_window",
                                         "vocab_size",
                                         "tie_word_embeddings",
                                         "dtype",
                                         "torch_dtype",
                                         "hidden_act",
                                         "attention_bias",
                                         "attention_dropout",
                                         "max_position_embeddings",
                                         "max_window_layers",
                                         "rope_scaling",
                                         "initializer_range",
                                         "use_cache"}));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["block_size"], 4);
  EXPECT_EQ(j["dflash_config"]["mask_token_id"], 36);
  EXPECT_EQ(j["dflash_config"]["target_layer_ids"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(j["hidden_size"], 16);
  EXPECT_EQ(j["intermediate_size"], 24);
  EXPECT_EQ(j["num_hidden_layers"], 2);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["num_target_layers"], 6);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);  // the decimal the user wrote, not float(1e-6) widened
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_EQ(j["layer_types"], nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(j["sliding_window"], 5);
  EXPECT_EQ(j["use_sliding_window"], true);
  EXPECT_EQ(j["max_window_layers"], 0);
  EXPECT_EQ(j["vocab_size"], 37);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["max_position_embeddings"], 40960);

  SafetensorsIndex idx = SafetensorsIndex::open(dir);
  EXPECT_EQ(idx.size(), m.table().entries.size());
  for (const auto& e : m.table().entries) {
    const StTensor* t = idx.find(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->dtype, DType::bf16) << e.name;
    const std::vector<int64_t> want =
        e.rows == 1 ? std::vector<int64_t>{e.cols} : std::vector<int64_t>{e.rows, e.cols};
    EXPECT_EQ(t->shape, want) << e.name;
    const float* p = buf(m.entry_view(m.params, e.name));
    const uint16_t* got = static_cast<const uint16_t*>(t->data);
    int64_t bad = 0;
    for (int64_t i = 0; i < e.rows * e.cols; ++i) bad += got[i] != f32_to_bf16(p[i]);
    EXPECT_EQ(bad, 0) << e.name;
  }
  const uint16_t* fcb = static_cast<const uint16_t*>(idx.find("fc.weight")->data);
  EXPECT_EQ(fcb[0], 0x3f80);
  EXPECT_EQ(fcb[1], 0x3f82);
  const uint16_t* down = static_cast<const uint16_t*>(idx.find("layers.1.mlp.down_proj.weight")->data);
  EXPECT_TRUE(std::isnan(bf16_to_f32(down[3])));
  EXPECT_EQ(down[0], 0x8000);  // -0 keeps its sign
}

TEST(ExportHf, AllFullAttentionAndBadTargetLayers) {
  DrafterConfig c = tiny_drafter_config();
  c.layer_types = {DrafterLayerType::full, DrafterLayerType::full};
  nlohmann::json j = drafter_hf_config(c, 4);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["max_window_layers"], 2);
  EXPECT_EQ(j["max_position_embeddings"], 262144);
  try {
    drafter_hf_config(c, 3);
    ADD_FAILURE() << "layer id 3 of a 3-layer target must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target layer id 3"), std::string::npos) << e.what();
  }
}
