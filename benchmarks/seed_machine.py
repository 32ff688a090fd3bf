#!/usr/bin/env python3
"""The seed's machine on paper: 8 x RTX PRO 6000 Blackwell (sm_120) on PCIe 5.0, no NVLink, two NUMA nodes.

No such card is lent here, so its rates are predicted: this project's FLOPs for one batch on each side
(`dflash_mpi plan flops`, the formulas of src/model/model_flops.h) divided into the card's dense bf16 peak times
an efficiency measured on a lent GPU with dispatch acting as on sm_120 (DFLASH_GPU_PROFILE=sm120: the portable
kernels, 99 KB of shared memory a block). The split and the interconnect's cost come from `dflash_mpi plan split
--link-gbps` (src/topo/plan_split.h): the feature stream and the drafters' fp32 gradient all-reduce over each
GPU's PCIe link. The 7-1 pipeline's predicted context tok/s is set against the seed's measured 26.8 K tok/s.

Efficiency: achieved FLOP/s / the measuring card's dense bf16 peak, one for each side, from
`bench_target_forward` (the target) and `bench_drafter_step` (the drafter) under DFLASH_GPU_PROFILE=sm120.
Without both the script prints the FLOPs and bytes only: a prediction needs a measured efficiency.

    python3 benchmarks/seed_machine.py --target-eff 0.55 --drafter-eff 0.60   # efficiencies as measured

The default card figures are third-party spec sheets' (504 TFLOP/s dense bf16 for the RTX PRO 6000 Blackwell);
the link default is the ~50 GB/s a PCIe 5.0 x16 link moves in practice (63 GB/s a direction after encoding).
--plot FILE draws the split table when matplotlib is installed.
"""
import argparse
import json
import os
import subprocess
import sys

SEED_CTX_TOK_S = 26800.0  # the seed's measured context tok/s, 7 targets + 1 drafter
SEED_PEAK_TFLOPS = 504.0  # RTX PRO 6000 Blackwell, dense bf16 (third-party spec sheets)
PCIE5_X16_GBPS = 50.0  # PCIe 5.0 x16, a direction, in practice


def per_gpu_rates(flops, eff_target, eff_drafter, peak_tflops):
    """Per-GPU rates on the card: tokens/s and batches/s of each side.

    `flops` is `plan flops --json`: target_flops and drafter_flops over one batch of `tokens` tokens. A side's
    batch takes flops / (eff * peak) seconds.
    """
    for name, v in (("--target-eff", eff_target), ("--drafter-eff", eff_drafter)):
        if not (0 < v <= 1):
            raise ValueError(f"{name} {v}: an efficiency is a fraction of the peak in (0, 1]")
    if peak_tflops <= 0:
        raise ValueError(f"--peak-tflops {peak_tflops} must be positive")
    peak = peak_tflops * 1e12
    target_bps = eff_target * peak / flops["target_flops"]
    drafter_bps = eff_drafter * peak / flops["drafter_flops"]
    tokens = flops["tokens"]
    return {
        "target_batches_s": target_bps,
        "drafter_batches_s": drafter_bps,
        "target_tok_s": target_bps * tokens,
        "drafter_tok_s": drafter_bps * tokens,
    }


def implied_efficiency(flops, ctx_tok_s, gpus_on_side, side, peak_tflops):
    """The efficiency `gpus_on_side` GPUs of one side ("target" or "drafter") need to run ctx_tok_s context tok/s."""
    return ctx_tok_s * flops[side + "_flops"] / flops["tokens"] / (gpus_on_side * peak_tflops * 1e12)


def split_row(split, targets):
    """The row of `plan split --json` with `targets` targets."""
    for r in split["rows"]:
        if r["targets"] == targets:
            return r
    raise ValueError(f"no {targets}-target row in the split plan")


