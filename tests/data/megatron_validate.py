"""Run Megatron-LM's own argument checks on argument lists: ``parse_args`` + ``validate_args``
(megatron/training/arguments.py) and the model config they build (``core_transformer_config_from_args``,
megatron/training/argument_utils.py: ``TransformerConfig.__post_init__``, where most MoE rules live), on CPU.

Usage: python tests/data/megatron_validate.py PATH/TO/Megatron-LM CASES.json

``CASES.json``: a list of ``{"name": str, "args": [argv tokens], "world_size": int, "env": {str: str},
"capability": [major, minor]}``. Prints one JSON line per case: ``{"name", "ok", "stage", "error"}`` where
``stage`` is where it stopped (``parse_args``, ``validate_args``, ``transformer_config``) or ``done``.

The checks run in this process with the CPU torch of this project. As in tests/data/extract_megatron_args.py,
GPU-only modules that are missing (Transformer Engine, apex, ...) and Megatron modules that import triton
unconditionally are empty stand-ins (version 99.0.0: newer than any minimum Megatron asserts), and
``torch.cuda.get_device_capability`` answers the case's ``capability`` (validate_args asks it for
``--moe-grouped-gemm``, "Unsupported compute capability for GroupedGEMM kernels"). So a check that reads
the installed Transformer Engine's version always passes here; every other check is Megatron-LM's code
as it runs. No Megatron source is copied into this project.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

STAND_INS: tuple[str, ...] = ()
#: the Transformer Engine version the checks are told is installed (TE is not installed here): 2.14.0, the
#: highest minimum that validate_args and TransformerConfig name at d98e8a64, so no TE version check fails
TE_VERSION = "2.14.0"
#: Megatron-Core's handles on Transformer Engine kernels, None when TE is not installed (each module's
#: ``try: from ...transformer_engine import ... except ImportError: x = None``); the checks ask only whether
#: they exist ("apply_rope_fusion is not available. Please install TE >= 1.4", "fused permutation is not
#: available"), so they are set to a stand-in object
TE_KERNELS = {
    "megatron.core.models.common.embeddings.rope_utils": ("fused_apply_rotary_pos_emb",),
    "megatron.core.transformer.moe.moe_utils": ("fused_permute", "fused_permute_with_probs",
                                                "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                                                "fused_unpermute"),
}


def _last_frame(exc: BaseException) -> str:
    """``file:line`` inside Megatron-LM where ``exc`` was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in tb if "megatron" in f.filename]
    f = (mine or tb)[-1]
    return f"{f.filename.split('Megatron-LM/')[-1].split('site-packages/')[-1]}:{f.lineno}"


def run_case(case: dict) -> dict:
    """One case through parse_args, validate_args and core_transformer_config_from_args."""
    import torch

    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.arguments import parse_args, validate_args

    cap = tuple(case.get("capability", (9, 0)))
    old_argv, old_env = sys.argv, dict(os.environ)
    sys.argv = ["pretrain_gpt.py", *case["args"]]
    os.environ.update({"WORLD_SIZE": str(case["world_size"]), "RANK": "0", **case.get("env", {})})
    for k in ("CUDA_DEVICE_MAX_CONNECTIONS",):
        if k not in case.get("env", {}):
            os.environ.pop(k, None)
    torch.cuda.get_device_capability = lambda *a, **k: cap
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=cap[0], minor=cap[1])
    stage = "parse_args"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = parse_args()
            stage = "validate_args"
            validate_args(args, {})
            stage = "transformer_config"
            core_transformer_config_from_args(args)
            stage = "done"
        return {"name": case["name"], "ok": True, "stage": stage, "error": None}
    except SystemExit as e:         # argparse: the message went to stderr
        msg = out.getvalue().strip().splitlines()
        return {"name": case["name"], "ok": False, "stage": stage,
                "error": f"exit {e.code}: {msg[-1] if msg else ''}"}
    except BaseException as e:      # noqa: BLE001 - report every failure of Megatron's checks
        return {"name": case["name"], "ok": False, "stage": stage,
                "error": f"{type(e).__name__} at {_last_frame(e)}: {str(e).strip()[:400]}"}
    finally:
        sys.argv = old_argv
        os.environ.clear()
        os.environ.update(old_env)


def main() -> None:
    src, cases_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, src)
    import torch  # noqa: F401  (before the stand-ins: torch must see that triton is absent)
    import torch.utils.flop_counter  # noqa: F401

    import extract_megatron_args as ex
    ex.STUBBED = STAND_INS
    sys.meta_path.insert(0, ex._Stubs())
    import typing
    if not hasattr(typing, "override"):         # Python < 3.12 (Megatron uses typing.override)
        typing.override = lambda f: f
    import importlib

    import megatron.core.utils as mcu
    from packaging.version import Version
    mcu._te_version = Version(TE_VERSION)
    for mod, names in TE_KERNELS.items():
        m = importlib.import_module(mod)
        for n in names:
            if getattr(m, n) is None:
                setattr(m, n, object())
    cases = json.loads(Path(cases_file).read_text())
    for case in cases:
        print(json.dumps(run_case(case)), flush=True)


if __name__ == "__main__":
    main()
