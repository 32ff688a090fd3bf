# Where a hybrid golden's bf16 error comes from: for each Gated DeltaNet layer of a committed Qwen3.5 golden,
# runs the fp32 checkpoint (pure-torch kernels, as make_golden.py's goldens) and reports, at the tokens where
# HF-bf16's worst elements sit (hf_bf16_error.json), how small the layer's conditioning-critical inputs are there:
# the per-head RMS of the DeltaNet output that the gated RMSNorm divides by, and the norms of q and k that the
# l2norm divides by, each as a percentile over every (token, head) of the golden. A worst element on a token whose
# norm input is in the bottom fraction of a percent is ill-conditioned: the norm turns a bf16-sized absolute
# error of a near-cancelled vector into an O(1) error of its output, whatever kernel computed it.
#   python3 tests/golden/conditioning.py [--models qwen35_long,qwen35_odd5] [--save DIR]   (CPU or CUDA, fp32, seconds)
# --save writes DIR/<model>/rms_o.h5: per DeltaNet layer l, dataset layer_l [tokens, value heads] = rms(o).
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# make_golden blocks flash-linear-attention and friends before transformers loads (without --hf-bf16), so the
# model runs the same pure-torch kernels as the fp32 goldens.
import make_golden as mg  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


# The n-th call of the DeltaNet rule during one sequence's forward is the n-th DeltaNet layer's. Installed before any
# model is built, so it is what each layer runs whether transformers binds the rule at construction or by name.
RULE_CALLS = []
_RULE = mg.q35.torch_chunk_gated_delta_rule


def _recording_rule(query, key, *a, **kw):
    RULE_CALLS.append((query[0].float().norm(dim=-1).cpu(), key[0].float().norm(dim=-1).cpu()))
    return _RULE(query, key, *a, **kw)


mg.q35.torch_chunk_gated_delta_rule = _recording_rule


@torch.no_grad()
def layer_norm_inputs(model, seqs, device):
    """Per DeltaNet layer: rms(o) [N, nv] that the gated norm divides by, ||q|| and ||k|| [N, heads] pre-l2norm."""
    linear = [l for l, layer in enumerate(model.model.layers) if getattr(layer, "linear_attn", None) is not None]
    got = {l: {"o": [], "q": [], "k": []} for l in linear}
    nv = model.config.linear_num_value_heads
    hooks = []
    for l in linear:
        def norm_in(module, args, rec=got[l]):
            rec["o"].append(args[0].float().pow(2).mean(-1).sqrt().reshape(-1, nv).cpu())

        hooks.append(model.model.layers[l].linear_attn.norm.register_forward_pre_hook(norm_in))
    calls = RULE_CALLS
    try:
        for ids in seqs:
            calls.clear()
            model.model(input_ids=torch.from_numpy(ids)[None].to(device), use_cache=False)
            if len(calls) != len(linear):
                raise SystemExit(f"{len(calls)} DeltaNet rule calls for {len(linear)} DeltaNet layers")
            for l, (q, k) in zip(linear, calls):
                got[l]["q"].append(q)
                got[l]["k"].append(k)
    finally:
        for h in hooks:
            h.remove()
    return {l: {k: torch.cat(v).numpy() for k, v in r.items()} for l, r in got.items()}


def percentile_of(values, x):
    return 100.0 * float((values < x).sum()) / values.size


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default="qwen35_long,qwen35_odd5,qwen35_gqa3,qwen35_tiny,qwen35_hd256")
    p.add_argument("--save", help="folder that receives <model>/rms_o.h5 (the per token and head rms(o))")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in args.models.split(","):
        d = os.path.join(mg.COMMITTED, name)
        model = mg.q35.Qwen3_5ForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
        model = model.to(device).eval()
        norms = layer_norm_inputs(model, mg.read_tokens(d), device)
        if args.save:
            os.makedirs(os.path.join(args.save, name), exist_ok=True)
            mg.write_datasets_atomic(os.path.join(args.save, name, "rms_o.h5"),
                                     {f"layer_{l}": r["o"].astype(np.float32) for l, r in norms.items()})
        with open(os.path.join(d, mg.HF_BF16_FILE)) as f:
            errs = json.load(f)["datasets"]
        rows = sorted({e[k][0] for e in errs.values() for k in ("worst_at", "ensemble_worst_at") if k in e})
        print(f"{name}: DeltaNet layers {sorted(norms)}; HF-bf16's worst rows {rows}")
        for l, r in sorted(norms.items()):
            o, q, k = r["o"], r["q"], r["k"]
            med = np.median(o, axis=0)
            qk = (f"; ||q|| 0.1 % quantile {np.quantile(q, 0.001):.3g}, median {np.median(q):.3g}"
                                       f"; ||k|| 0.1 % quantile {np.quantile(k, 0.001):.3g}, median {np.median(k):.3g}")
            print(f"  layer {l}: rms(o)/median per head: 0.1 % quantile {np.quantile(o / med, 0.001):.3g}{qk}")
            for row in rows:
                h = int(np.argmin(o[row] / med))
                qk = (f"; min ||q|| {q[row].min():.3g} (percentile "
                                           f"{percentile_of(q, q[row].min()):.2f}); min ||k|| {k[row].min():.3g} "
                                           f"(percentile {percentile_of(k, k[row].min()):.2f})")
                print(f"    row {row:5d}: smallest rms(o)/median {o[row, h] / med[h]:.3g} (head {h}, percentile "
                      f"{percentile_of(o / med, o[row, h] / med[h]):.3f}){qk}")


if __name__ == "__main__":
    main()
