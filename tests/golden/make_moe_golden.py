# Writes the golden files of the mixture-of-experts targets (issue 51) beside make_golden.py's, the same way: small
# random-weight Qwen3-MoE and Qwen3.5-MoE checkpoints as Hugging Face saves them, token files, and the hidden states
# transformers computes for them on the CPU in float32 (eager attention, eager experts, pure-torch DeltaNet).
# Each case stresses a part of the MoE block: odd expert counts, top-1 and top-8, a dense layer among sparse ones
# (mlp_only_layers, decoder_sparse_step), a routing tie at the top-k boundary (two experts with the same router
# row), an expert no token picks, the shared expert and its gate, the multimodal wrapper, long sequences, and
# Qwen3-Next (qwen3_next: the DeltaNet projections fused per key head, Qwen3.5's layers otherwise).
# Two more cases are block-scaled FP8 checkpoints as the Qwen FP8 releases (Qwen3.6-35B-A3B-FP8) store them
# (make_moe_fp8): e4m3 weights with 128x128 weight_scale_inv blocks for every decoder projection, routed and shared
# experts included, the router, the shared expert's gate and the DeltaNet's in_proj_a / in_proj_b in float32, one
# with per-expert tensors (as save_pretrained writes) and one with the fused experts; their golden is the fp32
# forward of the dequantised model. Their sizes are multiples of 128, as a CUDA FP8 run with the checkpoint's own
# blocks needs.
#
#   HF_HUB_OFFLINE=1 python3 tests/golden/make_moe_golden.py --out /tmp/golden_moe
#   cp -r /tmp/golden_moe/* tests/golden/data/
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402  (blocks fla / causal_conv1d / kernels before transformers is imported)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35m  # noqa: E402
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (  # noqa: E402
    Qwen3_5MoeConfig, Qwen3_5MoeTextConfig)
from transformers.models.qwen3_next import modeling_qwen3_next as q3n  # noqa: E402
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig  # noqa: E402

# Long sequences for the MoE cases: 11 full 64-token DeltaNet chunks plus 60, one token alone, 333 more; small
# enough that the files stay near a megabyte.
SEQ_LENGTHS_MOE_LONG = (764, 1, 333)


def qwen3moe_kwargs():
    return dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=3,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                num_experts=5, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False,
                decoder_sparse_step=1, mlp_only_layers=[1])


def qwen3moe_tiny_config():
    # 5 experts, top-2 without renormalisation, layer 1 dense: the tie case (tie=(0, 1, 3)).
    return Qwen3MoeConfig(**qwen3moe_kwargs())


def qwen3moe_top8_config():
    # Top-8 of 9 renormalised, every second layer sparse (decoder_sparse_step 2), untied, written in shards.
    kw = qwen3moe_kwargs()
    kw.update(vocab_size=89, hidden_size=40, num_hidden_layers=4, num_attention_heads=5, head_dim=8,
              intermediate_size=56, num_experts=9, num_experts_per_tok=8, moe_intermediate_size=20,
              norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=False)
    return Qwen3MoeConfig(**kw)


def qwen3moe_top1_long_config():
    # Top-1 of 7 over long sequences; expert 6 of every layer is never picked (dead=6).
    kw = qwen3moe_kwargs()
    kw.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
              num_experts=7, num_experts_per_tok=1, moe_intermediate_size=16, norm_topk_prob=True,
              mlp_only_layers=[])
    return Qwen3MoeConfig(**kw)


