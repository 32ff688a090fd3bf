#!/usr/bin/env python3
# Compares the per-step "loss" of two metrics.jsonl files: same number of steps, and every step within
# |a - b| <= atol + rtol * |b|. Prints how the difference grows with the steps and the worst step with both
# values either way; exit 1 on a mismatch. Used by tests/mpi/test_train_splits.sh,
# tests/gpu/test_train_cuda_{target,drafter}.sh and tests/gpu/test_train_nccl.sh.
# Usage: compare_losses.py A.jsonl B.jsonl RTOL ATOL LABEL
import json
import math
import sys


def losses(path):
    # Start markers ({"event": "start", ...}) carry no loss.
    with open(path) as f:
        return [r["loss"] for r in (json.loads(line) for line in f if line.strip()) if "loss" in r]


a_path, b_path, rtol, atol, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
a, b = losses(a_path), losses(b_path)
if len(a) != len(b) or not a:
    print(f"FAIL: {label}: {len(a)} steps in {a_path} but {len(b)} in {b_path}")
    sys.exit(1)
worst, worst_i = -1.0, 0
for i, (x, y) in enumerate(zip(a, b)):
    excess = abs(x - y) - (atol + rtol * abs(y)) if math.isfinite(x) and math.isfinite(y) else math.inf
    if excess > worst or worst_i < 0:
        worst, worst_i = excess, i
x, y = a[worst_i], b[worst_i]
# How the difference grows with the steps: the largest |a - b| up to each of these steps.
drift = {n: max(abs(p - q) for p, q in zip(a[:n], b[:n])) for n in (1, 5, 10, 20, 50, len(a)) if n <= len(a)}
print(f"{label}: max |diff| over steps 1..n: " + ", ".join(f"{n}: {d:.3g}" for n, d in drift.items()))
verdict = "ok" if worst <= 0 else "FAIL"
print(f"{verdict}: {label}: worst step {worst_i + 1} of {len(a)}: {x!r} vs {y!r} (|diff| {abs(x - y):.3g}, "
      f"allowed {atol + rtol * abs(y):.3g} = {atol:g} + {rtol:g}*|b|)")
sys.exit(0 if verdict == "ok" else 1)
