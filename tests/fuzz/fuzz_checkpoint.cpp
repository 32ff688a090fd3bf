// libFuzzer target: checkpoint files. As for token files, the input does not become HDF5 bytes (libhdf5's own
// parser is not ours to fix): it edits a valid checkpoint of a tiny drafter through the HDF5 API (objects
// deleted or added, tensors replaced by other shapes and types, root attributes rewritten, the stored
// drafter_config JSON and config text replaced by input text). checkpoint_read_header and checkpoint_load
// must load it or refuse it with a df::Error, and a refused load must leave the model as it was.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/h5_util.h"
#include "fuzz_util.h"
#include "ops/cpu/cpu_train_ops.h"
#include "train/checkpoint.h"

namespace {

df::DrafterConfig tiny() {
  df::DrafterConfig c;
  c.hidden = 8;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.intermediate = 12;
  c.vocab = 11;
  c.mask_token_id = 10;
  c.block_size = 4;
  c.target_layer_ids = {0, 1};
  c.layer_types = {df::DrafterLayerType::full};
  c.num_anchors = 3;
  return c;
}

df::CpuTrainOps& ops() {
  static df::CpuTrainOps o;
  return o;
}

const std::string& base_checkpoint() {
  static const std::string path = [] {
    df::DrafterModel m(tiny(), ops());
    df::drafter_init_params(m, 1);
    df::CheckpointState st;
    st.step = 3;
    st.batch_cursor = 6;
    st.config_text = "[drafter]\nmask_token_id = 10\n";
    return df::checkpoint_save(df_fuzz::scratch_dir() + "/base", m, st, 1);
  }();
  return path;
}

const char* kRoot[] = {"params", "adam_m", "adam_v", "config_text", "drafter_config", "extra"};
const char* kAttrs[] = {"format_version",   "step",   "batch_cursor", "tokens_seen",
                        "data_fingerprint", "created"};
const char* kTensors[] = {"params/fc.weight", "adam_m/norm.weight", "adam_v/layers.0.mlp.up_proj.weight",
                          "params/layers.0.self_attn.q_norm.weight", "params/bogus"};

void put_string(hid_t file, const char* name, const std::string& text) {
  H5Ldelete(file, name, H5P_DEFAULT);
  df::H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, text.size()));
  df::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  df::H5Handle d(H5Dcreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  std::string buf = text.empty() ? std::string(1, '\0') : text;
  H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
}

void mutate(FuzzedDataProvider& in, hid_t file) {
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      H5Ldelete(file, kRoot[in.ConsumeIntegralInRange(0, 5)], H5P_DEFAULT);
      break;
    case 1: {  // a tensor replaced: rank 1-3, small dims, f32 / f64 / i32
      const char* name = kTensors[in.ConsumeIntegralInRange(0, 4)];
      H5Ldelete(file, name, H5P_DEFAULT);
      const int rank = in.ConsumeIntegralInRange(1, 3);
      hsize_t dims[3];
      hsize_t n = 1;
      for (int i = 0; i < rank; ++i) n *= dims[i] = in.ConsumeIntegralInRange<hsize_t>(0, 40);
      const hid_t types[3] = {H5T_NATIVE_FLOAT, H5T_NATIVE_DOUBLE, H5T_NATIVE_INT32};
      const hid_t type = types[in.ConsumeIntegralInRange(0, 2)];
      std::vector<double> v(size_t(n) + 1, in.ConsumeFloatingPoint<double>());
      df::H5Handle space(H5Screate_simple(rank, dims, nullptr), H5Sclose);
      df::H5Handle d(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
      if (n > 0) H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      break;
    }
    case 2: {  // a root attribute rewritten with another value or type, or removed
      const char* name = kAttrs[in.ConsumeIntegralInRange(0, 5)];
      H5Adelete(file, name);
      if (in.ConsumeBool()) break;
      const int64_t value = in.ConsumeIntegral<int64_t>();
      const hid_t types[3] = {H5T_STD_I64LE, H5T_STD_I32LE, H5T_IEEE_F64LE};
      df::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
      df::H5Handle a(H5Acreate2(file, name, types[in.ConsumeIntegralInRange(0, 2)], space.get(), H5P_DEFAULT,
                                H5P_DEFAULT),
                     H5Aclose);
      H5Awrite(a.get(), H5T_NATIVE_INT64, &value);
      break;
    }
    case 3:
      put_string(file, "drafter_config", in.ConsumeRandomLengthString(2000));
      break;
    case 4:
      put_string(file, "config_text", in.ConsumeRandomLengthString(2000));
      break;
    default: {
      df::H5Handle g(
          H5Gcreate2(file, kRoot[in.ConsumeIntegralInRange(0, 5)], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Gclose);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string path = df_fuzz::scratch_dir() + "/work.h5";
  std::filesystem::copy_file(base_checkpoint(), path, std::filesystem::copy_options::overwrite_existing);
  {
    df::H5Quiet quiet;
    df::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    for (int k = in.ConsumeIntegralInRange(1, 4); k > 0; --k) mutate(in, file.get());
  }
  df_fuzz::expect_clean([&] { df::checkpoint_read_header(path); });
  df::DrafterModel m(tiny(), ops());
  std::memset(m.params.data, 0x5a, size_t(m.table().total) * 4);
  std::vector<char> before(static_cast<char*>(m.params.data),
                           static_cast<char*>(m.params.data) + m.table().total * 4);
  try {
    df::checkpoint_load(path, m);
  } catch (const df::Error&) {
    if (std::memcmp(before.data(), m.params.data, before.size()) != 0)
      std::abort();  // a refused load changed it
  }
  return 0;
}
