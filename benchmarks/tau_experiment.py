#!/usr/bin/env python3
"""The helper of benchmarks/tau_experiment.sh: writes the experiment's prompts and run configs, collects the τ
that `dflash_mpi eval` printed into a table, and plots it. The shell script runs the binary; this file holds what
is easier to write in Python (TOML, JSON, matplotlib). Needs only python3 (3.11: tomllib) and, for `plot`,
python3-matplotlib.

    tau_experiment.py target dense|hybrid --out config.json
    tau_experiment.py prompts --out-train T.jsonl --out-eval E.jsonl --train N --eval M --seed S
    tau_experiment.py config --kind K --target-dir D --data F.h5 --run-dir R --steps N --seed S --out F.toml
    tau_experiment.py record --out-dir OUT_DIR --target T --variant V --log eval.log
    tau_experiment.py table OUT_DIR        (reads OUT_DIR/results.jsonl; writes results.md)
    tau_experiment.py plot OUT_DIR [--png FILE]
"""
import argparse
import json
import os
import random
import re
import sys
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("dflash", "domino", "dspark", "dflash2")

VOCAB = 64
# The two targets: a tiny dense Qwen3 and configs/tiny-target.json (the demo's hybrid Qwen3.5: 3 Gated
# DeltaNet + 1 gated-attention layer), both with a vocabulary of 64 ids. A drafter of a random target must learn
# the target's next-token map from scratch; over 64 ids a CPU run of a few hundred steps learns enough of it for
# τ to move (with the demo's 256 ids the DFlash baseline stayed at τ ≈ 1.1 after 400 steps).
DENSE_TARGET = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "vocab_size": VOCAB,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
# Settings every kind shares beyond configs/tiny.toml's backbone: the mask token is the last id (prompts never
# hold it), and a learning rate of 1e-2 rather than the demo's 3e-3 for the short run.
DRAFTER = {"mask_token_id": VOCAB - 1}
TRAIN = {"lr": 1e-2, "epochs": 1000.0}


