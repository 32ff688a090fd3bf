#!/usr/bin/env bash
# A DSpark drafter (drafter.kind = "dspark") on the GPU end to end: a CUDA target rank and a CUDA drafter rank
# share the GPU over the MPI feature channel for 40 steps of the tiny config with an RNN Markov head and the
# confidence head over [h ; W1[prev]] (the drafter step's head and loss run kernels/train/dspark_head.cu, the
# target streams its final hidden state for the L1 term): the loss falls; the export then decodes
# speculatively on the GPU (`eval --device cuda`, DSpark's own proposals), with every proposal verified and
# with the confidence-based verify length, and prints τ over the prompts, each continuation of the asked
# length. That the committed tokens are the target's greedy ones is asserted by test_target_decode_cuda
# (DSparkSpeculativeDecodingCommitsTheGreedyTokens). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/d.toml" "$TMP/d" 1 1 40
sed -i -e 's/^device = "cpu"$/device = "cuda"/' \
  -e '/^\[drafter\]/a kind = "dspark"\nmarkov_rank = 8\nmarkov_head_type = "rnn"\nenable_confidence_head = true\nconfidence_head_with_markov = true\nconfidence_head_alpha = 1.0' \
  -e '/^\[train\]/a gamma = 4.0' "$TMP/d.toml"
if ! run_mpi 2 "$TMP/d.log" --config "$TMP/d.toml"; then fail "CUDA target + CUDA DSpark drafter run"; tail -30 "$TMP/d.log"; fi
grep -q "drafter on cuda" "$TMP/d.log" || fail "the DSpark drafter did not train on the CUDA backend"
loss_fell "CUDA DSpark drafter" "$TMP/d/metrics.jsonl" 40
kind_cuda_eval "DSpark drafter" "$TMP/d.toml" "" "--dspark-confidence 0.5"
echo "$fails failed"
[ "$fails" -eq 0 ]
