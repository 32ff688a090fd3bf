#!/usr/bin/env bash
# The shipped recipes as a user runs them before a job: configs/qwen3.6-35b-a3b.toml (a mixture-of-experts target)
# passes `config check` on the published Qwen3.6-35B-A3B config.json (tests/fixtures/models), with only its paths
# moved here, and `plan vram` fits it on an 80 GiB GPU in bf16 and in FP8; the same recipe on a Qwen3.5-122B-A10B is refused by
# `plan vram`, naming the weights' bytes and the GPU.
# Args: <dflash_mpi binary> <source dir>
BIN=$1
SRC=$2
source "$SRC/tests/cli/cli_common.sh"
FIX="$SRC/tests/fixtures/models"

"$BIN" data synth --out "$TMP/tokens.h5" --vocab 1000 --sequences 40 --min-len 64 --max-len 600 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }
# recipe NAME MODEL_DIR: configs/NAME.toml with target.model, data.train and run.dir moved to MODEL_DIR and $TMP.
recipe() {
  sed -E -e "s|^model = \"[^\"]*\"|model = \"$2\"|" -e "s|^train = \\[[^]]*\\]|train = [\"$TMP/tokens.h5\"]|" \
    -e "s|^dir = \"[^\"]*\"|dir = \"$TMP/run-$1\"|" "$SRC/configs/$1.toml" >"$TMP/$1.toml"
}

recipe qwen3.6-35b-a3b "$FIX/qwen3.6-35b-a3b"
out=$("$BIN" config check --config "$TMP/qwen3.6-35b-a3b.toml" 2>&1)
if [ $? -eq 0 ] && grep -q "config OK" <<<"$out" &&
   grep -q "MoE in 40 of 40 layers: top-8 of 256 experts" <<<"$out" &&
   grep -q "drafter: kind dflash, 6 layers, 385906176 trainable parameters, taps 1,6,11,16,22,27,32,37, block 16, \
mask id 248077" <<<"$out"; then
  echo "ok: config check passes the 35B-A3B recipe"
else
  echo "FAIL: config check of configs/qwen3.6-35b-a3b.toml"; echo "$out" | tail -20; fails=$((fails + 1))
fi

out=$("$BIN" plan vram --config "$TMP/qwen3.6-35b-a3b.toml" --gpu-mem 80 2>&1)
if [ $? -eq 0 ] && grep -q "verdict: fits (target 67.82 GiB, drafter 18.36 GiB, GPU 80.00 GiB)" <<<"$out"; then
  echo "ok: plan vram fits the 35B-A3B recipe on 80 GiB"
else
  echo "FAIL: plan vram of the 35B-A3B recipe"; echo "$out" | tail -20; fails=$((fails + 1))
fi

sed -e 's|^\[target\]|[target]\ndtype = "fp8"|' "$TMP/qwen3.6-35b-a3b.toml" >"$TMP/qwen3.6-35b-a3b-fp8.toml"
out=$("$BIN" plan vram --config "$TMP/qwen3.6-35b-a3b-fp8.toml" --gpu-mem 80 2>&1)
if [ $? -eq 0 ] && grep -q "verdict: fits (target 39.02 GiB, drafter 18.36 GiB, GPU 80.00 GiB)" <<<"$out" &&
   grep -q "MoE routed experts FP8 e4m3 + scales" <<<"$out"; then
  echo "ok: plan vram fits the 35B-A3B recipe in FP8 on 80 GiB with its experts as e4m3 codes"
else
  echo "FAIL: plan vram of the 35B-A3B recipe with target.dtype = fp8"; echo "$out" | tail -20; fails=$((fails + 1))
fi

big=("$BIN" plan vram --config "$TMP/qwen3.6-35b-a3b.toml" --target-config "$FIX/qwen3.5-122b-a10b" --gpu-mem 80)
expect_fail "The target's weights alone are 179.25 GiB (192463146496 B in bf16, the 38 layers up to the last tap) \
but one GPU has 80.00 GiB (--gpu-mem)" "${big[@]}"
out=$("${big[@]}" 2>&1)
grep -q "^verdict: DOES NOT FIT (target 190.60 GiB" <<<"$out" ||
  { echo "FAIL: no DOES NOT FIT verdict"; fails=$((fails + 1)); }
echo "$fails failed"
[ "$fails" -eq 0 ]
