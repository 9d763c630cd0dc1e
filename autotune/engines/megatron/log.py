"""Parse Megatron-LM's ``pretrain_gpt.py`` log: one record per logged iteration, the memory reports and the
run's settings.

Lines written by NVIDIA/Megatron-LM at d98e8a64 (megatron/training/training.py ``training_log`` and
megatron/training/utils/common_utils.py ``report_memory``; with ``--log-interval 1``)::

     [<date> <time>] iteration        5/      10 | consumed samples:           10 | elapsed time per
     iteration (ms): 2902.7 | throughput per GPU (TFLOP/s/GPU): 154.2 | learning rate: 1.000000E-04 |
     global batch size:     2 | lm loss: 1.504291E+00 | loss scale: 1.0 | grad norm: 12.557 | number of
     skipped iterations:   0 | number of nan iterations:   0 |
    [Rank 0] (after 2 iterations) memory (MB) | allocated: 82106.32 | max allocated: 123547.36 | reserved:
     128434.00 | max reserved: 128434.00

(each one line). The quantities:

* ``elapsed time per iteration (ms)``: wall time of the iteration(s) since the previous log line, over
  ``--log-interval`` (timers ``interval-time``), ms; the first iteration includes the warm-up;
* ``throughput per GPU``: Megatron's ``num_floating_point_operations`` (training.py) / (elapsed s x 1e12 x
  world size), TFLOP/s per GPU, with ``--log-throughput``;
* ``lm loss``: average language-model loss since the previous line, nats;
* ``memory (MB)``: ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` / ``memory_reserved`` /
  ``max_memory_reserved`` in MiB (divided by 1024 x 1024), reported after iterations 1 and 2 and every
  ``--log-memory-interval`` iterations (rank 0 of the data-parallel group).

The argument dump (``------------------------ arguments ------------------------`` then ``  name ....
value`` lines) gives the settings the run actually used (:func:`parse_arguments`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_ITER = re.compile(
    r"iteration\s+(?P<it>\d+)/\s*(?P<total>\d+)\s*\|.*?elapsed time per iteration \(ms\):\s*(?P<ms>" + _NUM + r")"
    r"(?:.*?throughput per GPU \(TFLOP/s/GPU\):\s*(?P<tflops>" + _NUM + r"))?"
    r"(?:.*?global batch size:\s*(?P<gbs>\d+))?"
    r"(?:.*?lm loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:.*?grad norm:\s*(?P<gn>" + _NUM + r"))?"
    r"(?:.*?number of skipped iterations:\s*(?P<skipped>\d+))?"
    r"(?:.*?number of nan iterations:\s*(?P<nan>\d+))?")
_MEM = re.compile(
    r"\[Rank (?P<rank>\d+)\] \((?P<when>[^)]*)\) memory \(MB\) \| allocated: (?P<alloc>" + _NUM + r") \| "
    r"max allocated: (?P<max_alloc>" + _NUM + r") \| reserved: (?P<res>" + _NUM + r") \| "
    r"max reserved: (?P<max_res>" + _NUM + r")")
_ARG = re.compile(r"^\s{2}(?P<name>[a-z_][a-z0-9_]*) \.+ (?P<value>.*)$")
_THEORY = re.compile(r"Theoretical memory footprints: weight and optimizer=(?P<wo>" + _NUM + r") MB, "
                     r"activation=(?P<act>" + _NUM + r") MB, total=(?P<tot>" + _NUM + r") MB")
MIB = 2**20


@dataclass(frozen=True)
class IterationRecord:
    """One ``iteration N/M`` line.

    Attributes:
        iteration: 1-based; total: ``--train-iters``.
        elapsed_ms: wall time per iteration, ms (mean over the log interval).
        tflops_per_gpu: Megatron's throughput per GPU, TFLOP/s (None without ``--log-throughput``).
        global_batch_size: sequences per iteration; loss: lm loss (None when not printed); grad_norm.
        skipped, nan: Megatron's counts of skipped and NaN iterations since the last line.
    """

    iteration: int
    total: int
    elapsed_ms: float
    tflops_per_gpu: float | None
    global_batch_size: int | None
    loss: float | None
    grad_norm: float | None
    skipped: int
    nan: int


@dataclass(frozen=True)
class MemoryReport:
    """One ``memory (MB)`` line, bytes (MiB x 2^20)."""

    rank: int
    when: str
    allocated_bytes: int
    max_allocated_bytes: int
    reserved_bytes: int
    max_reserved_bytes: int


def _f(x: str | None) -> float | None:
    return None if x is None else float(x)


def parse_iterations(text: str) -> list[IterationRecord]:
    """Every training ``iteration N/M`` line of ``text``, in log order (a repeated N keeps the last)."""
    out: dict[int, IterationRecord] = {}
    for line in text.splitlines():
        m = _ITER.search(line)
        if not m:
            continue
        it = int(m.group("it"))
        out.pop(it, None)
        out[it] = IterationRecord(iteration=it, total=int(m.group("total")), elapsed_ms=float(m.group("ms")),
                                  tflops_per_gpu=_f(m.group("tflops")),
                                  global_batch_size=int(m.group("gbs")) if m.group("gbs") else None,
                                  loss=_f(m.group("loss")), grad_norm=_f(m.group("gn")),
                                  skipped=int(m.group("skipped") or 0), nan=int(m.group("nan") or 0))
    return list(out.values())


def parse_memory(text: str) -> list[MemoryReport]:
    """Every ``memory (MB)`` report of ``text``, in log order."""
    out = []
    for m in _MEM.finditer(text):
        b = lambda k: int(round(float(m.group(k)) * MIB))  # noqa: E731
        out.append(MemoryReport(rank=int(m.group("rank")), when=m.group("when"), allocated_bytes=b("alloc"),
                                max_allocated_bytes=b("max_alloc"), reserved_bytes=b("res"),
                                max_reserved_bytes=b("max_res")))
    return out


def parse_arguments(text: str) -> dict[str, str]:
    """The argument dump's ``name -> value`` (strings, as printed), or {} when the log has none."""
    out: dict[str, str] = {}
    inside = False
    for line in text.splitlines():
        if "------------------------ arguments ------------------------" in line:
            inside = True
            continue
        if inside and "-------------------- end of arguments ---------------------" in line:
            break
        if inside and (m := _ARG.match(line)):
            out[m.group("name")] = m.group("value").strip()
    return out


