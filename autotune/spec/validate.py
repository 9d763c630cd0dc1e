"""One place for the type and range rules of every user-supplied value (CLI options and file fields).

Rules: an integer field takes a Python ``int`` only (``bool``, ``float`` - even ``4096.0`` or
``4096.7`` -, ``NaN``, ``inf`` and strings are refused, never truncated); a number field takes a
finite ``int`` or ``float`` (not ``bool``); a name takes a non-empty string. Bounds are inclusive.
Every refusal is a :class:`~autotune.errors.ConfigError` whose one-line message names the field, the
value (made printable) and what is valid.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.errors import ConfigError
from autotune.files import display_text

#: Optuna's samplers seed numpy's RandomState, which takes 0 <= seed < 2**32 (numpy.random.RandomState docs).
MAX_SEED = 2**32 - 1
#: Most sequences in a global batch (2**20 = 1,048,576; Llama 3 405B trained with 16M tokens = 2,048
#: sequences of 8,192): bounds the micro-batch count and hence the simulated step graph's size.
MAX_GLOBAL_BATCH_SEQUENCES = 2**20
#: Longest sequence accepted, tokens (2**24 = 16M; the longest published context, 10M, fits).
MAX_SEQ_LEN = 2**24
#: Most micro-batches per step a plan may have: the step graph has O(pp x vpp x m) nodes
#: (autotune/cost/graph.py), and 2**16 micro-batches already cost ~minutes to simulate.
MAX_NUM_MICRO_BATCHES = 2**16
#: Largest GPU count (2**18 = 262,144; the largest announced training clusters have 100,000-200,000 GPUs),
#: checked before any work: the layout enumeration grows with the count (2**20 GPUs took 15 s to refuse).
MAX_NUM_GPUS = 2**18
#: Most trials one command may add (10**6; a 405B study converges in a few hundred).
MAX_TRIALS = 10**6
#: Longest --timeout, seconds (30 days).
MAX_TIMEOUT_S = 30 * 86400.0
#: Shortest --timeout of ``run`` / ``retune``, seconds: a simulated trial of the 8B model takes 0.05-0.5 s on
#: this project's 2-core machine (bench/bench_tuner.py), so under 1 s a run may end with no trial at all.
MIN_TIMEOUT_S = 1.0
#: Shortest --seq-len, tokens: FlashAttention's kernels work in tiles of 128 query rows (FlashAttention-2
#: ``flash_fwd_launch_template.h`` kBlockM = 128 for head dims <= 128; FlashAttention-3 tile 128), and the
#: cost model's attention rates were measured on sequences of whole tiles; shorter sequences are refused.
MIN_SEQ_LEN = 128
#: Worker ids (--worker-id, $SLURM_ARRAY_TASK_ID): below 2**31, the largest Slurm array index is
#: ``MaxArraySize`` - 1 <= 4,000,000 (slurm.conf(5)), and a worker id seeds numpy's 32-bit RandomState.
MAX_WORKER_ID = 2**31 - 1
#: --workers on one host: at most this many per CPU core (each worker is a process of ~150-300 MB that is
#: mostly busy in the simulator; beyond a few per core they only contend), see :func:`max_workers`.
WORKERS_PER_CPU = 8
#: --workers is always allowed up to this many, whatever the core count.
MIN_MAX_WORKERS = 16
#: Longest URL or path option (--storage, --space as a file), characters (PATH_MAX 4096, limits.h, plus the
#: ``sqlite:///`` scheme and a query).
MAX_PATH_OPTION_CHARS = 4200
#: Most transformer layers of a model (2,048: 16x the 126 of Llama 3.1 405B). The step graph and the memory
#: model are O(layers): an HF config with 10**6 layers ran past 200 s at 3.2 GB before the cap.
MAX_NUM_LAYERS = 2048
#: Widest hidden size (2**18 = 262,144: 16x the 16,384 of Llama 3.1 405B).
MAX_HIDDEN_SIZE = 2**18
#: Widest MLP hidden size (2**20 = 1,048,576: ~20x the 53,248 of Llama 3.1 405B).
MAX_FFN_HIDDEN_SIZE = 2**20
#: Most attention (query or key/value) heads (4,096: 32x the 128 of Llama 3.1 405B).
MAX_NUM_HEADS = 4096
#: Most parameters of one model (2**44 = 17.6T: 17x Kimi K2's 1.03T, the largest open model, and above the
#: 10T of M6-10T, arXiv 2110.03888), checked once the fields are read, before any work: the per-field caps
#: do not bound their product (every field at its cap made a 2,260T-parameter model whose DP gradient buckets,
#: one list entry per 64 MiB, ran 215 s / 11.5 GB in the sampler's screen). At the cap, 262,144 GPUs and
#: 1 MiB buckets, 10 trials took 9.2 s / 500 MB on the dev machine (2026-12-03, simulated).
MAX_MODEL_PARAMS = 2**44
#: Longest name or label a plan file may hold (study, model, GPU, fabric and link names, enum values), characters:
#: Optuna's RDB storage keeps a study name in a ``VARCHAR(512)`` column (optuna/storages/_rdb/models.py
#: ``MAX_INDEXED_STRING_LENGTH = 512``), and no catalog name comes near it (the longest is < 40). Also the
#: default bound of :func:`require_name` (model, fabric, GPU, search-space names; issue 37: a 5,000-character
#: space name crashed on its file name, a 10 MiB study name was accepted).
MAX_NAME_CHARS = 512


def max_workers() -> int:
    """The largest ``--workers`` on this host: max(:data:`MIN_MAX_WORKERS`, :data:`WORKERS_PER_CPU` x the CPU
    cores this process may run on, ``os.sched_getaffinity``, else ``os.cpu_count()``)."""
    import os

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(MIN_MAX_WORKERS, WORKERS_PER_CPU * cpus)


def show(v: Any) -> str:
    """``repr`` of ``v`` cut to 80 printable characters (for messages)."""
    return display_text(repr(v), 80)


def require_int(v: Any, field: str, *, lo: int | None = 1, hi: int | None = None) -> int:
    """``v`` if it is an ``int`` (not ``bool``) within [lo, hi].

    Raises:
        ConfigError: "<field> must be an integer in [lo, hi], got <v>".
    """
    rng = (f">= {lo}" if hi is None else f"between {lo} and {hi:,}") if lo is not None else \
        (f"<= {hi:,}" if hi is not None else "")
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConfigError(f"{field} must be an integer {rng}, got {show(v)} ({type(v).__name__})".replace("  ", " "))
    if lo is not None and v < lo:
        raise ConfigError(f"{field} must be >= {lo}, got {v}" + (f" (at most {hi:,})" if hi is not None else ""))
    if hi is not None and v > hi:
        raise ConfigError(f"{field} must be <= {hi:,}, got {v:,}" if v < 10**30 else
                          f"{field} must be <= {hi:,}, got a {len(str(v))}-digit number")
    return v


def require_number(v: Any, field: str, *, lo: float | None = None, hi: float | None = None,
                   lo_open: bool = False) -> float:
    """``float(v)`` if ``v`` is a finite int/float (not ``bool``) within the bounds (``lo_open``: > lo).

    Raises:
        ConfigError: naming the field, the value and the valid range.
    """
    op = ">" if lo_open else ">="
    rng = " and ".join(x for x in ((f"{op} {lo:g}" if lo is not None else ""),
                                    (f"<= {hi:g}" if hi is not None else "")) if x)
    what = f"a finite number {rng}".rstrip()
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ConfigError(f"{field} must be {what}, got {show(v)} ({type(v).__name__})")
    x = float(v)
    if not math.isfinite(x) or (lo is not None and (x <= lo if lo_open else x < lo)) or (hi is not None and x > hi):
        raise ConfigError(f"{field} must be {what}, got {v!r}")
    return x


def require_name(v: Any, field: str, *, max_len: int = MAX_NAME_CHARS) -> str:
    """``v`` stripped if it is a non-empty printable string of at most ``max_len`` characters
    (:data:`MAX_NAME_CHARS`, 512, unless the caller says otherwise), checked before anything else reads it.

    Raises:
        ConfigError: not a string, empty/blank, too long (naming the length and the limit), or with control
            characters.
    """
    if not isinstance(v, str):
        raise ConfigError(f"{field} must be a name (a string), got {show(v)} ({type(v).__name__})")
    if len(v) > max_len:
        raise ConfigError(f"{field} {display_text(v, 40)!r} is {len(v):,} characters long; at most {max_len:,}")
    s = v.strip()
    if not s:
        raise ConfigError(f"{field} must not be empty")
    if not s.isprintable():
        raise ConfigError(f"{field} {show(s)} contains control characters")
    return s


def require_text(v: Any, field: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    """``v`` if it is a string of at most ``max_chars`` printable characters (``str.isprintable``: no newline,
    tab, carriage return, NUL, escape or other control or format character, so it cannot start a new line in
    a generated shell script, TOML or Python file). Unlike :func:`require_name` it is not stripped and may be
    empty.

    Raises:
        ConfigError: "<field> <excerpt> contains control characters (...)" or "... is N characters long",
            one line, the value shown as a short printable excerpt.
    """
    if not isinstance(v, str):
        raise ConfigError(f"{field} must be text (a string), got {show(v)} ({type(v).__name__})")
    if len(v) > max_chars:
        raise ConfigError(f"{field} {display_text(repr(v), 60)} is {len(v):,} characters long; valid: at most "
                          f"{max_chars:,} printable characters")
    if not v.isprintable():
        bad = next(ch for ch in v if not ch.isprintable())
        raise ConfigError(f"{field} {display_text(repr(v), 60)} contains a control character ({bad!r}); valid: "
                          f"printable text (no newline, tab, carriage return, escape or NUL)")
    return v


def require_bool(v: Any, field: str) -> bool:
    """``v`` if it is ``True``/``False``. Raises: ConfigError otherwise."""
    if not isinstance(v, bool):
        raise ConfigError(f"{field} must be true or false, got {show(v)}")
    return v


def check_model_size(model: Any) -> None:
    """Refuse a model whose total parameter count (``model.num_params``, elements: embedding, LM head, layers,
    MTP depths; :class:`~autotune.spec.models.ModelSpec`) exceeds :data:`MAX_MODEL_PARAMS`, naming the count,
    the fields that make it and the limit (one line).

    Raises:
        ConfigError: as above.
    """
    n = model.num_params
    if n > MAX_MODEL_PARAMS:
        experts = f", num_experts {model.num_experts:,}" if model.num_experts else ""
        raise ConfigError(f"model {display_text(model.name, 80)!r}: {n / 1e12:,.1f}T parameters (num_layers "
                          f"{model.num_layers:,} x hidden_size {model.hidden_size:,}, ffn_hidden_size "
                          f"{model.ffn_hidden_size:,}{experts}, vocab_size {model.vocab_size:,}); at most "
                          f"{MAX_MODEL_PARAMS / 1e12:.1f}T parameters ({MAX_MODEL_PARAMS:,}) are modelled")


#: an integer as autotune reads one from text (an option, a launch file, an environment variable): an optional
#: sign and 1-30 ASCII digits 0-9. Python's ``int()`` also takes other scripts' digits (``int("٨") == 8``,
#: Arabic-Indic), ``_`` separators and surrounding white space; click's ``INT`` type calls ``int()``.
ASCII_INT_PATTERN = r"[+-]?[0-9]{1,30}"
#: a decimal number in ASCII (``float()`` also takes ``"٨.5"`` and ``"1_0"``), or ``inf`` / ``nan`` words
#: (the fields' own bounds refuse those, naming the field)
ASCII_FLOAT_PATTERN = r"[+-]?(?:[0-9]{1,30}\.?[0-9]{0,30}|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,4})?|[+-]?(?i:inf|infinity|nan)"


def parse_ascii_int(text: Any, field: str) -> int:
    """``text`` (a string) read as an integer written in ASCII digits (:data:`ASCII_INT_PATTERN`; leading
    and trailing ASCII spaces allowed).

    Raises:
        ConfigError: naming ``field`` and the value (printable), e.g. ``--gpus '٨'``.
    """
    import re

    s = str(text).strip(" \t")
    if not re.fullmatch(ASCII_INT_PATTERN, s):
        raise ConfigError(f"{field} {show(text)}: expected an integer written in ASCII digits 0-9 (e.g. 8)")
    return int(s)


def parse_ascii_float(text: Any, field: str) -> float:
    """``text`` read as a decimal number written in ASCII (:data:`ASCII_FLOAT_PATTERN`).

    Raises:
        ConfigError: naming ``field`` and the value, e.g. ``--timeout '٣٠'``.
    """
    import re

    s = str(text).strip(" \t")
    if not re.fullmatch(ASCII_FLOAT_PATTERN, s):
        raise ConfigError(f"{field} {show(text)}: expected a number written in ASCII digits 0-9 (e.g. 2.5)")
    return float(s)
