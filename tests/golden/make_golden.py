# Writes the golden files that `dflash_mpi extract` is tested against (tests/unit/test_golden.cpp): small
# random-weight Qwen3 / Qwen3.5 checkpoints saved as Hugging Face writes them, token files, and the hidden
# states that HF transformers computes for them on CPU in float32 with its pure-torch kernels. With
# --hf-bf16 (a separate run, on the GPU machine) it instead records how far HF itself lands from those fp32
# states when run in bf16 on CUDA: the anchor of the CUDA golden test (tests/gpu/test_golden_cuda.cpp).
import sys

# Block the optional fast kernels before transformers is imported: transformers binds flash-linear-attention,
# causal-conv1d and hub kernels at import time when they exist, and the fp32 references must come from its
# plain torch code (the same math as MODELS.md, float32 throughout). The --hf-bf16 run measures the peer,
# HF + flash-linear-attention (benchmarks/hf_peer.py), so it leaves FLA importable; it is its own process, so
# no fp32 golden can ever come from a process with FLA loaded.
HF_BF16 = "--hf-bf16" in sys.argv[1:]
NO_FLA = "--no-fla" in sys.argv[1:]
for _blocked in ("causal_conv1d", "kernels") if HF_BF16 and not NO_FLA else ("fla", "causal_conv1d", "kernels"):
    sys.modules[_blocked] = None

import argparse
import collections
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import traceback

import h5py
import numpy as np
import safetensors.torch
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from hf_peer import FLA_CALLS, attach_fla, gdn_kernels, load_fla  # noqa: E402  (hf_peer imports torch only)


def _argv_value(flag):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv[:-1] else None


# The --hf-bf16 run loads FLA before transformers' Qwen3.5 module is imported, which is when transformers 5.x
# binds its DeltaNet kernels (hf_peer.load_fla).
FLA_INFO, FLA_ERROR = {}, None
if HF_BF16 and not NO_FLA:
    try:
        FLA_INFO = load_fla(_argv_value("--fla"))
    except RuntimeError as e:
        FLA_ERROR = e

import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig  # noqa: E402

COMMITTED = os.path.join(REPO, "tests", "golden", "data")
HF_BF16_FILE = "hf_bf16_error.json"

# Lengths straddle the GDN chunk size (64) and cover a single token; the order is mixed so that offsets
# matter. Every model gets its own token ids (its own vocab). The models added for issue 15 use 257 = 4·64 + 1
# for the long one (a last chunk of one token); the first four keep 300 so their files stay as committed.
SEQ_LENGTHS = (63, 1, 300, 64, 65)
SEQ_LENGTHS_257 = (63, 1, 257, 64, 65)
# Long sequences (issue 27): 23 full 64-token chunks plus 28 and 9 over 64-key attention tiles, so the DeltaNet
# state crosses many chunks and the attention's online softmax many tiles; one token alone in between.
SEQ_LENGTHS_LONG = (1500, 1, 585)
NORM_STD = 0.2  # spread of RMSNorm weights around their centre (0 for zero-centred norms, 1 otherwise)
EMBED_STD = 0.5
MAX_ABS_ACTIVATION = 100.0  # beyond this the random weights are too loud for a meaningful tolerance test

# Reloading must reproduce the states; same weights and code, so only thread-order noise is allowed.
RELOAD_TOL = 1e-6

GDN_CALLS = collections.Counter()


