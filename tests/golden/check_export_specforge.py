#!/usr/bin/env python3
# Does a drafter that `dflash_mpi export` wrote load into SpecForge's own model class and draft the same
# logits? Builds the pinned SpecForge class of the kind (specforge_draft.py, as make_drafter_golden.py does)
# twice: once from the exported folder (its config.json; its model.safetensors loaded strictly: no missing,
# unexpected or misshapen tensor), once from the golden's original model folder (config.json and weights as
# SpecForge's code wrote them, rounded to bf16 as the export stores them). Both run the draft forward in
# float32 on the CPU on the golden's inputs (one block per sequence, as spec_generate drafts it: the taps of
# the positions before the anchor as context, [x_a, MASK...] as the block) and every output must be bit-equal
# (max abs diff 0): the base logits, and the kind's head outputs (Domino's corrected logits; DSpark's Markov
# logits and confidence; DFlash2's unary logits, selector scores and greedy path). Prints one line; exits
# non-zero on any mismatch. Run where torch + transformers exist (the GPU machine; nothing runs on the GPU):
#
#   python3 tests/golden/check_export_specforge.py --kind dspark --export /tmp/x/dspark_rnn \
#       --golden tests/golden/drafter_dspark_rnn [--specforge .peer/SpecForge]
#
# tests/golden/check_export_all.sh BUILD_DIR exports every golden with the built dflash_mpi and runs this on each.
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specforge_draft  # noqa: E402

# The architectures SpecForge's export normaliser (scripts/gates/normalize_dflash_export.py) leaves for SGLang;
# DFlash2 is served under its own class name (SpecForge 5943b2f dflash2.py), which the normaliser does not touch.
EXPORT_ARCHITECTURES = {"dflash": "DFlashDraftModel", "domino": "DFlashDraftModel", "dspark": "Qwen3DSparkModel",
                        "dflash2": "DFlash2DraftModel"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Load an exported drafter into SpecForge's class; compare its "
                                            "draft outputs with the golden's original model.")
    p.add_argument("--kind", required=True, choices=specforge_draft.KINDS)
    p.add_argument("--export", required=True, help="the folder `dflash_mpi export` wrote")
    p.add_argument("--golden", required=True,
                   help="the golden folder the export came from (tests/golden/drafter*: model/ + golden.safetensors)")
    p.add_argument("--specforge", default=None,
                   help="SpecForge tree (default .peer/SpecForge; for dflash2 .peer/SpecForge-dflash2)")
    args = p.parse_args(argv)
    if args.specforge is None:
        args.specforge = specforge_draft.default_specforge(args.kind)
    for path in (os.path.join(args.export, "config.json"), os.path.join(args.export, "model.safetensors"),
                 os.path.join(args.golden, "model", "config.json"),
                 os.path.join(args.golden, "model", "model.safetensors"),
                 os.path.join(args.golden, "golden.safetensors")):
        if not os.path.isfile(path):
            p.error(f"{path} does not exist (--export is what `dflash_mpi export` wrote; --golden a "
                    f"tests/golden/drafter* folder)")
    return args


