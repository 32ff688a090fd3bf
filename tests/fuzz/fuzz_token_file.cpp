// libFuzzer target: HDF5 token files. The input does not become HDF5 bytes (that would fuzz libhdf5's own
// binary parser, which this project cannot fix); it chooses the file's structure: which datasets exist, their
// element types, ranks, lengths and values, and the vocab_size attribute. The reader (token_file_read) and
// the corpus (TokenCorpus: open, scan, read) must accept it or refuse it with a df::Error.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/h5_util.h"
#include "data/token_file.h"
#include "fuzz_util.h"

namespace {

const hid_t kTypes[4] = {H5T_NATIVE_INT32, H5T_NATIVE_INT64, H5T_NATIVE_UINT8, H5T_NATIVE_FLOAT};

// A dataset `name` of one of the types above, 1-D (or 2-D with 1 column), holding values from the input.
void write_dataset(FuzzedDataProvider& in, hid_t file, const char* name, hid_t usual_type, size_t n) {
  const hid_t type = in.ConsumeBool() ? usual_type : kTypes[in.ConsumeIntegralInRange(0, 3)];
  const int rank = in.ConsumeIntegralInRange(0, 9) == 0 ? 2 : 1;
  hsize_t dims[2] = {hsize_t(n), 1};
  std::vector<int64_t> v(n);
  for (auto& x : v) x = in.ConsumeIntegral<int64_t>();
  if (usual_type == H5T_NATIVE_INT64 &&
      in.ConsumeBool())  // offsets: often sorted, to get past the first check
    for (size_t i = 0; i < n; ++i) v[i] = int64_t(i) * in.ConsumeIntegralInRange<int64_t>(0, 3);
  if (usual_type == H5T_NATIVE_UINT8 && in.ConsumeBool())
    for (auto& x : v) x &= 1;
  std::vector<char> buf(n * 8);
  for (size_t i = 0; i < n; ++i) {
    if (type == H5T_NATIVE_INT32) reinterpret_cast<int32_t*>(buf.data())[i] = int32_t(v[i]);
    if (type == H5T_NATIVE_INT64) reinterpret_cast<int64_t*>(buf.data())[i] = v[i];
    if (type == H5T_NATIVE_UINT8) reinterpret_cast<uint8_t*>(buf.data())[i] = uint8_t(v[i]);
    if (type == H5T_NATIVE_FLOAT) reinterpret_cast<float*>(buf.data())[i] = float(v[i]);
  }
  df::H5Handle space(H5Screate_simple(rank, dims, nullptr), H5Sclose);
  df::H5Handle d(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (n > 0) H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string path = df_fuzz::scratch_dir() + "/tokens.h5";
  {
    df::H5Quiet quiet;
    df::H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 300);
    if (in.ConsumeIntegralInRange(0, 15) != 0) write_dataset(in, file.get(), "tokens", H5T_NATIVE_INT32, n);
    if (in.ConsumeIntegralInRange(0, 15) != 0)
      write_dataset(in, file.get(), "offsets", H5T_NATIVE_INT64, in.ConsumeIntegralInRange<size_t>(0, 40));
    if (in.ConsumeBool())
      write_dataset(in, file.get(), "loss_mask", H5T_NATIVE_UINT8,
                    in.ConsumeBool() ? n : in.ConsumeIntegral<uint8_t>());
    if (in.ConsumeBool()) {
      const int64_t vocab = in.ConsumeIntegral<int64_t>();
      df::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
      df::H5Handle a(H5Acreate2(file.get(), "vocab_size", in.ConsumeBool() ? H5T_STD_I64LE : H5T_IEEE_F64LE,
                                space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose);
      H5Awrite(a.get(), H5T_NATIVE_INT64, &vocab);
    }
  }
  const int64_t vocab = in.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
  const int64_t max_len = in.ConsumeIntegralInRange<int64_t>(1, 1000);
  df_fuzz::expect_clean([&] { df::token_file_read(path); });
  df_fuzz::expect_clean([&] {
    df::TokenCorpus corpus({path});
    corpus.scan(vocab, max_len);
    if (corpus.num_sequences() > 0) {
      const int64_t len = corpus.sequence_length(0);
      std::vector<int32_t> t(static_cast<size_t>(len));
      std::vector<uint8_t> m(static_cast<size_t>(len));
      corpus.read(0, 0, len, t.data(), m.data());
    }
  });
  return 0;
}
