// Golden test on the GPU: `dflash_mpi extract --device cuda` on every model under tests/golden/data must
// reproduce the hidden states Hugging Face computed in float32 (the CPU twin is tests/unit/test_golden.cpp)
// about as well as Hugging Face itself does in bf16 on the GPU (hf_bf16_error.json beside each golden,
// written by make_golden.py --hf-bf16). Checks the loader into bf16, the fused layouts and the CUDA forward
// end to end. Skips itself without a device or without a CUDA build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/strfmt.h"
#include "tests/unit/golden_util.h"

#ifdef DF_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace {

using namespace df::golden;

// Tolerance, anchored to the peer (issues 15, 27). Per dataset, our relative RMS error ||a − b|| / ||b|| and
// our tail, the mean of the largest 1 % of |a − b|, against the fp32 golden must each be at most 1.25x what HF
// transformers itself gets in bf16 on CUDA (sdpa attention, flash-linear-attention DeltaNet: the peer users would
// otherwise run) on the same checkpoint and tokens, measured by make_golden.py --hf-bf16 with the same
// definitions. Why an anchor and not a fixed number: bf16's error is not derivable up front, random DeltaNet
// gates and norms amplify it layer by layer by model-dependent factors (HF-bf16 itself ranges from ~1e-2 rel RMS
// on the dense models to ~4e-2 on the hybrids). Why 1.25: our fused kernels round at other points than HF's
// unfused ops (once, at the store: kernels/primitives/device_math.cuh), so each element's error is another draw than HF's;
// a real precision loss (an intermediate, a softmax sum, the DeltaNet state or a norm's statistics kept in bf16
// where HF keeps fp32) shows up as 2x or more on every dataset after it.
// Why the tail and not the single worst element (issue 27 item 5, measured on the H200 goldens): on the
// hybrids the largest errors sit on tokens where one DeltaNet head's output nearly cancels (rms(o) at 0.06-0.17x
// its head's median; tests/golden/conditioning.py), and the gated RMSNorm divides by it, turning a bf16-sized
// error into one 6-16x larger, whoever computed it. The worst element of a tap is then one draw from a heavy
// tail (HF's own worst is 8-15x its RMS error), and it flips between implementations of equal precision: on
// qwen35_long ours is at 1.81x HF's max abs and the exact fp32 DeltaNet
// (DFLASH_KERNEL_VARIANTS=gdn=recurrent) at 2.42x, while both are at 0.86-0.99x HF's rel RMS and 0.91-1.00x
// HF's tail mean on every tap. The 1 % tail averages
// 180-1000 of those draws and still moves by a row that is wrong: one wrong 48-wide row in a 100 K-element tap
// raises it ~1.5x. The single worst element keeps a ceiling, 4x HF's (the fp32-DeltaNet draw above plus
// margin), which an isolated element gone wrong (O(1)) still exceeds.
constexpr double kPeerFactor = 1.25;
constexpr double kTailFraction = 0.01;  // make_golden.py TAIL_FRACTION
constexpr double kMaxAbsCeiling = 4.0;
// An absolute ceiling as well: the rel RMS measured on the H200 (2026-11-29) was 1.2e-2 after 3 Qwen3
// layers and 3.2e-2 after 4 Qwen3.5 layers, and the wiring bugs this test also exists for (w vs 1 + w, RoPE
// span, key-head mapping, conv offset, a skipped or mis-fused tensor) give 0.3 to 1; 8e-2 (2.5x the worst
// measured) keeps catching them should the peer's own error on some model be large. Where HF-bf16's own error
// already passes that ceiling (qwen35moe_tiny: HF-bf16 0.143 at the final norm, where our CUDA extract
// measured 1.00-1.02x HF on every tap; the cause, likely routing flips in a tiny random MoE, is not yet
// studied), the ceiling is HF's own bound instead, and that golden must still keep 1.25x HF's error below the
// wiring bugs' 0.3, or it cannot tell a bug from HF's own rounding.
constexpr double kMaxRelRms = 8e-2;
constexpr double kWiringBugRelRms = 0.3;
// Elementwise statistics are reported against this (the CPU test's scale of interest), not asserted.
constexpr double kAtol = 5e-2;
constexpr double kRtol = 5e-2;
constexpr double kRelFloor = 1e-2;
constexpr const char* kPeerFile = "hf_bf16_error.json";

