#!/usr/bin/env bash
# A DSpark drafter (drafter.kind = "dspark") end to end on CPU ranks: configs/tiny-dspark.toml and the two
# DSpark recipes pass `config check` (with the recipes' CUDA drafter and on drafter.device = "cpu"); the
# targets stream their final hidden state and 1 target + 2 drafters train with a falling loss; a resume
# continues bit-identically and a resume as DFlash is refused; the export is in SpecForge's normalised layout,
# decodes speculatively against the target (`eval`, also with the confidence-based verify length) and
# warm-starts a run (`drafter.init_from`); a held-out set (with the target's final hidden state) is evaluated
# during a DSpark run.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"

# The demo config as committed, its corpus and run dir moved here.
sed -e "s|runs/tiny/tokens.h5|$TMP/tokens.h5|" -e "s|\"runs/tiny-dspark\"|\"$TMP/demo\"|" \
  -e "s|configs/tiny-target.json|$SRC/configs/tiny-target.json|" "$SRC/configs/tiny-dspark.toml" >"$TMP/demo.toml"
"$BIN" config check --config "$TMP/demo.toml" >"$TMP/check.log" 2>&1 ||
  fail "config check of configs/tiny-dspark.toml: $(tail -3 "$TMP/check.log")"
grep -q "dspark head: vanilla Markov bias of rank 16, confidence head over \[h ; W1\[prev\]\]" "$TMP/check.log" ||
  fail "config check does not describe the DSpark head: $(grep -m1 dspark "$TMP/check.log")"
grep -q "dspark p_target: softmax(frozen lm_head x target final-norm output), computed on the drafter rank" \
  "$TMP/check.log" || fail "config check does not say where p_target is computed"

# The recipes against the fixtures' target configs and the test corpus.
kind_recipes_check dspark cuda qwen3.6-27b-dspark:qwen3.6-27b qwen3-8b-dspark:qwen3-8b
for recipe in qwen3.6-27b-dspark qwen3-8b-dspark; do
  grep -q "dspark head: vanilla Markov bias of rank 256" "$TMP/$recipe.cpu.log" ||
    fail "configs/$recipe.toml: the plan names no rank-256 Markov head"
done

# dspark_config FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS: the tiny test config with a DSpark head.
dspark_config() {
  write_config "$@"
  sed -i -e '/^\[drafter\]/a kind = "dspark"\nmarkov_rank = 8\nmarkov_head_type = "rnn"\nenable_confidence_head = true\nconfidence_head_with_markov = true\nconfidence_head_alpha = 1.0' \
    -e '/^\[train\]/a gamma = 4.0' "$1"
}
kind_trains_and_resumes dspark dspark_config

# Export: SpecForge's normalised layout; eval decodes with it against the same random target.
"$BIN" export --config "$TMP/straight.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
python3 - "$TMP/drafter" <<'PY' || fail "the exported DSpark drafter"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
assert cfg["architectures"] == ["Qwen3DSparkModel"] and "auto_map" not in cfg, cfg["architectures"]
dc = cfg["dflash_config"]
want = {"projector_type": "dspark", "markov_rank": 8, "markov_head_type": "rnn", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "attention_mode": "gqa"}
assert all(dc[k] == v for k, v in want.items()), dc
assert all(cfg[k] == dc[k] for k in ("markov_rank", "markov_head_type", "enable_confidence_head",
                                     "confidence_head_with_markov")), cfg
raw = open(f"{d}/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
want = {"markov_head.markov_w1.weight": [256, 8], "markov_head.markov_w2.weight": [256, 8],
        "markov_head.joint_proj.weight": [24, 80], "markov_head.joint_proj.bias": [24],
        "confidence_head.proj.weight": [1, 72], "confidence_head.proj.bias": [1]}
for k, v in want.items():
    assert names[k]["shape"] == v, (k, names.get(k))
print("export: Qwen3DSparkModel with projector_type dspark and the peer's head tensors")
PY
kind_eval dspark
grep -q "^draft tokens verified per block: 7.000 of 7$" "$TMP/eval.log" ||
  fail "eval without a verify length verified fewer than B - 1: $(grep verified "$TMP/eval.log")"
# The confidence-based verify length (a survival threshold of 0.9 cuts most blocks of an untrained head) verifies
# fewer tokens, and the generated tokens stay the target's greedy ones.
"$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
  --max-new-tokens 16 --dspark-confidence 0.9 --out "$TMP/eval_conf.jsonl" >"$TMP/eval_conf.log" 2>&1 ||
  fail "eval --dspark-confidence: $(tail -3 "$TMP/eval_conf.log")"
python3 - "$TMP/eval.jsonl" "$TMP/eval_conf.jsonl" "$TMP/eval_conf.log" <<'PY' || fail "eval --dspark-confidence"
import json, re, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [p["tokens"] for p in a] == [p["tokens"] for p in b], "the verify length changed the generated tokens"
assert all(p["verified"] == 7 * len(p["accept_lengths"]) for p in a), "without it every block verifies 7"
per_block = float(re.search(r"verified per block: ([0-9.]+) of 7", open(sys.argv[3]).read()).group(1))
blocks = sum(len(p["accept_lengths"]) for p in b)
assert per_block < 7 and abs(per_block - sum(p["verified"] for p in b) / blocks) < 1e-3, per_block
print(f"ok: eval --dspark-confidence 0.9: the same tokens, {per_block} draft tokens verified per block of 7")
PY
# The export warm-starts a new run (drafter.init_from) of the same drafter.
dspark_config "$TMP/warm.toml" "$TMP/warm" 1 1 2
sed -i "/^\[drafter\]/a init_from = \"$TMP/drafter\"" "$TMP/warm.toml"
run_mpi 2 "$TMP/warm.log" --config "$TMP/warm.toml" || { fail "a run warm-started from the DSpark export"; tail -20 "$TMP/warm.log"; }
# Held-out evaluation during a DSpark run ([eval]: the held-out file holds final_norm for p_target).
kind_heldout_eval dspark dspark_config
echo "$fails failed"
[ "$fails" -eq 0 ]
