#!/usr/bin/env python3
# The peers of bench_kernels' non-GEMM rows, on the same shapes, for run_kernels_peer.sh to take the ratio in the
# same GPU call: torch's fused SDPA with the cuDNN backend (and FlashAttention-2's, for reference) for causal
# prefill attention over 8 x 4096 tokens at the 27B (24/4 heads x 256, output gate) and the 8B (32/8 x 128)
# shapes, and flash-linear-attention's chunk_gated_delta_rule forward at the 27B DeltaNet shape (16 key / 48
# value heads, 128 x 128), called the way transformers' Qwen3.5 layer calls it (q, k repeated to the value heads,
# l2norm in the kernel, g and beta computed in torch first). Prints one JSON line per row:
#   {"row": NAME, "ms": median, "backend": ...}
# Timing: CUDA events around each call, 3 warm-ups, the median of 10 (as bench_kernels' cuda_median_ms).
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_peer import load_fla  # noqa: E402


def median_ms(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def emit(**row):
    print(json.dumps(row), flush=True)


def attention_rows(S, L):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for hq, hkv, hd, gated in ((24, 4, 256, True), (32, 8, 128, False)):
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.rand(S, hq, L, hd, device="cuda", generator=g, dtype=torch.bfloat16) * 4 - 2
        k = torch.rand(S, hkv, L, hd, device="cuda", generator=g, dtype=torch.bfloat16) * 4 - 2
        v = torch.rand(S, hkv, L, hd, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
        gate = torch.rand(S, L, hq * hd, device="cuda", generator=g, dtype=torch.bfloat16) * 6 - 3
        flops = 4.0 * hd * hq * S * (L * (L + 1) / 2)
        label = f"{hq}/{hkv} hd{hd}{' gated' if gated else ''}"
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            # GQA: the backend's own grouped path when it has one, else K/V repeated to the query heads first
            # (the repeat is outside the timed call).
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))
                try:
                    with sdpa_kernel(backend):
                        def call():
                            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                        ms = median_ms(call)
                        o = call()
                        if gated:  # transformers' Qwen3.5 full layer: out * sigmoid(gate) after the attention
                            def gated_call():
                                out = call().transpose(1, 2).reshape(S, L, hq * hd)
                                return out * torch.sigmoid(gate)
                            ms_gated = median_ms(gated_call)
                except RuntimeError as e:
                    emit(row=f"attention {label}", backend=name, gqa=gqa, error=str(e).splitlines()[0][:200])
                    continue
                if not torch.isfinite(o).all():
                    raise SystemExit(f"peer_kernels: {name} attention {label} gave non-finite values")
                emit(row=f"attention {label}", backend=name, gqa=gqa, ms=ms, tflops=flops / ms / 1e9)
                if gated:
                    emit(row=f"attention {label} + gate", backend=name, gqa=gqa, ms=ms_gated)
                break
        del q, k, v, gate
        torch.cuda.empty_cache()


def gdn_rows(S, L, fla_root):
    info = load_fla(fla_root)
    import fla.ops.gated_delta_rule as gdr

    nk, nv, dk, dv = 16, 48, 128, 128
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.rand(S, L, nk, dk, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
    k = torch.rand(S, L, nk, dk, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
    v = torch.rand(S, L, nv, dv, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
    a = torch.rand(S, L, nv, device="cuda", generator=g, dtype=torch.bfloat16) * 6 - 3
    b = torch.rand(S, L, nv, device="cuda", generator=g, dtype=torch.bfloat16) * 6 - 3
    A_log = torch.rand(nv, device="cuda", generator=g) * 3 - 2
    dt_bias = torch.rand(nv, device="cuda", generator=g) * 2 - 1
    rep = nv // nk

    def core(qq, kk, gg, beta):
        return gdr.chunk_gated_delta_rule(qq, kk, v, g=gg, beta=beta, initial_state=None, output_final_state=False,
                                          use_qk_l2norm_in_kernel=True)

    qq, kk = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
    gg = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    beta = b.sigmoid()
    ms_core = median_ms(lambda: core(qq, kk, gg, beta))

    def layer():  # what the Qwen3.5 layer runs between its conv and its gated norm
        q2, k2 = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
        g2 = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
        return core(q2, k2, g2, b.sigmoid())

    ms_layer = median_ms(layer)
    o, _ = core(qq, kk, gg, beta)
    if not torch.isfinite(o).all():
        raise SystemExit("peer_kernels: FLA chunk_gated_delta_rule gave non-finite values")
    emit(row="gdn_prefill 16/48 128", backend="fla chunk_gated_delta_rule", ms=ms_core,
         fla_version=info["fla_version"], fla_commit=info["fla_commit"])
    emit(row="gdn_prefill 16/48 128 + repeat, g, beta", backend="fla, as transformers' Qwen3.5 layer", ms=ms_layer)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("what", nargs="?", default="all", choices=["all", "attention", "gdn"])
    p.add_argument("--fla", default=None, help="FLA source tree (default .peer/flash-linear-attention)")
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--len", type=int, default=4096)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("peer_kernels: no CUDA device; nothing measured")
        return
    emit(row="peer", torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
         device=torch.cuda.get_device_name(0))
    if a.what in ("all", "attention"):
        attention_rows(a.seqs, a.len)
    if a.what in ("all", "gdn"):
        gdn_rows(a.seqs, a.len, a.fla)


if __name__ == "__main__":
    main()