struct PeerError {
  double max_abs = 0, rel_rms = 0, tail_mean_abs = 0;
  std::string worst;  // where HF's own worst element is, with its values ("" in files written before it was kept)
};

// HF-bf16's error per dataset for `model`; a missing file or dataset fails the test with what to regenerate.
void read_peer_errors(const std::string& model, std::map<std::string, PeerError>& out, std::string& kernels) {
  const fs::path path = fs::path(DF_TEST_DATA) / model / kPeerFile;
  const std::string hint =
      "HINT: on the GPU machine run `python3 tests/golden/make_golden.py --hf-bf16 --out "
      "/tmp/golden --models " +
      model + "` and copy /tmp/golden/" + model + "/" + kPeerFile + " into tests/golden/data/" + model +
      "/ (tests/golden/README.md)";
  ASSERT_TRUE(fs::exists(path)) << path << " is missing: no HF-bf16 error to anchor the tolerance. " << hint;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
    kernels = j.value("gdn_kernels", "");
    for (const auto& [name, e] : j.at("datasets").items()) {
      if (!e.contains("tail_mean_abs") || e.at("tail_fraction").get<double>() != kTailFraction)
        FAIL() << path << ": dataset '" << name << "' has no tail_mean_abs of the largest " << 100 * kTailFraction
               << " % (written before issue 27's tail rule). " << hint;
      out[name] = PeerError{e.at("max_abs").get<double>(), e.at("rel_rms").get<double>(),
                            e.at("tail_mean_abs").get<double>(), ""};
      if (e.contains("worst_at") && e.at("worst_at").size() == 2)
        out[name].worst = df::strfmt("[%lld, %lld] HF %.5g want %.5g", e.at("worst_at")[0].get<long long>(),
                                     e.at("worst_at")[1].get<long long>(), e.at("worst_got").get<double>(),
                                     e.at("worst_want").get<double>());
    }
  } catch (const nlohmann::json::exception& e) {
    FAIL() << path << ": " << e.what() << ". " << hint;
  }
}

// Where |a − b| is largest, for the report.
struct Worst {
  size_t index = 0;
  double got = 0, want = 0;
};

Worst worst_element(const std::vector<double>& got, const std::vector<double>& want) {
  Worst w;
  double d = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isfinite(got[i]) && std::fabs(got[i] - want[i]) > d)
      d = std::fabs(got[i] - want[i]), w = {i, got[i], want[i]};
  return w;
}

bool have_device() {
#ifdef DF_HAVE_CUDA
  return df::cuda_device_count() > 0;
#else
  return false;
#endif
}

// The mean of the largest kTailFraction of |got − want| (at least one element): make_golden.py's tail_mean_abs.
double tail_mean_abs(const std::vector<double>& got, const std::vector<double>& want) {
  std::vector<double> d(want.size());
  for (size_t i = 0; i < want.size(); ++i) d[i] = std::fabs(got[i] - want[i]);
  const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(double(d.size()) * kTailFraction)));
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(k - 1), d.end(), std::greater<double>());
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += d[i];
  return sum / double(k);
}

double rel_rms(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Every golden case: skipped without a device, else the model's HF-bf16 errors read (or the test fails there).
class GoldenExtractCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU golden test skipped";
    read_peer_errors(GetParam(), peer_, peer_kernels_);
  }
  std::map<std::string, PeerError> peer_;
  std::string peer_kernels_;
};

