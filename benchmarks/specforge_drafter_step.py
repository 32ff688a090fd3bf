#!/usr/bin/env python3
# The peer of bench_drafter_step: SpecForge's own DFlash training step (TrainerCore.train_step with its
# DFlashTrainStrategy over OnlineDFlashModel: flex_attention mask, anchor sampling, chunked loss, backward of
# the loss numerator, gradient normalisation, then BF16Optimizer) on the drafter shapes of our run configs,
# or with --kind domino its Domino step (DominoTrainStrategy over OnlineDominoModel and DominoDraftModel, at
# λ of the recipe's schedule) on our Domino recipes' shapes, or with --kind dspark its DSpark step
# (DSparkTrainStrategy over OnlineDSparkModel and DSparkDraftModel, the recipe's loss weights, the target's
# final hidden state random like the taps) on our DSpark recipes' shapes, or with --kind dflash2 its DFlash2
# step (DFlash2DraftModel under OnlineDFlashModel with the candidate selector's loss, from --specforge
# .peer/SpecForge-dflash2: SpecForge 5943b2f, PROVENANCE inside) on our DFlash2 recipe's shapes,
# random weights, 1 x 4096 tokens, one GPU (its FSDPTrainingBackend unwrapped, as a single-rank run has
# nothing to shard). Prints ONE JSON line per shape (seconds/step, context tok/s, peak memory) so
# run_drafter_step.sh can take the ratio. SpecForge is read from .peer/SpecForge, never copied.
#
# SpecForge's package __init__ files pull in its whole runtime (config schema, data, sglang capture...). Only
# a few module files are needed here, so load_specforge() registers empty package stubs for the folders and
# imports those files alone: modeling/draft/dflash.py (+ its dflash_kernels.py, registry.py; domino.py and
# utils.py for Domino, dspark.py for DSpark),
# algorithms/common/dflash_family_model.py (+ core/chunking.py), optimizer.py (+ lr_scheduler.py, utils.py)
# and, for the benchmark, training/{backend,controller,strategies/base}.py (+ runtime/contracts.py).
import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
import tomllib
import types

# The SpecForge commit these scripts were written against (github:sgl-project/SpecForge, 2026-08-08).
SPECFORGE_COMMIT = "a6b6b0230009d15ec2a97a57384e6f53f0f96946"
DFLASH2_COMMIT = "5943b2f66840d809d68925d1aa6896e7cd2775db"  # the first commit with DFlash2DraftModel
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SPECFORGE = os.path.join(REPO, ".peer", "SpecForge")

# Target shapes the drafter borrows (hidden size, vocabulary, layer count, intermediate): the run configs name
# a checkpoint directory that the benchmark machine does not have. Same figures as MODELS.md.
TARGETS = {
    "27b": {"toml": "configs/qwen3.6-27b.toml", "domino_toml": "configs/qwen3.6-27b-domino.toml",
            "dspark_toml": "configs/qwen3.6-27b-dspark.toml", "dflash2_toml": "configs/qwen3.6-27b-dflash2.toml",
            "hidden": 5120, "vocab": 248320, "layers": 64, "intermediate": 17408},
    "8b": {"toml": "configs/qwen3-8b.toml", "domino_toml": "configs/qwen3-8b-domino.toml",
           "dspark_toml": "configs/qwen3-8b-dspark.toml", "hidden": 4096, "vocab": 151936, "layers": 36,
           "intermediate": 12288},
}


def specforge_commit(root):
    """The commit recorded in the tree (<root>/SPECFORGE_COMMIT, as .peer/SpecForge-dflash2 holds it) or beside
    it (.peer/SPECFORGE_COMMIT for .peer/SpecForge), or 'unknown'."""
    for path in (os.path.join(root, "SPECFORGE_COMMIT"),
                 os.path.join(os.path.dirname(os.path.abspath(root)), "SPECFORGE_COMMIT")):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            pass
    return "unknown"


