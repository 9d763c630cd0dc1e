"""Merge a newly exported calibration profile into an existing one, part by part.

Why: the shipped ``h200.yaml`` holds collective curves, overlap interference and reclaim figures that
need 2 GPUs (measured 2026-11-30 on 2x H200), while a later single-GPU run re-measures the kernels
(GEMMs BF16 + FP8, attention, memory-bound ops eager and compiled, FP8 quantization). Rather than
hand-editing, :func:`merge_profiles` takes each *part* from the profile that measured it:

===============  =====================================================================================
part             keys (top level; ``measurements.*`` raw rows of the same part go with them)
===============  =====================================================================================
``kernels``      gemm, gemm_backward_factor, attention, memory_bound_bandwidth_gbs, memory_bound_ops,
                 memory_bound_ops_compiled, gemm_fp8, quantize; measurements gemm, attention,
                 memory_ops, gemm_fp8, quantize, block_ops
``collectives``  collectives, overlap; measurements collectives, overlap (a base tier's
                 ``group_curves``, curves of larger groups, stay when the new tier has none)
``reclaim``      reclaim; measurements reclaim
===============  =====================================================================================

``kernels`` always comes from the new profile; ``collectives`` and ``reclaim`` from the new profile only
when its ``measurements`` hold rows of them, else from the base. A kernel key the new profile lacks
(e.g. no FP8 run) is kept from the base. ``environment`` becomes the new profile's environment plus
``environment.parts: {part: environment it was measured in}``, and ``source`` says which part was
measured when and on what. ``label`` is the new profile's; fragmentation stays the base's.

CLI: ``python -m autotune.profiling.merge NEW.yaml --into BASE.yaml [-o OUT.yaml]`` (in place by default),
or ``autotune profile ... --export NEW.yaml --merge-into BASE.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.cost.calibration import CalibrationProfile
from autotune.errors import ConfigError

#: part -> (top-level keys, measurements keys); module docstring
PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kernels": (("gemm", "gemm_backward_factor", "attention", "memory_bound_bandwidth_gbs", "memory_bound_ops",
                 "memory_bound_ops_compiled", "gemm_fp8", "quantize"),
                ("gemm", "attention", "memory_ops", "gemm_fp8", "quantize", "block_ops")),
    "collectives": (("collectives", "overlap"), ("collectives", "overlap")),
    "reclaim": (("reclaim",), ("reclaim",)),
}


def _env_of(d: Mapping[str, Any], part: str) -> dict[str, Any]:
    env = dict(d.get("environment") or {})
    parts = env.pop("parts", None) or {}
    return dict(parts.get(part) or env)


def _describe(env: Mapping[str, Any]) -> str:
    return (f"{env.get('gpu_count', '?')}x {env.get('gpu_name', '?')} {env.get('date', '?')} "
            f"(torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, driver {env.get('driver', '?')})")


def merge_profiles(new: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The merged profile mapping (module docstring); both inputs are validated first and the result too.

    Raises:
        ConfigError: either input, or the result, is not a valid calibration profile.
    """
    CalibrationProfile.from_dict(new, source="new profile")
    CalibrationProfile.from_dict(base, source="base profile")
    new_meas = dict(new.get("measurements") or {})
    base_meas = dict(base.get("measurements") or {})
    out: dict[str, Any] = {k: v for k, v in base.items()}
    meas: dict[str, Any] = {}
    parts_env: dict[str, Any] = {}
    for part, (keys, mkeys) in PARTS.items():
        take_new = part == "kernels" or any(new_meas.get(k) for k in mkeys)
        src, src_meas = (new, new_meas) if take_new else (base, base_meas)
        for k in keys:
            if k in src:
                out[k] = src[k]
            elif part == "kernels" and k in base:
                out[k] = base[k]          # e.g. gemm_fp8 from an earlier run when this one had no FP8 section
            else:
                out.pop(k, None)
        for k in mkeys:
            if src_meas.get(k):
                meas[k] = src_meas[k]
            elif part == "kernels" and base_meas.get(k):
                meas[k] = base_meas[k]
        parts_env[part] = _env_of(src, part)
    if out.get("collectives") is not (base.get("collectives")):
        # a tier's curves of larger groups (group_curves: published nccl-tests rows, not re-measured by a
        # 2-GPU profile) stay with the tier when the new profile re-measured it without them
        cols = {t: dict(td) for t, td in dict(out.get("collectives") or {}).items()}
        for t, btd in dict(base.get("collectives") or {}).items():
            bgc = dict((btd or {}).get("group_curves") or {})
            if t in cols and bgc and not cols[t].get("group_curves"):
                g0 = int(cols[t].get("group_size", 2))
                kept = {g: v for g, v in bgc.items() if isinstance(g, int) and g > g0}
                if kept:
                    cols[t]["group_curves"] = kept
        out["collectives"] = cols
    for k, v in new_meas.items():        # raw rows of any other kind the new profile has
        meas.setdefault(k, v)
    out["measurements"] = meas
    env = dict(new.get("environment") or {})
    env.pop("parts", None)
    env["parts"] = parts_env
    out["environment"] = env
    out["label"] = new.get("label", base.get("label"))
    out["measured"] = bool(new.get("measured", False)) and bool(base.get("measured", False))
    out["source"] = ("merged by autotune.profiling.merge: " + "; ".join(
        f"{part} measured on {_describe(e)}" for part, e in parts_env.items())
        + f". New profile: {new.get('source', '')} Base profile ({base.get('label', '?')}): "
        + str(base.get("source", "")))
    # key order: the schema's, then anything else, measurements last
    order = ["schema_version", "label", "measured", "source", "environment", "gpu", "peak_bf16_tflops",
             "hbm_bandwidth_gbs", "gemm", "gemm_backward_factor", "gemm_fp8", "attention",
             "memory_bound_bandwidth_gbs", "memory_bound_ops", "memory_bound_ops_compiled", "quantize",
             "collectives", "overlap", "reclaim", "fragmentation"]
    merged = {k: out[k] for k in order if k in out}
    merged.update({k: v for k, v in out.items() if k not in merged and k != "measurements"})
    merged["measurements"] = out["measurements"]
    CalibrationProfile.from_dict(merged, source="merged profile")
    return merged


def merge_files(new_path: str | Path, base_path: str | Path, *, output: str | Path | None = None) -> str:
    """Merge the profile file ``new_path`` into ``base_path``; write ``output`` (default ``base_path``).

    Returns the path written.

    Raises:
        ConfigError: a file is missing, not YAML, or not a valid profile.
    """
    from autotune.files import read_yaml_file
    from autotune.profiling.store import dump_profile_yaml

    merged = merge_profiles(read_yaml_file(new_path, what="calibration file"),
                            read_yaml_file(base_path, what="calibration file"))
    out = Path(output or base_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from autotune.files import write_output_text
    write_output_text(out, dump_profile_yaml(merged), what="--merge-output" if output else "--merge-into")
    return str(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autotune.profiling.merge NEW --into BASE [-o OUT]``; exit 2 with one line on bad input."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m autotune.profiling.merge", description=__doc__.splitlines()[0])
    ap.add_argument("new", help="newly exported profile (YAML)")
    ap.add_argument("--into", required=True, help="profile to merge into (e.g. autotune/data/calibration/h200.yaml)")
    ap.add_argument("-o", "--output", default=None, help="output file (default: --into, in place)")
    a = ap.parse_args(argv)
    try:
        path = merge_files(a.new, a.into, output=a.output)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"merged {a.new} into {a.into} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