TEST_P(GoldenExtractCuda, MatchesTransformersInBf16) {
  const std::string model = GetParam();
  ScratchDir tmp("cuda_" + model);
  std::unique_ptr<H5File> want_file, got_file;
  std::vector<std::string> names;
  golden_extract_and_open(model, "cuda", tmp, want_file, got_file, names);
  if (HasFatalFailure()) return;
  std::printf(
      "[golden-cuda] %s: ours vs HF-bf16 (DeltaNet: %s), both against the fp32 golden; pass: rel rms and "
      "the largest-1 %% mean <= %.2fx HF's, max abs <= %.1fx HF's, rel rms <= %.0e (or 1.25x HF where HF "
      "passes it)\n",
      model.c_str(), peer_kernels_.empty() ? "none" : peer_kernels_.c_str(), kPeerFactor, kMaxAbsCeiling,
      kMaxRelRms);
  double worst_abs_ratio = 0, worst_rms_ratio = 0, worst_tail_ratio = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(model + "/" + name);
    Dataset want = read_dataset(want_file->id, name), got = read_dataset(got_file->id, name);
    ASSERT_TRUE(want.ok) << "cannot read " << name << " from expected.h5";
    ASSERT_TRUE(got.ok) << "extract's output lacks dataset '" << name << "'";
    ASSERT_EQ(got.dims, want.dims) << name << ": shape differs";
    if (name == "offsets") {
      EXPECT_EQ(got.values, want.values) << "offsets must be copied from the token file";
      continue;
    }
    auto it = peer_.find(name);
    ASSERT_NE(it, peer_.end()) << kPeerFile << " of " << model << " has no figure for dataset '" << name
                              << "'; regenerate it with make_golden.py --hf-bf16 (tests/golden/README.md)";
    const PeerError& hf = it->second;
    Errors e = compare(got.values, want.values, kAtol, kRtol, kRelFloor);
    const double rms = rel_rms(got.values, want.values);
    const Worst w = worst_element(got.values, want.values);
    const size_t cols = want.dims.size() > 1 ? want.dims[1] : 1;
    const double tail = tail_mean_abs(got.values, want.values);
    const double abs_ratio = e.max_abs / std::max(hf.max_abs, 1e-300),
                 rms_ratio = rms / std::max(hf.rel_rms, 1e-300),
                 tail_ratio = tail / std::max(hf.tail_mean_abs, 1e-300);
    if (name != "embeddings") {  // a bf16 cast of the table: the same bits as HF's, 1.00x on every statistic
      worst_abs_ratio = std::max(worst_abs_ratio, abs_ratio);
      worst_rms_ratio = std::max(worst_rms_ratio, rms_ratio);
      worst_tail_ratio = std::max(worst_tail_ratio, tail_ratio);
    }
    std::printf(
        "[golden-cuda] %-22s %-11s rel rms ours %.3e HF %.3e (%.2fx)  top-1%% mean ours %.3e HF %.3e (%.2fx)  "
        "max abs ours %.3e HF %.3e (%.2fx)  worst [%zu, %zu] ours %.5g want %.5g  worst/tol %.3f%s%s\n",
        model.c_str(), name.c_str(), rms, hf.rel_rms, rms_ratio, tail, hf.tail_mean_abs, tail_ratio, e.max_abs,
        hf.max_abs, abs_ratio,
        w.index / cols, w.index % cols, w.got, w.want, e.worst_ratio, hf.worst.empty() ? "" : "  HF's worst ",
        hf.worst.c_str());
    EXPECT_EQ(e.nan, 0) << name << ": non-finite values in extract's output";
    EXPECT_LE(tail, kPeerFactor * hf.tail_mean_abs)
        << name << ": the mean of the largest 1 % of |error|, " << tail << ", exceeds " << kPeerFactor
        << " x HF-bf16's " << hf.tail_mean_abs;
    EXPECT_LE(e.max_abs, kMaxAbsCeiling * hf.max_abs)
        << name << " " << got.dims[0] << "x" << cols << ": max abs error " << e.max_abs << " at ["
        << w.index / cols << ", " << w.index % cols << "] (ours " << w.got << ", golden " << w.want
        << ") exceeds " << kMaxAbsCeiling << " x HF-bf16's " << hf.max_abs;
    EXPECT_LE(rms, kPeerFactor * hf.rel_rms) << name << ": relative RMS error " << rms << " exceeds "
                                             << kPeerFactor << " x HF-bf16's " << hf.rel_rms;
    EXPECT_LE(rms, std::max(kMaxRelRms, kPeerFactor * hf.rel_rms))
        << name << ": relative RMS error over the dataset";
    EXPECT_LT(kPeerFactor * hf.rel_rms, kWiringBugRelRms)
        << name << ": HF-bf16's own error on this golden, " << hf.rel_rms
        << ", is too large for it to tell a wiring bug from rounding; HINT: a golden with clearer router "
           "margins";
  }
  std::printf(
      "[golden-cuda] %-22s worst ratio to HF-bf16 over the layers and the final norm: rel rms %.2fx, top-1%% mean "
      "%.2fx, max abs %.2fx\n",
      model.c_str(), worst_rms_ratio, worst_tail_ratio, worst_abs_ratio);
}

