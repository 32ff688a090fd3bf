# The peer our CUDA target forward is measured against: Hugging Face transformers with flash-linear-attention
# (FLA) for the Gated DeltaNet, wired the way transformers wires it when it finds the package. Shared by
# benchmarks/hf_target_forward.py (speed) and tests/golden/make_golden.py --hf-bf16 (the bf16 error anchor).
import collections
import functools
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The FLA tree these scripts were written against (github:fla-org/flash-linear-attention, v0.5.2); the lead's
# checkout keeps it, git-ignored, at .peer/flash-linear-attention with the commit in .peer/FLA_COMMIT.
FLA_COMMIT = "9c8e42e762fce087c27b673af4922795d9edb85e"
DEFAULT_FLA = os.path.join(REPO, ".peer", "flash-linear-attention")


def fla_commit(root):
    """The commit recorded beside the exported tree (.peer/FLA_COMMIT), or 'unknown'."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(root)), "FLA_COMMIT")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


FLA_CALLS = collections.Counter()  # calls into FLA's chunked gated delta rule, through the wrapper below


def _counted(fn):
    @functools.wraps(fn)  # keeps fn's signature: transformers filters the kwargs it passes by it
    def wrapper(*args, **kwargs):
        FLA_CALLS["chunk_gated_delta_rule"] += 1
        return fn(*args, **kwargs)

    wrapper.df_counted = True  # FLA's own function may carry __wrapped__ (a decorator): this marks ours
    return wrapper


def load_fla(root=None):
    """Imports FLA from `root` (default .peer/flash-linear-attention, or what is importable already) and counts
    the calls into its chunked gated delta rule. Call it BEFORE transformers' Qwen3.5 module is imported:
    transformers 5.x binds a kernel package's functions when that module is imported (it takes the package when
    it is importable, its pure-torch function otherwise). Returns a dict describing FLA; raises RuntimeError
    with a HINT when FLA cannot be imported."""
    root = os.path.abspath(root or DEFAULT_FLA)
    if os.path.isfile(os.path.join(root, "fla", "__init__.py")) and root not in sys.path:
        sys.path.insert(0, root)
    # FLA probes the device once, at import, and caches the answer: CUDA must be up before it is imported.
    if not torch.cuda.is_available():
        raise RuntimeError("FLA needs a CUDA device and torch sees none")
    torch.zeros(1, device="cuda")
    try:
        import fla
        import fla.ops
        import fla.ops.gated_delta_rule as gdr
    except ImportError as e:
        raise RuntimeError(f"flash-linear-attention not importable ({type(e).__name__}: {e}). HINT: carry the "
                           f"lead's .peer/ (FLA v0.5.2 at {DEFAULT_FLA}, commit {FLA_COMMIT}) or pass --fla DIR")
    if not getattr(gdr.chunk_gated_delta_rule, "df_counted", False):
        gdr.chunk_gated_delta_rule = _counted(gdr.chunk_gated_delta_rule)
        if hasattr(fla.ops, "chunk_gated_delta_rule"):
            fla.ops.chunk_gated_delta_rule = gdr.chunk_gated_delta_rule
    commit = fla_commit(os.path.dirname(os.path.dirname(os.path.abspath(fla.__file__))))
    if commit not in (FLA_COMMIT, "unknown"):
        print(f"warning: FLA commit {commit} is not the pinned {FLA_COMMIT}", file=sys.stderr)
    return {"fla_version": getattr(fla, "__version__", "unknown"), "fla_commit": commit,
            "fla_path": os.path.dirname(os.path.abspath(fla.__file__))}


def fla_chunk_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, cu_seqlens=None, **ignored):
    """FLA's chunked gated delta rule behind the signature of transformers' pure-torch one (same [B, T, H, D]
    layout, scale dk^-1/2, returns (output, final state)); FLA picks its own chunk size (64, as HF's). It stands
    where transformers' hub wrapper stood, which drops the keywords the torch function lacks: so does `ignored`,
    while cu_seqlens (packed sequences) goes on to FLA, which takes it."""
    import fla.ops.gated_delta_rule as gdr

    extra = {"cu_seqlens": cu_seqlens} if cu_seqlens is not None else {}
    return gdr.chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **extra)


def attach_fla(model, modeling):
    """Routes the Gated DeltaNet layers of a constructed `model` (transformers module `modeling`, e.g.
    modeling_qwen3_5) to FLA: the chunked rule, which transformers 5.17 calls through the module's name
    torch_chunk_gated_delta_rule when it found no kernel package, and FLA's fused gated RMSNorm holding each
    layer's own norm weight. Needed because transformers decides by the installed package, which a source tree on
    sys.path is not: loaded that way, FLA is importable yet never called. Returns the number of layers wired;
    FLA_CALLS then counts the calls. Call after load_fla."""
    from fla.modules import FusedRMSNormGated

    # fla_chunk_rule calls the counted FLA function (load_fla), so each call counts once, whether transformers
    # reaches FLA through this name or (FLA installed as a package) directly.
    modeling.torch_chunk_gated_delta_rule = fla_chunk_rule
    wired = 0
    for m in model.modules():
        if not (type(m).__name__.endswith("GatedDeltaNet") and hasattr(m, "norm")):
            continue
        old = m.norm
        eps = getattr(old, "variance_epsilon", getattr(old, "eps", None))
        if eps is None:
            raise RuntimeError(f"attach_fla: {qualified(type(old))} has no eps attribute to carry over")
        norm = FusedRMSNormGated(old.weight.shape[0], eps=eps, activation="silu", device=old.weight.device,
                                 dtype=old.weight.dtype)
        with torch.no_grad():
            norm.weight.copy_(old.weight)
        m.norm = norm
        wired += 1
    return wired


def qualified(obj):
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def gdn_kernels(model, fla_calls):
    """What the DeltaNet layers of `model` ran, as one string (empty for a model without DeltaNet layers), from
    their gated norm's type and `fla_calls`, the FLA chunk-rule calls counted over the forward: proof of which
    kernels ran."""
    norms = sorted({qualified(type(m.norm)) for m in model.modules()
                    if type(m).__name__.endswith("GatedDeltaNet") and hasattr(m, "norm")})
    if not norms:
        return ""
    rule = f"fla.ops.gated_delta_rule.chunk_gated_delta_rule ({fla_calls} calls)" if fla_calls else \
        "transformers' pure-torch chunk rule (no FLA call)"
    return f"{rule} + {'; '.join(norms)}"
