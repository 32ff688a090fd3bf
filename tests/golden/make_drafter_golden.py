#!/usr/bin/env python3
# Golden files for the drafter's training step, written by SpecForge's own DFlash code (DFlashDraftModel +
# OnlineDFlashModel: mask, labels, anchor-block weights, decay, loss) on a tiny awkward config, in float64 on
# the CPU. Attention is SpecForge's "sdpa" backend (its dense twin of the flex_attention mask,
# create_dflash_sdpa_mask): flex_attention on the CPU would need inductor, and the "eager" path casts
# float64's additive mask minimum to float32 -inf inside transformers' softmax, so padding blocks (no visible
# key) turn NaN. test_drafter_golden(.cpp, unit and gpu) loads the drafter through drafter.init_from's reader
# and must reproduce the loss and every parameter gradient. Run where torch + transformers exist (the GPU
# machine):
#
#   python3 tests/golden/make_drafter_golden.py [--specforge .peer/SpecForge] [--out tests/golden/drafter]
#   python3 tests/golden/make_drafter_golden.py --kind domino     (-> tests/golden/drafter_domino)
#   python3 tests/golden/make_drafter_golden.py --kind dflash2 --specforge .peer/SpecForge-dflash2
#                                                                 (-> tests/golden/drafter_dflash2)
#   python3 tests/golden/make_drafter_golden.py --kind dspark --markov-head rnn   (-> drafter_dspark_rnn; also
#                                                               vanilla, gated)
#
# --kind domino runs SpecForge's DominoDraftModel + OnlineDominoModel instead (shift_label, a GRU prefix head,
# λ fixed at LAMBDA_BASE so both CE terms carry gradient) and also records the backbone's normed output per
# block (hidden [S·N·B, H]) with the loss's gradient with respect to it, the GRU input and label ids, and the
# final / base loss terms: the head oracle (ops/domino_head.h) is checked on those alone.
#
# --kind dspark runs SpecForge's DSparkDraftModel + OnlineDSparkModel (shifted labels, the cumulative eval mask,
# a Markov head of the chosen type, a confidence head, CE + L1 + BCE with the loss weights DSPARK_ALPHAS) on one
# more input, the target's final hidden state per token (target_hidden [T, H]), and records as Domino does the
# backbone's normed output per block with its gradient, the previous and label ids, and the three loss
# numerators: the head oracle (model/dspark_head.h) is checked on those alone. SpecForge computes the L1 and
# confidence terms in float32 (its .float() casts) even in a float64 run, which the tolerances allow for.
#
# --kind dflash2 runs SpecForge's DFlash2DraftModel + OnlineDFlashModel with its candidate selector; they exist
# from SpecForge commit specforge_draft.DFLASH2_COMMIT on (the tree --specforge names must hold it, and its commit in
# <tree>/SPECFORGE_COMMIT). It records the backbone's normed output per block with the loss's gradient (the
# selector oracle, ops/dflash2_selector.h, is checked on those), the label and predecessor ids, the loss
# terms, and for every grouped convolution its input, output and the loss's gradients with respect to both,
# on each side (ops/dflash2_conv.h is checked on those).
#
# --seed (default 0) seeds every draw. DSpark's L1 term |softmax_draft − softmax_target| has a kink where the two
# probabilities of a token are equal; on a draw with a heavily weighted token within a bf16 rounding of it, which
# side of the kink a bf16 step lands on is a coin flip that moves that logit's gradient by 2·α_l1·w·q, for
# SpecForge's bf16 step and ours alike, so the bf16 comparison measures the flip instead of the precision. Seed
# 0's vanilla draw had one (row 24, token 28: q = 0.051 with log q − log t = −7e-3). The committed
# drafter_dspark_vanilla is seed 3's draw (`--kind dspark --markov-head vanilla --seed 3`): its nearest weighted
# tie carries w·q = 0.004, and the fp32 head oracle on 12 draws of bf16-sized input noise stays within 0.0122 of
# the golden on every head gradient (seed 0: 0.035). tests/gpu/test_dspark_golden_head_cuda.cpp prints each
# golden's near-ties and that noise sweep.
#
# Out: <out>/model/{config.json, model.safetensors} (the drafter, HF layout, F32) and <out>/golden.safetensors
# (inputs, SpecForge's per-row weight mask, loss and gradients, F32; versions and commit in its metadata).
# Every value is seeded, and float64 on the CPU is deterministic, so a rerun with the same versions writes the
# same numbers.
#
# Then <out>/peer_bf16_error.json: the same SpecForge step once more with the drafter, the frozen tables and the
# inputs in bfloat16 (the loss mask stays float32, as SpecForge's batches hold it), on CUDA when there is a device
# (as SpecForge trains; else the CPU), same anchors and attention (the SDPA mask on the math kernel), no float32
# master copy: the relative RMS error ||g_bf16 − g_f64|| / ||g_f64|| of every parameter gradient and the loss's
# relative error, with the torch version and the device. tests/gpu/test_drafter_golden_cuda.cpp bounds our bf16
# step by 1.25× these where they exceed its own constant. This pass runs after the golden is written and draws
# no random number the golden records, so the golden files are what they were without it.
import argparse
import copy
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specforge_draft  # noqa: E402  (the kind's SpecForge class, shared with check_export_specforge.py)
from specforge_draft import REPO, peer  # noqa: E402

