// safetensors: write/read round trips per dtype, sharded checkpoints through an index, and the error messages
// for corrupt, truncated and missing files (the loader's first line of defence against a bad download).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "test_data_util.h"

using namespace df;
using df_test::ScratchDir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Builds a raw file from a header string and a data section, for the corrupt-file cases.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// Expects open() to throw a df::Error whose message contains every fragment.
void expect_open_error(const std::string& path, std::initializer_list<const char*> fragments) {
  try {
    SafetensorsIndex::open(path);
    ADD_FAILURE() << "open(" << path << ") did not throw";
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  ScratchDir d;
  // Awkward sizes: a scalar, 1, 7 and 3×19 elements.
  std::vector<float> f32(3 * 19);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = std::sin(0.37f * i) * 100.0f;
  std::vector<uint16_t> bf16(7), f16 = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555};
  const float bf16_src[7] = {1.0f, -2.5f, 3.14159f, 1e-20f, -65504.0f, 0.0f, 1e30f};
  for (int i = 0; i < 7; ++i) bf16[i] = f32_to_bf16(bf16_src[i]);
  std::vector<int32_t> i32 = {-7, 0, 1 << 20};
  std::vector<int64_t> i64 = {-(int64_t{1} << 40), 5};
  std::vector<uint8_t> u8 = {0, 1, 255};
  float scalar = 42.0f;

  safetensors_write(d.file("a.safetensors"),
                    {{"w.f32", DType::f32, {3, 19}, f32.data()},
                     {"w.bf16", DType::bf16, {7}, bf16.data()},
                     {"w.f16", DType::f16, {5, 1}, f16.data()},
                     {"w.i32", DType::i32, {3}, i32.data()},
                     {"w.i64", DType::i64, {1, 2}, i64.data()},
                     {"w.u8", DType::u8, {3}, u8.data()},
                     {"w.scalar", DType::f32, {}, &scalar},
                     {"w.empty", DType::bf16, {0, 4}, nullptr}},
                    {{"format", "pt"}});
  // No temp file is left next to the result.
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()), 1);
  const std::string bytes = slurp(d.file("a.safetensors"));
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(hlen % 8, 0u) << "header must be padded so the data section is 8-byte aligned";
  auto header = nlohmann::json::parse(bytes.substr(8, hlen));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["w.f32"]["dtype"], "F32");
  EXPECT_EQ(header["w.bf16"]["dtype"], "BF16");

  SafetensorsIndex idx = SafetensorsIndex::open(d.file("a.safetensors"));
  EXPECT_EQ(idx.size(), 8u);
  EXPECT_EQ(idx.find("__metadata__"), nullptr);
  EXPECT_EQ(idx.find("w.missing"), nullptr);

  const StTensor* t = idx.find("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 19}));
  EXPECT_EQ(t->nbytes, f32.size() * 4);
  std::vector<float> got(t->numel());
  st_to_f32(*t, got.data());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(got[i], f32[i]) << i;  // f32 is copied bit for bit

  t = idx.find("w.bf16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::bf16);
  EXPECT_EQ(std::memcmp(t->data, bf16.data(), 14), 0);
  got.assign(7, NAN);
  st_to_f32(*t, got.data());
  // bf16 keeps 8 significant bits: relative error ≤ 2^-9 after round-to-nearest (atol 0 suffices since
  // no value is subnormal in bf16's range).
  for (int i = 0; i < 7; ++i) {
    EXPECT_FALSE(std::isnan(got[i]));
    EXPECT_LE(std::fabs(got[i] - bf16_src[i]), std::ldexp(1.0f, -9) * std::fabs(bf16_src[i])) << i;
    EXPECT_EQ(got[i], bf16_round(bf16_src[i]));
  }

  t = idx.find("w.f16");
  ASSERT_NE(t, nullptr);
  got.assign(5, NAN);
  st_to_f32(*t, got.data());
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(got[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(got[3]));
  EXPECT_NEAR(got[4], 1.0f / 3.0f, 1e-3f);  // 0x3555 is f16's nearest value to 1/3 (10 mantissa bits)

  t = idx.find("w.i32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(static_cast<const int32_t*>(t->data)[2], 1 << 20);
  got.assign(3, NAN);
  st_to_f32(*t, got.data());
  EXPECT_EQ(got[0], -7.0f);
  t = idx.find("w.i64");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 16u);
  int64_t v64;
  std::memcpy(&v64, t->data, 8);
  EXPECT_EQ(v64, i64[0]);
  t = idx.find("w.u8");
  ASSERT_NE(t, nullptr);
  got.assign(3, NAN);
  st_to_f32(*t, got.data());
  EXPECT_EQ(got[2], 255.0f);
  t = idx.find("w.scalar");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(t->numel(), 1);
  t = idx.find("w.empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->numel(), 0);
  EXPECT_EQ(t->nbytes, 0u);

  // Names come back sorted; a moved-from index keeps its tensors valid in the new owner.
  SafetensorsIndex moved = std::move(idx);
  auto names = moved.names();
  EXPECT_EQ(names.front(), "w.bf16");
  EXPECT_EQ(names.size(), 8u);
  float back = 0;  // through st_to_f32: a tensor inside the file need not be 4-byte aligned (UBSan)
  st_to_f32(*moved.find("w.scalar"), &back);
  EXPECT_EQ(back, 42.0f);
}

TEST(Safetensors, DirectoryWithSingleFile) {
  ScratchDir d;
  float x[3] = {1, 2, 3};
  safetensors_write(d.file("model.safetensors"), {{"x", DType::f32, {3}, x}});
  SafetensorsIndex idx = SafetensorsIndex::open(d.path().string());
  ASSERT_NE(idx.find("x"), nullptr);
  EXPECT_EQ(idx.find("x")->file, d.file("model.safetensors"));
  // Writing again over an existing file replaces it atomically.
  float y[1] = {9};
  safetensors_write(d.file("model.safetensors"), {{"y", DType::f32, {1}, y}});
  SafetensorsIndex idx2 = SafetensorsIndex::open(d.path().string() + "/");
  EXPECT_EQ(idx2.find("x"), nullptr);
  ASSERT_NE(idx2.find("y"), nullptr);
}

TEST(Safetensors, ShardedCheckpointThroughIndex) {
  ScratchDir d;
  std::vector<uint16_t> a(19), b(65);
  for (int i = 0; i < 19; ++i) a[i] = f32_to_bf16(float(i));
  for (int i = 0; i < 65; ++i) b[i] = f32_to_bf16(-float(i));
  float c = 0.5f;
  safetensors_write(d.file("model-00001-of-00002.safetensors"),
                    {{"model.a", DType::bf16, {19}, a.data()}, {"model.c", DType::f32, {1}, &c}});
  safetensors_write(d.file("model-00002-of-00002.safetensors"),
                    {{"lm_head.weight", DType::bf16, {5, 13}, b.data()}});
  nlohmann::json index = {{"metadata", {{"total_size", 19 * 2 + 4 + 65 * 2}}},
                          {"weight_map",
                           {{"model.a", "model-00001-of-00002.safetensors"},
                            {"model.c", "model-00001-of-00002.safetensors"},
                            {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
  spit(d.file("model.safetensors.index.json"), index.dump(2));
  // The index wins over a stray single file.
  float stray = 1;
  safetensors_write(d.file("model.safetensors"), {{"stray", DType::f32, {1}, &stray}});

  SafetensorsIndex idx = SafetensorsIndex::open(d.path().string());
  EXPECT_EQ(idx.size(), 3u);
  EXPECT_EQ(idx.find("stray"), nullptr);
  const StTensor* t = idx.find("lm_head.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->file, d.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(t->shape, (std::vector<int64_t>{5, 13}));
  std::vector<float> got(65);
  st_to_f32(*t, got.data());
  EXPECT_EQ(got[64], -64.0f);
  EXPECT_EQ(idx.find("model.a")->file, d.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(idx.find("nope"), nullptr);

  // The index naming a tensor its shard lacks is an error that names both.
  index["weight_map"]["model.ghost"] = "model-00002-of-00002.safetensors";
  spit(d.file("model.safetensors.index.json"), index.dump());
  expect_open_error(d.path().string(), {"model.ghost", "model-00002-of-00002.safetensors"});

  // A shard missing from disk is named.
  index["weight_map"].erase("model.ghost");
  index["weight_map"]["x"] = "model-00003-of-00002.safetensors";
  spit(d.file("model.safetensors.index.json"), index.dump());
  expect_open_error(d.path().string(), {"model-00003-of-00002.safetensors", "does not exist"});

  // Malformed index JSON.
  spit(d.file("model.safetensors.index.json"), "{\"weight_map\": [1,2]}");
  expect_open_error(d.path().string(), {"weight_map", "model.safetensors.index.json"});
}

TEST(Safetensors, MissingPathsNameWhatWasLookedFor) {
  ScratchDir d;
  expect_open_error(d.file("no_such_dir"), {"no_such_dir", "does not exist"});
  // An existing directory with no weights in it.
  expect_open_error(d.path().string(),
                    {d.path().string().c_str(), "model.safetensors.index.json", "model.safetensors"});
}

TEST(Safetensors, CorruptFilesAreRejectedWithTheProblemNamed) {
  ScratchDir d;
  const std::string p = d.file("bad.safetensors");

  spit(p, "abc");
  expect_open_error(p, {"bad.safetensors", "truncated"});

  spit(p, raw_file("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", "1234"));
  expect_open_error(p, {"bad.safetensors", "not valid JSON"});

  // Header length pointing past the end of the file.
  std::string f = raw_file("{}", "");
  f[0] = 100;
  spit(p, f);
  expect_open_error(p, {"bad.safetensors", "header length 100"});

  // Truncated data section: the offsets say 12 bytes, only 8 are there.
  spit(p,
       raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", std::string(8, '\0')));
  expect_open_error(p, {"'w'", "bad data_offsets [0, 12]", "8 bytes"});

  // Offsets reversed.
  spit(p, raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", std::string(8, '\0')));
  expect_open_error(p, {"'w'", "data_offsets"});

  // Byte count disagreeing with the shape.
  spit(p,
       raw_file(R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", std::string(8, '\0')));
  expect_open_error(p, {"'w'", "8 bytes", "needs 6"});

  // An unsupported dtype names the tensor and the dtype.
  spit(p,
       raw_file(R"({"w64": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", std::string(8, '\0')));
  expect_open_error(p, {"'w64'", "F64"});

  // Missing fields and negative dimensions.
  spit(p, raw_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", std::string(4, '\0')));
  expect_open_error(p, {"'w'", "shape"});
  spit(p,
       raw_file(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", std::string(4, '\0')));
  expect_open_error(p, {"'w'", "negative"});

  // A valid hand-made file with metadata and an unpadded header is accepted.
  spit(p,
       raw_file(R"({"__metadata__": {"k": "v"}, "w": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}})",
                "xyz"));
  SafetensorsIndex idx = SafetensorsIndex::open(p);
  EXPECT_EQ(idx.size(), 1u);
  EXPECT_EQ(std::string(static_cast<const char*>(idx.find("w")->data), 3), "xyz");
}

TEST(Safetensors, WriteRejectsBadInput) {
  ScratchDir d;
  float x = 1;
  EXPECT_THROW(
      safetensors_write(d.file("a.safetensors"), {{"x", DType::f32, {1}, &x}, {"x", DType::f32, {1}, &x}}),
      Error);
  EXPECT_THROW(safetensors_write(d.file("a.safetensors"), {{"x", DType::f32, {2}, nullptr}}), Error);
  EXPECT_FALSE(fs::exists(d.file("a.safetensors")));
  // A directory that does not exist: the message names the target path.
  try {
    safetensors_write(d.file("nodir/a.safetensors"), {{"x", DType::f32, {1}, &x}});
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nodir/a.safetensors"), std::string::npos) << e.what();
  }
}

// A write that runs out of space (simulated with the file-size limit, which makes write() fail with EFBIG
// the way a full disk makes it fail with ENOSPC) leaves neither the target nor the temp file behind.
TEST(Safetensors, FailedWriteLeavesNoPartialFile) {
  ScratchDir d;
  std::vector<float> big(1 << 18, 1.0f);  // 1 MiB, well past the 64 KiB limit below
  float small = 3;
  safetensors_write(d.file("keep.safetensors"), {{"old", DType::f32, {1}, &small}});

  std::string msg;
  {
    df_test::FileSizeLimit limit(64 * 1024);
    ASSERT_TRUE(limit.ok());
    try {
      safetensors_write(d.file("big.safetensors"), {{"big", DType::f32, {1 << 18}, big.data()}});
    } catch (const Error& e) {
      msg = e.what();
    }
    try {  // an existing file is left untouched by a failed overwrite
      safetensors_write(d.file("keep.safetensors"), {{"big", DType::f32, {1 << 18}, big.data()}});
    } catch (const Error&) {
    }
  }

  EXPECT_NE(msg.find("big.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("writing tensor 'big'"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.file("big.safetensors")));
  int entries = 0;
  for (auto& e : fs::directory_iterator(d.path())) {
    EXPECT_EQ(e.path().filename(), "keep.safetensors");
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  SafetensorsIndex idx = SafetensorsIndex::open(d.file("keep.safetensors"));
  EXPECT_NE(idx.find("old"), nullptr);
}
