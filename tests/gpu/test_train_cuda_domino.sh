#!/usr/bin/env bash
# A Domino drafter (drafter.kind = "domino") on the GPU end to end: a CUDA target rank and a CUDA drafter rank
# share the GPU over the MPI feature channel for 40 steps of the tiny config with a Domino head (the drafter
# step's head and loss run kernels/train/domino_head.cu): the loss falls; the export then decodes
# speculatively on the GPU (`eval --device cuda`, Domino's own proposals) and prints τ over the prompts, each
# continuation of the asked length. That the committed tokens are the target's greedy ones is asserted by
# test_target_decode_cuda (DominoSpeculativeDecodingCommitsTheGreedyTokens). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/d.toml" "$TMP/d" 1 1 40
sed -i -e 's/^device = "cpu"$/device = "cuda"/' \
  -e '/^\[drafter\]/a kind = "domino"\npure_draft_prefix_len = 1\nshift_label = true\ngru_hidden_dim = 24\nemb_dim = 12' \
  -e '/^\[train\]/a lambda_base_start = 1.0\nlambda_base_decay_ratio = 0.5' "$TMP/d.toml"
if ! run_mpi 2 "$TMP/d.log" --config "$TMP/d.toml"; then fail "CUDA target + CUDA Domino drafter run"; tail -30 "$TMP/d.log"; fi
grep -q "drafter on cuda" "$TMP/d.log" || fail "the Domino drafter did not train on the CUDA backend"
loss_fell "CUDA Domino drafter" "$TMP/d/metrics.jsonl" 40
kind_cuda_eval "Domino drafter" "$TMP/d.toml"
echo "$fails failed"
[ "$fails" -eq 0 ]