def qwen35moe_text_kwargs():
    kw = mg.qwen35_text_kwargs()
    for k in ("intermediate_size", "attn_output_gate"):  # not fields of Qwen3_5MoeTextConfig (always gated)
        kw.pop(k)
    kw.update(num_experts=5, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
    return kw


def qwen35moe_tiny_config():
    return Qwen3_5MoeTextConfig(layer_types=["linear_attention"] * 3 + ["full_attention"], **qwen35moe_text_kwargs())


def qwen35moe_top8_text_config():
    # Top-8 of 9 with a shared expert of 20, the first layer an attention layer; the multimodal case.
    kw = qwen35moe_text_kwargs()
    kw.update(vocab_size=113, hidden_size=48, num_attention_heads=3, num_key_value_heads=1, linear_num_key_heads=1,
              linear_num_value_heads=3, num_experts=9, num_experts_per_tok=8, moe_intermediate_size=12,
              shared_expert_intermediate_size=20)
    return Qwen3_5MoeTextConfig(layer_types=["full_attention", "linear_attention", "linear_attention",
                                             "full_attention"], **kw)


def qwen35moe_fp8_config():
    # Sizes in whole 128 blocks: hidden 128, heads of 128 (q_proj 2 x 2 x 128 rows with its gate), DeltaNet qkv
    # 2 x 64 + 2 x 64 = 256 rows and z 128, experts and shared expert 128 wide; top-2 of 5.
    kw = qwen35moe_text_kwargs()
    kw.update(vocab_size=97, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
              linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
              num_experts=5, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128)
    kw["rope_parameters"] = dict(kw["rope_parameters"], mrope_section=[6, 5, 5])  # 32 rotary dims of 128
    return Qwen3_5MoeTextConfig(layer_types=["linear_attention", "full_attention", "linear_attention",
                                             "full_attention"], **kw)


def qwen3next_tiny_config():
    # Qwen3-Next: DeltaNet projections fused per key head (in_proj_qkvz, in_proj_ba) with 2 key heads feeding 2
    # value heads each, so every piece of that layout moves when it is regrouped; top-3 of 7 not renormalised,
    # a shared expert of 20; decoder_sparse_step 2 makes layers 1 and 3 sparse and mlp_only_layers [3] leaves
    # layer 1 the only sparse one (dense MLPs of 56 elsewhere).
    kw = qwen35moe_text_kwargs()
    kw.update(vocab_size=101, hidden_size=40, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
              intermediate_size=56, num_experts=7, num_experts_per_tok=3, moe_intermediate_size=12,
              shared_expert_intermediate_size=20, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3])
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": kw["rope_parameters"]["rope_theta"],
                             "partial_rotary_factor": 0.25}
    return Qwen3NextConfig(layer_types=["linear_attention", "full_attention", "linear_attention",
                                        "full_attention"], **kw)


def qwen3moe_fp8_config():
    # Top-3 of 7 renormalised, layer 1 dense (intermediate 256), untied; sizes in whole 128 blocks.
    kw = qwen3moe_kwargs()
    kw.update(vocab_size=89, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
              intermediate_size=256, num_experts=7, num_experts_per_tok=3, moe_intermediate_size=128,
              norm_topk_prob=True, tie_word_embeddings=False)
    return Qwen3MoeConfig(**kw)


def build(model_cls, config, seed):
    # Eager experts: the loop over experts with index_add_ that the CPU oracle's grouping mirrors.
    try:
        config._experts_implementation = "eager"
    except AttributeError as e:  # the implementation that ran is printed and stored either way
        print(f"  cannot ask for eager experts ({e})")
    model = mg.build(model_cls, config, seed)
    print(f"  experts implementation: {getattr(model.config, '_experts_implementation', 'eager')}")
    return model


def moe_blocks(backbone):
    return [(l, layer.mlp) for l, layer in enumerate(backbone.layers) if hasattr(layer.mlp, "gate")]


def shape_routers(backbone, tie=None, dead=None):
    """tie = (layer, a, b): expert b gets expert a's router row, so the two tie on every token of that layer.
    dead = e: in every MoE layer expert e's router row is the mean of the others', so its logit is the mean of theirs
    and never the largest: with top-1 no token picks it."""
    with torch.no_grad():
        for l, block in moe_blocks(backbone):
            w = block.gate.weight
            if tie is not None and tie[0] == l:
                w[tie[2]] = w[tie[1]]
            if dead is not None:
                others = [e for e in range(w.shape[0]) if e != dead]
                w[dead] = w[others].mean(dim=0)