# The config: H 64, 2 layers (sliding then full), GQA 4/2 x 16, block 4, window 5, vocab 97, two taps.
TARGET = {"hidden": 64, "vocab": 97, "layers": 6, "intermediate": 96}
FIELDS = {
    "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 96, "block_size": 4,
    "mask_token_id": 96, "num_taps": 2, "target_layer_ids": [1, 3],
    "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "num_anchors": 5,
}
GAMMA = 3.0
# Domino's head (dflash_config keys): odd sizes, one uncorrected slot; λ between its ends.
DOMINO = {"projector_type": "domino", "pure_draft_prefix_len": 1, "emb_dim": 23, "gru_hidden_dim": 19,
          "shift_label": True}
LAMBDA_BASE = 0.3
# DFlash2 (dflash_config keys): 3 taps in blocks of 4, 4 groups of 16 channels, an odd rank, a top-K that
# holds the gold label for some rows and not for others, both unary transforms on; α between 0 and 1.
DFLASH2 = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 7, "selector_top_k": 24,
           "output_multiplier": 0.7, "final_logit_softcapping": 4.0}
SELECTOR_ALPHA = 0.6
# DSpark's head (dflash_config keys): odd rank; the confidence head reads W1[prev] except with the gated head,
# so both confidence inputs are covered. Loss weights unlike SpecForge's defaults, so a swapped pair shows.
DSPARK_RANK = 5
DSPARK_ALPHAS = {"dspark_ce_loss_alpha": 0.2, "dspark_l1_loss_alpha": 0.7, "dspark_confidence_head_alpha": 0.6}


def dspark_head(markov_head):
    return {"projector_type": "dspark", "markov_rank": DSPARK_RANK, "markov_head_type": markov_head,
            "enable_confidence_head": True, "confidence_head_with_markov": markov_head != "gated",
            "confidence_head_alpha": 1.0, "attention_mode": "gqa"}