def load_specforge(root, trainer=False, optimizer=True, domino=False, dspark=False, dflash2=False):
    """Imports SpecForge's DFlash model, training wrapper and (with `optimizer`) optimizer (and with `trainer`
    its training loop pieces, with `domino` its Domino draft model, with `dspark` its DSpark draft model) from
    `root` without running its package __init__ files. Returns a namespace of modules."""
    pkg = os.path.join(root, "specforge")
    if not os.path.isfile(os.path.join(pkg, "modeling", "draft", "dflash.py")):
        sys.exit(f"SpecForge not found at {root} (no specforge/modeling/draft/dflash.py). HINT: export it "
                 f"with `git --git-dir=<mirror> archive {SPECFORGE_COMMIT} | tar -x -C .peer/SpecForge` on "
                 f"the build machine and carry .peer/ along, or pass --specforge DIR")
    for sub in ["", "modeling", "modeling/draft", "core", "algorithms", "algorithms/common", "training",
                "training/strategies", "runtime"]:
        name = "specforge" + ("." + sub.replace("/", ".") if sub else "")
        stub = types.ModuleType(name)
        stub.__path__ = [os.path.join(pkg, sub)]
        sys.modules[name] = stub
    names = {"dflash": "modeling.draft.dflash", "family": "algorithms.common.dflash_family_model"}
    if optimizer:
        names["optimizer"] = "optimizer"
    if domino:
        names["domino"] = "modeling.draft.domino"
    if dspark:
        names["dspark"] = "modeling.draft.dspark"
    if dflash2:
        names["dflash2"] = "modeling.draft.dflash2"
    if trainer:
        names.update(backend="training.backend", strategies="training.strategies.base",
                     controller="training.controller", contracts="runtime.contracts")
    return types.SimpleNamespace(**{k: importlib.import_module("specforge." + v) for k, v in names.items()})


def drafter_fields(toml_path, target):
    """The [drafter] section of one of our run configs, resolved against the target the way
    drafter_config_from_run does (intermediate 0 = the target's, empty taps = the DFlash default)."""
    with open(toml_path, "rb") as f:
        toml = tomllib.load(f)
    d, t = toml["drafter"], toml.get("train", {})
    layers = d.get("layers", 5)
    types_ = d.get("layer_types") or ["full_attention"] * layers
    taps = d.get("target_layer_ids") or []
    return {
        "layers": layers, "heads": d.get("heads", 32), "kv_heads": d.get("kv_heads", 8),
        "head_dim": d.get("head_dim", 128),
        "intermediate": d.get("intermediate", 0) or target["intermediate"],
        "block_size": d.get("block_size", 16), "mask_token_id": d["mask_token_id"],
        "num_taps": d.get("num_taps", 5),
        "target_layer_ids": taps, "layer_types": types_, "sliding_window": d.get("sliding_window", 2048),
        "rope_theta": d.get("rope_theta", 1e7), "rms_norm_eps": d.get("rms_norm_eps", 1e-6),
        "num_anchors": d.get("num_anchors", 512),
        "kind": d.get("kind", "dflash"), "pure_draft_prefix_len": d.get("pure_draft_prefix_len", 1),
        "emb_dim": d.get("emb_dim", 256), "gru_hidden_dim": d.get("gru_hidden_dim", 1024),
        "shift_label": d.get("shift_label", False), "lambda_base_start": t.get("lambda_base_start", 1.0),
        "lambda_base_decay_ratio": t.get("lambda_base_decay_ratio", 0.5),
        "markov_rank": d.get("markov_rank", 0), "markov_head_type": d.get("markov_head_type", "vanilla"),
        "enable_confidence_head": d.get("enable_confidence_head", False),
        "confidence_head_with_markov": d.get("confidence_head_with_markov", False),
        "confidence_head_alpha": d.get("confidence_head_alpha", 0.0),
        "attention_mode": d.get("attention_mode", "gqa"),
        "dspark_alphas": {k: t.get(k, v) for k, v in (("dspark_ce_loss_alpha", 0.1), ("dspark_l1_loss_alpha", 0.9),
                                                      ("dspark_confidence_head_alpha", 1.0))},
        "conv_kernel_size": d.get("conv_kernel_size", 0), "conv_group_size": d.get("conv_group_size", 0),
        "selector_rank": d.get("selector_rank", 0), "selector_top_k": d.get("selector_top_k", 0),
        "output_multiplier": d.get("output_multiplier", 1.0),
        "final_logit_softcapping": d.get("final_logit_softcapping", 0.0),
        "selector_alpha": t.get("dflash2_selector_loss_alpha", 1.0),
    }


