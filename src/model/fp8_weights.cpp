// Block-scaled FP8 weights: dequantising a checkpoint tensor with its weight_scale_inv, and the per-block
// quantiser that writes such checkpoints. The e4m3 format itself is core/fp8.h.
#include "model/fp8_weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp8.h"

namespace df {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

std::string fp8_scale_name(const std::string& weight_name) {
  return weight_name + "_scale_inv";
}

std::vector<int64_t> fp8_scale_shape(int64_t N, int64_t K, int block_n, int block_k) {
  return {ceil_div(N, block_n), ceil_div(K, block_k)};
}

const uint8_t* fp8_block_codes(const SafetensorsIndex& st, const StTensor& q, int block_n, int block_k,
                               std::vector<float>& scale) {
  DF_CHECK(q.dtype == DType::f8_e4m3, "fp8_dequantize: tensor '%s' in %s is %s, not F8_E4M3", q.name.c_str(),
           q.file.c_str(), dtype_name(q.dtype));
  DF_CHECK(block_n > 0 && block_k > 0, "fp8_dequantize: tensor '%s': block size %dx%d must be positive",
           q.name.c_str(), block_n, block_k);
  DF_CHECK(
      q.shape.size() == 2 || q.shape.size() == 3,
      "%s: tensor '%s' is F8_E4M3 with shape %s; block-scaled FP8 is only read for 2-D weights and the 3-D "
      "fused experts; HINT: this tensor must be stored in bf16 (re-download or re-quantise the checkpoint)",
      q.file.c_str(), q.name.c_str(), st_shape_text(q.shape).c_str());
  const bool stacked = q.shape.size() == 3;  // [E, N, K]: E matrices, each in its own blocks
  const int64_t mats = stacked ? q.shape[0] : 1, N = q.shape[stacked ? 1 : 0], K = q.shape.back();
  std::vector<int64_t> want = fp8_scale_shape(N, K, block_n, block_k);
  if (stacked) want.insert(want.begin(), mats);
  const std::string sname = fp8_scale_name(q.name);
  const StTensor* s = st.find(sname);
  DF_CHECK(s != nullptr,
           "%s: tensor '%s' is F8_E4M3 but its block scales '%s' are missing from the checkpoint; HINT: the "
           "download is incomplete, or the FP8 format is not the block-scaled one (weight_block_size)",
           q.file.c_str(), q.name.c_str(), sname.c_str());
  DF_CHECK(s->dtype == DType::f32 || s->dtype == DType::bf16,
           "%s: tensor '%s' (scales of '%s') is %s; block scales must be F32 or BF16", s->file.c_str(),
           sname.c_str(), q.name.c_str(), dtype_name(s->dtype));
  DF_CHECK(s->shape == want,
           "%s: tensor '%s' has shape %s but '%s' %s in %dx%d blocks needs %s; HINT: config.json's "
           "quantization_config.weight_block_size does not match the weights",
           s->file.c_str(), sname.c_str(), st_shape_text(s->shape).c_str(), q.name.c_str(),
           st_shape_text(q.shape).c_str(), block_n, block_k, st_shape_text(want).c_str());
  scale.resize(static_cast<size_t>(mats * ceil_div(N, block_n) * ceil_div(K, block_k)));
  st_to_f32(*s, scale.data());
  const uint8_t* codes = static_cast<const uint8_t*>(q.data);
  int64_t bad = INT64_MAX;  // first NaN code, reported after the parallel loop
#pragma omp parallel for schedule(static) reduction(min : bad)
  for (int64_t i = 0; i < mats * N * K; ++i)
    if ((codes[i] & 0x7fu) == 0x7fu) bad = std::min(bad, i);
  DF_CHECK(bad == INT64_MAX,
           "%s: tensor '%s' holds the e4m3 NaN code at [%lld, %lld] (row counted over all experts of a fused "
           "tensor); HINT: the checkpoint is corrupt",
           q.file.c_str(), q.name.c_str(), static_cast<long long>(bad / K), static_cast<long long>(bad % K));
  return codes;
}

void fp8_dequantize(const SafetensorsIndex& st, const StTensor& q, int block_n, int block_k, float* out) {
  std::vector<float> scale;
  const uint8_t* codes = fp8_block_codes(st, q, block_n, block_k, scale);
  const bool stacked = q.shape.size() == 3;
  const int64_t N = q.shape[stacked ? 1 : 0], K = q.shape.back(), kb = ceil_div(K, block_k),
                nb = ceil_div(N, block_n);
  const int64_t rows = (stacked ? q.shape[0] : 1) * N;
  std::array<float, 256> lut;
  for (int c = 0; c < 256; ++c) lut[c] = e4m3_to_f32(static_cast<uint8_t>(c));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* qr = codes + r * K;
    const float* sr = scale.data() + ((r / N) * nb + (r % N) / block_n) * kb;
    float* o = out + r * K;
    for (int64_t c = 0; c < K; ++c) o[c] = lut[qr[c]] * sr[c / block_k];
  }
}

void fp8_quantize(const float* w, int64_t N, int64_t K, int block_n, int block_k, uint8_t* q,
                  float* scale_inv) {
  DF_CHECK(block_n > 0 && block_k > 0, "fp8_quantize: block size %dx%d must be positive", block_n, block_k);
  const int64_t nb = ceil_div(N, block_n), kb = ceil_div(K, block_k);
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t bj = 0; bj < kb; ++bj) {
      const int64_t r1 = std::min(N, (bi + 1) * block_n), c1 = std::min(K, (bj + 1) * block_k);
      float amax = 0.0f;
      for (int64_t r = bi * block_n; r < r1; ++r)
        for (int64_t c = bj * block_k; c < c1; ++c) {
          const float v = w[r * K + c];
          DF_CHECK(std::isfinite(v), "fp8_quantize: weight [%lld, %lld] is %g; only finite weights quantise",
                   static_cast<long long>(r), static_cast<long long>(c), double(v));
          amax = std::max(amax, std::fabs(v));
        }
      const float s = e4m3_scale(amax), inv = e4m3_inv_scale(s);
      scale_inv[bi * kb + bj] = s;
      for (int64_t r = bi * block_n; r < r1; ++r)
        for (int64_t c = bj * block_k; c < c1; ++c) q[r * K + c] = e4m3_quantize(w[r * K + c], inv);
    }
}

bool fp8_quantized_weight(const std::string& name) {
  if (name.find("layers.") == std::string::npos) return false;
  // The MLP's projections: the dense mlp.*_proj, every routed expert's (mlp.experts.{e}.*_proj.weight, or the
  // fused mlp.experts.gate_up_proj / down_proj) and the shared expert's; the router mlp.gate and the
  // shared_expert_gate are not among them.
  static const char* suffixes[] = {"self_attn.q_proj.weight",
                                   "self_attn.k_proj.weight",
                                   "self_attn.v_proj.weight",
                                   "self_attn.o_proj.weight",
                                   "linear_attn.in_proj_qkv.weight",
                                   "linear_attn.in_proj_z.weight",
                                   "linear_attn.in_proj_qkvz.weight",
                                   "linear_attn.out_proj.weight",
                                   ".gate_proj.weight",
                                   ".up_proj.weight",
                                   ".down_proj.weight",
                                   "mlp.experts.gate_up_proj",
                                   "mlp.experts.down_proj"};
  return std::any_of(std::begin(suffixes), std::end(suffixes),
                     [&](const char* s) { return ends_with(name, s); });
}

}  // namespace df