def counted(name, fn):
    @functools.wraps(fn)  # keeps fn's name, so gdn_kernels() reports the function that really runs
    def wrapper(*args, **kwargs):
        GDN_CALLS[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def describe(fn):
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


TORCH_CHUNK_GDN = q35.torch_chunk_gated_delta_rule
TORCH_RECURRENT_GDN = q35.torch_recurrent_gated_delta_rule
TORCH_CONV = q35.causal_conv1d_fn
for _fn in (TORCH_CHUNK_GDN, TORCH_RECURRENT_GDN, TORCH_CONV):
    if not getattr(_fn, "__module__", "").endswith("modeling_qwen3_5"):
        raise SystemExit(f"GDN/conv function {describe(_fn)} is not the pure-torch one from modeling_qwen3_5")
q35.torch_chunk_gated_delta_rule = counted("chunk_gated_delta_rule", TORCH_CHUNK_GDN)
q35.causal_conv1d_fn = counted("causal_conv1d_fn", TORCH_CONV)
GDN_IMPL = (f"chunk: {describe(TORCH_CHUNK_GDN)} (chunk_size 64, torch.linalg.solve_triangular); "
            f"conv: {describe(TORCH_CONV)} (F.conv1d); fla, causal_conv1d and kernels blocked")


def chunk_via_recurrent(query, key, value, g, beta, chunk_size=64, **kwargs):
    """Stands in for the chunked GDN to measure how far HF's chunked form is from its token-by-token form."""
    return TORCH_RECURRENT_GDN(query, key, value, g=g, beta=beta, **kwargs)


# ----------------------------------------------------------------------------------------------- models


def qwen3_tiny_config():
    return Qwen3Config(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                       rms_norm_eps=1e-6, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def qwen3_untied_config():
    # A different eps and theta than qwen3_tiny so that a loader ignoring config.json fails one of the two.
    return Qwen3Config(vocab_size=89, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                       num_attention_heads=5, num_key_value_heads=5, head_dim=8, max_position_embeddings=1024,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def qwen35_text_kwargs():
    return dict(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                max_position_embeddings=1024, tie_word_embeddings=False, attn_output_gate=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})


def qwen35_tiny_config():
    return Qwen3_5TextConfig(layer_types=["linear_attention"] * 3 + ["full_attention"], **qwen35_text_kwargs())


def qwen35_gqa3_config():
    # Attention with 3 query heads on 1 kv head of 32 (rotary on 8 dims), the first layer an attention layer;
    # DeltaNet 1 key head x 16 feeding 3 value heads x 24 (three value heads per key head).
    kw = qwen35_text_kwargs()
    kw.update(vocab_size=113, hidden_size=48, intermediate_size=88, num_attention_heads=3, num_key_value_heads=1,
              linear_num_key_heads=1, linear_num_value_heads=3)
    return Qwen3_5TextConfig(layer_types=["full_attention", "linear_attention", "linear_attention",
                                          "full_attention"], **kw)


def qwen3_gqa5_config():
    # Dense GQA with a group of 5 (5 query heads x 16 on 1 kv head), hidden 40 = not a multiple of 16.
    return Qwen3Config(vocab_size=101, hidden_size=40, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=5, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def qwen3_hd128_config():
    # Head dim 128, a shape the CUDA forward's Hopper (wgmma) attention kernel takes, on 2 query heads over
    # 1 kv head; the 257-token sequence spans three 128-row query blocks and five 64-key tiles.
    return Qwen3Config(vocab_size=103, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=128, max_position_embeddings=1024,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def qwen35_hd256_config():
    # Qwen3.6-27B's kernel shapes at toy width: gated attention of head dim 256 (2 query heads on 1 kv head,
    # rotary on 64 dims, mrope sections summing to 32) and DeltaNet heads of 128 (1 key head feeding 2 value
    # heads), which the CUDA forward runs on its wgmma attention and its 128-wide GDN kernels.
    kw = qwen35_text_kwargs()
    kw.update(vocab_size=107, num_attention_heads=2, num_key_value_heads=1, head_dim=256, linear_num_key_heads=1,
              linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128)
    kw["rope_parameters"] = dict(kw["rope_parameters"], mrope_section=[11, 11, 10])
    return Qwen3_5TextConfig(layer_types=["linear_attention", "full_attention", "linear_attention",
                                          "full_attention"], **kw)


def qwen35_odd5_config():
    # Small, odd heads (issue 27): gated attention of 5 query heads on 1 kv head of 48 (rotary on 12 dims: 6
    # pairs, mrope sections summing to 6); DeltaNet 1 key head of 48 feeding 5 value heads of 32 (key dim above
    # value dim, five value heads per key head); hidden 40 (not a multiple of 16).
    kw = qwen35_text_kwargs()
    kw.update(vocab_size=109, hidden_size=40, intermediate_size=72, num_attention_heads=5, num_key_value_heads=1,
              head_dim=48, linear_num_key_heads=1, linear_num_value_heads=5, linear_key_head_dim=48,
              linear_value_head_dim=32)
    kw["rope_parameters"] = dict(kw["rope_parameters"], mrope_section=[2, 2, 2])
    return Qwen3_5TextConfig(layer_types=["linear_attention", "full_attention", "linear_attention",
                                          "full_attention"], **kw)


def qwen35_long_config():
    # Long sequences on small odd heads: attention 6 query heads on 2 kv heads of 24 (group 3, rotary on 6 dims:
    # 3 pairs), DeltaNet 2 key heads of 24 feeding 6 value heads of 40 (key dim below value dim, neither a power
    # of two); three DeltaNet layers ahead of the attention layer, as in the 27B's [linear x 3, full] pattern.
    kw = qwen35_text_kwargs()
    kw.update(vocab_size=127, hidden_size=48, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2,
              head_dim=24, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=24,
              linear_value_head_dim=40, max_position_embeddings=4096)
    kw["rope_parameters"] = dict(kw["rope_parameters"], mrope_section=[1, 1, 1])
    return Qwen3_5TextConfig(layer_types=["linear_attention"] * 3 + ["full_attention"], **kw)


def qwen3_hd40_long_config():
    # Dense attention of head dim 40 (3 query heads on 1 kv head) over long sequences.
    return Qwen3Config(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=40, max_position_embeddings=4096,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def qwen35_interval_config():
    return Qwen3_5TextConfig(full_attention_interval=2, **qwen35_text_kwargs())


def save_multimodal_weights(model, h, seed, out_dir):
    """The text model's weights under the multimodal wrapper's names (model.language_model.*), with an MTP and a
    vision tensor beside them that the loader must skip, as a released Qwen3.5 / 3.6 checkpoint has."""
    tensors = {}
    for key, t in model.state_dict().items():
        new_key = "model.language_model." + key[len("model."):] if key.startswith("model.") else key
        tensors[new_key] = t.detach().clone().contiguous()
    gen = torch.Generator().manual_seed(seed + 2)
    tensors["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=gen)
    tensors["model.visual.merger.linear_fc2.bias"] = torch.randn(h, generator=gen)
    safetensors.torch.save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def tiny_vision_config():
    # Only config.json needs it (no vision weights are written but one dummy tensor); small so HF can build it.
    return dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
                temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16, in_channels=3)


def build(model_cls, config, seed):
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = model_cls(config).to(torch.float32).eval()
    randomise(model, seed)
    return model


def randomise(model, seed):
    """Draw every parameter afresh: HF's 0/1 norm init and fixed dt_bias would hide loader and math bugs."""
    gen = torch.Generator().manual_seed(seed + 1)
    norm_params = set()
    for mname, module in model.named_modules():
        if type(module).__name__.endswith(("RMSNorm", "RMSNormGated")):
            norm_params.add(f"{mname}.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in norm_params:
                # Zero-centred Qwen3.5 norms are initialised to 0, the others to 1: keep that centre.
                centre = float(p.flatten()[0])
                if not torch.all(p == centre) or centre not in (0.0, 1.0):
                    raise SystemExit(f"{name}: unexpected RMSNorm init, cannot tell its centre")
                new = centre + NORM_STD * torch.randn(p.shape, generator=gen)
            elif name.endswith("A_log"):
                # A log-uniform in [0.02, 2]: slow heads carry state across chunks, fast ones decay within one.
                new = math.log(0.02) + (math.log(2.0) - math.log(0.02)) * torch.rand(p.shape, generator=gen)
            elif name.endswith("dt_bias"):
                new = 0.5 * torch.randn(p.shape, generator=gen)
            elif name.endswith("conv1d.weight"):
                new = 0.35 * torch.randn(p.shape, generator=gen)
            elif name.endswith("embed_tokens.weight"):
                new = EMBED_STD * torch.randn(p.shape, generator=gen)
            elif p.dim() == 2:
                new = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1])
            elif p.dim() == 3 and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # Fused MoE experts [E, out, in] (make_moe_golden.py): each expert a Linear of fan-in in.
                new = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[2])
            else:
                raise SystemExit(f"{name} {tuple(p.shape)}: no randomisation rule; add one")
            p.copy_(new)


def check_rope(model, config):
    """The rotary frequencies HF built must be the configured ones (catches a silently ignored rope key)."""
    theta = config.rope_parameters["rope_theta"]
    rotary_dims = int(config.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    inv = model.model.rotary_emb.inv_freq.double()
    want = 1.0 / theta ** (torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)
    if inv.shape != want.shape or (inv - want).abs().max() > 1e-6 * want.max():
        raise SystemExit(f"rope not as configured: inv_freq {inv.tolist()} vs {want.tolist()}")


# ----------------------------------------------------------------------------------------------- forward


def make_tokens(vocab, seed, lengths=SEQ_LENGTHS):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, size=n, dtype=np.int64) for n in lengths]
    seqs[1][0] = vocab - 1  # the largest valid id, alone in the length-1 sequence
    seqs[0][0] = 0
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    return seqs, offsets


@torch.no_grad()
def forward_all(backbone, seqs, device="cpu"):
    """Runs each sequence alone from position 0 and returns {dataset name: [N, H] float32} in extract's layout."""
    n_layers = len(backbone.layers)
    captured = {}
    hooks = [backbone.embed_tokens.register_forward_hook(lambda m, i, o: captured.__setitem__("embeddings", o))]
    for l, layer in enumerate(backbone.layers):
        # A hook, not hidden_states[l+1], because the last entry of hidden_states is the final-norm output.
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, l=l: captured.__setitem__(f"layer_{l}", o[0] if isinstance(o, tuple) else o)))
    rows = collections.defaultdict(list)
    hs_last_is_final_norm = True
    try:
        for ids in seqs:
            captured.clear()
            out = backbone(input_ids=torch.from_numpy(ids)[None].to(device), use_cache=False,
                           output_hidden_states=True)
            captured["final_norm"] = out.last_hidden_state
            hs = out.hidden_states
            if hs is None or not torch.equal(hs[0], captured["embeddings"]):
                raise SystemExit("hidden_states[0] is not the embedding output")
            for l in range(min(n_layers, len(hs) - 1) - 1):
                if not torch.equal(hs[l + 1], captured[f"layer_{l}"]):
                    raise SystemExit(f"hidden_states[{l + 1}] is not the output of layer {l}")
            hs_last_is_final_norm &= len(hs) == n_layers + 1 and bool(torch.equal(hs[-1], out.last_hidden_state))
            for key, t in captured.items():
                rows[key].append(t[0].to(torch.float32).cpu().numpy())
    finally:
        for h in hooks:
            h.remove()
    result = {k: np.ascontiguousarray(np.concatenate(v, axis=0)) for k, v in rows.items()}
    for key, a in result.items():
        if not np.isfinite(a).all() or np.abs(a).max() > MAX_ABS_ACTIVATION:
            raise SystemExit(f"{key}: activations not finite or above {MAX_ABS_ACTIVATION}; rescale the weights")
    return result, hs_last_is_final_norm


