#!/usr/bin/env bash
# A Domino drafter (drafter.kind = "domino") end to end on CPU ranks: configs/tiny-domino.toml and the two
# Domino recipes pass `config check` (as written, with a CUDA drafter, and with drafter.device = "cpu"); 1
# target + 2 drafters train with a falling loss; a resume continues bit-identically (λ's schedule included)
# and a resume as DFlash is refused; the export is in SpecForge's normalised layout and decodes speculatively
# against the target (`eval`); a held-out set is evaluated during a Domino run.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"

# The demo config as committed, its corpus and run dir moved here.
sed -e "s|runs/tiny/tokens.h5|$TMP/tokens.h5|" -e "s|\"runs/tiny-domino\"|\"$TMP/demo\"|" \
  -e "s|configs/tiny-target.json|$SRC/configs/tiny-target.json|" "$SRC/configs/tiny-domino.toml" >"$TMP/demo.toml"
"$BIN" config check --config "$TMP/demo.toml" >"$TMP/check.log" 2>&1 ||
  fail "config check of configs/tiny-domino.toml: $(tail -3 "$TMP/check.log")"
grep -q "domino head: GRU hidden 32 over the previous tokens' embeddings, MLP 96 -> 16 -> vocab from slot 1" \
  "$TMP/check.log" || fail "config check does not describe the Domino head: $(grep -m1 domino "$TMP/check.log")"

# The recipes against the fixtures' target configs and the test corpus.
kind_recipes_check domino cuda qwen3.6-27b-domino:qwen3.6-27b qwen3-8b-domino:qwen3-8b

# domino_config FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS: the tiny test config with a Domino head.
domino_config() {
  write_config "$@"
  sed -i -e '/^\[drafter\]/a kind = "domino"\npure_draft_prefix_len = 1\nshift_label = true\ngru_hidden_dim = 24\nemb_dim = 12' \
    -e '/^\[train\]/a lambda_base_start = 1.0\nlambda_base_decay_ratio = 0.5' "$1"
}
# (λ follows the step, so a resume continues its schedule too.)
kind_trains_and_resumes domino domino_config

# Export: SpecForge's normalised layout; eval decodes with it against the same random target.
"$BIN" export --config "$TMP/straight.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
python3 - "$TMP/drafter" <<'PY' || fail "the exported Domino drafter"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
assert cfg["architectures"] == ["DFlashDraftModel"] and "auto_map" not in cfg, cfg["architectures"]
dc = cfg["dflash_config"]
assert (dc["projector_type"], dc["pure_draft_prefix_len"], dc["emb_dim"], dc["gru_hidden_dim"], dc["shift_label"]) == \
    ("domino", 1, 12, 24, True), dc
raw = open(f"{d}/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
want = {"prefix_gru.weight_ih_l0": [72, 64], "prefix_gru.weight_hh_l0": [72, 24], "embed_proj.0.weight": [12, 88],
        "embed_proj.2.weight": [256, 12]}
for k, v in want.items():
    assert names[k]["shape"] == v, (k, names.get(k))
print("export: DFlashDraftModel with projector_type domino and the peer's head tensors")
PY
kind_eval domino
# Held-out evaluation during a Domino run ([eval], at the step's λ).
kind_heldout_eval domino domino_config
echo "$fails failed"
[ "$fails" -eq 0 ]
