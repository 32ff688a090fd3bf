#!/usr/bin/env python3
# The peer of bench_target_forward: Hugging Face transformers' own backbone forward (embeddings, every decoder
# layer, final norm; every hidden state kept with output_hidden_states=True) in bf16 on one GPU, random weights,
# 8 sequences of 4096 tokens as one batch, on the same shapes (Qwen3.6-27B with flash-linear-attention for the
# Gated DeltaNet, Qwen3-8B with sdpa, Qwen3.6-35B-A3B with FLA and transformers' experts implementation of
# --experts, by default grouped_mm, its fastest). Prints ONE JSON line so run_target_forward.sh can take the ratio.
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine reaches no network

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_peer import FLA_CALLS, FLA_COMMIT, attach_fla, gdn_kernels, load_fla  # noqa: E402


def argv_value(flag):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv[:-1] else None


# FLA must be imported before transformers' Qwen3.5 module, which binds its kernels when it is imported
# (hf_peer.load_fla); only the hybrid needs it.
FLA, FLA_ERROR = {"fla_version": None, "fla_commit": None}, None
if argv_value("--model") in ("27b", "35b-a3b") and torch.cuda.is_available():
    try:
        FLA = load_fla(argv_value("--fla"))
    except RuntimeError as e:
        FLA_ERROR = e

import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3Model  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35m  # noqa: E402
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig  # noqa: E402


# The shapes of bench_target_forward.cpp (benchmarks/target_configs.h).
def config_27b():
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(64)]
    return Qwen3_5TextConfig(vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                             layer_types=types, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                             attn_output_gate=True, linear_num_key_heads=16, linear_num_value_heads=48,
                             linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                             rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=262144,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                              "mrope_section": [11, 11, 10], "mrope_interleaved": True})


def config_8b():
    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, max_position_embeddings=40960,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def config_35b_a3b():
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(40)]
    return Qwen3_5MoeTextConfig(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, layer_types=types,
                                num_attention_heads=16, num_key_value_heads=2, head_dim=256, attn_output_gate=True,
                                linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                                linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
                                num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=262144,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                 "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                                 "mrope_interleaved": True})


# (label, config, model class, hybrid (needs FLA), the model's modeling module)
MODELS = {"27b": ("Qwen3.6-27B", config_27b, q35.Qwen3_5TextModel, True, q35),
          "8b": ("Qwen3-8B", config_8b, Qwen3Model, False, None),
          "35b-a3b": ("Qwen3.6-35B-A3B", config_35b_a3b, q35m.Qwen3_5MoeTextModel, True, q35m)}


def main():
    p = argparse.ArgumentParser(description="HF transformers (+ FLA) target forward, the peer of bench_target_forward")
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2, help="untimed forwards (FLA's Triton kernels autotune first)")
    p.add_argument("--steps", type=int, default=3, help="timed forwards; the median is reported")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--fla", help="flash-linear-attention tree (default .peer/flash-linear-attention)")
    p.add_argument("--allow-no-fla", action="store_true",
                   help="time the hybrid with HF's pure-torch DeltaNet when FLA is missing (not the peer)")
    p.add_argument("--experts", default="grouped_mm", choices=["grouped_mm", "batched_mm", "eager"],
                   help="transformers' experts implementation for the MoE model (config._experts_implementation)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        sys.exit("hf_target_forward: no CUDA device; this peer runs on the GPU machine only")
    label, make_config, model_cls, hybrid, modeling = MODELS[args.model]
    moe = args.model == "35b-a3b"

    fla = FLA
    if hybrid and FLA_ERROR is not None:
        if not args.allow_no_fla:
            sys.exit(f"hf_target_forward: {FLA_ERROR}\nThe peer of the hybrid is HF + FLA; --allow-no-fla times "
                     f"HF's pure-torch DeltaNet instead (and says so)")
        print(f"warning: {FLA_ERROR}; timing HF's pure-torch DeltaNet (--allow-no-fla)", file=sys.stderr)
    config = make_config()
    config._attn_implementation = args.attn
    if moe:
        config._experts_implementation = args.experts
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = model_cls(config).eval()  # HF's own random init, drawn on the device
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    if hybrid and fla["fla_version"] and not attach_fla(model, modeling):
        sys.exit("hf_target_forward: FLA is loaded but the model has no Gated DeltaNet layer to wire it into")
    bad = [name for name, t in model.named_parameters() if not bool(torch.isfinite(t).all())]
    if bad:
        sys.exit(f"hf_target_forward: HF's init left non-finite values in {bad[:3]} ({len(bad)} tensors)")

    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.seqs, args.seq_len), device="cuda", generator=gen)
    tokens = args.seqs * args.seq_len
    times = []
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for step in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t)
            if len(out.hidden_states) != config.num_hidden_layers + 1:
                sys.exit(f"hf_target_forward: {len(out.hidden_states)} hidden states, expected "
                         f"{config.num_hidden_layers + 1}")
            finite = bool(torch.isfinite(out.last_hidden_state).all())
            del out
            if not finite:
                sys.exit("hf_target_forward: non-finite final hidden state; no speed reported")
    seconds = statistics.median(times)
    kernels = gdn_kernels(model, FLA_CALLS["chunk_gated_delta_rule"])
    if hybrid and fla["fla_version"] and not FLA_CALLS["chunk_gated_delta_rule"]:
        sys.exit(f"hf_target_forward: FLA was loaded but the forward never called it ({kernels}); no speed "
                 f"reported, since this would not be the HF + FLA peer")
    result = {"model": args.model, "label": label, "peer": "HF transformers" + (" + FLA" if fla["fla_version"] else ""),
              "tok_s": tokens / seconds, "seconds": seconds, "seconds_all": times, "tokens": tokens,
              "seqs": args.seqs, "seq_len": args.seq_len, "hidden_states": config.num_hidden_layers + 1,
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "init_s": init_s,
              "attn_implementation": args.attn, "gdn_kernels": kernels,
              "experts_implementation": getattr(model.config, "_experts_implementation", None) if moe else None, "fla_version": fla["fla_version"],
              "fla_commit": fla["fla_commit"], "fla_pinned_commit": FLA_COMMIT,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__,
              "device": torch.cuda.get_device_name()}
    print(f"{label}: {result['peer']}, {tokens} tokens ({args.seqs} x {args.seq_len}), median {seconds:.3f} s of "
          f"{[round(x, 3) for x in times]} -> {result['tok_s']:.0f} tok/s, peak {result['peak_mem_gib']:.1f} GiB")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
