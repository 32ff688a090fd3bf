// What the CPU backend's drafter-head loss ops share (cpu_domino.cpp, cpu_dflash2.cpp, cpu_dspark.cpp): the
// checks that a tensor is contiguous host memory of one dtype and shape (else the op throws naming itself and
// the argument), and a head loss's rows and statistics, block by block.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/loss_rows.h"

namespace df {

// Throws unless t is a contiguous host tensor of dtype dt and shape [rows, cols], naming the op and the
// argument.
void cpu_expect(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op, const char* what);

// The arguments every head-loss op shares (domino_head_loss, dflash2_selector_loss, dspark_head_loss):
// y [N, H] of whole blocks of B rows, lm_head [V, H], labels, row_w, argmax [1, N] and the statistics slots.
void cpu_expect_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& labels, const Tensor& row_w,
                          const Tensor& argmax, const Tensor& stats, int B, int H, int V, const char* op);

// The statistics of a head's loss op over `rows` block rows, block by block: Σ w·L, Σ w, the argmax of every
// weighted slot, and the accuracy and τ counts with slot k counted at block offset k + shift (the offset of
// its label; a slot past offset B − 1 is not counted), as loss_row_stats counts DFlash's rows.
class HeadLossStats {
 public:
  HeadLossStats(int64_t rows, int block, int shift);
  // Starts the block at row r0: its labels and weights (rows r0 .. r0 + B − 1) into block_labels and
  // block_weights (B each), argmax −1 on its rows. Returns whether any row carries weight (a block without
  // any, padding or unlabelled, has no loss and no gradient).
  bool open_block(int64_t r0, const int32_t* labels, const float* row_w, int32_t* argmax,
                  std::vector<int32_t>& block_labels, std::vector<double>& block_weights) const;
  // The block starting at row r0, whose Σ w·L is `loss`: its weighted slots' weights and the argmax of their
  // logits ([B, vocab] row-major) into argmax; weightless slots' argmax is left as it is.
  void add_block(int64_t r0, double loss, const float* logits, int vocab, const float* row_w,
                 const int32_t* labels, int32_t* argmax);
  // Adds everything to stats (LossStatsSlots f64 accumulators as u8 bytes).
  void add_to(const Tensor& stats);

 private:
  int block_, shift_;
  LossStats st_;
  std::vector<uint8_t> labelled_;
  std::vector<int32_t> argmax_, labels_;
};

// The CPU heads' loss ops over their N / B blocks: each block whose rows carry weight gets its labels and
// weights (and, where Rows has them, its previous tokens from `prev`) into a Rows, then block(r0, rows,
// logits) runs the head's block step and returns its Σ w·L with the block's [B, V] logits in `logits`; the
// statistics (slot k counted at offset k + shift) go to `stats`.
template <class Rows, class Block>
void cpu_head_blocks(const Tensor& labels, const Tensor* prev, const Tensor& row_w, const Tensor& argmax,
                     const Tensor& stats, int B, int V, int shift, Block block) {
  const int64_t N = labels.numel();
  const int32_t* lab = labels.ptr<int32_t>();
  const float* wr = row_w.ptr<float>();
  int32_t* am = argmax.ptr<int32_t>();
  HeadLossStats hs(N, B, shift);
  std::vector<float> logits(size_t(B) * size_t(V));
  Rows rows;
  for (int64_t r0 = 0; r0 + B <= N; r0 += B) {
    if (!hs.open_block(r0, lab, wr, am, rows.labels, rows.weights)) continue;
    if constexpr (requires(Rows r) { r.prev; })
      rows.prev.assign(prev->ptr<int32_t>() + r0, prev->ptr<int32_t>() + r0 + B);
    hs.add_block(r0, block(r0, rows, logits.data()), logits.data(), V, wr, lab, am);
  }
  hs.add_to(stats);
}

}  // namespace df
