#!/usr/bin/env python3
# Plots a run's metrics.jsonl (one JSON object per log interval, written by drafter rank 0) as one PNG: loss,
# accuracy per block offset, tau measured / estimated (and held-out tau when the run logs it), context
# tokens/s and the queue depths q_hs / q_pre, all against the optimizer step. Restarts of a resumed run show as
# grey dotted vertical lines, role moves ({"event": "rebalance"}, pipeline.rebalance = "auto") as magenta dashed
# ones labelled with the old and new target-drafter split. Needs only python3-matplotlib (Debian).
#   python3 launch/plot_metrics.py RUN_DIR [--out FILE.png]     (default RUN_DIR/metrics.png)
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    rows, restarts, moves = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path} line {n}: not valid JSON ({e})")
            if "loss" in rec and "step" in rec:
                rows.append(rec)
            elif rec.get("event") == "rebalance":
                moves.append((rec["step"], f"{rec['from']} -> {rec['to']}"))
            elif rec.get("event") == "start":
                restarts.append(rec["step"])
    return rows, restarts, moves


def make_figure(rows, restarts, moves, title):
    """The six panels against the optimizer step; every axis labelled, every panel of several curves with a
    legend (the lr / grad-norm panel's two y axes included)."""
    step = [r["step"] for r in rows]
    fig, ax = plt.subplots(2, 3, figsize=(16, 8.5), constrained_layout=True)
    fig.suptitle(f"{title}: {len(rows)} intervals, steps {step[0]}..{step[-1]}")

    ax[0, 0].plot(step, [r["loss"] for r in rows], color="tab:red")
    ax[0, 0].set_title("loss (Σ w·CE / Σ w)")
    ax[0, 0].set_ylabel("loss")

    acc = [r.get("acc", []) for r in rows]
    k_max = max((len(x) for x in acc), default=0)
    cmap = plt.get_cmap("viridis")
    for k in range(k_max):
        ax[0, 1].plot(step, [x[k] if k < len(x) else float("nan") for x in acc], color=cmap(k / max(1, k_max - 1)),
                      label=f"k={k + 1}", linewidth=1)
    ax[0, 1].set_title("accuracy per block offset")
    ax[0, 1].set_ylabel("top-1 accuracy")
    if k_max:
        ax[0, 1].legend(ncol=3, fontsize=7)

    ax[0, 2].plot(step, [r.get("tau", float("nan")) for r in rows], label="tau (teacher-forced)")
    ax[0, 2].plot(step, [r.get("tau_est", float("nan")) for r in rows], label="tau estimated", linestyle="--")
    held = [(r["step"], r["eval_tau"]) for r in rows if "eval_tau" in r]
    if held:
        ax[0, 2].plot([s for s, _ in held], [t for _, t in held], "o-", label="tau held-out (drafting)")
    ax[0, 2].set_title("acceptance length tau")
    ax[0, 2].set_ylabel("tokens accepted per block")
    ax[0, 2].legend(fontsize=8)

    ax[1, 0].plot(step, [r.get("ktok_s", float("nan")) for r in rows], color="tab:green")
    ax[1, 0].set_title("context K tok/s")
    ax[1, 0].set_ylabel("thousand context tokens / s")
    ax[1, 1].plot(step, [r.get("q_hs", float("nan")) for r in rows], label="q_hs (batches waiting at drafters)")
    ax[1, 1].plot(step, [r.get("q_pre", float("nan")) for r in rows], label="q_pre (prefetched at targets)")
    ax[1, 1].set_title("queue depths")
    ax[1, 1].set_ylabel("batches")
    ax[1, 1].legend(fontsize=8)
    lr = ax[1, 2].plot(step, [r.get("lr", float("nan")) for r in rows], color="tab:purple", label="lr (left)")
    ax[1, 2].set_title("learning rate and grad norm")
    ax[1, 2].set_ylabel("learning rate")
    g = ax[1, 2].twinx()
    gn = g.plot(step, [r.get("grad_norm", float("nan")) for r in rows], color="tab:orange", linewidth=0.8,
                label="grad norm before clipping (right)")
    g.set_ylabel("grad norm")
    ax[1, 2].legend(handles=lr + gn, fontsize=8)
    for axis in ax.flat:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        for s in restarts:
            axis.axvline(s, color="grey", linestyle=":", linewidth=1)
        for s, label in moves:
            axis.axvline(s, color="magenta", linestyle="--", linewidth=1.2)
            axis.annotate(label, (s, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                          textcoords="offset points", fontsize=7, color="magenta")
    return fig


def main():
    ap = argparse.ArgumentParser(description="Plot a dflash_mpi run's metrics.jsonl as one PNG")
    ap.add_argument("run_dir", help="the run's run.dir (holds metrics.jsonl)")
    ap.add_argument("--out", help="PNG to write (default RUN_DIR/metrics.png)")
    a = ap.parse_args()
    src = os.path.join(a.run_dir, "metrics.jsonl")
    if not os.path.isfile(src):
        sys.exit(f"{src}: not found; HINT: pass the run's run.dir (the directory that holds metrics.jsonl)")
    rows, restarts, moves = read_metrics(src)
    if not rows:
        sys.exit(f"{src}: no metrics lines yet (the first is written after run.log_interval seconds)")
    fig = make_figure(rows, restarts, moves, os.path.abspath(a.run_dir))
    out = a.out or os.path.join(a.run_dir, "metrics.png")
    tmp = f"{out}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=90)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