// Issue 16's fidelity figure on the HF goldens: `extract --device cuda --target-dtype fp8` against the fp32
// golden, per dataset, next to HF-bf16's own error on the same model, tokens and dataset. Bound, anchored to
// that error as the bf16 test is: e4m3 keeps 4 significant bits where bf16 keeps 8, a unit roundoff 2^-4
// against 2^-8, and the model amplifies a rounding error the same way whichever format made it (random
// DeltaNet gates and norms amplify it several-fold layer by layer, so no per-layer constant holds across
// models: the tiny hybrid's third layer sits at 0.26 rel RMS where the dense model's sits at 0.10). So FP8's
// rel RMS is at most 16x HF-bf16's (measured on the H200: 7.3-8.5x on every dataset of the three goldens FP8
// runs); a wrong scale or a lost row gives O(1), 30x and more of HF's. A golden whose shapes the FP8 GEMMs
// refuse (a K or N not a multiple of 16: the odd-shape goldens, deliberately) is skipped with the loader's
// message, which names the tensor. Floor: FP8 taps at least 1e-3 from the golden (else the FP8 path did not
// run). The MoE goldens run their experts in FP8 too (the grouped FP8 GEMM of kernels/moe/moe_fp8_gemm.cu):
// per output channel where the checkpoint is f32, and on the block-scaled FP8 checkpoints make_moe_golden.py
// writes as the Qwen FP8 releases are (qwen35moe_fp8, qwen3moe_fp8_fused) with their own 128x128 blocks and
// 128-column input groups, against an fp32 golden of the dequantised model.
constexpr double kFp8PeerFactor = 16.0;
TEST_P(GoldenExtractCuda, Fp8TapsWithin16xHfBf16Error) {
  const std::string model = GetParam();
  ScratchDir tmp("cuda_fp8_" + model);
  const fs::path dir = fs::path(DF_TEST_DATA) / model, out = tmp.path / "out.h5", log = tmp.path / "extract.log";
  const std::string cmd = extract_command(dir, dir / "tokens.h5", out, "cuda", "--target-dtype fp8");
  if (run_logged(cmd, log) != 0) {
    const std::string text = read_text(log);
    if (text.find("multiples of 16") != std::string::npos)
      GTEST_SKIP() << model << ": the FP8 GEMMs refuse its shapes: " << text;
    FAIL() << cmd << "\nfailed; its output:\n" << text;
  }
  H5File want_file(dir / "expected.h5", H5F_ACC_RDONLY), got_file(out, H5F_ACC_RDONLY);
  ASSERT_GE(got_file.id, 0) << out;
  for (const std::string& name : dataset_names(want_file.id)) {
    if (name == "offsets" || name == "tokens") continue;
    SCOPED_TRACE(model + "/" + name);
    Dataset want = read_dataset(want_file.id, name), got = read_dataset(got_file.id, name);
    ASSERT_TRUE(want.ok && got.ok && got.dims == want.dims) << name << ": missing or reshaped in extract's output";
    auto hf = peer_.find(name);
    ASSERT_NE(hf, peer_.end()) << kPeerFile << " of " << model << " has no figure for dataset '" << name << "'";
    const double rms = rel_rms(got.values, want.values), bound = kFp8PeerFactor * hf->second.rel_rms;
    const Worst w = worst_element(got.values, want.values);
    const size_t cols = want.dims.size() > 1 ? want.dims[1] : 1;
    std::printf("[golden-cuda-fp8] %-22s %-11s FP8 vs fp32 golden: rel rms %.3e = %.1fx HF-bf16's %.3e (bound "
                "%.0fx), max abs %.3e at [%zu, %zu] (%.5g vs %.5g), HF-bf16's %.3e\n",
                model.c_str(), name.c_str(), rms, rms / std::max(hf->second.rel_rms, 1e-300), hf->second.rel_rms,
                kFp8PeerFactor, std::fabs(w.got - w.want), w.index / cols, w.index % cols, w.got, w.want,
                hf->second.max_abs);
    if (name == "embeddings") continue;  // a bf16 lookup before any FP8 GEMM (MatchesTransformersInBf16)
    EXPECT_LE(rms, bound) << name << ": worst at [" << w.index / cols << ", " << w.index % cols << "]: FP8 "
                          << w.got << " vs golden " << w.want;
    EXPECT_GE(rms, 1e-3) << name << ": FP8 taps equal the fp32 golden: the FP8 path did not run";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenExtractCuda, ::testing::ValuesIn(golden_models()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