# Three sequences; loss-mask holes (a prompt, one unsupervised token). Anchors are SpecForge-valid positions
# (loss_mask[a] and loss_mask[a+1], a <= len-2) chosen to hit the edges: a = 0 (no context), neighbours closer
# than the block (1, 2; 3, 4), blocks running past the sequence end (11 in 13, 17 in 21), a label on a masked
# token (12: its offset 3 is position 15), a window that cuts the context (a >= 5 in the sliding layer), and
# padding blocks (keep = false) where a sequence has fewer than 5 anchors.
LENGTHS = [13, 21, 9]
MASK_ZEROS = {1: [0, 1, 2, 15]}
ANCHORS = [[0, 1, 2, 7, 11], [3, 4, 12, 17], [5]]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--specforge", default=None,
                   help="SpecForge tree (default .peer/SpecForge; for dflash2 .peer/SpecForge-dflash2)")
    p.add_argument("--kind", default="dflash", choices=specforge_draft.KINDS)
    p.add_argument("--markov-head", default="rnn", choices=["vanilla", "gated", "rnn"],
                   help="--kind dspark: the Markov head type")
    p.add_argument("--out", default=None, help="default tests/golden/drafter (dflash), drafter_domino (domino), "
                                               "drafter_dspark_<markov head> (dspark), drafter_dflash2 (dflash2)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0, help="seeds every draw (see the file's head)")
    args = p.parse_args()
    # cuBLAS's deterministic mode for the bfloat16 pass on CUDA (read when torch first makes a cuBLAS handle).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    domino, dspark, dflash2 = args.kind == "domino", args.kind == "dspark", args.kind == "dflash2"
    if args.out is None:
        name = {"dflash": "drafter", "domino": "drafter_domino", "dspark": "drafter_dspark_" + args.markov_head,
                "dflash2": "drafter_dflash2"}
        args.out = os.path.join(REPO, "tests", "golden", name[args.kind])
    if args.specforge is None:
        args.specforge = specforge_draft.default_specforge(args.kind)
    head_keys = DOMINO if domino else dspark_head(args.markov_head) if dspark else DFLASH2 if dflash2 else {}

    import torch
    from safetensors.torch import save_file
    from torch import nn
    import transformers

    commit, pinned = specforge_draft.check_commit(args.kind, args.specforge, "make_drafter_golden")
    print(f"SpecForge {commit} (pinned {pinned}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    if commit != pinned:
        print("WARNING: the SpecForge tree is not the pinned commit", file=sys.stderr)
    sf, draft_class = specforge_draft.load_draft_class(args.kind, args.specforge)
    dflash, family = sf.dflash, sf.family
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    f64 = getattr(torch, args.dtype)  # the reference's compute dtype (float64 unless asked otherwise)

    cfg = peer.qwen3_draft_config(dflash, FIELDS, TARGET, args.attn)
    cfg.architectures = [specforge_draft.CLASS_NAMES[args.kind]]
    cfg.dflash_config.update(head_keys)
    draft = draft_class(cfg).to(f64)
    if domino:
        assert draft.suffix_start == DOMINO["pure_draft_prefix_len"] and draft.shift_label
    elif dflash2:
        d2 = sys.modules[draft_class.__module__]
        assert draft.candidate_selector.top_k == DFLASH2["selector_top_k"]
    elif dspark:
        assert draft.markov_head is not None and draft.markov_head.markov_head_type == args.markov_head
        assert draft.confidence_head is not None
        assert draft.confidence_head_with_markov == head_keys["confidence_head_with_markov"]
    hd, theta = FIELDS["head_dim"], FIELDS["rope_theta"]
    want = theta ** (-torch.arange(0, hd, 2, dtype=f64) / hd)
    got = draft.rotary_emb.inv_freq.to(f64)
    assert torch.allclose(got, want, rtol=1e-6), f"rotary inv_freq {got} is not theta {theta}'s"
    assert draft.sliding_window == FIELDS["sliding_window"]
    assert list(draft.layer_types) == FIELDS["layer_types"]

    # Every value is drawn in float64 and rounded to float32 once, so the float32 files hold exactly what the
    # float64 reference ran on. Matrices ~ N(0, 1/fan_in); norm weights 1 + N(0, 0.2) (never the init's 1).
    def f32_exact(t):
        return t.to(torch.float32).to(f64)

    H, V, k = TARGET["hidden"], TARGET["vocab"], FIELDS["num_taps"]
    with torch.no_grad():
        for name, prm in draft.named_parameters():
            if name.endswith("base_kernel"):  # [2, taps, H]: the identity plus a real dynamic range
                ident = torch.zeros(prm.shape, dtype=f64)
                ident[:, 0] = 1.0
                prm.copy_(f32_exact(ident + 0.3 * torch.randn(prm.shape, dtype=f64)))
            elif prm.dim() == 2:
                prm.copy_(f32_exact(torch.randn(prm.shape, dtype=f64) / math.sqrt(prm.shape[1])))
            else:
                prm.copy_(f32_exact(1.0 + 0.2 * torch.randn(prm.shape, dtype=f64)))
    embed = nn.Embedding(V, H, dtype=f64)
    lm_head = nn.Linear(H, V, bias=False, dtype=f64)
    with torch.no_grad():
        embed.weight.copy_(f32_exact(0.5 * torch.randn(V, H, dtype=f64)))
        lm_head.weight.copy_(f32_exact(1.5 * torch.randn(V, H, dtype=f64) / math.sqrt(H)))
    for frozen in (embed, lm_head):
        frozen.requires_grad_(False)

    S, L, N, B = len(LENGTHS), max(LENGTHS), FIELDS["num_anchors"], FIELDS["block_size"]
    T = sum(LENGTHS)
    tokens = torch.randint(0, V - 1, (T,))
    taps = f32_exact(torch.randn(T, k * H, dtype=f64))
    loss_mask_packed = torch.ones(T, dtype=torch.uint8)
    offsets = [0]
    for n in LENGTHS:
        offsets.append(offsets[-1] + n)
    for s, zeros in MASK_ZEROS.items():
        for t in zeros:
            loss_mask_packed[offsets[s] + t] = 0
    # The target's final-norm output per token (DSpark's target distributions), drawn after every other input so
    # the other kinds' draws stay as they were.
    target_hidden = f32_exact(torch.randn(T, H, dtype=f64)) if dspark else None
    # SpecForge trains on [batch, seq] rows padded to the longest, padding masked out.
    input_ids = torch.zeros(S, L, dtype=torch.long)
    hidden = torch.zeros(S, L, k * H, dtype=f64)
    loss_mask = torch.zeros(S, L)
    target_last = torch.zeros(S, L, H, dtype=f64) if dspark else None
    anchors = torch.zeros(S, N, dtype=torch.long)
    keep = torch.zeros(S, N, dtype=torch.bool)
    for s, n in enumerate(LENGTHS):
        input_ids[s, :n] = tokens[offsets[s]:offsets[s + 1]]
        hidden[s, :n] = taps[offsets[s]:offsets[s + 1]]
        loss_mask[s, :n] = loss_mask_packed[offsets[s]:offsets[s + 1]].to(loss_mask.dtype)
        if dspark:
            target_last[s, :n] = target_hidden[offsets[s]:offsets[s + 1]]
        for j, a in enumerate(ANCHORS[s]):
            assert a <= n - 2 and loss_mask[s, a] > 0.5 and loss_mask[s, a + 1] > 0.5, (s, a)
            anchors[s, j], keep[s, j] = a, True

    # SpecForge's training wrapper of the kind around a drafter and frozen tables, with fixed anchors in place of
    # its random draw (same return contract: positions with 0 where not kept, and the keep mask, on the
    # wrapper's device).
    def online_model(draft_model, embed_tokens, target_lm_head):
        common = dict(draft_model=draft_model, target_lm_head=target_lm_head, target_embed_tokens=embed_tokens,
                      mask_token_id=FIELDS["mask_token_id"], block_size=B, attention_backend=args.attn,
                      num_anchors=N, loss_decay_gamma=GAMMA, objective_chunk_blocks=128)
        if domino:
            online = family.OnlineDominoModel(**common, shift_label=DOMINO["shift_label"])
        elif dflash2:
            online = family.OnlineDFlashModel(**common, loss_type="dflash", selector_loss_alpha=SELECTOR_ALPHA)
        elif dspark:
            online = family.OnlineDSparkModel(**common, **DSPARK_ALPHAS)
        else:
            online = family.OnlineDFlashModel(**common, loss_type="dflash")
        online.train()
        online._sample_anchor_positions = lambda seq_len, lm, device, **kw: (anchors.to(device, copy=True),
                                                                             keep.to(device, copy=True))
        return online

    model = online_model(draft, embed, lm_head)
    # The weight mask the objective receives is recorded for the row-by-row comparison.
    seen = {}
    if domino:
        objective = model._domino_objective_chunk_terms
        head_inputs = model._build_domino_head_inputs

        def recording_objective(hidden_4d, prev_ids, target_ids, weight_mask, eval_weight_mask):
            seen.setdefault("weight_mask", weight_mask.detach().clone())
            return objective(hidden_4d, prev_ids, target_ids, weight_mask, eval_weight_mask)

        # The backbone's output as the head receives it, kept with its gradient, and the head's token ids.
        def recording_head_inputs(**kw):
            hidden4d, prev_ids = head_inputs(**kw)
            hidden4d.retain_grad()
            seen.update(hidden=hidden4d, prev_ids=prev_ids.detach().clone(),
                        target_ids=kw["target_ids"].detach().clone())
            return hidden4d, prev_ids

        model._domino_objective_chunk_terms = recording_objective
        model._build_domino_head_inputs = recording_head_inputs
    elif dflash2:
        objective = model._dflash_objective_chunk_terms
        draft_blocks = model._forward_draft_blocks

        def recording_objective(hidden_4d, target_ids, weight_mask, predecessor_ids):
            seen.setdefault("weight_mask", weight_mask.detach().clone())
            seen.setdefault("target_ids", target_ids.detach().clone())
            seen.setdefault("predecessor_ids", predecessor_ids.detach().clone())
            return objective(hidden_4d, target_ids, weight_mask, predecessor_ids)

        # The backbone's normed output, kept with its gradient (the objective runs under checkpointing).
        def recording_draft_blocks(**kw):
            anchor_positions, keep_mask, output_hidden = draft_blocks(**kw)
            output_hidden.retain_grad()
            seen["hidden"] = output_hidden
            return anchor_positions, keep_mask, output_hidden

        model._dflash_objective_chunk_terms = recording_objective
        model._forward_draft_blocks = recording_draft_blocks
        # Every grouped convolution's two sides: input and output, both kept with their gradients.
        conv_names = {id(m): n for n, m in draft.named_modules() if isinstance(m, d2.DFlashGroupedConv)}
        convs = {}
        prepare, finish = d2.DFlashGroupedConv.prepare, d2.DFlashGroupedConv.finish

        def recording_prepare(self, hidden_states):
            out, coefficients = prepare(self, hidden_states)
            for t in (hidden_states, out):
                t.retain_grad()
            convs[conv_names[id(self)]] = {"x": hidden_states, "a": out}
            return out, coefficients

        def recording_finish(self, hidden_states, coefficients):
            out = finish(self, hidden_states, coefficients)
            for t in (hidden_states, out):
                t.retain_grad()
            convs[conv_names[id(self)]].update(y=hidden_states, z=out)
            return out

        d2.DFlashGroupedConv.prepare, d2.DFlashGroupedConv.finish = recording_prepare, recording_finish
    elif dspark:
        weight_mask_of = model._dspark_loss_weight_mask
        compute_loss = model._compute_dspark_loss

        def recording_weight_mask(eval_mask):
            weights = weight_mask_of(eval_mask)
            seen["weight_mask"] = weights.detach().clone()
            return weights

        # The backbone's output as the head receives it, kept with its gradient, and the head's token ids.
        def recording_loss(**kw):
            kw["output_hidden"].retain_grad()
            seen.update(hidden=kw["output_hidden"], prev_ids=kw["prev_token_ids"].detach().clone(),
                        target_ids=kw["target_ids"].detach().clone())
            return compute_loss(**kw)

        model._dspark_loss_weight_mask = recording_weight_mask
        model._compute_dspark_loss = recording_loss
    else:
        objective = model._dflash_objective_chunk_terms

        def recording_objective(hidden_4d, target_ids, weight_mask):
            seen["weight_mask"] = weight_mask.detach().clone()
            return objective(hidden_4d, target_ids, weight_mask)

        model._dflash_objective_chunk_terms = recording_objective
    # The math SDPA kernel: float64 throughout, and a fully masked row (a padding block) gives 0, not NaN.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        extra = ({"lambda_base": LAMBDA_BASE} if domino else
                 {"target_last_hidden_states": target_last} if dspark else {})
        loss, _acc, metrics = model(input_ids=input_ids, hidden_states=hidden, loss_mask=loss_mask, **extra)
        loss.backward()
    if dflash2:  # the recording is this pass's alone
        d2.DFlashGroupedConv.prepare, d2.DFlashGroupedConv.finish = prepare, finish
    if domino:
        loss_den = seen["weight_mask"].sum()
        loss_num = loss * (loss_den + 1e-6)
    elif dflash2:
        loss_num, loss_den = metrics["loss_terms"]
        selector_num, _ = metrics["ratio_metrics"]["selector_loss"]
        covered, _ = metrics["ratio_metrics"]["selector_coverage"]
        print(f"selector: CE sum {float(selector_num):.6f}, gold inside the top-{DFLASH2['selector_top_k']} on "
              f"{float(covered):.0f} of {float(seen['weight_mask'].sum()):.0f} labelled rows")
        assert 0 < float(covered) < float(seen["weight_mask"].sum()), "both selector branches must be exercised"
    elif dspark:
        loss_den = seen["weight_mask"].sum()
        loss_num = loss * loss_den
    else:
        loss_num, loss_den = metrics["loss_terms"]
    bad = [n for n, prm in draft.named_parameters() if prm.grad is None or not torch.isfinite(prm.grad).all()]
    if not math.isfinite(float(loss)) or bad:
        sys.exit(f"make_drafter_golden: loss {float(loss)} or gradients of {bad} are not finite; nothing "
                 f"written. HINT: try --attn eager --dtype float32 (then loosen the CPU test's tolerance: a "
                 f"float32 reference)")
    print(f"loss {float(loss):.9f} = {float(loss_num):.6f} / {float(loss_den):.6f}")

    packed_anchors = []
    for s in range(S):
        for j in range(N):
            packed_anchors.append([s, int(anchors[s, j]) if keep[s, j] else -1])
    out = {
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "tokens": tokens.to(torch.int32),
        "loss_mask": loss_mask_packed,
        "anchors": torch.tensor(packed_anchors, dtype=torch.int32),
        "taps": taps.float(),
        "embed": embed.weight.detach().float(),
        "lm_head": lm_head.weight.detach().float(),
        "gamma": torch.tensor([GAMMA], dtype=torch.float32),
        "weight_mask": seen["weight_mask"].reshape(-1).float(),
        "loss": torch.tensor([float(loss)], dtype=torch.float32),
        "loss_den": torch.tensor([float(loss_den)], dtype=torch.float32),
    }
    if domino:
        hs = seen["hidden"]
        out.update({
            "lambda_base": torch.tensor([LAMBDA_BASE], dtype=torch.float32),
            "final_loss": torch.tensor([float(metrics["final_loss"])], dtype=torch.float32),
            "base_loss": torch.tensor([float(metrics["base_loss"])], dtype=torch.float32),
            "hidden": hs.detach().reshape(-1, H).float().contiguous(),
            "grad.hidden": hs.grad.detach().reshape(-1, H).float().contiguous(),
            "prev_ids": seen["prev_ids"].reshape(-1).to(torch.int32),
            "target_ids": seen["target_ids"].reshape(-1).to(torch.int32),
        })
    if dflash2:
        hs = seen["hidden"]
        out.update({
            "selector_alpha": torch.tensor([SELECTOR_ALPHA], dtype=torch.float32),
            "loss_num": torch.tensor([float(loss_num)], dtype=torch.float32),
            "selector_loss_num": torch.tensor([float(selector_num)], dtype=torch.float32),
            "hidden": hs.detach().reshape(-1, H).float().contiguous(),
            "grad.hidden": hs.grad.detach().reshape(-1, H).float().contiguous(),
            "target_ids": seen["target_ids"].reshape(-1).to(torch.int32),
            "predecessor_ids": seen["predecessor_ids"].reshape(-1).to(torch.int32),
        })
        for name, c in convs.items():
            for key, t in c.items():
                out[f"conv.{name}.{key}"] = t.detach().reshape(-1, H).float().contiguous()
                out[f"conv_grad.{name}.{key}"] = t.grad.detach().reshape(-1, H).float().contiguous()
    if dspark:
        hs = seen["hidden"]
        ratio = metrics["ratio_metrics"]
        out.update({
            "target_hidden": target_hidden.float(),
            "alphas": torch.tensor([DSPARK_ALPHAS[k] for k in ("dspark_ce_loss_alpha", "dspark_l1_loss_alpha",
                                                               "dspark_confidence_head_alpha")],
                                   dtype=torch.float32),
            "ce_num": torch.tensor([float(ratio["ce_loss"][0])], dtype=torch.float32),
            "l1_num": torch.tensor([float(ratio["l1_loss"][0])], dtype=torch.float32),
            "confidence_num": torch.tensor([float(ratio["confidence_loss"][0])], dtype=torch.float32),
            "hidden": hs.detach().reshape(-1, H).float().contiguous(),
            "grad.hidden": hs.grad.detach().reshape(-1, H).float().contiguous(),
            "prev_ids": seen["prev_ids"].reshape(-1).to(torch.int32),
            "target_ids": seen["target_ids"].reshape(-1).to(torch.int32),
        })
    weights = {}
    for name, prm in draft.named_parameters():
        assert prm.grad is not None, f"no gradient for {name}"
        out["grad." + name] = prm.grad.detach().float().contiguous()
        weights[name] = prm.detach().float().contiguous()
    meta = {"specforge_commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
            "precision": f"{args.dtype} reference on float32-exact inputs", "attention": args.attn,
            "seed": str(args.seed)}

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    save_file(weights, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    # The 2026 published layout: block_size inside dflash_config, rope_theta inside rope_parameters.
    hf = {
        "architectures": [specforge_draft.CLASS_NAMES[args.kind]], "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": FIELDS["intermediate"], "num_hidden_layers": FIELDS["layers"],
        "num_attention_heads": FIELDS["heads"], "num_key_value_heads": FIELDS["kv_heads"], "head_dim": hd,
        "num_target_layers": TARGET["layers"], "rms_norm_eps": FIELDS["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "layer_types": FIELDS["layer_types"], "sliding_window": FIELDS["sliding_window"],
        "use_sliding_window": True, "vocab_size": V, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "dtype": "float32",
        "dflash_config": {"mask_token_id": FIELDS["mask_token_id"],
                          "target_layer_ids": FIELDS["target_layer_ids"], "block_size": B,
                          **head_keys},
    }
    with open(os.path.join(model_dir, "config.json"), "w") as fh:
        json.dump(hf, fh, indent=2)
        fh.write("\n")
    save_file(out, os.path.join(args.out, "golden.safetensors"), metadata=meta)
    print(f"wrote {model_dir}/{{config.json,model.safetensors}} and {args.out}/golden.safetensors "
          f"({len(weights)} parameters)")

    inputs = dict(input_ids=input_ids, hidden_states=hidden, loss_mask=loss_mask, **extra)
    error = peer_bf16_error(torch, online_model, draft_class(cfg), draft, embed, lm_head, inputs, loss)
    error.update(specforge_commit=commit, transformers=transformers.__version__)
    with open(os.path.join(args.out, "peer_bf16_error.json"), "w") as fh:
        json.dump(error, fh, indent=2)
        fh.write("\n")
    worst = max(error["grad_rel_rms"], key=error["grad_rel_rms"].get)
    print(f"SpecForge in bfloat16 on {error['device']}: loss relative error {error['loss_rel_error']:.3g}, worst "
          f"gradient relative RMS error {error['grad_rel_rms'][worst]:.3g} ({worst}); wrote "
          f"{args.out}/peer_bf16_error.json")


def rel_rms(got, want):
    """||got − want|| / ||want|| (||got − want|| where want is 0), as the C++ golden tests' grad_diff."""
    num, den = float((got - want).norm()), float(want.norm())
    return num / den if den > 0 else num


def peer_bf16_error(torch, online_model, draft_bf16, draft, embed, lm_head, inputs, loss):
    """SpecForge's step in bfloat16 on the inputs the float64 step `draft` (its gradients filled, loss `loss`)
    ran: the drafter `draft_bf16` (fresh, of the same class and config) takes `draft`'s values, the frozen tables
    and the floating inputs are rounded to bfloat16 (the loss mask stays float32, as SpecForge's batches hold
    it), on CUDA when there is a device. Returns the loss's relative error and every parameter gradient's
    relative RMS error against the float64 step, with the torch version and the device."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = torch.bfloat16
    draft_bf16.load_state_dict(draft.state_dict())
    draft_bf16.to(device=dev, dtype=bf16)
    embed_bf16 = copy.deepcopy(embed).to(device=dev, dtype=bf16)
    lm_head_bf16 = copy.deepcopy(lm_head).to(device=dev, dtype=bf16)
    model = online_model(draft_bf16, embed_bf16, lm_head_bf16)
    batch = {}
    for key, value in inputs.items():
        if not torch.is_tensor(value):
            batch[key] = value
        elif value.is_floating_point() and key != "loss_mask":
            batch[key] = value.to(device=dev, dtype=bf16)
        else:
            batch[key] = value.to(dev)
    # An op without a deterministic CUDA kernel warns instead of stopping: this pass measures an error, the
    # golden does not depend on it.
    torch.use_deterministic_algorithms(True, warn_only=True)
    with sdpa_kernel(SDPBackend.MATH):
        loss_bf16, _acc, _metrics = model(**batch)
        loss_bf16.backward()
    grads = dict(draft_bf16.named_parameters())
    bad = [n for n, prm in grads.items() if prm.grad is None or not torch.isfinite(prm.grad).all()]
    if not math.isfinite(float(loss_bf16)) or bad:
        sys.exit(f"make_drafter_golden: the bfloat16 pass's loss {float(loss_bf16)} or gradients of {bad} are not "
                 f"finite; the golden files are written, peer_bf16_error.json is not")
    errors = {}
    for name, prm in draft.named_parameters():
        got = grads[name].grad.detach().to(device="cpu", dtype=torch.float64)
        errors[name] = rel_rms(got, prm.grad.detach().to(torch.float64))
    want = float(loss)
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": "bfloat16 drafter, frozen tables and inputs; float32 loss mask; no float32 master copy",
        "loss_f64": want,
        "loss_bf16": float(loss_bf16),
        "loss_rel_error": abs(float(loss_bf16) - want) / abs(want),
        "grad_rel_rms": errors,
    }


if __name__ == "__main__":
    main()
