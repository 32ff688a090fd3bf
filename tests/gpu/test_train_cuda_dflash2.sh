#!/usr/bin/env bash
# A DFlash2 drafter (drafter.kind = "dflash2") on the GPU end to end: a CUDA target rank and a CUDA drafter rank
# share the GPU over the MPI feature channel for 40 steps of the tiny config as DFlash2 (3-tap convolutions in
# groups of 16 channels, a rank-12 selector over the top 6, α 0.5; the drafter step's convolutions and selector
# run kernels/train/dflash2_conv.cu, dflash2_selector.cu): the loss falls, and its first step's loss is the CPU
# drafter's on the same batch and anchors (within 3 %: bf16 activations against the fp32 oracle). The export
# then decodes speculatively on the GPU (`eval --device cuda`, the selector's lattice walk on the device) and
# prints τ over the prompts, each continuation of the asked length. That the committed tokens are the target's
# greedy ones is asserted by test_target_decode_cuda (Dflash2SpeculativeDecodingCommitsTheGreedyTokens). Skips
# (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
for dev in cuda cpu; do
  write_config "$TMP/$dev.toml" "$TMP/$dev" 1 1 40
  sed -i -e '/^\[drafter\]/a kind = "dflash2"\nconv_kernel_size = 3\nconv_group_size = 16\nselector_rank = 12\nselector_top_k = 6' \
    -e '/^\[train\]/a dflash2_selector_loss_alpha = 0.5' "$TMP/$dev.toml"
  # The target on the GPU in both runs (the same bf16 taps); the drafter on $dev.
  sed -i -e 's/^device = "cpu"$/device = "cuda"/' -e "/^\[drafter\]/a device = \"$dev\"" "$TMP/$dev.toml"
  if ! run_mpi 2 "$TMP/$dev.log" --config "$TMP/$dev.toml"; then
    fail "CUDA target + $dev DFlash2 drafter run"
    tail -30 "$TMP/$dev.log"
  fi
  grep -q "drafter on $dev" "$TMP/$dev.log" || fail "the DFlash2 drafter did not train on the $dev backend"
done
python3 - "$TMP/cuda/metrics.jsonl" "$TMP/cpu/metrics.jsonl" <<'PY' || fail "the CUDA DFlash2 drafter's loss"
import json, sys
g, c = ([json.loads(x)["loss"] for x in open(p) if '"loss"' in x] for p in sys.argv[1:3])
first, last = sum(g[:8]) / 8, sum(g[-8:]) / 8
print(f"CUDA DFlash2 drafter: {len(g)} steps, mean loss of the first 8 {first:.4f}, of the last 8 {last:.4f}; "
      f"first step {g[0]:.5f} (CPU drafter {c[0]:.5f})")
sys.exit(0 if len(g) == 40 and last < first and abs(g[0] - c[0]) <= 3e-2 * abs(c[0]) else 1)
PY

kind_cuda_eval "DFlash2 drafter" "$TMP/cuda.toml"
echo "$fails failed"
[ "$fails" -eq 0 ]
