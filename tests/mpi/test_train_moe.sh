#!/usr/bin/env bash
# A mixture-of-experts target end to end on CPU ranks (issue 51): configs/tiny-moe.toml passes `config check`,
# `plan vram` lists the experts and the routing buffers, `model init` writes a random Qwen3.5-MoE checkpoint that
# `extract` reads, 1 target + 1 drafter train from the random MoE target with a falling loss, and the exported
# drafter decodes speculatively against it (`eval`, `eval --generate`); the MoE target's measured rate drives the
# rebalancer's advice and the end-of-run split table; a Qwen3-Next checkpoint from `model init` decodes with the same
# drafter. On a GPU, `extract --device cuda` runs it too.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"

# The demo config as committed, its corpus and run dir moved here.
sed -e "s|runs/tiny-moe/tokens.h5|$TMP/tokens.h5|" -e "s|\"runs/tiny-moe\"|\"$TMP/demo\"|" \
  -e "s|configs/tiny-moe-target.json|$SRC/configs/tiny-moe-target.json|" "$SRC/configs/tiny-moe.toml" >"$TMP/demo.toml"
"$BIN" config check --config "$TMP/demo.toml" >"$TMP/check.log" 2>&1 || fail "config check of configs/tiny-moe.toml: $(tail -3 "$TMP/check.log")"
grep -q "MoE in 4 of 4 layers: top-2 of 8 experts" "$TMP/check.log" ||
  fail "config check does not describe the MoE target: $(grep -m1 qwen3_5_moe "$TMP/check.log")"

"$BIN" plan vram --config "$TMP/demo.toml" --gpu-mem 80 >"$TMP/vram.log" 2>&1 || fail "plan vram: $(tail -3 "$TMP/vram.log")"
for row in "MoE routing ids + weights" "MoE expert workspace"; do
  grep -q "$row" "$TMP/vram.log" || fail "plan vram lacks '$row'"
done

"$BIN" model init --hf-config "$SRC/configs/tiny-moe-target.json" --out "$TMP/target" --seed 1 >/dev/null ||
  fail "model init of the MoE config"
python3 - "$TMP/target" <<'PY' || fail "the written MoE checkpoint"
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
assert cfg["model_type"] == "qwen3_5_moe_text" and cfg["num_experts"] == 8, cfg
raw = open(f"{d}/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
for l in range(4):  # the fused naming of the Qwen3.5 releases
    p = f"model.layers.{l}.mlp."
    assert names[p + "experts.gate_up_proj"]["shape"] == [8, 64, 64], names[p + "experts.gate_up_proj"]
    assert names[p + "experts.down_proj"]["shape"] == [8, 64, 32]
    assert names[p + "gate.weight"]["shape"] == [8, 64]
    assert names[p + "shared_expert_gate.weight"]["shape"] == [1, 64]
print("model init wrote the fused expert tensors")
PY
"$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --out "$TMP/feat.h5" --layers 1,3 >"$TMP/extract.log" 2>&1 ||
  fail "extract from the MoE checkpoint: $(tail -3 "$TMP/extract.log")"

write_config "$TMP/moe.toml" "$TMP/moe" 1 1 40
sed -i "s|tiny-target.json|tiny-moe-target.json|" "$TMP/moe.toml"
run_mpi 2 "$TMP/moe.log" --config "$TMP/moe.toml" || { fail "MoE training run"; tail -20 "$TMP/moe.log"; }
grep -q "target: qwen3_5_moe_text: .*MoE in 4 of 4 layers" "$TMP/moe.log" || fail "the run's log does not describe the MoE target"
python3 - "$TMP/moe/metrics.jsonl" <<'PY' || fail "the drafter did not learn from the MoE target"
import json, sys
loss = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
print(f"{len(loss)} steps; mean loss of the first 5 {first:.4f}, of the last 5 {last:.4f}")
assert len(loss) == 40 and last < first, (len(loss), first, last)
PY

# Speculative decoding and generation against the MoE target (the run's random target drawn with random_seed 1, the
# same model as $TMP/target): eval prints its tau; greedy generation gives the same tokens batched and one at a time.
"$BIN" export --config "$TMP/moe.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
"$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
  --max-new-tokens 16 --out "$TMP/eval.jsonl" >"$TMP/eval.log" 2>&1 || fail "eval on the MoE target: $(tail -3 "$TMP/eval.log")"
grep -qE "^tau [0-9]+\.[0-9]{3} over 3 prompts$" "$TMP/eval.log" || fail "eval printed no tau: $(tail -3 "$TMP/eval.log")"
for b in 3 1; do
  "$BIN" eval --generate --target "$TMP/target" --prompts "$TMP/tokens.h5" --num-prompts 3 --max-new-tokens 12 \
    --batch $b --out "$TMP/gen_b$b.h5" >"$TMP/gen_b$b.log" 2>&1 || fail "eval --generate --batch $b: $(tail -3 "$TMP/gen_b$b.log")"
done
h5diff "$TMP/gen_b3.h5" "$TMP/gen_b1.h5" tokens tokens >/dev/null || fail "batched greedy generation on the MoE target differs"

# A Qwen3-Next target (qwen3_next: DeltaNet projections fused per key head, layer 2 dense by mlp_only_layers) of
# the same shapes: `model init` writes Qwen3-Next's tensor names, and the same drafter decodes against it.
python3 - "$SRC/configs/tiny-moe-target.json" "$TMP/next.json" <<'PY' || fail "writing the Qwen3-Next config"
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", norm_topk_prob=True,
           decoder_sparse_step=1, mlp_only_layers=[2], intermediate_size=48)