def normaliser_changes(kind, specforge, config_path):
    """What SpecForge's export normaliser would still change in the exported config.json (run on a copy): a
    description per key, none when the export already is in its layout. DFlash2 is not one of the kinds it
    knows (it would rename the architecture to DFlashDraftModel); SpecForge serves it as saved, so it is skipped."""
    if kind == "dflash2":
        return []
    import importlib.util
    import shutil
    import tempfile

    script = os.path.join(specforge, "scripts", "gates", "normalize_dflash_export.py")
    if not os.path.isfile(script):
        sys.exit(f"check_export_specforge: {script} is missing; HINT: --specforge must be a whole SpecForge tree")
    spec = importlib.util.spec_from_file_location("normalize_dflash_export", script)
    normaliser = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(normaliser)
    before = read_config(config_path)
    with tempfile.TemporaryDirectory() as tmp:
        copy = shutil.copy(config_path, os.path.join(tmp, "config.json"))
        try:
            after = normaliser.normalize_export(copy, before.get("block_size"))
        except ValueError as e:
            return [f"SpecForge's normaliser refuses it: {e}"]
    return [f"normaliser changes {k}: {before.get(k)!r} -> {after.get(k)!r}"
            for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


def read_config(path):
    with open(path) as fh:
        return json.load(fh)


def build_model(draft_class, hf, where):
    """The SpecForge class on the Qwen3Config that config.json's keys make, float32, sdpa attention. SpecForge
    a6b6b023 reads block_size from the top level only; the 2026 layout (the goldens') keeps it in dflash_config,
    where loaders look first, so it is copied up when the top level lacks it."""
    from transformers import Qwen3Config

    hf = dict(hf)
    if "block_size" not in hf:
        block = (hf.get("dflash_config") or {}).get("block_size")
        if block is None:
            sys.exit(f"check_export_specforge: {where} has no block_size (neither top level nor dflash_config)")
        hf["block_size"] = block
    cfg = Qwen3Config.from_dict(hf)
    cfg._attn_implementation = "sdpa"
    return draft_class(cfg).float().eval()


def load_strict(model, weights, where):
    """Loads `weights` (name → tensor) into model; any missing, unexpected or misshapen tensor is an error."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    misshapen = sorted(f"{n} {list(weights[n].shape)} (class wants {list(expected[n].shape)})"
                       for n in set(weights) & set(expected) if weights[n].shape != expected[n].shape)
    if missing or unexpected or misshapen:
        sys.exit(f"check_export_specforge: {where} does not fit {type(model).__name__}: missing {missing}, "
                 f"unexpected {unexpected}, misshapen {misshapen}")
    model.load_state_dict(weights, strict=True)


def draft_outputs(kind, model, golden):
    """Every output the class exposes for one drafted block per golden sequence, name → tensor."""
    import torch

    tokens, offsets, taps = golden["tokens"].long(), golden["offsets"].tolist(), golden["taps"]
    embed, lm_head = golden["embed"], golden["lm_head"]
    B, mask_id = model.block_size, model.mask_token_id
    out = {}
    for s in range(len(offsets) - 1):
        start, n = offsets[s], offsets[s + 1] - offsets[s]
        a = n - B  # the last anchor whose block lies inside the sequence: gold tokens for every head input
        if a < 1:
            sys.exit(f"check_export_specforge: golden sequence {s} has {n} tokens; it needs more than the block "
                     f"({B}) to give the block a context")
        block_ids = torch.full((1, B), mask_id, dtype=torch.long)
        block_ids[0, 0] = tokens[start + a]
        prev_ids = tokens[start + a:start + a + B].reshape(1, B)  # gold x[a..a+B-1]: each slot's predecessor
        hidden = model(position_ids=torch.arange(a + B).reshape(1, -1),
                       noise_embedding=torch.nn.functional.embedding(block_ids, embed),
                       target_hidden=taps[start:start + a].unsqueeze(0), is_causal=False)
        logits = hidden @ lm_head.T
        out[f"seq{s}.hidden"], out[f"seq{s}.logits"] = hidden, logits
        if kind == "domino":
            prev_emb = torch.nn.functional.embedding(prev_ids, embed)
            out[f"seq{s}.domino_logits"] = model.apply_logits_head(
                logits.unsqueeze(1), prev_token_embeddings=prev_emb.unsqueeze(1), hidden_states=hidden.unsqueeze(1))
        elif kind == "dspark":
            out[f"seq{s}.markov_logits"] = model.apply_logits_head(logits, prev_token_ids=prev_ids,
                                                                   hidden_states=hidden)
            out[f"seq{s}.confidence"] = model.predict_confidence(hidden, prev_token_ids=prev_ids)
        elif kind == "dflash2":
            selector = model.candidate_selector
            unary = model.transform_unary_logits(logits)
            unary_top, candidates = unary.topk(selector.top_k, dim=-1)
            out[f"seq{s}.unary_logits"], out[f"seq{s}.candidates"] = unary, candidates
            out[f"seq{s}.selector_scores"] = selector.score_candidates(
                candidate_ids=candidates, unary_logits=unary_top, hidden_states=hidden, predecessor_ids=prev_ids)
            out[f"seq{s}.greedy_path"] = selector.greedy_path(
                candidate_ids=candidates[:, 1:], unary_logits=unary_top[:, 1:], hidden_states=hidden[:, 1:],
                anchor_token_ids=block_ids[:, 0])
    return out


def main(argv=None):
    args = parse_args(argv)
    import torch
    from safetensors.torch import load_file

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    commit, pinned = specforge_draft.check_commit(args.kind, args.specforge, "check_export_specforge")
    if commit != pinned:
        print(f"WARNING: the SpecForge tree {args.specforge} is at {commit}, not the pinned {pinned}",
              file=sys.stderr)
    _sf, draft_class = specforge_draft.load_draft_class(args.kind, args.specforge)

    exported_cfg = read_config(os.path.join(args.export, "config.json"))
    want_arch = EXPORT_ARCHITECTURES[args.kind]
    problems = normaliser_changes(args.kind, args.specforge, os.path.join(args.export, "config.json"))
    if exported_cfg.get("architectures") != [want_arch]:
        problems.append(f"architectures {exported_cfg.get('architectures')} (SGLang's loader wants [{want_arch!r}])")
    exported = load_file(os.path.join(args.export, "model.safetensors"))
    not_bf16 = sorted(n for n, t in exported.items() if t.dtype != torch.bfloat16)
    if not_bf16:
        problems.append(f"tensors not bf16 although config.json says dtype bfloat16: {not_bf16}")

    model = build_model(draft_class, exported_cfg, args.export)
    load_strict(model, {n: t.float() for n, t in exported.items()}, os.path.join(args.export, "model.safetensors"))
    golden_model_dir = os.path.join(args.golden, "model")
    reference = build_model(draft_class, read_config(os.path.join(golden_model_dir, "config.json")), golden_model_dir)
    original = load_file(os.path.join(golden_model_dir, "model.safetensors"))
    load_strict(reference, {n: t.to(torch.bfloat16).float() for n, t in original.items()},
                os.path.join(golden_model_dir, "model.safetensors"))

    golden = load_file(os.path.join(args.golden, "golden.safetensors"))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        ours, theirs = draft_outputs(args.kind, model, golden), draft_outputs(args.kind, reference, golden)
        # What the bf16 storage itself changes (informational): the reference on the golden's float32 weights.
        load_strict(reference, {n: t.float() for n, t in original.items()}, golden_model_dir)
        f32 = draft_outputs(args.kind, reference, golden)
    worst = {}
    for name, want in theirs.items():
        got = ours[name]
        if got.shape != want.shape:
            problems.append(f"{name} has shape {list(got.shape)}, the golden model's {list(want.shape)}")
            continue
        if got.is_floating_point() and not (torch.isfinite(got).all() and torch.isfinite(want).all()):
            problems.append(f"{name} holds non-finite values")
            continue
        diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
        key = name.split(".", 1)[1]
        worst[key] = max(worst.get(key, 0.0), diff)
    bad = {k: d for k, d in worst.items() if d != 0.0}
    if bad:
        problems.append("outputs differ from the golden model's: " +
                        ", ".join(f"{k} max abs diff {d:.3g}" for k, d in sorted(bad.items())))
    bf16_effect = max((ours[n].double() - f32[n].double()).abs().max().item() for n in f32 if n.endswith(".logits"))
    compared = ", ".join(sorted(worst))
    status = "FAIL" if problems else "ok"
    print(f"{status} {args.kind} ({args.export}): {len(exported)} tensors loaded strictly into "
          f"{draft_class.__name__} (SpecForge {commit}); max abs diff 0 expected on [{compared}]: "
          f"{'; '.join(problems) if problems else 'all 0'} (bf16 storage moves the logits by "
          f"{bf16_effect:.3g} from the golden's float32 weights)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