@torch.no_grad()
def routing_stats(backbone, seqs, tie=None):
    """Per MoE layer, how many (token, slot) pairs picked each expert; for tie = (layer, a, b), how many tokens kept
    exactly one of a and b (the tie at the top-k boundary) and which one."""
    chosen, tie_equal, hooks = {}, [], []

    def record(l, output):
        if not (isinstance(output, tuple) and len(output) == 3):
            raise SystemExit(f"layer {l}: the router returned {type(output)}, not (logits, weights, indices)")
        chosen.setdefault(l, []).append(output[2].reshape(-1, output[2].shape[-1]).clone())
        if tie is not None and tie[0] == l:  # the router's first output (logits or probabilities) per expert
            scores = output[0].reshape(-1, output[0].shape[-1])
            tie_equal.append(bool(torch.equal(scores[:, tie[1]], scores[:, tie[2]])))

    for l, block in moe_blocks(backbone):
        hooks.append(block.gate.register_forward_hook(lambda m, i, o, l=l: record(l, o)))
    try:
        for ids in seqs:
            backbone(input_ids=torch.from_numpy(ids)[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    stats = {"picks": {}, "tie_boundary": {}}
    for l, blocks in moe_blocks(backbone):
        idx = torch.cat(chosen[l])
        stats["picks"][str(l)] = np.bincount(idx.flatten().numpy(), minlength=blocks.gate.weight.shape[0]).tolist()
        if tie is not None and tie[0] == l:
            has_a, has_b = (idx == tie[1]).any(-1), (idx == tie[2]).any(-1)
            one = has_a ^ has_b
            stats["tie_boundary"] = {"layer": l, "experts": [tie[1], tie[2]], "tokens": int(one.sum()),
                                     "kept": {str(tie[1]): int((one & has_a).sum()),
                                              str(tie[2]): int((one & has_b).sum())},
                                     "both_kept": int((has_a & has_b).sum()),
                                     "bitwise_equal_scores": all(tie_equal)}
    return stats


def check_stats(name, stats, tie, dead):
    if tie is not None and stats["tie_boundary"].get("tokens", 0) == 0:
        raise SystemExit(f"{name}: no token has the tie at its top-k boundary; choose another seed")
    if tie is not None and not stats["tie_boundary"]["bitwise_equal_scores"]:
        print(f"  WARNING {name}: the tied experts' router scores differ in the last bits here, so torch.topk's "
              "choice at the boundary follows rounding, not its tie order")
    if dead is not None:
        for l, counts in stats["picks"].items():
            if counts[dead]:
                raise SystemExit(f"{name}: layer {l} expert {dead} was picked {counts[dead]} times")
    print(f"  routing: {json.dumps(stats)}")


def gdn_impl(backbone):
    for layer in backbone.layers:
        if hasattr(layer, "linear_attn"):
            la = layer.linear_attn
            # transformers keeps the chunked rule on the layer in some releases, as a module function in others.
            fn = getattr(la, "chunk_gated_delta_rule", None) or \
                getattr(sys.modules[type(la).__module__], "torch_chunk_gated_delta_rule")
            if not getattr(fn, "__module__", "").endswith(("modeling_qwen3_5_moe", "modeling_qwen3_next")):
                raise SystemExit(f"DeltaNet runs {mg.describe(fn)}, not the pure-torch one of its modeling module")
            return mg.describe(fn)
    return ""


def case_attrs(model, config, seed, hs_last, stats):
    attrs = mg.base_attrs(config, seed, hs_last)
    attrs["generator"] = "tests/golden/make_moe_golden.py"
    attrs["experts_implementation"] = str(getattr(model.config, "_experts_implementation", "eager"))
    attrs["moe_routing"] = json.dumps(stats)
    gdn = gdn_impl(model.model)
    if gdn:
        attrs["gdn_implementation"] = gdn + "; fla, causal_conv1d and kernels blocked"
    return attrs


def saved_expert_naming(out_dir):
    names = []
    for f in sorted(os.listdir(out_dir)):
        if f.endswith(".safetensors"):
            names += list(safetensors.torch.load_file(os.path.join(out_dir, f)).keys())
    fused = any(n.endswith("experts.gate_up_proj") for n in names)
    per_expert = any(".experts.0.gate_proj.weight" in n for n in names)
    return "fused" if fused and not per_expert else "per expert" if per_expert and not fused else "mixed"


def make_moe_text(out_root, name, model_cls, config, seed, lengths=mg.SEQ_LENGTHS, tie=None, dead=None, shard=None):
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    model = build(model_cls, config, seed)
    shape_routers(model.model, tie, dead)
    mg.check_rope(model, config)
    seqs, offsets = mg.make_tokens(config.vocab_size, seed, lengths)
    states, hs_last = mg.forward_all(model.model, seqs)
    stats = routing_stats(model.model, seqs, tie)
    check_stats(name, stats, tie, dead)
    attrs = case_attrs(model, config, seed, hs_last, stats)
    if shard:
        model.save_pretrained(out_dir, max_shard_size=shard)
    else:
        model.save_pretrained(out_dir)
    attrs["expert_naming"] = saved_expert_naming(out_dir)
    mg.write_h5(out_dir, seqs, offsets, states, attrs)
    mg.summarise(name, out_dir, attrs)
    print(f"  experts saved as: {attrs['expert_naming']}")
    mg.verify_reload(model_cls, out_dir, seqs, states, experts_implementation="eager")


def make_moe_multimodal(out_root, name, seed):
    """A Qwen3.5-MoE text model under the multimodal names (model.language_model.*), with mtp.* and model.visual.*
    tensors the loader must skip, and the config as the Qwen3_5MoeConfig wrapper."""
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    text_cfg = qwen35moe_top8_text_config()
    model = build(q35m.Qwen3_5MoeForCausalLM, text_cfg, seed)
    mg.check_rope(model, text_cfg)
    seqs, offsets = mg.make_tokens(text_cfg.vocab_size, seed, mg.SEQ_LENGTHS_257)
    states, hs_last = mg.forward_all(model.model, seqs)
    stats = routing_stats(model.model, seqs)
    check_stats(name, stats, None, None)
    attrs = case_attrs(model, text_cfg, seed, hs_last, stats)
    mg.save_multimodal_weights(model, text_cfg.hidden_size, seed, out_dir)
    attrs["expert_naming"] = saved_expert_naming(out_dir)
    text_dict = text_cfg.to_dict()
    full_cfg = Qwen3_5MoeConfig(text_config=text_dict, vision_config=mg.tiny_vision_config(), tie_word_embeddings=False)
    full_cfg.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    full_cfg.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg_dict = json.load(f)
    cfg_dict["dtype"] = cfg_dict["text_config"]["dtype"] = "float32"
    with open(cfg_path, "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    mg.write_h5(out_dir, seqs, offsets, states, attrs)
    mg.summarise(name, out_dir, attrs)
    again_model = mg.load_multimodal_text(out_dir, model_cls=q35m.Qwen3_5MoeForCausalLM)
    again_model.config._experts_implementation = "eager"
    again, _ = mg.forward_all(again_model.model, seqs)
    diff = mg.max_abs_diff(again, states)
    if diff > mg.RELOAD_TOL:
        raise SystemExit(f"{out_dir}: reloaded multimodal checkpoint differs (max abs diff {diff})")
    print(f"  reload through AutoConfig + prefix strip: max abs diff {diff:.3g}")


FP8_BLOCK = 128
# What the Qwen FP8 releases keep unquantised among the decoder layers' 2-D weights (their modules_to_not_convert):
# the MoE router, the shared expert's gate and the DeltaNet's tiny in_proj_a / in_proj_b.
FP8_KEEP = ("mlp.gate.weight", "mlp.shared_expert_gate.weight", "linear_attn.in_proj_a.weight",
            "linear_attn.in_proj_b.weight")


def fp8_quantized(name, p):
    """Whether the release stores this parameter as block FP8: every other 2-D weight of the decoder layers (the
    attention and DeltaNet projections, the dense MLP, the shared expert) and the fused routed experts; embeddings,
    lm_head, norms and the conv stay float (dflash_mpi's writer decides the same: fp8_quantized_weight)."""
    if ".layers." not in name or name.endswith(FP8_KEEP):
        return False
    return p.dim() == 2 or name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def quantize_blocks(w):
    """w [.., N, K] -> (codes float8_e4m3fn, weight_scale_inv float32 [.., ceil(N/128), ceil(K/128)]): per 128x128
    block scale = amax / 448 (1 for an all-zero block), codes = e4m3(w / scale), round to nearest even."""
    b = FP8_BLOCK
    n, k = w.shape[-2], w.shape[-1]
    nb, kb = -(-n // b), -(-k // b)
    blocks = torch.nn.functional.pad(w, (0, kb * b - k, 0, nb * b - n)).reshape(*w.shape[:-2], nb, b, kb, b)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).float()
    full = scale.repeat_interleave(b, dim=-2)[..., :n, :].repeat_interleave(b, dim=-1)[..., :k]
    return (w / full).to(torch.float8_e4m3fn), scale


def fp8_tensor(name, quant):
    """The (codes, scales) of checkpoint tensor `name` from the quantised parameters: the parameter itself, or
    one expert's slice of the fused experts (gate = the first I rows of gate_up_proj, up the rest; I a multiple of
    128, so the slice takes whole block rows). None: the tensor stays float."""
    if name in quant:
        return quant[name]
    m = mg.PER_EXPERT.match(name)
    if not m:
        return None
    e, part = int(m.group(2)), m.group(3)
    if part == "down":
        codes, scale = quant[m.group(1) + ".down_proj"]
        return codes[e], scale[e]
    codes, scale = quant[m.group(1) + ".gate_up_proj"]
    rows, brows = codes.shape[1] // 2, scale.shape[1] // 2
    return (codes[e, :rows], scale[e, :brows]) if part == "gate" else (codes[e, rows:], scale[e, brows:])


def make_moe_fp8(out_root, name, model_cls, config, seed, fused):
    """A block-FP8 checkpoint of a random MoE model: its quantised weights replaced by their dequantised values
    before the fp32 forward that makes the golden, then written as e4m3 codes + weight_scale_inv. fused: the
    routed experts as the model's own experts.gate_up_proj / down_proj [E, rows, cols] (scales [E, row blocks,
    column blocks]); else per expert, in the names save_pretrained writes."""
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    model = build(model_cls, config, seed)
    mg.check_rope(model, config)
    quant = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if fp8_quantized(pname, p):
                quant[pname] = quantize_blocks(p.detach())
                p.copy_(mg.fp8_dequantize(*quant[pname], (FP8_BLOCK, FP8_BLOCK)))
    seqs, offsets = mg.make_tokens(config.vocab_size, seed)
    states, hs_last = mg.forward_all(model.model, seqs)
    stats = routing_stats(model.model, seqs)
    check_stats(name, stats, None, None)
    attrs = case_attrs(model, config, seed, hs_last, stats)
    model.save_pretrained(out_dir)
    saved = {}
    for f in sorted(os.listdir(out_dir)):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            if f.endswith(".safetensors"):
                saved.update(safetensors.torch.load_file(os.path.join(out_dir, f)))
            os.remove(os.path.join(out_dir, f))
    if fused:
        saved = {n: t for n, t in model.state_dict().items() if n in saved or "experts." in n}
    tensors = {}
    for n, t in saved.items():
        q = fp8_tensor(n, quant)
        if q is None:
            tensors[n] = t.detach().float().contiguous()
        else:
            tensors[n], tensors[n + "_scale_inv"] = q[0].contiguous(), q[1].contiguous()
    safetensors.torch.save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    keep = ["lm_head", "model.embed_tokens"] + sorted(
        n[: -len(".weight")] for n in saved if n.endswith(FP8_KEEP) and ".layers." in n)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg_dict = json.load(f)
    cfg_dict["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "modules_to_not_convert": keep}
    with open(cfg_path, "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    attrs["expert_naming"] = saved_expert_naming(out_dir)
    attrs["fp8"] = "128x128 block-scaled e4m3 weights; the golden is the fp32 forward of the dequantised model"
    n_fp8 = sum(t.dtype == torch.float8_e4m3fn for t in tensors.values())
    print(f"  {n_fp8} FP8 tensors, experts saved as: {attrs['expert_naming']}, kept float: {len(keep)} modules")
    mg.write_h5(out_dir, seqs, offsets, states, attrs)
    mg.summarise(name, out_dir, attrs)
    reload_cfg = type(config).from_pretrained(out_dir)
    reload_cfg._attn_implementation = "eager"
    reload_cfg._experts_implementation = "eager"
    again, _ = mg.forward_all(mg.load_fp8_dequantized(out_dir, model_cls, reload_cfg).model, seqs)
    diff = mg.max_abs_diff(again, states)
    if diff > mg.RELOAD_TOL:
        raise SystemExit(f"{out_dir}: the written FP8 checkpoint, dequantised, gives other states (max abs diff {diff})")
    print(f"  reload of the FP8 checkpoint, dequantised: max abs diff {diff:.3g}")


JOBS = {
    "qwen3moe_tiny": lambda o: make_moe_text(o, "qwen3moe_tiny", Qwen3MoeForCausalLM, qwen3moe_tiny_config(), 31,
                                             tie=(0, 1, 3)),
    "qwen3moe_top8": lambda o: make_moe_text(o, "qwen3moe_top8", Qwen3MoeForCausalLM, qwen3moe_top8_config(), 32,
                                             lengths=mg.SEQ_LENGTHS_257, shard="40KB"),
    "qwen3moe_top1_long": lambda o: make_moe_text(o, "qwen3moe_top1_long", Qwen3MoeForCausalLM,
                                                  qwen3moe_top1_long_config(), 33, lengths=SEQ_LENGTHS_MOE_LONG,
                                                  dead=6),
    "qwen35moe_tiny": lambda o: make_moe_text(o, "qwen35moe_tiny", q35m.Qwen3_5MoeForCausalLM,
                                              qwen35moe_tiny_config(), 34),
    "qwen35moe_top8_multimodal": lambda o: make_moe_multimodal(o, "qwen35moe_top8_multimodal", 35),
    "qwen35moe_fp8": lambda o: make_moe_fp8(o, "qwen35moe_fp8", q35m.Qwen3_5MoeForCausalLM, qwen35moe_fp8_config(),
                                            36, fused=False),
    "qwen3next_tiny": lambda o: make_moe_text(o, "qwen3next_tiny", q3n.Qwen3NextForCausalLM, qwen3next_tiny_config(),
                                              38, lengths=mg.SEQ_LENGTHS_257),
    "qwen3moe_fp8_fused": lambda o: make_moe_fp8(o, "qwen3moe_fp8_fused", Qwen3MoeForCausalLM, qwen3moe_fp8_config(),
                                                 37, fused=True),
}


def main():
    parser = argparse.ArgumentParser(description="Write the MoE golden files for dflash_mpi extract.")
    parser.add_argument("--out", required=True, help="folder that receives one subfolder per model")
    parser.add_argument("--models", default=",".join(JOBS), help=f"comma-separated subset of {','.join(JOBS)}")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(JOBS)}")
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    failed = []
    for name in names:
        try:
            JOBS[name](args.out)
        except BaseException as e:  # noqa: BLE001 - keep going so one run reports every model
            traceback.print_exc()
            failed.append(f"{name}: {e}")
    for m in ("fla", "causal_conv1d", "kernels"):
        if sys.modules.get(m) is not None:
            failed.append(f"{m} was imported despite the block")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("all MoE golden files written and verified")


if __name__ == "__main__":
    main()
