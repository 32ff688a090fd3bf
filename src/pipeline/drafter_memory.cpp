// DrafterMemory (pipeline/drafter_memory.h): the frozen tables in the drafter backend's dtype and the staging
// of each batch's features, allocated once.
#include "pipeline/drafter_memory.h"

#include "core/dtype.h"
#include "core/error.h"

namespace df {

DrafterMemory::DrafterMemory(TrainOps& ops, const Tensor& embed, const Tensor& lm_head, int64_t max_tokens,
                             int64_t feat_cols, int64_t final_cols)
    : ops_(ops), host_(ops.device() == Device::cpu) {
  DF_CHECK(embed.device == Device::cpu && lm_head.device == Device::cpu,
           "drafter: the frozen tables must come from a host-loaded target");
  if (host_) {
    DF_CHECK(embed.dtype == DType::f32 && lm_head.dtype == DType::f32,
             "drafter: the CPU backend needs f32 frozen tables, the target loader gave %s",
             dtype_name(embed.dtype));
    embed_ = embed;
    lm_head_ = lm_head;
    return;
  }
  const bool tied = lm_head.data == embed.data;
  const size_t table = size_t(embed.numel()) * dtype_size(DType::bf16);
  const size_t taps = size_t(max_tokens * feat_cols) * dtype_size(DType::bf16);
  const size_t fin = size_t(max_tokens * final_cols) * dtype_size(DType::bf16);
  mem_ = static_cast<char*>(ops.alloc_bytes(table * (tied ? 1 : 2) + taps + fin));
  embed_ = upload_bf16(embed, mem_);
  lm_head_ = tied ? embed_ : upload_bf16(lm_head, mem_ + table);
  char* stage = mem_ + table * (tied ? 1 : 2);
  taps_ = tensor_make(stage, DType::bf16, ops.device(), max_tokens, feat_cols);
  if (final_cols > 0) final_ = tensor_make(stage + taps, DType::bf16, ops.device(), max_tokens, final_cols);
}

DrafterMemory::~DrafterMemory() {
  if (mem_) ops_.free_bytes(mem_);
}

DrafterBatch DrafterMemory::load(const FeaturePacket& p) {
  DrafterBatch b;
  b.offsets = p.offsets;
  b.tokens = p.tokens;
  b.loss_mask = p.loss_mask;
  const FeatureHeader& h = p.hdr;
  if (p.slot) {
    const char* fin = p.slot + WireLayout::final_offset(h.tokens, h.feat_cols);
    b.taps = in_slot(p.slot, p.slot_device, h.tokens, h.feat_cols, taps_f32_);
    if (h.final_cols > 0) b.target_hidden = in_slot(fin, p.slot_device, h.tokens, h.final_cols, final_f32_);
    return b;
  }
  b.taps = stage(p.features, h.feat_cols, taps_, taps_f32_);
  if (h.final_cols > 0) b.target_hidden = stage(p.final_hidden, h.final_cols, final_, final_f32_);
  return b;
}

Tensor DrafterMemory::in_slot(const char* at, Device where, int64_t rows, int64_t cols, std::vector<float>& f32) {
  if (host_) {
    DF_CHECK(where == Device::cpu, "drafter: a CPU drafter got its features in device memory (internal error)");
    return host_f32(reinterpret_cast<const uint16_t*>(at), rows, cols, f32);
  }
  DF_CHECK(where == ops_.device(), "drafter: features arrived in %s memory but the drafter trains on %s "
           "(internal error: the receive pool must come from the drafter's backend)",
           where == Device::cpu ? "host" : "device", ops_.name());
  return tensor_make(const_cast<char*>(at), DType::bf16, where, rows, cols);
}

Tensor DrafterMemory::host_f32(const uint16_t* bf16, int64_t rows, int64_t cols, std::vector<float>& f32) {
  f32.resize(size_t(rows * cols));
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = bf16_to_f32(bf16[i]);
  return tensor_make(f32.data(), DType::f32, Device::cpu, rows, cols);
}

Tensor DrafterMemory::upload_bf16(const Tensor& t, char* at) {
  std::vector<uint16_t> lp(size_t(t.numel()));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) {
      const char* src = t.row_bytes(r) + c * int64_t(dtype_size(t.dtype));
      lp[size_t(r * t.cols + c)] = t.dtype == DType::bf16 ? *reinterpret_cast<const uint16_t*>(src)
                                                          : f32_to_bf16(*reinterpret_cast<const float*>(src));
    }
  Tensor d = tensor_make(at, DType::bf16, ops_.device(), t.rows, t.cols);
  ops_.upload_raw(d, lp.data());
  return d;
}

Tensor DrafterMemory::stage(const std::vector<uint16_t>& bf16, int64_t cols, const Tensor& dev,
                            std::vector<float>& f32) {
  const int64_t rows = cols > 0 ? int64_t(bf16.size()) / cols : 0;
  if (host_) return host_f32(bf16.data(), rows, cols, f32);
  DF_CHECK(rows <= dev.rows && cols == dev.cols,
           "drafter: a batch of %lld x %lld features does not fit the staging buffer %s planned from "
           "data.token_budget; HINT: all ranks must run the same config",
           (long long)rows, (long long)cols, dev.shape_str().c_str());
  Tensor t = dev.rows_view(0, rows);
  ops_.upload_raw(t, bf16.data());
  return t;
}

}  // namespace df