def max_abs_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in b)


def dataset_names(n_layers):
    return ["embeddings"] + [f"layer_{l}" for l in range(n_layers)] + ["final_norm"]


def write_h5(out_dir, seqs, offsets, states, attrs):
    with h5py.File(os.path.join(out_dir, "tokens.h5"), "w") as f:
        f.create_dataset("tokens", data=np.concatenate(seqs).astype(np.int32))
        f.create_dataset("offsets", data=offsets)
    with h5py.File(os.path.join(out_dir, "expected.h5"), "w") as f:
        for key in dataset_names(len(states) - 2):
            f.create_dataset(key, data=states[key].astype(np.float32))
        f.create_dataset("offsets", data=offsets)
        for k, v in attrs.items():
            # Plain variable-length UTF-8: numpy would turn torch's version string into an unsupported '<U'.
            if isinstance(v, str):
                f.attrs.create(k, str(v), dtype=h5py.string_dtype())
            else:
                f.attrs[k] = v


def base_attrs(config, seed, hs_last_is_final_norm):
    return {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "attn_implementation": "eager", "device": "cpu", "dtype": "float32", "seed": seed,
            "model_type": config.model_type,
            "layer_types": json.dumps(list(getattr(config, "layer_types", None) or [])),
            "hf_hidden_states_last_is_final_norm": int(hs_last_is_final_norm),
            "generator": "tests/golden/make_golden.py"}