def qwen3_draft_config(dflash, f, target, attn):
    """A Qwen3Config laid out as SpecForge's configs/qwen3.6-27b-dflash.json (same keys), for these fields;
    a Domino drafter's as configs/qwen3.6-27b-domino-full-attention.json (DominoDraftModel, the head's keys in
    dflash_config), a DSpark drafter's as configs/qwen3.6-27b-dspark.json (DSparkDraftModel, likewise)."""
    from transformers import Qwen3Config

    taps = f["target_layer_ids"] or dflash.build_target_layer_ids(target["layers"], f["num_taps"])
    sliding = "sliding_attention" in f["layer_types"]
    domino = f.get("kind", "dflash") == "domino"  # the golden script's FIELDS name no kind: it sets its own head
    dflash_config = {"mask_token_id": f["mask_token_id"], "target_layer_ids": taps}
    if domino:
        dflash_config.update(projector_type="domino", pure_draft_prefix_len=f["pure_draft_prefix_len"],
                             emb_dim=f["emb_dim"], gru_hidden_dim=f["gru_hidden_dim"],
                             shift_label=f["shift_label"])
    dspark = f.get("kind", "dflash") == "dspark"
    if dspark:
        dflash_config.update(projector_type="dspark", markov_rank=f["markov_rank"],
                             markov_head_type=f["markov_head_type"],
                             enable_confidence_head=f["enable_confidence_head"],
                             confidence_head_with_markov=f["confidence_head_with_markov"],
                             confidence_head_alpha=f["confidence_head_alpha"], attention_mode=f["attention_mode"])
    dflash2 = f.get("kind", "dflash") == "dflash2"
    if dflash2:  # SpecForge's DFlash2 keys; no softcap key means none there (our 0)
        dflash_config.update({k: f[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                "selector_top_k", "output_multiplier")})
        if f["final_logit_softcapping"] > 0:
            dflash_config["final_logit_softcapping"] = f["final_logit_softcapping"]
    arch = ("DominoDraftModel" if domino else "DSparkDraftModel" if dspark else "DFlash2DraftModel" if dflash2
            else "DFlashDraftModel")
    cfg = Qwen3Config(
        architectures=[arch], attention_bias=False,
        attention_dropout=0.0, block_size=f["block_size"], dflash_config=dflash_config,
        head_dim=f["head_dim"], hidden_act="silu", hidden_size=target["hidden"], initializer_range=0.02,
        intermediate_size=f["intermediate"], layer_types=list(f["layer_types"]),
        max_position_embeddings=262144,
        max_window_layers=f["layers"], num_attention_heads=f["heads"], num_hidden_layers=f["layers"],
        num_key_value_heads=f["kv_heads"], num_target_layers=target["layers"], rms_norm_eps=f["rms_norm_eps"],
        sliding_window=f["sliding_window"] if sliding else None, use_sliding_window=sliding,
        tie_word_embeddings=False, vocab_size=target["vocab"], rope_theta=f["rope_theta"], rope_scaling=None)
    cfg._attn_implementation = attn
    return cfg