json.dump(cfg, open(sys.argv[2], "w"))
PY
"$BIN" model init --hf-config "$TMP/next.json" --out "$TMP/next" --seed 2 >"$TMP/next_init.log" 2>&1 ||
  fail "model init of the Qwen3-Next config: $(tail -2 "$TMP/next_init.log")"
python3 - "$TMP/next" <<'PY' || fail "the written Qwen3-Next checkpoint"
import json, struct, sys
raw = open(f"{sys.argv[1]}/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
p = "model.layers.0.linear_attn."
assert names[p + "in_proj_qkvz.weight"]["shape"] == [2 * 2 * 16 + 2 * 4 * 16, 64], names[p + "in_proj_qkvz.weight"]
assert names[p + "in_proj_ba.weight"]["shape"] == [8, 64] and p + "in_proj_qkv.weight" not in names
assert "model.layers.2.mlp.gate_proj.weight" in names and "model.layers.1.mlp.experts.0.gate_proj.weight" in names
print("model init wrote Qwen3-Next's fused DeltaNet projections and per-expert tensors")
PY
"$BIN" eval --target "$TMP/next" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
  --max-new-tokens 16 --out "$TMP/eval_next.jsonl" >"$TMP/eval_next.log" 2>&1 ||
  fail "eval on the Qwen3-Next target: $(tail -3 "$TMP/eval_next.log")"
grep -qE "^tau [0-9]+\.[0-9]{3} over 3 prompts$" "$TMP/eval_next.log" || fail "eval on Qwen3-Next printed no tau"

# The split planner and the rebalancer take the MoE target's rate as measured by its rank, as they take a dense
# one's: nothing in them reads the model kind. 1 target + 2 drafters with the target slowed to at most 2 batches/s
# (pipeline.test_target_delay_s, as tests/mpi/test_train_rebalance.sh does) must be advised 2-1 after step 4, with
# the target rate of that record under 2 batches/s and the end-of-run split table printed from the same rates.
write_config "$TMP/split.toml" "$TMP/split" 1 2 6 "[pipeline]" 'rebalance = "advise"' "rebalance_warmup_steps = 1" \
  "rebalance_window_steps = 3" "rebalance_dwell_steps = 4" "test_target_delay_s = 0.5"
sed -i "s|tiny-target.json|tiny-moe-target.json|" "$TMP/split.toml"
if ! run_mpi 3 "$TMP/split.log" --config "$TMP/split.toml"; then
  fail "MoE 1-2 run"; tail -20 "$TMP/split.log"
else
  advice=$(python3 -c 'import json,sys
for j in map(json.loads, open(sys.argv[1])):
    if j.get("event") == "rebalance_advice" and j["decided_at"] == 4:
        print(j["from"], j["to"], "%.3f" % j["target_rate"], "%.3f" % j["drafter_rate"], j["grad_accum_to"])' "$TMP/split/metrics.jsonl")
  read -r from to rt rd ga <<<"$advice"
  if [ "$from $to $ga" != "1-2 2-1 4" ] || ! python3 -c "import sys; sys.exit(not (0 < $rt < 2 < $rd))"; then
    fail "MoE target: expected advice 1-2 -> 2-1 (grad_accum 4) after step 4 from a target rate under 2 batches/s, got: '$advice'"
    grep "rebalance\|event" "$TMP/split/metrics.jsonl" | head -5
  elif ! grep -q "measured per-rank rates: target" "$TMP/split.log" || ! grep -q "recommendation: 2-1" "$TMP/split.log"; then
    fail "MoE target: no end-of-run split table recommending 2-1"; tail -20 "$TMP/split.log"
  else
    echo "ok: the MoE target's measured rate ($rt batches/s per target, drafter $rd) advises 1-2 -> 2-1"
  fi
fi

# On a GPU the MoE target extracts on CUDA too (tests/gpu/test_golden_cuda.cpp holds its accuracy); without one
# the refusal names the missing device.
if "$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --out "$TMP/cuda.h5" --device cuda >"$TMP/cuda.log" 2>&1; then
  h5ls "$TMP/cuda.h5" | grep -q "^final_norm" || fail "extract --device cuda of the MoE target wrote no final_norm"
else
  grep -q "no CUDA GPU" "$TMP/cuda.log" || fail "extract --device cuda of the MoE target failed: $(tail -2 "$TMP/cuda.log")"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
