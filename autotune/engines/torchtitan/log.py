"""Parse torchtitan's trainer log: one record per logged training step, and the run's facts.

The metrics line is written by ``MetricsProcessor.log`` in torchtitan/components/metrics.py (the same
f-string in releases 0.2.x and 0.3.0, checked in the 0.2.2 and 0.3.0 wheels from PyPI)::

    step: {step:2}  loss: {global_avg_loss:8.5f}  grad_norm: {grad_norm:7.4f}
    memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps: {round(tps):,}
    tflops: {tflops:,.2f}  mfu: {mfu:.2f}%

(one line; 0.3.0 prints ``mfu: N/A`` when a quantization converter is active), behind the logger prefix
``[titan] <date> <time>,<ms> - root - INFO - `` (torchtitan/tools/logging.py ``init_logger``), possibly
behind torchrun's ``[rank0]:`` tee prefix, and wrapped in ANSI colour codes unless
``--metrics.disable_color_printing``. The quantities, as metrics.py computes them over the ``log_freq``
steps since the previous line:

* ``loss``: global average loss per valid token (all ranks), nats;
* ``grad_norm``: gradient norm after clipping;
* ``memory``: peak *reserved* bytes of the CUDA caching allocator (``torch.cuda.memory_stats``
  ``reserved_bytes.all.peak``, reset after every line) in GiB (2^30 bytes), and as % of the device's
  ``total_memory``;
* ``tps``: tokens per second per device: this rank's tokens / (wall seconds x non-data-parallel size),
  rounded to an integer and printed with thousands separators;
* ``tflops``: ``num_flops_per_token x tps / 1e12``, TFLOP/s per device;
* ``mfu``: ``100 x num_flops_per_token x tps / peak``, %, with ``peak`` from
  torchtitan/tools/utils.py ``get_peak_flops`` (989e12 for H100 SXM and H200, dense BF16) and
  ``num_flops_per_token`` from torchtitan/models/utils.py ``get_dense_model_nparams_and_flops``:
  ``6 x (params - embedding params) + 6 x layers x heads x (2 x head_dim) x seq_len``, the PaLM count
  with no causal discount of attention (autotune's ``mfu_palm``; :func:`causal_mfu` converts).

Step 1 includes warm-up (and torch.compile's compilation): :func:`summarize` leaves the first steps out.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"
_STEP = re.compile(
    rf"(?<!validate )\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})\s+"
    rf"(?:grad_norm:\s*(?P<grad_norm>{_NUM})\s+)?"
    rf"memory:\s*(?P<mem>{_NUM})GiB\((?P<mem_pct>{_NUM})%\)\s+"
    rf"tps:\s*(?P<tps>{_NUM})\s+tflops:\s*(?P<tflops>{_NUM})\s+mfu:\s*(?:(?P<mfu>{_NUM})%|N/A)")
_FACTS = {
    "torchtitan_version": re.compile(r"torchtitan version: (\S+)"),
    "model": re.compile(r"Model (\S+ \S+) size: ([\d,]+) total parameters"),
    "device": re.compile(r"CUDA capacity: (.+?) with ([\d.]+)GiB memory"),
    "peak_flops": re.compile(r"Peak FLOPS used for computing MFU: ([\d.e+]+)"),
    "model_memory": re.compile(r"CUDA memory usage for model: ([\d.]+)GiB"),
    "batch": re.compile(r"local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+), "
                        r"sequence length (\d+), total steps (\d+)"),
    "float8": re.compile(r"Float8 (?:training active with recipe (\w+)|(tensorwise) scaled training active)"),
    "compile": re.compile(r"Compiling each TransformerBlock with torch\.compile"),
}
# Triton's "OutOfMemoryError: out of resource: <kernel> Required: N Hardware limit: M" is a shared-memory limit of one
# autotuning candidate (torch/_inductor/select_algorithm.py skips it: "Ignoring this choice"), not CUDA memory
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError(?!: out of resource)")


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    return float(s.replace(",", ""))


@dataclass(frozen=True)
class StepRecord:
    """One metrics line of torchtitan's trainer.

    Attributes:
        step: training step (1-based; with ``log_freq > 1`` the values cover the steps since the
            previous line).
        loss: global average loss per valid token, nats.
        grad_norm: gradient norm after clipping (None if the line has none).
        memory_gib: peak reserved CUDA memory since the previous line, GiB (2^30 bytes).
        memory_pct: the same as % of the device's total memory.
        tps: tokens per second per device (rank tokens / (seconds x non-data-parallel size)).
        tflops: achieved TFLOP/s per device, torchtitan's FLOP count (PaLM, no causal discount).
        mfu_pct: model FLOPs utilization, %, against torchtitan's peak (989 TFLOP/s on H100/H200);
            None where torchtitan prints ``N/A`` (0.3.0 with a quantization converter).
    """

    step: int
    loss: float
    grad_norm: float | None
    memory_gib: float
    memory_pct: float
    tps: float
    tflops: float
    mfu_pct: float | None

    def step_time_s(self, tokens_per_step: int, non_dp_size: int = 1) -> float:
        """Seconds per training step implied by ``tps``: ``tokens_per_step / (tps x non_dp_size)``.

        ``tokens_per_step``: the tokens one rank consumes per step (local batch x seq_len x gradient
        accumulation steps); ``non_dp_size``: the product of the TP, PP and CP degrees (torchtitan divides
        by it). With ``log_freq > 1`` this is the mean over the interval. torchtitan rounds ``tps`` to an
        integer, so the result carries a relative error of at most 0.5 / tps.
        """
        return tokens_per_step / (self.tps * non_dp_size)


def parse_steps(text: str) -> list[StepRecord]:
    """Every training-step metrics line of ``text`` (validation lines are skipped), in log order."""
    out = []
    for line in text.splitlines():
        m = _STEP.search(_ANSI.sub("", line))
        if not m:
            continue
        g = m.groupdict()
        out.append(StepRecord(step=int(g["step"]), loss=_num(g["loss"]), grad_norm=_num(g["grad_norm"]),
                              memory_gib=_num(g["mem"]), memory_pct=_num(g["mem_pct"]), tps=_num(g["tps"]),
                              tflops=_num(g["tflops"]), mfu_pct=_num(g["mfu"])))
    return out


def parse_facts(text: str) -> dict:
    """What the run's log says about itself: ``torchtitan_version``, ``model`` (name and flavour),
    ``params`` (total parameters), ``device`` and ``device_gib``, ``peak_flops`` (FLOP/s used for MFU),
    ``model_memory_gib`` (reserved after building the model), ``local_batch_size``,
    ``global_batch_size``, ``grad_accum_steps``, ``seq_len``, ``steps``, ``float8_recipe``, ``compiled``
    and ``oom`` (a CUDA out-of-memory error appears). Absent facts are left out (``compiled``, ``oom``:
    always there)."""
    t = _ANSI.sub("", text)
    f: dict = {}
    if m := _FACTS["torchtitan_version"].search(t):
        f["torchtitan_version"] = m.group(1).rstrip(".")
    if m := _FACTS["model"].search(t):
        f["model"], f["params"] = m.group(1), int(m.group(2).replace(",", ""))
    if m := _FACTS["device"].search(t):
        f["device"], f["device_gib"] = m.group(1), float(m.group(2))
    if m := _FACTS["peak_flops"].search(t):
        f["peak_flops"] = float(m.group(1))
    if m := _FACTS["model_memory"].search(t):
        f["model_memory_gib"] = float(m.group(1))
    if m := _FACTS["batch"].search(t):
        for k, v in zip(("local_batch_size", "global_batch_size", "grad_accum_steps", "seq_len", "steps"),
                        m.groups()):
            f[k] = int(v)
    if m := _FACTS["float8"].search(t):
        f["float8_recipe"] = m.group(1) or m.group(2)
    f["compiled"] = bool(_FACTS["compile"].search(t))
    f["oom"] = bool(_OOM.search(t))
    return f


def summarize(records: list[StepRecord], *, skip: int = 3) -> dict:
    """Medians over the steps after the first ``skip`` logged steps (warm-up, compilation): ``steps``
    (how many), ``tps``, ``tflops``, ``mfu_pct`` (None if not printed), ``memory_gib`` (the maximum of the
    per-line peaks, all steps), ``final_loss``. Raises ValueError when no step is left."""
    rest = records[skip:]
    if not rest:
        raise ValueError(f"{len(records)} logged steps: none left after skipping {skip}")
    mfu = [r.mfu_pct for r in rest if r.mfu_pct is not None]
    return {"steps": len(rest), "tps": statistics.median(r.tps for r in rest),
            "tflops": statistics.median(r.tflops for r in rest),
            "mfu_pct": statistics.median(mfu) if mfu else None,
            "memory_gib": max(r.memory_gib for r in records), "final_loss": records[-1].loss}


def causal_mfu(mfu: float, *, flops_per_token: float, layers: int, heads: int, head_dim: int,
               seq_len: int) -> float:
    """torchtitan's MFU converted to autotune's convention (attention FLOPs halved for the causal mask):
    ``mfu x (F - 6 L H d T) / F`` with ``F`` torchtitan's FLOPs per token, whose attention term is
    ``6 L H (2d) T`` (torchtitan/models/utils.py ``get_dense_model_nparams_and_flops``)."""
    return mfu * (flops_per_token - 6 * layers * heads * head_dim * seq_len) / flops_per_token


def parse_file(path: str | Path, *, skip: int = 3) -> dict:
    """``{"facts": parse_facts, "records": [dict ...], "summary": summarize or None}`` of a log file."""
    text = Path(path).read_text(errors="replace")
    recs = parse_steps(text)
    try:
        summ = summarize(recs, skip=skip)
    except ValueError:
        summ = None
    return {"facts": parse_facts(text), "records": [asdict(r) for r in recs], "summary": summ}


__all__ = ["StepRecord", "causal_mfu", "parse_facts", "parse_file", "parse_steps", "summarize"]
