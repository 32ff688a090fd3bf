# SpecForge's draft model class for each drafter kind, from the pinned SpecForge trees under .peer/ (never
# copied into this repository). Shared by make_drafter_golden.py (which writes the goldens with these classes)
# and check_export_specforge.py (which loads our exports into them), so both build the same class the same way.
import importlib
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import specforge_drafter_step as peer  # noqa: E402  (SpecForge loader shared with the peer benchmark)

KINDS = ("dflash", "domino", "dspark", "dflash2")
# DFlash2DraftModel exists from this SpecForge commit on; the other kinds come from peer.SPECFORGE_COMMIT.
DFLASH2_COMMIT = "5943b2f66840d809d68925d1aa6896e7cd2775db"
CLASS_NAMES = {"dflash": "DFlashDraftModel", "domino": "DominoDraftModel", "dspark": "DSparkDraftModel",
               "dflash2": "DFlash2DraftModel"}


def default_specforge(kind):
    """The SpecForge tree a kind's class comes from: .peer/SpecForge-dflash2 for dflash2, else .peer/SpecForge."""
    return os.path.join(REPO, ".peer", "SpecForge-dflash2") if kind == "dflash2" else peer.DEFAULT_SPECFORGE


def check_commit(kind, specforge, tool):
    """The commit of the tree at `specforge` (printed beside the pinned one; a mismatch is a warning) for `kind`.
    Exits with a hint when the tree lacks the kind's module."""
    module = os.path.join(specforge, "specforge", "modeling", "draft", kind + ".py")
    if kind == "dflash2":
        commit_file = os.path.join(specforge, "SPECFORGE_COMMIT")
        commit = open(commit_file).read().strip() if os.path.isfile(commit_file) else "unknown"
        pinned = DFLASH2_COMMIT
        if not os.path.isfile(module):
            sys.exit(f"{tool}: {specforge} has no specforge/modeling/draft/dflash2.py. HINT: export SpecForge "
                     f"{DFLASH2_COMMIT} there (git --git-dir=<mirror> archive {DFLASH2_COMMIT} | tar -x -C "
                     f"{specforge}) and write the commit into {commit_file}, or pass --specforge DIR")
    else:
        commit, pinned = peer.specforge_commit(specforge), peer.SPECFORGE_COMMIT
    return commit, pinned


def load_draft_class(kind, specforge):
    """(SpecForge modules as peer.load_specforge returns them, the kind's draft model class)."""
    sf = peer.load_specforge(specforge, optimizer=False)
    if kind == "dflash":
        return sf, sf.dflash.DFlashDraftModel
    module = importlib.import_module("specforge.modeling.draft." + kind)
    return sf, getattr(module, CLASS_NAMES[kind])