def gdn_attrs(backbone, seqs, states):
    """Records the GDN path that ran and how far HF's chunked form is from its recurrent form here."""
    q35.torch_chunk_gated_delta_rule = chunk_via_recurrent
    try:
        recurrent, _ = forward_all(backbone, seqs)
    finally:
        q35.torch_chunk_gated_delta_rule = counted("chunk_gated_delta_rule", TORCH_CHUNK_GDN)
    return {"gdn_implementation": GDN_IMPL, "gdn_chunk_vs_recurrent_max_abs_diff": max_abs_diff(recurrent, states)}


# ----------------------------------------------------------------------------------------------- writers


def verify_reload(model_cls, out_dir, seqs, states, **load_kwargs):
    model, info = model_cls.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32,
                                            output_loading_info=True, **load_kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise SystemExit(f"{out_dir}: reload reported {bad}")
    again, _ = forward_all(model.eval().model, seqs)
    diff = max_abs_diff(again, states)
    if diff > RELOAD_TOL:
        raise SystemExit(f"{out_dir}: reloaded checkpoint gives different states (max abs diff {diff})")
    print(f"  reload with {model_cls.__name__}.from_pretrained: max abs diff {diff:.3g}")


def make_text_model(out_root, name, model_cls, config, seed, shard=None, lengths=SEQ_LENGTHS):
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    model = build(model_cls, config, seed)
    check_rope(model, config)
    seqs, offsets = make_tokens(config.vocab_size, seed, lengths)
    states, hs_last = forward_all(model.model, seqs)
    attrs = base_attrs(config, seed, hs_last)
    if model_cls is q35.Qwen3_5ForCausalLM:
        attrs.update(gdn_attrs(model.model, seqs, states))
    if shard:
        model.save_pretrained(out_dir, max_shard_size=shard)
    else:
        model.save_pretrained(out_dir)
    write_h5(out_dir, seqs, offsets, states, attrs)
    summarise(name, out_dir, attrs)
    verify_reload(model_cls, out_dir, seqs, states)