def link_per_step(flops, row, link_bps):
    """Bytes one drafter's link carries an optimizer step (grad_accum micro-batches) and their time on it."""
    features = flops["payload_bytes"] * flops["grad_accum"]
    allreduce = row["allreduce_bytes"]
    return {
        "feature_bytes": features,
        "allreduce_bytes": allreduce,
        "feature_s": features / link_bps,
        "allreduce_s": allreduce / link_bps,
        "step_s": flops["grad_accum"] / row["drafter_rate"],
    }


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dflash-mpi", default=os.path.join(here, "build", "dflash_mpi"), help="the binary")
    ap.add_argument("--config", default=os.path.join(here, "configs", "qwen3.6-27b.toml"))
    ap.add_argument("--target-config", default=os.path.join(here, "tests", "fixtures", "models", "qwen3.6-27b"),
                    help="config.json (or its directory) of the target (default: the Qwen3.6-27B shapes)")
    ap.add_argument("--seq-len", type=int, default=0, help="sequence length (default: one fills the batch)")
    ap.add_argument("--target-eff", type=float, help="target forward: achieved / peak bf16 FLOP/s, sm120 profile")
    ap.add_argument("--drafter-eff", type=float, help="drafter step: achieved / peak bf16 FLOP/s, sm120 profile")
    ap.add_argument("--peak-tflops", type=float, default=SEED_PEAK_TFLOPS, help="the card's dense bf16 peak")
    ap.add_argument("--link-gbps", type=float, default=PCIE5_X16_GBPS, help="each GPU's link, GB/s a direction")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--targets", type=int, default=7, help="the split set against the measurement")
    ap.add_argument("--measured-ctx-tok-s", type=float, default=SEED_CTX_TOK_S)
    ap.add_argument("--plot", help="PNG of the split table (needs matplotlib)")
    a = ap.parse_args(argv)

    base = [a.dflash_mpi]
    model = ["--config", a.config, "--target-config", a.target_config]
    fl = run_json(base + ["plan", "flops", "--json"] + model + (["--seq-len", str(a.seq_len)] if a.seq_len else []))
    tokens = fl["tokens"]
    print(f"batch: {tokens} tokens as {fl['seqs']} sequence(s) of {fl['seq_len']} ({a.config})")
    print(f"FLOPs a batch (plan flops): target forward {fl['target_flops'] / 1e12:.4g} T "
          f"({fl['target_layers_run']} layers), drafter step {fl['drafter_flops'] / 1e12:.4g} T "
          f"({fl['blocks']} blocks of {fl['anchors']} anchors drawn)")
    print(f"wire: {fl['payload_bytes'] / 1e9:.4g} GB of features a batch; {fl['grad_bytes'] / 1e9:.4g} GB of fp32 "
          f"gradients a drafter, all-reduced every {fl['grad_accum']} micro-batch(es)")
    drafters = a.gpus - a.targets
    et = implied_efficiency(fl, a.measured_ctx_tok_s, a.targets, "target", a.peak_tflops)
    ed = implied_efficiency(fl, a.measured_ctx_tok_s, drafters, "drafter", a.peak_tflops)
    print(f"the seed's {a.measured_ctx_tok_s:,.0f} context tok/s at {a.targets}-{drafters} on {a.peak_tflops:.4g} "
          f"TFLOP/s cards takes, in this project's FLOPs, an efficiency of {et:.3f} on each target and {ed:.3f} on "
          f"each drafter")
    if a.target_eff is None or a.drafter_eff is None:
        print("no prediction: pass --target-eff and --drafter-eff, each side's achieved / peak bf16 FLOP/s measured "
              "under DFLASH_GPU_PROFILE=sm120 (bench_target_forward, bench_drafter_step)", file=sys.stderr)
        return 2
    try:
        rates = per_gpu_rates(fl, a.target_eff, a.drafter_eff, a.peak_tflops)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"card: {a.peak_tflops:.4g} TFLOP/s dense bf16; efficiency target {a.target_eff:.3f}, drafter "
          f"{a.drafter_eff:.3f}")
    print(f"per GPU: target {rates['target_tok_s']:,.0f} tok/s ({rates['target_batches_s']:.4g} batches/s), "
          f"drafter {rates['drafter_tok_s']:,.0f} context tok/s ({rates['drafter_batches_s']:.4g} batches/s)")
    link_bps = a.link_gbps * 1e9
    split = run_json(base + ["plan", "split", "--json", "--target-rate", repr(rates["target_batches_s"]),
                             "--drafter-rate", repr(rates["drafter_batches_s"]), "--gpus", str(a.gpus),
                             "--link-gbps", repr(a.link_gbps), "--link-name", "PCIe 5.0 x16"] + model)
    print(f"splits over {a.gpus} GPUs with each GPU's link at {a.link_gbps:.4g} GB/s (plan split --link-gbps):")
    print(f"  {'split':6} {'ctx tok/s':>10} {'bottleneck':>10}  all-reduce a step on each drafter's link")
    for i, r in enumerate(split["rows"]):
        mark = "  <- best" if i == split["best"] else ""
        print(f"  {r['targets']}-{r['drafters']:<4} {r['throughput'] * tokens:>10,.0f} {r['bottleneck']:>10}  "
              f"{r['allreduce_bytes'] / 1e9:.4g} GB, {r['allreduce_s']:.3f} s{mark}")
    row = split_row(split, a.targets)
    ctx = row["throughput"] * tokens
    print(f"{row['targets']}-{row['drafters']} predicted: {ctx:,.0f} context tok/s, {ctx / a.measured_ctx_tok_s:.2f}x "
          f"the seed's measured {a.measured_ctx_tok_s:,.0f} (bottleneck {row['bottleneck']})")
    s = link_per_step(fl, row, link_bps)
    print(f"{row['targets']}-{row['drafters']} per optimizer step ({s['step_s']:.3f} s) on each drafter's link: "
          f"features {s['feature_bytes'] / 1e9:.4g} GB ({s['feature_s']:.4f} s at {a.link_gbps:.4g} GB/s, "
          f"{100 * s['feature_s'] / s['step_s']:.1f}% of the step, received while it trains), all-reduce "
          f"{s['allreduce_bytes'] / 1e9:.4g} GB ({s['allreduce_s']:.4f} s, after the backward)")
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed; no plot written", file=sys.stderr)
            return 0
        names = [f"{r['targets']}-{r['drafters']}" for r in split["rows"]]
        plt.bar(names, [r["throughput"] * tokens for r in split["rows"]])
        plt.axhline(a.measured_ctx_tok_s, color="k", linestyle="--", label="seed, measured 7-1")
        plt.ylabel("context tok/s (predicted)")
        plt.legend()
        plt.savefig(a.plot)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