def parse_facts(text: str) -> dict:
    """What the log says about the run: the settings that decide what ran (``transformer_impl``,
    ``num_layers``, ``hidden_size``, ``seq_length``, ``micro_batch_size``, ``global_batch_size``,
    ``recompute_granularity``, ``fp8``, ``bf16``, ``world_size``, from the argument dump), Megatron's
    ``theoretical_memory_mib`` estimate (weight and optimizer, activation, total) when printed, and
    ``oom``."""
    args = parse_arguments(text)
    keep = ("transformer_impl", "num_layers", "hidden_size", "ffn_hidden_size", "seq_length", "micro_batch_size",
            "global_batch_size", "recompute_granularity", "fp8", "bf16", "world_size", "tensor_model_parallel_size",
            "pipeline_model_parallel_size", "attention_backend")
    facts: dict = {k: args[k] for k in keep if k in args}
    m = _THEORY.search(text)
    if m:
        facts["theoretical_memory_mib"] = {"weight_and_optimizer": float(m.group("wo")),
                                           "activation": float(m.group("act")), "total": float(m.group("tot"))}
    facts["oom"] = bool(re.search(r"CUDA out of memory|OutOfMemoryError", text))
    return facts


__all__ = ["IterationRecord", "MemoryReport", "parse_arguments", "parse_facts", "parse_iterations", "parse_memory"]
