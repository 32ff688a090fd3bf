#!/usr/bin/env bash
# launch/plot_metrics.py writes a real picture of a run's metrics: a metrics.jsonl in the format MetricsLog
# writes (with a restart marker line and a role move) becomes a PNG whose pixels carry several colours (curves,
# not a blank canvas) and the move's magenta line; every axis of the figure is labelled, and the lr / grad-norm
# panel's legend names both curves; a missing run dir fails naming the file.
# Args: binary (unused), source dir.
set -u
SRC="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# Debian's python3 carries python3-matplotlib; a python3 earlier on PATH (pyenv) may not.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
$PY -c "import matplotlib" 2>/dev/null || { echo "SKIP: python3-matplotlib missing for $PY"; exit 77; }
$PY - "$TMP" <<'PY'
import json, math, sys
with open(sys.argv[1] + "/metrics.jsonl", "w") as f:
    for i in range(1, 41):
        if i == 20:
            f.write(json.dumps({"event": "start", "step": 20, "from": "step_00000020.h5"}) + "\n")
        if i == 30:
            f.write(json.dumps({"event": "rebalance", "step": 150, "from": "2-2", "to": "3-1"}) + "\n")
            f.write(json.dumps({"event": "start", "step": 150, "from": "step_00000150.h5"}) + "\n")
        f.write(json.dumps({"step": i * 5, "loss": 5.5 * math.exp(-i / 15) + 1, "acc": [0.1 * k * i / 40 for k in range(15)],
                            "tau": 1 + i / 20, "tau_est": 1 + i / 22, "lr": 1e-3, "grad_norm": 1 / i, "ktok_s": 3 + i % 3,
                            "q_hs": 1.5, "q_pre": 2.0, "tgt_batches_s": 1, "dft_batches_s": 1, "eta_s": 10, "elapsed_s": i}) + "\n")
PY
out=$($PY "$SRC/launch/plot_metrics.py" "$TMP" 2>&1) || { echo "FAIL: plot failed: $out"; exit 1; }
echo "$out" | grep -qF "plot: $TMP/metrics.png" || { echo "FAIL: no path printed: $out"; exit 1; }
$PY - "$TMP/metrics.png" <<'PY' || exit 1
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])
h, w = img.shape[:2]
colours = {tuple((img[y, x, :3] * 255).astype(int)) for y in range(0, h, 3) for x in range(0, w, 3)}
print(f"{w}x{h} px, {len(colours)} distinct colours sampled")
if w < 800 or h < 500 or len(colours) < 50:
    print("FAIL: the PNG looks empty"); sys.exit(1)
px = (img[:, :, :3] * 255).astype(int)
magenta = int(((px[:, :, 0] > 200) & (px[:, :, 1] < 80) & (px[:, :, 2] > 200)).sum())
print(f"{magenta} magenta px (the role move)")
if magenta < 100:
    print("FAIL: the role move is not marked"); sys.exit(1)
PY
$PY - "$SRC/launch/plot_metrics.py" "$TMP" <<'PY' || exit 1
import importlib.util, sys
spec = importlib.util.spec_from_file_location("plot_metrics", sys.argv[1])
pm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pm)
rows, restarts, moves = pm.read_metrics(sys.argv[2] + "/metrics.jsonl")
fig = pm.make_figure(rows, restarts, moves, "test")
bad = [f"{a.get_title() or 'twin axis'}: y" for a in fig.axes if not a.get_ylabel()]
bad += [f"{a.get_title()}: x" for a in fig.axes if a.get_title() and not a.get_xlabel()]
if bad:
    print("FAIL: axes without a label: " + ", ".join(bad)); sys.exit(1)
lr_panel = next(a for a in fig.axes if a.get_title() == "learning rate and grad norm")
legend = lr_panel.get_legend()
names = [t.get_text() for t in legend.get_texts()] if legend else []
if not (any(n.startswith("lr") for n in names) and any(n.startswith("grad norm") for n in names)):
    print(f"FAIL: the lr / grad-norm panel's legend names {names}"); sys.exit(1)
print(f"{len(fig.axes)} axes labelled; lr panel legend: {names}")
PY
if $PY "$SRC/launch/plot_metrics.py" "$TMP/nope" >"$TMP/err" 2>&1; then echo "FAIL: missing dir accepted"; exit 1; fi
grep -qF "metrics.jsonl: not found" "$TMP/err" || { echo "FAIL: unclear error: $(cat "$TMP/err")"; exit 1; }
echo "plot_metrics: ok"
