# The peer our CUDA target forward is measured against: Hugging Face transformers with flash-linear-attention
# (FLA) for the Gated DeltaNet, wired the way transformers wires it when it finds the package. Shared by
# benchmarks/hf_target_forward.py (speed) and tests/golden/make_golden.py --hf-bf16 (the bf16 error anchor).
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


def wire_fla(q35, root=None):
    """Imports FLA from `root` (default .peer/flash-linear-attention, or what is importable already) and makes
    transformers' Qwen3.5 module use its chunked/recurrent gated delta rule and fused gated norm: the module
    globals that Qwen3_5GatedDeltaNet.__init__ reads, so call this before building a model. Returns a dict
    describing what was wired; raises RuntimeError with a HINT when FLA cannot be imported."""
    root = os.path.abspath(root or DEFAULT_FLA)
    if os.path.isfile(os.path.join(root, "fla", "__init__.py")) and root not in sys.path:
        sys.path.insert(0, root)
    # FLA probes the device once, at import, and caches the answer: CUDA must be up before it is imported.
    if not torch.cuda.is_available():
        raise RuntimeError("FLA needs a CUDA device and torch sees none")
    torch.zeros(1, device="cuda")
    try:
        import fla
        from fla.modules import FusedRMSNormGated
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        raise RuntimeError(f"flash-linear-attention not importable ({type(e).__name__}: {e}). HINT: carry the "
                           f"lead's .peer/ (FLA v0.5.2 at {DEFAULT_FLA}, commit {FLA_COMMIT}) or pass --fla DIR")
    q35.chunk_gated_delta_rule = chunk_gated_delta_rule
    q35.fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule
    q35.FusedRMSNormGated = FusedRMSNormGated
    commit = fla_commit(os.path.dirname(os.path.dirname(os.path.abspath(fla.__file__))))
    if commit not in (FLA_COMMIT, "unknown"):
        print(f"warning: FLA commit {commit} is not the pinned {FLA_COMMIT}", file=sys.stderr)
    return {"fla_version": getattr(fla, "__version__", "unknown"), "fla_commit": commit,
            "fla_path": os.path.dirname(os.path.abspath(fla.__file__))}


def qualified(obj):
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def gdn_kernels(model):
    """The gated-delta-rule and gated-norm implementations the DeltaNet layers of `model` hold, as one string
    (empty for a model without DeltaNet layers): proof of which kernels ran."""
    seen = set()
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            fn, norm = module.chunk_gated_delta_rule, type(module.norm)
            seen.add(f"{qualified(fn)} + {qualified(norm)}")
    return "; ".join(sorted(seen))
