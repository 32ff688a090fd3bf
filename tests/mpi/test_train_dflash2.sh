#!/usr/bin/env bash
# A DFlash2 drafter (drafter.kind = "dflash2") end to end on CPU ranks: configs/tiny-dflash2.toml and the
# Qwen3.6-27B recipe pass `config check` (the recipe's CUDA drafter is refused naming drafter.kind until the
# CUDA ops exist, and passes on drafter.device = "cpu"; its drafter is SpecForge 5943b2f6's
# configs/qwen3.6-27b-dflash2.json); 1 target + 2 drafters train with a falling loss; a resume continues
# bit-identically; the selector's α follows its warm-up step by step; the export is SpecForge's
# DFlash2DraftModel layout and decodes speculatively against the target (`eval`); a DFlash export starts a
# DFlash2 run (drafter.init_from).
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"

# The demo config as committed, its corpus and run dir moved here.
sed -e "s|runs/tiny/tokens.h5|$TMP/tokens.h5|" -e "s|\"runs/tiny-dflash2\"|\"$TMP/demo\"|" \
  -e "s|configs/tiny-target.json|$SRC/configs/tiny-target.json|" "$SRC/configs/tiny-dflash2.toml" >"$TMP/demo.toml"
"$BIN" config check --config "$TMP/demo.toml" >"$TMP/check.log" 2>&1 ||
  fail "config check of configs/tiny-dflash2.toml: $(tail -3 "$TMP/check.log")"
grep -q "dflash2: 2-tap convolutions in groups of 16 channels around every sublayer; selector rank 16 over the top 8" \
  "$TMP/check.log" || fail "config check does not describe DFlash2: $(grep -m1 dflash2 "$TMP/check.log")"

# The recipe against the fixture's target config and the test corpus; its drafter is the peer's.
recipe=qwen3.6-27b-dflash2
kind_recipes_check dflash2 cuda "$recipe:qwen3.6-27b" qwen3-8b-dflash2:qwen3-8b
python3 - "$SRC/configs/$recipe.toml" <<'PY' || fail "configs/$recipe.toml is not SpecForge's qwen3.6-27b-dflash2.json"
import sys, tomllib
d = tomllib.load(open(sys.argv[1], "rb"))["drafter"]
# SpecForge 5943b2f6 configs/qwen3.6-27b-dflash2.json, key by key (num_hidden_layers, num_attention_heads, ...).
peer = {"layers": 5, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 17408, "block_size": 8,
        "mask_token_id": 248070, "target_layer_ids": [5, 19, 33, 47, 61],
        "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "rope_theta": 1e7,
        "rms_norm_eps": 1e-6, "kind": "dflash2", "conv_kernel_size": 2, "conv_group_size": 16,
        "selector_rank": 256, "selector_top_k": 16}
bad = {k: (d.get(k), v) for k, v in peer.items() if d.get(k) != v}
assert not bad, bad
assert "output_multiplier" not in d and "final_logit_softcapping" not in d  # absent there: 1 and none
print("ok: the recipe's drafter is the peer's")
PY

# dflash2_config FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS [ALPHA [WARMUP_RATIO]]: the tiny test config as DFlash2
# (hidden 64 of the tiny target: groups of 16), the selector's CE at weight ALPHA (0.5) after WARMUP_RATIO (0) of
# the steps.
dflash2_config() {
  write_config "${@:1:5}"
  sed -i -e '/^\[drafter\]/a kind = "dflash2"\nconv_kernel_size = 3\nconv_group_size = 16\nselector_rank = 12\nselector_top_k = 6' \
    -e "/^\\[train\\]/a dflash2_selector_loss_alpha = ${6:-0.5}\\ndflash2_selector_warmup_ratio = ${7:-0.0}" "$1"
}
kind_trains_and_resumes dflash2 dflash2_config
# α follows its schedule step by step: held at 0 by a warm-up over every step, α = 0.5 trains exactly as α = 0
# does, and without the warm-up it does not.
for run in a0:0.0:0.0 warm:0.5:1.0 a05:0.5:0.0; do
  IFS=: read -r name alpha warm <<<"$run"
  dflash2_config "$TMP/$name.toml" "$TMP/$name" 1 1 6 "$alpha" "$warm"
  run_mpi 2 "$TMP/$name.log" --config "$TMP/$name.toml" || { fail "DFlash2 run $name"; tail -20 "$TMP/$name.log"; }
done
[ "$(losses "$TMP/a0/metrics.jsonl")" == "$(losses "$TMP/warm/metrics.jsonl")" ] && echo "ok: α warmed up over every step == α 0" ||
  fail "a warm-up over every step does not train as α = 0"
[ "$(losses "$TMP/a0/metrics.jsonl")" != "$(losses "$TMP/a05/metrics.jsonl")" ] ||
  fail "α = 0.5 without a warm-up trains as α = 0: the selector's term is not in the loss"

# Export: SpecForge's DFlash2DraftModel layout; eval decodes with it against the same random target.
"$BIN" export --config "$TMP/straight.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
python3 - "$TMP/drafter" <<'PY' || fail "the exported DFlash2 drafter"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
assert cfg["architectures"] == ["DFlash2DraftModel"], cfg["architectures"]
dc = cfg["dflash_config"]
assert "projector_type" not in dc and "final_logit_softcapping" not in dc, dc
assert (dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"], dc["selector_top_k"],
        dc["output_multiplier"]) == (3, 16, 12, 6, 1.0), dc
raw = open(f"{d}/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
want = {"layers.0.attention_conv.base_kernel": [2, 3, 64], "layers.0.mlp_conv.base_kernel": [2, 3, 64],
        "layers.0.attention_conv.kernel_projection.weight": [24, 64],
        "layers.0.mlp_conv.kernel_projection.weight": [24, 64],
        "candidate_selector.predecessor_codebook": [256, 12], "candidate_selector.successor_codebook": [256, 12],
        "candidate_selector.hidden_projection.weight": [12, 64]}
for k, v in want.items():
    assert names[k]["shape"] == v, (k, names.get(k))
print("export: DFlash2DraftModel with the peer's convolution and selector tensors")
PY
kind_eval dflash2

# drafter.init_from a DFlash export: the DFlash2 run starts from its backbone (identity convolutions).
write_config "$TMP/base.toml" "$TMP/base" 1 1 4
run_mpi 2 "$TMP/base.log" --config "$TMP/base.toml" || { fail "DFlash run for init_from"; tail -20 "$TMP/base.log"; }
"$BIN" export --config "$TMP/base.toml" --out "$TMP/base_drafter" >"$TMP/base_export.log" 2>&1 ||
  fail "export of the DFlash run: $(tail -3 "$TMP/base_export.log")"
dflash2_config "$TMP/from_dflash.toml" "$TMP/from_dflash" 1 1 4
sed -i "/^\[drafter\]/a init_from = \"$TMP/base_drafter\"" "$TMP/from_dflash.toml"
if run_mpi 2 "$TMP/from_dflash.log" --config "$TMP/from_dflash.toml"; then
  grep -q "drafter weights from $TMP/base_drafter" "$TMP/from_dflash.log" || fail "the warm start names no init_from folder"
else
  fail "a DFlash2 run from a DFlash export"; tail -20 "$TMP/from_dflash.log"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