def make_multimodal(out_root, name, seed):
    """A Qwen3.5 text model written under the multimodal names, with tensors the loader must skip."""
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    text_cfg = qwen35_interval_config()
    want_types = ["linear_attention", "full_attention"] * 2
    if list(text_cfg.layer_types) != want_types:
        raise SystemExit(f"full_attention_interval 2 gave {text_cfg.layer_types}")
    model = build(q35.Qwen3_5ForCausalLM, text_cfg, seed)
    check_rope(model, text_cfg)
    seqs, offsets = make_tokens(text_cfg.vocab_size, seed)
    states, hs_last = forward_all(model.model, seqs)
    attrs = base_attrs(text_cfg, seed, hs_last)
    attrs.update(gdn_attrs(model.model, seqs, states))

    save_multimodal_weights(model, text_cfg.hidden_size, seed, out_dir)

    text_dict = text_cfg.to_dict()
    text_dict.pop("layer_types")
    text_dict["full_attention_interval"] = 2
    full_cfg = Qwen3_5Config(text_config=text_dict, vision_config=tiny_vision_config(), tie_word_embeddings=False)
    full_cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    full_cfg.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg_dict = json.load(f)
    # HF writes layer_types expanded from the interval; the file must exercise the interval path alone.
    cfg_dict["text_config"].pop("layer_types", None)
    cfg_dict["text_config"]["full_attention_interval"] = 2
    cfg_dict["dtype"] = cfg_dict["text_config"]["dtype"] = "float32"
    with open(cfg_path, "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    write_h5(out_dir, seqs, offsets, states, attrs)
    summarise(name, out_dir, attrs)
    verify_multimodal(out_dir, seqs, states, want_types)


def load_multimodal_text(out_dir, attn="eager", model_cls=None):
    """The text model of a multimodal checkpoint read the way HF would: config through AutoConfig (Qwen3_5Config,
    Qwen3_5MoeConfig), weights under the prefix (float32, CPU), into model_cls (default Qwen3_5ForCausalLM)."""
    text_cfg = transformers.AutoConfig.from_pretrained(out_dir).text_config
    text_cfg._attn_implementation = attn
    text_cfg.dtype = torch.float32  # FLA's gated norm, when wired, is built in the config's dtype
    model = (model_cls or q35.Qwen3_5ForCausalLM)(text_cfg).to(torch.float32).eval()
    prefix = "model.language_model."
    loaded = safetensors.torch.load_file(os.path.join(out_dir, "model.safetensors"))
    sd = {("model." + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in loaded.items()
          if not k.startswith(("mtp.", "model.visual."))}
    model.load_state_dict(sd, strict=True)
    return model


def verify_multimodal(out_dir, seqs, states, want_types):
    """Reads the files back through load_multimodal_text and HF's own multimodal class."""
    model = load_multimodal_text(out_dir)
    if list(model.config.layer_types) != want_types:
        raise SystemExit(f"{out_dir}: config.json reloads with layer_types {model.config.layer_types}")
    again, _ = forward_all(model.model, seqs)
    diff = max_abs_diff(again, states)
    if diff > RELOAD_TOL:
        raise SystemExit(f"{out_dir}: reloaded multimodal checkpoint differs (max abs diff {diff})")
    print(f"  reload through AutoConfig + prefix strip: max abs diff {diff:.3g}")
    # HF's own multimodal class as a second opinion; its vision tower is mostly missing, so only report.
    try:
        mm = q35.Qwen3_5ForConditionalGeneration.from_pretrained(out_dir, attn_implementation="eager",
                                                                 dtype=torch.float32).eval()
        again, _ = forward_all(mm.model.language_model, seqs)
        print(f"  Qwen3_5ForConditionalGeneration reload: max abs diff {max_abs_diff(again, states):.3g}")
    except Exception as e:  # noqa: BLE001 - a report, not a gate
        print(f"  Qwen3_5ForConditionalGeneration reload not checked: {type(e).__name__}: {e}")


def summarise(name, out_dir, attrs):
    with h5py.File(os.path.join(out_dir, "expected.h5"), "r") as f:
        scales = ", ".join(f"{k} rms {float(np.sqrt(np.mean(f[k][...] ** 2))):.3f}"
                           for k in f.keys() if k != "offsets")
    size = sum(os.path.getsize(os.path.join(out_dir, p)) for p in os.listdir(out_dir))
    print(f"{name}: {sorted(os.listdir(out_dir))} {size / 1e6:.2f} MB")
    print(f"  {scales}")
    for k in ("layer_types", "hf_hidden_states_last_is_final_norm", "gdn_chunk_vs_recurrent_max_abs_diff"):
        if k in attrs:
            print(f"  {k}: {attrs[k]}")


# ----------------------------------------------------------------------------------------------- HF in bf16


def read_tokens(model_dir):
    with h5py.File(os.path.join(model_dir, "tokens.h5"), "r") as f:
        tokens, offsets = f["tokens"][...].astype(np.int64), f["offsets"][...]
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def model_type(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["model_type"]


def fp8_block_size(model_dir):
    """The (n, k) weight block of a block-scaled FP8 checkpoint's config.json quantization_config; None without."""
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    return tuple(q["weight_block_size"]) if q and q.get("quant_method") == "fp8" else None


def fp8_dequantize(codes, scale_inv, block):
    """codes [.., N, K] float8_e4m3fn and scale_inv [.., ceil(N/bn), ceil(K/bk)] -> float32 code · block scale."""
    bn, bk = block
    n, k = codes.shape[-2], codes.shape[-1]
    s = scale_inv.float().repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return codes.float() * s


PER_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def load_fp8_dequantized(model_dir, model_cls, config):
    """A block-scaled FP8 checkpoint (make_moe_golden.py's) as its dequantised float32 model: every F8_E4M3 tensor
    times its weight_scale_inv blocks, per-expert tensors (experts.{e}.gate_proj / up_proj / down_proj.weight)
    stacked into the model's fused experts.gate_up_proj / down_proj, loaded strictly. (transformers would load it
    through its FP8 kernels instead, which is not the model the fp32 golden holds.)"""
    block = fp8_block_size(model_dir)
    raw = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            raw.update(safetensors.torch.load_file(os.path.join(model_dir, f)))
    sd, experts = {}, collections.defaultdict(dict)
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        t = fp8_dequantize(t, raw[name + "_scale_inv"], block) if t.dtype == torch.float8_e4m3fn else t.float()
        m = PER_EXPERT.match(name)
        if m:
            experts[m.group(1)][(int(m.group(2)), m.group(3))] = t
        else:
            sd[name] = t
    for base, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        sd[base + ".gate_up_proj"] = torch.stack([torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(n)])
        sd[base + ".down_proj"] = torch.stack([parts[(e, "down")] for e in range(n)])
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = model_cls(config).to(torch.float32)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def load_bf16(model_dir):
    """The checkpoint in model_dir as HF loads it, then bf16 on CUDA with sdpa attention. The MoE goldens
    (make_moe_golden.py) run transformers' eager experts, a bf16 GEMM pair per expert: its grouped kernels want
    16-byte rows, which the goldens' odd expert widths (20, 12) do not have. A block-scaled FP8 golden is its
    dequantised model in bf16 (load_fp8_dequantized): HF-bf16's error on the model the fp32 golden holds."""
    kind = model_type(model_dir)
    moe = kind in ("qwen3_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
    if moe:
        from transformers import Qwen3MoeForCausalLM
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35m
    if fp8_block_size(model_dir):
        if kind not in ("qwen3_moe", "qwen3_5_moe_text"):
            raise SystemExit(f"{model_dir}: FP8 goldens are text-only MoE models, not {kind}")
        cls = Qwen3MoeForCausalLM if kind == "qwen3_moe" else q35m.Qwen3_5MoeForCausalLM
        config = cls.config_class.from_pretrained(model_dir)
        config._attn_implementation = "sdpa"
        config._experts_implementation = "eager"
        return load_fp8_dequantized(model_dir, cls, config).to("cuda", torch.bfloat16).eval()
    if kind == "qwen3_5":
        model = load_multimodal_text(model_dir, attn="sdpa")
    elif kind == "qwen3_5_moe":
        model = load_multimodal_text(model_dir, attn="sdpa", model_cls=q35m.Qwen3_5MoeForCausalLM)
        model.config._experts_implementation = "eager"
    else:
        cls = {"qwen3": Qwen3ForCausalLM, "qwen3_5_text": q35.Qwen3_5ForCausalLM}.get(kind)
        extra = {"experts_implementation": "eager"} if moe else {}
        if kind == "qwen3_moe":
            cls = Qwen3MoeForCausalLM
        elif kind == "qwen3_5_moe_text":
            cls = q35m.Qwen3_5MoeForCausalLM
        elif kind == "qwen3_next":
            from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM
            cls = Qwen3NextForCausalLM
        model = cls.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32, **extra)
    return model.to("cuda", torch.bfloat16).eval()


# The tail statistic of test_golden_cuda.cpp: the mean of the largest 1 % of |a − b| (at least one element).
TAIL_FRACTION = 0.01


def tail_mean_abs(d):
    k = max(1, math.ceil(d.size * TAIL_FRACTION))
    return float(np.sort(np.abs(d).ravel())[-k:].mean())


def bf16_errors(got, want):
    """max |a − b|, the mean of its largest 1 % and ||a − b|| / ||b|| over a dataset, in float64: the
    definitions of test_golden_cuda.cpp."""
    a, b = got.astype(np.float64), want.astype(np.float64)
    d = a - b
    rel_rms = math.sqrt((d * d).sum() / max((b * b).sum(), 1e-300))
    at = np.unravel_index(int(np.abs(d).argmax()), d.shape)
    # Where HF's worst element sits, and its values: test_golden_cuda prints it beside ours, which tells a
    # sensitive element (both worst there) from a kernel of ours that is off.
    return {"max_abs": float(np.abs(d).max()), "rel_rms": float(rel_rms), "tail_mean_abs": tail_mean_abs(d),
            "tail_fraction": TAIL_FRACTION, "worst_at": [int(i) for i in at],
            "worst_got": float(a[at]), "worst_want": float(b[at])}


def write_json_atomic(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_datasets_atomic(path, arrays):
    """{name: array} as the datasets of an HDF5 file at path, written beside it and renamed into place."""
    tmp = f"{path}.tmp{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        for k in sorted(arrays):
            f.create_dataset(k, data=arrays[k])
    os.replace(tmp, path)


def measure_bf16(name, golden_dir, out_dir, fla, save_states=False):
    """HF in bf16 on CUDA over the golden's tokens; writes its error against expected.h5 per dataset."""
    model = load_bf16(golden_dir)
    if fla:  # the model's own modeling module: modeling_qwen3_5, or modeling_qwen3_5_moe for the MoE hybrids
        attach_fla(model, sys.modules[type(model).__module__])
    calls0 = FLA_CALLS["chunk_gated_delta_rule"]
    states, _ = forward_all(model.model, read_tokens(golden_dir), device="cuda")
    calls = FLA_CALLS["chunk_gated_delta_rule"] - calls0
    kernels = gdn_kernels(model, calls)
    if kernels and fla and not calls:
        raise RuntimeError(f"{name}: FLA was loaded but the forward never called it ({kernels})")
    expected = os.path.join(golden_dir, "expected.h5")
    with h5py.File(expected, "r") as f:
        want = {k: f[k][...] for k in f.keys() if k != "offsets"}
    if sorted(want) != sorted(states):
        raise SystemExit(f"{name}: HF in bf16 gave datasets {sorted(states)}, expected.h5 holds {sorted(want)}")
    with open(expected, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    record = {"model": name, "reference": "expected.h5 (HF float32 on CPU, pure-torch kernels)",
              "expected_h5_sha256": digest, "dtype": "bfloat16", "device": torch.cuda.get_device_name(),
              "attn_implementation": "sdpa", "gdn_kernels": kernels, "torch_version": torch.__version__,
              "transformers_version": transformers.__version__, "generator": "tests/golden/make_golden.py --hf-bf16",
              "experts_implementation": getattr(model.config, "_experts_implementation", None),
              "datasets": {k: bf16_errors(states[k], want[k]) for k in sorted(want)}}
    if kernels:
        record.update(fla_version=fla.get("fla_version"), fla_commit=fla.get("fla_commit"))
    os.makedirs(out_dir, exist_ok=True)
    if save_states:
        write_datasets_atomic(os.path.join(out_dir, "hf_bf16.h5"), {k: states[k] for k in want})
    write_json_atomic(os.path.join(out_dir, HF_BF16_FILE), record)
    for key, e in record["datasets"].items():
        print(f"  {name:22s} {key:11s} HF bf16: max abs {e['max_abs']:.3e}  rel rms {e['rel_rms']:.3e}")
    print(f"{name}: HF bf16 vs the fp32 golden in {golden_dir}; DeltaNet: {kernels or 'none'}")
    return record


def run_hf_bf16(args, names):
    """One JSON per model into --out/<model>/, against the golden just written there or the committed one. A
    hybrid that FLA fails on is measured again in a process of its own with FLA blocked (--no-fla): HF's
    pure-torch DeltaNet, and the JSON says so."""
    if not torch.cuda.is_available():
        raise SystemExit("--hf-bf16 needs a CUDA device (run it on the GPU machine)")
    fla = FLA_INFO
    if FLA_ERROR is not None and not args.allow_no_fla and not NO_FLA:
        raise SystemExit(f"{FLA_ERROR}\nThe peer is HF + FLA; --allow-no-fla records HF's pure-torch DeltaNet instead")
    if not fla and not NO_FLA:
        print(f"warning: {FLA_ERROR}; recording HF's pure-torch DeltaNet (--allow-no-fla)")
    print(f"FLA: {fla or 'not used'}")
    failed = []
    for name in names:
        fresh = os.path.join(args.out, name)
        golden_dir = fresh if os.path.isfile(os.path.join(fresh, "expected.h5")) else os.path.join(COMMITTED, name)
        try:
            if not os.path.isfile(os.path.join(golden_dir, "expected.h5")):
                raise SystemExit(f"no golden for {name} in {fresh} or {COMMITTED}; write it first (without --hf-bf16)")
            try:
                measure_bf16(name, golden_dir, fresh, fla, args.save_states)
            except Exception as e:  # noqa: BLE001 - FLA refusing a tiny shape must not lose the whole run
                if not fla or not model_type(golden_dir).startswith("qwen3_5"):
                    raise
                traceback.print_exc()
                print(f"{name}: FLA failed ({type(e).__name__}: {e}); measuring HF's pure-torch DeltaNet instead")
                cmd = [sys.executable, os.path.abspath(__file__), "--hf-bf16", "--no-fla", "--models", name,
                       "--out", args.out]
                if subprocess.run(cmd).returncode != 0:
                    raise RuntimeError(f"{name}: the --no-fla re-run failed too") from e
                path = os.path.join(fresh, HF_BF16_FILE)
                with open(path) as f:
                    record = json.load(f)
                record["fla_error"] = f"{type(e).__name__}: {e}"
                write_json_atomic(path, record)
        except BaseException as e:  # noqa: BLE001 - keep going so one run reports every model
            traceback.print_exc()
            failed.append(f"{name}: {e}")
    return failed


JOBS = {
    "qwen3_tiny": lambda o: make_text_model(o, "qwen3_tiny", Qwen3ForCausalLM, qwen3_tiny_config(), 11),
    "qwen3_untied_sharded": lambda o: make_text_model(o, "qwen3_untied_sharded", Qwen3ForCausalLM,
                                                      qwen3_untied_config(), 12, shard="40KB"),
    "qwen35_tiny": lambda o: make_text_model(o, "qwen35_tiny", q35.Qwen3_5ForCausalLM, qwen35_tiny_config(), 13),
    "qwen35_multimodal": lambda o: make_multimodal(o, "qwen35_multimodal", 14),
    "qwen35_gqa3": lambda o: make_text_model(o, "qwen35_gqa3", q35.Qwen3_5ForCausalLM, qwen35_gqa3_config(), 15,
                                             lengths=SEQ_LENGTHS_257),
    "qwen3_gqa5": lambda o: make_text_model(o, "qwen3_gqa5", Qwen3ForCausalLM, qwen3_gqa5_config(), 16,
                                            lengths=SEQ_LENGTHS_257),
    "qwen3_hd128": lambda o: make_text_model(o, "qwen3_hd128", Qwen3ForCausalLM, qwen3_hd128_config(), 17,
                                             lengths=SEQ_LENGTHS_257),
    "qwen35_hd256": lambda o: make_text_model(o, "qwen35_hd256", q35.Qwen3_5ForCausalLM, qwen35_hd256_config(),
                                              18, lengths=SEQ_LENGTHS_257),
    "qwen35_odd5": lambda o: make_text_model(o, "qwen35_odd5", q35.Qwen3_5ForCausalLM, qwen35_odd5_config(), 19,
                                             lengths=SEQ_LENGTHS_257),
    "qwen35_long": lambda o: make_text_model(o, "qwen35_long", q35.Qwen3_5ForCausalLM, qwen35_long_config(), 20,
                                             lengths=SEQ_LENGTHS_LONG),
    "qwen3_hd40_long": lambda o: make_text_model(o, "qwen3_hd40_long", Qwen3ForCausalLM, qwen3_hd40_long_config(),
                                                 21, lengths=SEQ_LENGTHS_LONG),
}


def main():
    parser = argparse.ArgumentParser(description="Write golden files for dflash_mpi extract, or (--hf-bf16) "
                                     "HF-bf16's error against them.")
    parser.add_argument("--out", required=True, help="folder that receives one subfolder per model")
    parser.add_argument("--models", default=",".join(JOBS),
                        help=f"comma-separated subset of {','.join(JOBS)} (default all)")
    parser.add_argument("--hf-bf16", action="store_true",
                        help=f"on CUDA: write <out>/<model>/{HF_BF16_FILE}, HF-bf16's error against the fp32 "
                        f"golden in <out>/<model> if there, else the committed one in {COMMITTED}")
    parser.add_argument("--fla", help="FLA tree for --hf-bf16 (default .peer/flash-linear-attention)")
    parser.add_argument("--allow-no-fla", action="store_true",
                        help="--hf-bf16 without FLA: record HF's pure-torch DeltaNet (not the peer)")
    parser.add_argument("--no-fla", action="store_true",
                        help="--hf-bf16 with FLA blocked (the re-run of a hybrid FLA failed on)")
    parser.add_argument("--save-states", action="store_true",
                        help="--hf-bf16 also writes HF-bf16's own taps, as float32, to <out>/<model>/hf_bf16.h5 "
                        "(for studying where its error sits; not used by the tests)")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    # --hf-bf16 also measures goldens other writers made (make_moe_golden.py's MoE cases): any committed one.
    unknown = [n for n in names if n not in JOBS and not (args.hf_bf16 and os.path.isdir(os.path.join(COMMITTED, n)))]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(JOBS)} (with --hf-bf16 also any folder of "
                     f"{COMMITTED})")
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}, "
          f"h5py {h5py.__version__}")
    if args.hf_bf16:
        failed = run_hf_bf16(args, names)
    else:
        print(f"GDN: {GDN_IMPL}")
        failed = []
        for name in names:
            try:
                JOBS[name](args.out)
            except BaseException as e:  # noqa: BLE001 - keep going so one run reports every model
                traceback.print_exc()
                failed.append(f"{name}: {e}")
        print(f"GDN calls: {dict(GDN_CALLS)}")
        for m in ("fla", "causal_conv1d", "kernels"):
            if sys.modules.get(m) is not None:
                failed.append(f"{m} was imported despite the block")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print(f"all {'HF-bf16 error files' if args.hf_bf16 else 'golden files'} written and verified")


if __name__ == "__main__":
    main()
