#!/usr/bin/env bash
# benchmarks/seed_machine.py: its arithmetic on synthetic inputs (rates from FLOPs and an efficiency, bytes and
# seconds on a link), the refusal to predict without measured efficiencies, and a full run against the real
# binary whose 7-1 figure is recomputed here from `plan flops` by hand. Args: binary, source dir.
BIN="$1"
SRC="$2"
source "$SRC/tests/cli/cli_common.sh"
SCRIPT="$SRC/benchmarks/seed_machine.py"
M27="$SRC/tests/fixtures/models/qwen3.6-27b"
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

python3 -B - "$SRC/benchmarks" <<'EOF' || fail "arithmetic"
import sys
sys.path.insert(0, sys.argv[1])
import seed_machine as sm
# 1 PFLOP a target batch, 0.1 PFLOP a drafter batch of 1000 tokens, half of 500 TFLOP/s: 4 s and 0.4 s a batch.
r = sm.per_gpu_rates({"target_flops": 1e15, "drafter_flops": 1e14, "tokens": 1000}, 0.5, 0.5, 500.0)
assert abs(r["target_batches_s"] - 0.25) < 1e-12 and abs(r["target_tok_s"] - 250) < 1e-9, r
assert abs(r["drafter_batches_s"] - 2.5) < 1e-12 and abs(r["drafter_tok_s"] - 2500) < 1e-9, r
for bad in ((0.0, 0.5, 500.0), (0.5, 1.5, 500.0), (0.5, 0.5, 0.0)):
    try:
        sm.per_gpu_rates({"target_flops": 1, "drafter_flops": 1, "tokens": 1}, *bad)
        raise SystemExit(f"accepted {bad}")
    except ValueError:
        pass
# 2 GB of features a micro-batch, 4 micro-batches a step, 8 GB all-reduced, 50 GB/s, 0.5 micro-batches/s.
s = sm.link_per_step({"payload_bytes": 2e9, "grad_accum": 4}, {"allreduce_bytes": 8e9, "drafter_rate": 0.5}, 50e9)
assert s == {"feature_bytes": 8e9, "allreduce_bytes": 8e9, "feature_s": 0.16, "allreduce_s": 0.16, "step_s": 8.0}, s
# 100 tok/s at 2 TFLOP a token over two 500 TFLOP/s GPUs: 0.2 of their peak.
assert abs(sm.implied_efficiency({"target_flops": 2e15, "tokens": 1000}, 100, 2, "target", 500.0) - 0.2) < 1e-15
split = {"rows": [{"targets": 7}, {"targets": 6}]}
assert sm.split_row(split, 6) is split["rows"][1]
try:
    sm.split_row(split, 5)
    raise SystemExit("found a 5-target row")
except ValueError:
    pass
EOF

# Without efficiencies: the FLOPs and bytes, no prediction, exit 2.
python3 "$SCRIPT" --dflash-mpi "$BIN" --target-config "$M27" >"$TMP/none.out" 2>"$TMP/none.err"
rc=$?
[ "$rc" -eq 2 ] || fail "no efficiency: exit $rc, expected 2"
grep -qF "no prediction: pass --target-eff and --drafter-eff" "$TMP/none.err" || fail "no efficiency: no refusal"
grep -qF "FLOPs a batch (plan flops): target forward" "$TMP/none.out" || fail "no efficiency: no FLOPs"
grep -q "predicted" "$TMP/none.out" && fail "no efficiency: printed a prediction"
grep -qF "the seed's 26,800 context tok/s at 7-1 on 504 TFLOP/s cards takes" "$TMP/none.out" ||
  fail "no efficiency: no implied efficiency"
python3 "$SCRIPT" --dflash-mpi "$BIN" --target-config "$M27" --target-eff 2 --drafter-eff 0.5 >/dev/null 2>"$TMP/bad.err"
[ "$?" -eq 2 ] && grep -qF -- "--target-eff 2.0: an efficiency is a fraction" "$TMP/bad.err" || fail "eff 2 accepted"

# A full run: 7-1 at efficiencies 0.5 / 0.4 on 504 TFLOP/s and 50 GB/s links, recomputed from plan flops.
python3 "$SCRIPT" --dflash-mpi "$BIN" --target-config "$M27" --target-eff 0.5 --drafter-eff 0.4 \
  --plot "$TMP/split.png" >"$TMP/run.out" 2>"$TMP/run.err" || fail "run: $(cat "$TMP/run.err")"
"$BIN" plan flops --json --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" >"$TMP/flops.json" ||
  fail "plan flops --json"
python3 - "$TMP/flops.json" "$TMP/run.out" <<'EOF' || fail "run: the 7-1 prediction differs from the hand arithmetic"
import json, sys
f = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
T = f["tokens"]
t_bps = 0.5 * 504e12 / f["target_flops"]
d_bps = 0.4 * 504e12 / f["drafter_flops"]
# One drafter: no all-reduce; its 1.68 GB batch (0.034 s at 50 GB/s) hides behind its step.
assert f["payload_bytes"] / 50e9 < 1 / d_bps
ctx = min(7 * t_bps, d_bps) * T
want = f"7-1 predicted: {ctx:,.0f} context tok/s, {ctx / 26800:.2f}x the seed's measured 26,800"
assert want in out, (want, out)
assert f"per GPU: target {t_bps * T:,.0f} tok/s" in out, out
assert "all-reduce 0 GB (0.0000 s, after the backward)" in out, out
EOF
if python3 -c "import matplotlib" 2>/dev/null; then
  [ -s "$TMP/split.png" ] || fail "plot: no PNG"
else
  grep -qF "matplotlib is not installed" "$TMP/run.err" || fail "plot: no word about matplotlib"
fi

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all seed_machine checks passed"