def bench_shape(label, toml_path, target, mods, args):
    import torch
    from torch import nn

    dflash, family = mods.dflash, mods.family
    f = drafter_fields(toml_path, target)
    cfg = qwen3_draft_config(dflash, f, target, args.attn)
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    H, V, T = target["hidden"], target["vocab"], args.seq_len
    if f["kind"] != args.kind:
        sys.exit(f"specforge_drafter_step: --kind {args.kind}, but {toml_path} configures a {f['kind']} drafter")
    domino = f.get("kind", "dflash") == "domino"  # the golden script's FIELDS name no kind: it sets its own head
    dspark = f["kind"] == "dspark"
    dflash2 = f["kind"] == "dflash2"
    draft_class = (mods.domino.DominoDraftModel if domino else mods.dspark.DSparkDraftModel if dspark
                   else mods.dflash2.DFlash2DraftModel if dflash2 else dflash.DFlashDraftModel)
    with dev:
        draft = draft_class(cfg).to(torch.bfloat16)
        embed = nn.Embedding(V, H, dtype=torch.bfloat16)
        lm_head = nn.Linear(H, V, bias=False, dtype=torch.bfloat16)
    # Same scales as bench_drafter_step: embedding std 0.02; lm_head std 0.1/sqrt(H) so the first loss is
    # ~ln(V).
    nn.init.normal_(embed.weight, 0.0, 0.02)
    nn.init.normal_(lm_head.weight, 0.0, 0.1 / math.sqrt(H))
    for frozen in (embed, lm_head):
        frozen.requires_grad_(False)
    common = dict(draft_model=draft, target_lm_head=lm_head, target_embed_tokens=embed,
                  mask_token_id=f["mask_token_id"], block_size=f["block_size"], attention_backend=args.attn,
                  num_anchors=f["num_anchors"], loss_decay_gamma=args.gamma,
                  objective_chunk_blocks=args.objective_chunk_blocks)
    if domino:
        model = family.OnlineDominoModel(**common, shift_label=f["shift_label"])
    elif dspark:
        model = family.OnlineDSparkModel(**common, **f["dspark_alphas"])
    elif dflash2:  # the recipe's α (its warm-up and ramp are 0: α from the first step)
        model = family.OnlineDFlashModel(**common, loss_type="dflash", selector_loss_alpha=f["selector_alpha"])
    else:
        model = family.OnlineDFlashModel(**common, loss_type="dflash")
    model.train()
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    opt = mods.optimizer.BF16Optimizer(draft, lr=6e-4, weight_decay=0.0, max_grad_norm=1.0, total_steps=1000,
                                       warmup_ratio=0.04)
    if args.fused_adamw:
        # The fused CUDA AdamW kernel over the same fp32 masters (SpecForge builds torch.optim.AdamW with its
        # defaults, i.e. the foreach path); the scheduler is rebuilt on the new optimizer.
        opt.optimizer = torch.optim.AdamW(opt.fp32_params, lr=6e-4, weight_decay=0.0, fused=True)
        opt.scheduler = type(opt.scheduler)(opt.optimizer, total_steps=1000, warmup_steps=40)

    backend = mods.backend.FSDPTrainingBackend(mods.backend.ParallelConfig())
    backend.prepare_model(model, wrap=False)
    backend.set_optimizer(opt)
    if domino:
        strategy = mods.strategies.DominoTrainStrategy(model, lambda_start=f["lambda_base_start"],
                                                       decay_ratio=f["lambda_base_decay_ratio"])
    elif dspark:
        strategy = mods.strategies.DSparkTrainStrategy(model)
    else:
        strategy = mods.strategies.DFlashTrainStrategy(model)
    trainer = mods.controller.TrainerCore(strategy, backend, accumulation_steps=1)

    g = torch.Generator(device=dev).manual_seed(args.seed)
    ids = torch.randint(0, V, (1, T), device=dev, generator=g)
    hidden = torch.randn(1, T, len(draft.target_layer_ids) * H, device=dev, generator=g, dtype=torch.bfloat16)
    loss_mask = torch.ones(1, T, device=dev)
    tensors = {"input_ids": ids, "hidden_states": hidden, "loss_mask": loss_mask}
    if dspark:  # the target's final-norm output, as the taps random (bench_drafter_step does the same)
        tensors["target_last_hidden_states"] = torch.randn(1, T, H, device=dev, generator=g, dtype=torch.bfloat16)
    batch = mods.contracts.TrainBatch(sample_ids=["bench"], strategy="dflash" if dflash2 else f["kind"],
                                      tensors=tensors)
    step_no = [0]

    def step():
        # The schedule's step and horizon (Domino's λ reads them; DFlash ignores them), as bench_drafter_step.
        ctx = mods.strategies.StepContext(global_step=step_no[0], total_steps=1000)
        step_no[0] += 1
        r = trainer.train_step(batch, ctx)
        assert r.optimizer_stepped, "TrainerCore did not step the optimizer"
        return r.loss, r.grad_norm

    losses, times = [], []
    t0 = time.time()
    for _ in range(args.warmup):
        loss, grad_norm = step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    ev = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(args.steps)]
    for a, b in ev:
        a.record()
        loss, grad_norm = step()
        b.record()
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) / 1e3 for a, b in ev]
    losses.append(float(loss))
    s = statistics.median(times)
    finite = all(math.isfinite(x) for x in losses)
    finite = finite and grad_norm is not None and math.isfinite(float(grad_norm))
    out = {
        "bench": "specforge_drafter_step", "model": label, "kind": f["kind"],
        "config": os.path.relpath(toml_path, REPO),
        "specforge_commit": specforge_commit(args.specforge), "torch": torch.__version__,
        "transformers": importlib.import_module("transformers").__version__, "attention": args.attn,
        "fused_adamw": args.fused_adamw, "objective_chunk_blocks": args.objective_chunk_blocks,
        "step": f"TrainerCore.train_step ({type(strategy).__name__}, FSDPTrainingBackend unwrapped, "
                "BF16Optimizer)",
        "tokens": T, "anchors": f["num_anchors"], "block": f["block_size"], "trainable_params": trainable,
        "warmup_steps": args.warmup, "warmup_s": round(warm_s, 2), "steps": args.steps,
        "seconds_per_step": s, "min_s": min(times), "max_s": max(times), "ctx_tok_s": T / s,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "loss_first": losses[0], "loss_last": losses[-1], "ln_vocab": math.log(V), "finite": finite,
    }
    print(json.dumps(out), flush=True)
    del trainer, backend, model, draft, embed, lm_head, opt
    torch.cuda.empty_cache()
    return finite


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="all", choices=["all", *TARGETS], help="drafter shape(s) to time")
    p.add_argument("--kind", default="dflash", choices=["dflash", "domino", "dspark", "dflash2"],
                   help="the drafter kind: its recipe of --model (configs/*-domino.toml, *-dspark.toml, "
                        "*-dflash2.toml) and "
                        "SpecForge's step")
    p.add_argument("--config", help="a run config TOML instead of the model's (its target: --model's)")
    p.add_argument("--specforge", default=DEFAULT_SPECFORGE, help="SpecForge tree (default .peer/SpecForge)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (flex_attention compiles first)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--gamma", type=float, default=7.0, help="loss_decay_gamma (SpecForge examples use 7)")
    p.add_argument("--attn", default="flex_attention", choices=["flex_attention", "sdpa", "eager"])
    p.add_argument("--objective-chunk-blocks", type=int, default=128, help="SpecForge's default 128")
    p.add_argument("--no-fused-adamw", dest="fused_adamw", action="store_false")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("specforge_drafter_step: no CUDA device; this peer benchmark runs on the GPU machine only")
    commit = specforge_commit(args.specforge)
    pinned = DFLASH2_COMMIT if args.kind == "dflash2" else SPECFORGE_COMMIT
    if commit != pinned:
        print(f"specforge_drafter_step: WARNING the tree at {args.specforge} records commit {commit}, this "
              f"script pins {pinned} for --kind {args.kind}", file=sys.stderr)
    mods = load_specforge(args.specforge, trainer=True, domino=args.kind == "domino", dspark=args.kind == "dspark",
                          dflash2=args.kind == "dflash2")
    ok = True
    for label in TARGETS if args.model == "all" else [args.model]:
        key = {"domino": "domino_toml", "dspark": "dspark_toml", "dflash2": "dflash2_toml"}.get(args.kind, "toml")
        if not args.config and key not in TARGETS[label]:
            print(f"{label}: no {args.kind} recipe of this target yet, skipped")
            continue
        toml_path = args.config or os.path.join(REPO, TARGETS[label][key])
        ok &= bench_shape(label, toml_path, TARGETS[label], mods, args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