def write_target(args):
    """The Hugging Face config.json of target `dense` or `hybrid` (then `model init` makes its weights)."""
    if args.name == "dense":
        cfg = dict(DENSE_TARGET)
    else:
        with open(os.path.join(REPO, "configs", "tiny-target.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["vocab_size"] = VOCAB
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def write_prompts(args):
    """Random prompts over ids [0, vocab − 1) (the last id is the drafters' mask token): `train` for the
    training data, then `eval` held-out ones drawn from the same stream and refused where they repeat a
    training prompt, so no held-out prompt is in the training data."""
    rng = random.Random(args.seed)

    def prompt():
        return [rng.randrange(args.vocab - 1) for _ in range(rng.randint(args.min_len, args.max_len))]

    train = [prompt() for _ in range(args.train)]
    seen = {tuple(p) for p in train}
    held_out = []
    while len(held_out) < args.eval:
        p = prompt()
        if tuple(p) not in seen:
            seen.add(tuple(p))
            held_out.append(p)
    for path, rows in ((args.out_train, train), (args.out_eval, held_out)):
        with open(path, "w", encoding="utf-8") as f:
            for p in rows:
                f.write(json.dumps({"input_ids": p}) + "\n")


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def kind_config(kind, target_dir, data, run_dir, steps, seed):
    """configs/tiny-<kind>.toml (configs/tiny.toml for dflash) with this experiment's target, data, run dir,
    steps, seed, mask token and learning rate. The kind's own keys (its head and loss settings) are the repo's
    tiny configs' values, the peers' defaults scaled to hidden 64, untouched here."""
    name = "tiny.toml" if kind == "dflash" else f"tiny-{kind}.toml"
    path = os.path.join(REPO, "configs", name)
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    got = cfg["drafter"].get("kind", "dflash")
    if got != kind:
        sys.exit(f"{path}: drafter.kind is '{got}', expected '{kind}'")
    cfg["run"].update({"dir": run_dir, "seed": seed, "max_steps": steps, "log_interval": 5.0})
    cfg["target"] = {"model": target_dir, "device": "cpu"}
    cfg["drafter"].update(DRAFTER)
    cfg["drafter"]["device"] = "cpu"
    cfg["data"].update({"train": [data], "buckets": [128]})
    cfg["train"].update(TRAIN)
    cfg["pipeline"] = {"hs_queue_depth": 2, "rebalance": "off"}
    cfg["checkpoint"] = {"interval": steps, "keep_last": 1}
    cfg["topology"] = {"targets": 1, "drafters": 1}
    lines = [f"# Written by benchmarks/tau_experiment.py from configs/{name} (kind {kind})."]
    for section, table in cfg.items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_config(args):
    text = kind_config(args.kind, args.target_dir, args.data, args.run_dir, args.steps, args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)


TAU_LINE = re.compile(r"^tau (\d+\.\d+) over (\d+) prompts$", re.M)


def parse_tau(log_path):
    """The `tau X.XXX over N prompts` line of an eval log, as (tau, prompts)."""
    with open(log_path, encoding="utf-8") as f:
        m = TAU_LINE.findall(f.read())
    if len(m) != 1:
        sys.exit(f"{log_path}: expected one 'tau X.XXX over N prompts' line, found {len(m)}")
    return float(m[0][0]), int(m[0][1])


def read_results(out_dir):
    path = os.path.join(out_dir, "results.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{path}: missing; HINT: run benchmarks/tau_experiment.sh --out {out_dir} first")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path} line {n}: not valid JSON ({e})")
    return rows


def record(args):
    """Appends one eval's τ (parsed from its log) to OUT_DIR/results.jsonl."""
    tau, prompts = parse_tau(args.log)
    row = {"target": args.target, "variant": args.variant, "tau": tau, "prompts": prompts, "log": args.log}
    with open(os.path.join(args.out_dir, "results.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  tau {tau:.3f} over {prompts} prompts: {args.target} / {args.variant}")


def ordered(rows, key):
    seen = []
    for r in rows:
        if r[key] not in seen:
            seen.append(r[key])
    return seen


def table(args):
    rows = read_results(args.out_dir)
    targets, variants = ordered(rows, "target"), ordered(rows, "variant")
    tau = {(r["target"], r["variant"]): r["tau"] for r in rows}
    out = ["| drafter | " + " | ".join(f"τ {t}" for t in targets) + " |",
           "|---|" + "---:|" * len(targets)]
    for v in variants:
        cells = [f"{tau[(t, v)]:.3f}" if (t, v) in tau else "—" for t in targets]
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    with open(os.path.join(args.out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")


def plot(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, os.path.join(REPO, "launch"))
    from plot_metrics import read_metrics

    rows = read_results(args.out_dir)
    targets, variants = ordered(rows, "target"), ordered(rows, "variant")
    tau = {(r["target"], r["variant"]): r["tau"] for r in rows}
    fig, ax = plt.subplots(1, 1 + len(targets), figsize=(5 + 4.5 * len(targets), 4.2), constrained_layout=True)
    width = 0.8 / len(targets)
    for i, t in enumerate(targets):
        xs = [j + (i - (len(targets) - 1) / 2) * width for j in range(len(variants))]
        ys = [tau.get((t, v), float("nan")) for v in variants]
        bars = ax[0].bar(xs, ys, width, label=f"target {t}")
        ax[0].bar_label(bars, fmt="%.2f", fontsize=7)
    ax[0].axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax[0].set_xticks(range(len(variants)), variants, rotation=20, fontsize=8)
    ax[0].set_xlabel("drafter kind")
    ax[0].set_ylabel("τ (eval, greedy, held-out prompts)")
    ax[0].set_title("acceptance length per kind")
    ax[0].set_ylim(0, 1.25 * max(r["tau"] for r in rows))
    ax[0].legend(fontsize=8, ncol=len(targets), loc="upper center")
    for i, t in enumerate(targets):
        a = ax[1 + i]
        for kind in KINDS:
            path = os.path.join(args.out_dir, t, kind, "run", "metrics.jsonl")
            if not os.path.exists(path):
                continue
            metrics, _, _ = read_metrics(path)
            a.plot([r["step"] for r in metrics], [r["loss"] for r in metrics], label=kind)
        a.set_title(f"training loss, target {t}")
        a.set_xlabel("optimizer step")
        a.set_ylabel("loss (each kind's own objective)")
        a.legend(fontsize=8)
    png = args.png or os.path.join(args.out_dir, "tau_experiment.png")
    fig.savefig(png, dpi=90)
    print(f"plot: {png}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("target")
    s.add_argument("name", choices=("dense", "hybrid"))
    s.add_argument("--out", required=True)
    s.set_defaults(fn=write_target)
    s = sub.add_parser("prompts")
    s.add_argument("--out-train", required=True)
    s.add_argument("--out-eval", required=True)
    s.add_argument("--train", type=int, required=True)
    s.add_argument("--eval", type=int, required=True)
    s.add_argument("--vocab", type=int, default=VOCAB)
    s.add_argument("--min-len", type=int, default=8)
    s.add_argument("--max-len", type=int, default=24)
    s.add_argument("--seed", type=int, required=True)
    s.set_defaults(fn=write_prompts)
    s = sub.add_parser("config")
    s.add_argument("--kind", choices=KINDS, required=True)
    s.add_argument("--target-dir", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--run-dir", required=True)
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=write_config)
    s = sub.add_parser("record")
    s.add_argument("--out-dir", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--variant", required=True)
    s.add_argument("--log", required=True)
    s.set_defaults(fn=record)
    s = sub.add_parser("table")
    s.add_argument("out_dir")
    s.set_defaults(fn=table)
    s = sub.add_parser("plot")
    s.add_argument("out_dir")
    s.add_argument("--png")
    s.set_defaults(fn=plot)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
