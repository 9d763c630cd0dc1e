"""What the commands share: target, study, tuning and real-backend option sets, target resolution, the
interrupt handling of long commands, and the text and JSON output helpers."""

from __future__ import annotations

import re
from typing import Any

import click

from autotune.errors import ConfigError, redact

#: --size -> (default GPU count, default global batch in tokens); M = 2**20 tokens.
SIZE_DEFAULTS = {"8b": (8, "1M"), "70b": (64, "4M"), "405b": (1024, "16M")}
DEFAULT_GPU = "b200"
DEFAULT_STORAGE = "sqlite:///studies/autotune.db"  # == autotune.tune.tuner.DEFAULT_STORAGE (not imported: keeps --help fast)
DEFAULT_SEQ_LEN = 8192
#: built-in model names ``--model`` takes besides a config.json (== autotune.spec.models.MOE_CATALOG; not
#: imported: keeps --help fast; tests/cli/test_model_names.py checks they agree)
BUILTIN_MODEL_NAMES = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "kimi-k2", "deepseek-16b",
                       "gpt-oss-20b", "gpt-oss-120b")
MODEL_HELP = ("A Hugging Face config.json, or a built-in model: " + ", ".join(BUILTIN_MODEL_NAMES)
              + " (mixtures of experts: MFU on the active path; expert parallelism searched for engines that have "
                "it); instead of --size.")
#: GPUs of autotune/data/gpus.yaml for --help (tests/cli/test_model_names.py checks the list)
GPU_NAMES = ("a100-80gb", "h100", "h800", "h200", "b200", "b300", "gb200", "gb300")



class AsciiInt(click.ParamType):
    """click's integer type with ASCII digits only (click's ``INT`` calls ``int()``, which reads ``"٨"``
    as 8 and ``"1_0"`` as 10): :data:`autotune.spec.validate.ASCII_INT_PATTERN`. Every integer option of
    the CLI uses :data:`ASCII_INT` (tests/cli/test_hostile_open_cases.py checks each command's options)."""

    name = "integer"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        from autotune.spec.validate import ASCII_INT_PATTERN

        text = str(value).strip(" \t")
        if not re.fullmatch(ASCII_INT_PATTERN, text):
            from autotune.files import excerpt
            self.fail(f"{excerpt(repr(value), 60)} is not an integer written in ASCII digits 0-9 (e.g. 8)", param, ctx)
        return int(text)


class AsciiFloat(click.ParamType):
    """click's number type with ASCII digits only (``float()`` reads ``"٣٠"`` as 30.0):
    :data:`autotune.spec.validate.ASCII_FLOAT_PATTERN`."""

    name = "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        from autotune.spec.validate import ASCII_FLOAT_PATTERN

        text = str(value).strip(" \t")
        if not re.fullmatch(ASCII_FLOAT_PATTERN, text):
            from autotune.files import excerpt
            self.fail(f"{excerpt(repr(value), 60)} is not a number written in ASCII digits 0-9 (e.g. 2.5)", param, ctx)
        return float(text)


ASCII_INT = AsciiInt()
ASCII_FLOAT = AsciiFloat()


def parse_tokens(text: str) -> int:
    """``16M`` -> 16 x 2^20, ``512K`` -> 512 x 2^10, ``524288`` -> 524288 (tokens).

    Raises:
        ConfigError: not a positive integer with an optional K/M/G suffix (binary multiples).
    """
    m = re.fullmatch(r"\s*([0-9]{1,30})\s*([kKmMgG]?)\s*", str(text), re.ASCII)      # not "٨M"
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"--global-batch {text!r}: expected a positive number of tokens, e.g. 16M, 4M, 1M, "
                          "524288 (K = 2^10, M = 2^20, G = 2^30)")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]


def resolve_target(*, size: str | None, model_path: str | None, gpu: str | None, gpus: int | None,
                   interconnect: str | None, seq_len: int | None, global_batch: str | None):
    """(ModelSpec, ClusterSpec, Workload) from the CLI options with the per-size defaults.

    Defaults: B200 on nvlink5+ib-ndr400; 1024 GPUs and 16M tokens for 405b, 64 and 4M for 70b, 8 and 1M
    for 8b (a ``--model`` config takes the defaults of the nearest size by parameter count); seq 8192.
    ``--model`` is a config.json path or a built-in name (:data:`BUILTIN_MODEL_NAMES`, a Llama 3.1 name);
    a value with a ``/`` or ending in ``.json`` is always a path.

    Raises:
        ConfigError: unknown size/GPU/fabric (lists the known ones), both or neither of --size/--model,
            a batch that is not a whole number of sequences.
    """
    from autotune.spec.hardware import make_cluster
    from autotune.spec.hf_config import model_from_hf_config
    from autotune.spec.models import CATALOG, builtin_model_names, get_builtin_model, get_model
    from autotune.spec.plan import Workload
    from autotune.spec.validate import (
        MAX_GLOBAL_BATCH_SEQUENCES,
        MAX_NUM_GPUS,
        MAX_PATH_OPTION_CHARS,
        MAX_SEQ_LEN,
        MIN_SEQ_LEN,
        require_int,
        require_name,
    )

    size = require_name(size, "--size") if size is not None else None
    model_path = require_name(model_path, "--model", max_len=MAX_PATH_OPTION_CHARS) if model_path is not None else None
    gpu = require_name(gpu, "--gpu") if gpu is not None else None
    interconnect = require_name(interconnect, "--interconnect", max_len=MAX_PATH_OPTION_CHARS) if interconnect is not None else None
    if global_batch is not None:
        require_name(global_batch, "--global-batch")
    if gpus is not None:
        require_int(gpus, "--gpus", hi=MAX_NUM_GPUS)
    if seq_len is not None:
        require_int(seq_len, "--seq-len", lo=MIN_SEQ_LEN, hi=MAX_SEQ_LEN)
    if size and model_path:
        raise ConfigError("give either --size or --model, not both")
    if not size and not model_path:
        raise ConfigError(f"give --size ({', '.join(CATALOG)}) or --model path/to/config.json")
    builtin = None
    if model_path and "/" not in model_path and not model_path.lower().endswith(".json"):
        builtin = get_builtin_model(model_path)     # --model deepseek-v3 (a file: ./deepseek-v3 or *.json)
        from pathlib import Path
        if builtin is None and not Path(model_path).exists():
            raise ConfigError(f"--model {model_path}: not a built-in model and no such file; built-in: "
                              f"{', '.join(builtin_model_names())}, or give a config.json path")
    if size:
        model = get_model(size)
        key = next(k for k, v in CATALOG.items() if v == model)
    else:
        model = builtin if builtin is not None else model_from_hf_config(model_path)
        n = model.num_params
        key = next((k for k, v in CATALOG.items() if v == model), None) or \
            ("8b" if n < 20e9 else "70b" if n < 150e9 else "405b")
    d_gpus, d_batch = SIZE_DEFAULTS[key]
    cluster = make_cluster(gpu or DEFAULT_GPU, gpus if gpus is not None else d_gpus, interconnect)
    seq = seq_len if seq_len is not None else DEFAULT_SEQ_LEN
    tokens = parse_tokens(global_batch if global_batch is not None else d_batch)
    if tokens // seq > MAX_GLOBAL_BATCH_SEQUENCES:
        top = MAX_GLOBAL_BATCH_SEQUENCES * seq
        hint = ""
        g = re.fullmatch(r"\s*([0-9]+)\s*[gG]\s*", str(global_batch), re.ASCII)
        if g and seq <= int(g.group(1)) * 2**20 <= top:     # the same number with M would be valid
            hint = f"; did you mean {g.group(1)}M?"
        raise ConfigError(f"--global-batch {global_batch}: {tokens:,} tokens = {tokens // seq:,} sequences of {seq}; "
                          f"valid: {seq:,} to {top:,} tokens (1 to {MAX_GLOBAL_BATCH_SEQUENCES:,} sequences of "
                          f"{seq}){hint}")
    workload = Workload.from_tokens(seq_len=seq, global_batch_tokens=tokens)
    warning = model.check_sequence(workload.seq_len)
    if warning:
        click.echo(warning, err=True)
    return model, cluster, workload


def check_tune_options(*, space: str | None = None, backend: str | None = None, trials: int | None = None,
                       timeout: float | None = None, seed: int | None = None,
                       storage: str | None = None, top_k: int | None = None, real_steps: int | None = None,
                       trial_timeout: float | None = None, layers: int | None = None) -> None:
    """Refuse out-of-range values of the tuning options (given ones only).

    Bounds: 1 <= --trials <= MAX_TRIALS; 1 s <= --timeout <= 30 days (``MIN_TIMEOUT_S``); 0 <= --seed < 2**32 (numpy
    RandomState, which Optuna's samplers seed); --top-k >= 1; --real-steps >= 1; --trial-timeout > 0;
    --layers >= 1; a writable --storage (``mode=ro`` is refused for commands that add trials).

    Raises:
        ConfigError: naming the option, the value and the valid range.
    """
    from autotune.study.storage_check import is_readonly_url
    from autotune.spec.validate import (
        MAX_PATH_OPTION_CHARS,
        MAX_SEED,
        MAX_TIMEOUT_S,
        MAX_TRIALS,
        MIN_TIMEOUT_S,
        require_int,
        require_name,
        require_number,
    )

    if space is not None:
        require_name(space, "--space", max_len=MAX_PATH_OPTION_CHARS)
        import os as _os
        if any(len(_os.fsencode(part)) > 255 for part in str(space).split("/")):
            raise ConfigError(f"--space: a name of {len(_os.fsencode(str(space))):,} bytes; a space name or file "
                              "name has at most 255 (search_spaces/NAME.yaml or a YAML path)")
    if backend is not None:
        require_name(backend, "--backend")
    if trials is not None:
        require_int(trials, "--trials", hi=MAX_TRIALS)
    if timeout is not None:
        require_number(timeout, "--timeout (seconds)", lo=MIN_TIMEOUT_S, hi=MAX_TIMEOUT_S)
    if seed is not None:
        require_int(seed, "--seed", lo=0, hi=MAX_SEED)
    if top_k is not None:
        require_int(top_k, "--top-k", hi=10_000)
    if real_steps is not None:
        require_int(real_steps, "--real-steps", hi=10_000)
    if trial_timeout is not None:
        require_number(trial_timeout, "--trial-timeout (seconds)", lo=0, hi=MAX_TIMEOUT_S, lo_open=True)
    if layers is not None:
        require_int(layers, "--layers", hi=2**20)
    if storage is not None:
        require_name(storage, "--storage", max_len=MAX_PATH_OPTION_CHARS)
        from autotune.study.storage_check import check_storage_path
        check_storage_path(storage)     # a name too long, a symbolic link loop
        if is_readonly_url(storage):
            raise ConfigError(f"--storage {redact(storage)} is read-only (mode=ro); this command adds trials, give a "
                              "writable storage")
        from pathlib import Path

        from autotune.study.storage_check import fresh_sqlite_file, readonly_url, sqlite_path
        sp = sqlite_path(storage)       # (path, query) of sqlite:///PATH; None without a path or for :memory:
        if storage.startswith("sqlite:") and sp is None and ":memory:" not in storage:
            raise ConfigError(f"--storage {redact(storage)}: expected sqlite:///PATH (a file, e.g. "
                              "sqlite:///studies/autotune.db)")
        if sp is not None and sp[1].get("mode") == "memory":
            raise ConfigError(f"--storage {redact(storage)}: mode=memory is a database of one SQLite connection, "
                              "which Optuna's connection pool does not keep; use sqlite:///PATH (or "
                              "sqlite:///:memory: for a single run that keeps nothing)")
        if sp is not None and Path(sp[0]).exists() and not fresh_sqlite_file(sp[0]):
            readonly_url(storage)       # an existing file must already be an Optuna storage (never adopted)
        from autotune.study.storage_check import check_journal_file
        check_journal_file(storage)     # likewise a journal:PATH file


#: signals that arrived between the start of ``run`` / ``retune`` and its first :func:`interruptible` (the imports of
#: Optuna and the simulator take a second or more): noted by :func:`early_signals`' handler, acted on there
EARLY_SIGNALS: list[int] = []


def early_signals() -> None:
    """Note SIGINT / SIGTERM from now on (only note: nothing is raised into the imports that follow), so
    a Ctrl-C in the first second of ``run`` is not lost; the first :func:`interruptible` ends the command
    with it (exit 130 / 143 and the "interrupted:" line). The previous handlers come back when the command
    ends. A process that started with SIGINT ignored (``cmd &`` in a script) ignores it until here."""
    import signal

    from autotune.signals import take_startup_signals

    EARLY_SIGNALS.clear()
    ctx = click.get_current_context(silent=True)
    replaced: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            replaced[sig] = signal.signal(sig, lambda signum, frame: EARLY_SIGNALS.append(signum))
        except ValueError:      # not the main thread
            continue
    # a signal noted by the command's startup handler (autotune/cli/__init__.py) since the CLI's check counts too
    EARLY_SIGNALS.extend(take_startup_signals(replaced))
    if ctx is not None:
        for sig, old in replaced.items():
            ctx.call_on_close(lambda sig=sig, old=old: signal.signal(sig, old))


def interruptible(fn, *, storage: str, study: str):
    """Run ``fn()``; on SIGINT or SIGTERM print how many trials the study holds (each finished trial is
    already stored: Tuner.optimize persists it as it ends) and the best plan so far, then exit 130
    (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number convention."""
    import signal

    from autotune.signals import (
        clear_interrupt,
        interrupted,
        note_interrupt,
        safe_to_raise,
    )

    def on_signal(signum, frame):
        note_interrupt(signum)
        if safe_to_raise(frame):     # never into SQLAlchemy's pool finalizers (they log a traceback)
            raise KeyboardInterrupt

    import sys

    # not cleared here: a signal noted (not raised) during an earlier step of the same command must still
    # end it (before, `run --workers N` lost a Ctrl-C noted while the study was opened)
    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, on_signal)
        except ValueError:      # not the main thread: leave the signals alone
            pass
    # A signal that lands inside a finalizer or weakref callback (SQLAlchemy's registry runs some from
    # the garbage collector) cannot propagate: Python reports it through sys.unraisablehook as
    # "Exception ignored in ..." with a traceback. The interrupt is already noted (the run stops at the
    # next check), so such a KeyboardInterrupt is dropped silently; anything else goes to the old hook.
    old_hook = sys.unraisablehook

    def unraisable(u):
        if isinstance(u.exc_value, KeyboardInterrupt) and interrupted() is not None:
            return
        old_hook(u)

    sys.unraisablehook = unraisable
    try:
        if EARLY_SIGNALS:          # arrived before this command's first interruptible (see early_signals)
            note_interrupt(EARLY_SIGNALS.pop())
            EARLY_SIGNALS.clear()
            raise KeyboardInterrupt
        r = fn()
        if interrupted() is not None:    # noted inside a library call that went on (see safe_to_raise)
            raise KeyboardInterrupt
        return r
    except KeyboardInterrupt:
        code = 143 if interrupted() == signal.SIGTERM else 130
        click.echo(interrupted_line(storage, study), err=True)
        clear_interrupt()    # acted on: later tuning in this process (the Python API) is not stopped by it
        raise click.exceptions.Exit(code) from None
    except Exception:
        if interrupted() is None:
            raise
        # the signal landed inside a library call that turned it into its own error (SQLite: "interrupted")
        code = 143 if interrupted() == signal.SIGTERM else 130
        click.echo(interrupted_line(storage, study), err=True)
        clear_interrupt()
        raise click.exceptions.Exit(code) from None
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        sys.unraisablehook = old_hook


def interrupted_line(storage: str, study: str) -> str:
    try:
        from autotune.study.identity import load_study
        from autotune.study.trials import best_plan
        st, info = load_study(study, storage)
        trials = st.get_trials(deepcopy=False)
        n = sum(t.state.is_finished() for t in trials)      # RUNNING ones (other hosts' workers) are not saved yet
        running = len(trials) - n
        bp = best_plan(st, info)
        best = (f"best so far: trial {bp.trial_number}, MFU {100 * bp.result.mfu:.1f}%, step "
                f"{bp.result.step_time_ms:,.1f} ms" if bp else "no feasible plan yet")
        return (f"interrupted: {n} trials saved in {study} ({redact(storage)})"
                + (f", {running} still running or waiting" if running else "") + f"; {best}")
    except Exception:  # noqa: BLE001 - the study may not exist yet
        return f"interrupted: no trials saved in {study} ({redact(storage)})"


def target_options(f):
    """--size --model --gpu --gpus --interconnect --seq-len --global-batch."""
    opts = [
        click.option("--size", help="Llama 3.1 size: 8b, 70b or 405b."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False), metavar="FILE|NAME", help=MODEL_HELP),
        click.option("--gpu", help=f"GPU: {', '.join(GPU_NAMES)} (default {DEFAULT_GPU})."),
        click.option("--gpus", type=ASCII_INT, help="GPU count (default: 8 for 8b, 64 for 70b, 1024 for 405b)."),
        click.option("--interconnect", help="Fabric <intra>[+<inter>], e.g. nvlink5+ib-ndr400, or a YAML file "
                                            "(default: the GPU's NVLink + ib-ndr400)."),
        click.option("--seq-len", type=ASCII_INT, help=f"Sequence length in tokens (default {DEFAULT_SEQ_LEN})."),
        click.option("--global-batch", help="Global batch in tokens: 16M, 4M, 1M, 524288 ... (default: 16M for "
                                            "405b, 4M for 70b, 1M for 8b)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def study_options(f):
    opts = [
        click.option("--storage", default=DEFAULT_STORAGE, show_default=True, help="Optuna storage URL."),
        click.option("--space", default="default", show_default=True,
                     help="Search space: a name under search_spaces/ or a YAML file."),
        click.option("--backend", default="simulated", show_default=True, help="simulated, measured or real."),
        ENGINE_OPTION,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


ENGINE_OPTION = click.option(
    "--engine", default=None,
    help="Engine that runs the plan: megatron, torchtitan or native (autotune's runtime). Default: megatron; "
         "native with --backend real.")


JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the result as JSON (schema autotune.result v1, docs/json-schema.md) on stdout; progress goes "
         "to stderr.")


def make_say(as_json: bool):
    """click.echo to stdout, or to stderr when stdout carries the JSON document."""
    return (lambda m="": click.echo(m, err=True)) if as_json else click.echo


def json_entry(*, plan, result, info=None, model=None, cluster=None, workload=None, engine, label=None, study=None,
           trial=None, memory=None, extra=None):
    from autotune.report.summary import result_entry

    if info is not None:
        model, workload = info.model, info.workload
        gpu, num_gpus, fabric = info.gpu, info.num_gpus, info.fabric_name
    else:
        gpu, num_gpus, fabric = cluster.gpu.name, cluster.num_gpus, cluster.fabric.name
    return result_entry(plan=plan, result=result, model=model, gpu=gpu, num_gpus=num_gpus, fabric=fabric,
                        workload=workload, engine=engine, label=label, study=study, trial=trial, memory=memory,
                        extra=extra)


def tune_options(f):
    opts = [
        click.option("--trials", type=ASCII_INT, default=200, show_default=True, help="Trials to run at most (added to the study; `run` ends earlier once the search has converged: docs/search.md)."),
        click.option("--timeout", type=ASCII_FLOAT, default=None,
                     help="Stop tuning after this many seconds (s), counted from the start of tuning, ranking the "
                          "layouts included; with --workers N, per worker, from each worker's start (the layouts "
                          "are ranked before)."),
        click.option("--seed", type=ASCII_INT, default=0, show_default=True, help="Sampler seed (the layout sampler orders near-equal estimates with it; same seed and history, same trials)."),
        click.option("--workers", type=ASCII_INT, default=1, show_default=True,
                     help="Worker processes on this machine, all on one study (--trials is per worker)."),
        click.option("--worker-id", type=ASCII_INT, default=None,
                     help="This worker's index (seeds differ per worker; default $SLURM_ARRAY_TASK_ID, else 0; "
                          "with --workers N the workers get ID..ID+N-1)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f



def target_line(model, cluster, workload) -> str:
    return (f"{model.name} ({params_text(model)}) on {cluster.num_gpus} x {cluster.gpu.name} ({cluster.fabric.name}"
            f"{segment_note(cluster)}), seq {workload.seq_len}, "
            f"global batch {workload.global_batch_size} sequences = {workload.global_batch_tokens:,} tokens")


def segment_note(cluster) -> str:
    """``; 4 NVLink domains of 64 GPUs`` when the cluster uses part of each multi-host domain (NVL72
    segments, :class:`autotune.spec.hardware.ClusterSpec`), else empty."""
    used, full = cluster.nvlink_domain_size, cluster.fabric.nvlink_domain_size
    if cluster.num_gpus <= full or used == full:
        return ""
    host = cluster.fabric.gpus_per_host
    seg = used // host
    note = (f"; {cluster.num_nodes} NVLink domains of {used} of their {full} GPUs, {seg} host{'s' if seg > 1 else ''} "
            f"each (Slurm --segment={seg}, as Megatron-Bridge launches)")
    if 2 * used < full:
        # the segment rule keeps equal segments; a count whose host number has no divisor near a
        # domain's spreads thinly (76 GPUs = 19 trays -> 19 domains of 4)
        lo, hi = (cluster.num_gpus // full) * full, (cluster.num_gpus // full + 1) * full
        note += (f"; warning: {cluster.num_gpus // host} hosts have no divisor between {full // host // 2 + 1} and "
                 f"{full // host}, so process groups of more than {used} GPUs cross the network; {lo or 64} or {hi} "
                 "GPUs fill whole domains")
    return note


def params_text(model) -> str:
    """``8.03B parameters`` (the exact count follows in export's output)."""
    n = model.num_params
    return f"{n / 1e9:.2f}B parameters" if n >= 1e9 else f"{n / 1e6:.1f}M parameters"


def real_options(f):
    opts = [
        click.option("--layers", type=ASCII_INT, default=None,
                     help="real backend: run depth-truncated proxies with N layers (true widths)."),
        click.option("--real-steps", type=ASCII_INT, default=3, show_default=True,
                     help="real backend: timed steps per trial (after 2 warm-up steps). With another backend "
                          "this, --trial-timeout and --heartbeat-interval change no prediction and only warn; "
                          "--layers and --launcher would change what is run, so they are refused."),
        click.option("--trial-timeout", type=ASCII_FLOAT, default=900.0, show_default=True,
                     help="real backend: wall-clock limit per trial, s (a hung trial is killed and marked failed)."),
        click.option("--heartbeat-interval", type=ASCII_INT, default=None,
                     help="real backend: Optuna heartbeat of running trials, s (default 30; a killed worker's "
                          "trial fails after 2x this and is run once more by another worker)."),
        click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                     help="real backend: run each trial on this host's GPUs, or as a Slurm job (sbatch)."),
        click.option("--nodes", type=ASCII_INT, default=None, help="slurm launcher: nodes per trial job (default: "
                                                              "GPUs / --gpus-per-node)."),
        click.option("--gpus-per-node", type=ASCII_INT, default=None, help="slurm launcher: GPUs per node (default: "
                                                                      "the cluster's)."),
        click.option("--partition", default=None, help="slurm launcher: partition (sbatch --partition)."),
        click.option("--account", default=None, help="slurm launcher: account (sbatch --account)."),
        click.option("--time", "time_limit", default=None, help="slurm launcher: job time limit (sbatch --time, "
                                                                "e.g. 00:20:00; default: the trial timeout)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


#: real-backend options that only pace or bound real trials: with another backend they change no
#: prediction, so they are accepted with a warning (unlike --layers, which would change the model that is
#: costed, and --launcher/--nodes/..., which ask for a place to run: those are refused)
REAL_ONLY_PACING = ("real_steps", "trial_timeout", "heartbeat_interval")


def warn_real_only_options(backend: str | None) -> list[str]:
    """With ``--backend`` other than ``real``, print ``warning: --X has no effect with --backend B`` on
    stderr for each of --real-steps, --trial-timeout, --heartbeat-interval given on the command line (or
    by environment); returns the lines. Options left at their defaults say nothing."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None or backend == "real":
        return []
    lines = []
    for name in REAL_ONLY_PACING:
        src = ctx.get_parameter_source(name)
        if src in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            line = (f"warning: --{name.replace('_', '-')} has no effect with --backend {backend or 'simulated'} "
                    "(it applies to --backend real only)")
            click.echo(line, err=True)
            lines.append(line)
    return lines


def make_evaluator_options(backend, layers, real_steps, trial_timeout, launcher="local", nodes=None, gpus_per_node=None,
                       partition=None, account=None, time_limit=None, num_gpus=None):
    """The real backend's evaluator options from the CLI (None for other backends); with ``--launcher slurm``
    every Slurm option is checked here, before any study is created
    (:func:`autotune.launchers.slurm.check_slurm_options`: nodes x GPUs per node = ``num_gpus``, the time
    format, plain partition / account names, ``sbatch`` on PATH).

    Raises:
        click.UsageError: a real-backend option with another backend; ConfigError: a bad Slurm option.
    """
    slurm_opts = {"nodes": nodes, "gpus_per_node": gpus_per_node, "partition": partition, "account": account,
                  "time": time_limit}
    if backend != "real":
        if layers is not None:
            raise click.UsageError("--layers applies to --backend real only")
        if launcher != "local" or any(v is not None for v in slurm_opts.values()):
            raise click.UsageError("--launcher/--nodes/--gpus-per-node/--partition/--account/--time apply to "
                                   "--backend real only")
        return None
    opts = {"layers": layers, "steps": real_steps, "timeout_s": trial_timeout}
    if launcher == "slurm":
        opts["launcher"] = {"kind": "slurm", **{k: v for k, v in slurm_opts.items() if v is not None}}
        from autotune.launchers.slurm import check_slurm_options
        check_slurm_options(opts["launcher"], num_gpus)
    elif any(v is not None for v in slurm_opts.values()):
        raise click.UsageError("--nodes/--gpus-per-node/--partition/--account/--time need --launcher slurm")
    return opts


def check_worker_id(worker_id, workers: int = 1):
    """This worker's id: --worker-id, else $SLURM_ARRAY_TASK_ID (a Slurm array task), else 0.

    Both must be non-negative integers with ``id + workers - 1 <= MAX_WORKER_ID`` (2**31 - 1); a
    $SLURM_ARRAY_TASK_ID that is set but is not a plain decimal integer (``abc``, ``-4``, ``²``) is an error,
    never worker 0.

    Raises:
        ConfigError: naming the option or variable, the value and the valid range.
    """
    import os
    import re

    from autotune.spec.validate import MAX_WORKER_ID, require_int, show

    hi = MAX_WORKER_ID - max(1, workers) + 1
    if worker_id is not None:
        return require_int(worker_id, "--worker-id", lo=0, hi=hi)
    if "SLURM_ARRAY_TASK_ID" not in os.environ:
        return 0
    v = os.environ["SLURM_ARRAY_TASK_ID"]
    if not re.fullmatch(r"[0-9]{1,12}", v.strip()):
        raise ConfigError(f"$SLURM_ARRAY_TASK_ID={show(v)} is not a worker id: expected an integer between 0 and "
                          f"{hi:,} (unset it, or give --worker-id N)")
    return require_int(int(v.strip()), "$SLURM_ARRAY_TASK_ID", lo=0, hi=hi)


def check_workers(workers, storage: str | None = None, *, backend: str | None = None,
                  launcher: str | None = None) -> int:
    """``--workers``: an integer from 1 to :func:`autotune.spec.validate.max_workers` (8 per CPU core of
    this host, at least 16): each worker is a process, so an unbounded count would exhaust memory. With more
    than one, ``storage`` must be one the worker processes can share: not SQLite's ``:memory:`` (a database
    per connection, so each worker would see an empty one); and not ``--backend real --launcher local``, whose
    every trial runs on all of this host's GPUs (:func:`autotune.runtime.launch.run_plan`): the workers'
    trials would share the GPUs and time each other.

    Raises:
        ConfigError: naming the value and the bound, the in-memory storage, or the local real backend.
    """
    from autotune.spec.validate import WORKERS_PER_CPU, max_workers, require_int

    top = max_workers()
    try:
        n = require_int(workers, "--workers", lo=1, hi=top)
    except ConfigError:
        got = f"{workers:,}" if isinstance(workers, int) and not isinstance(workers, bool) else repr(workers)
        raise ConfigError(f"--workers must be an integer from 1 to {top}, got {got}: the bound is "
                          f"{WORKERS_PER_CPU} worker processes per CPU core of this host, at least 16; for more, "
                          "start `autotune run --worker-id N` on other hosts") from None
    if n > 1 and storage is not None and ":memory:" in storage:
        raise ConfigError(f"--workers {n} needs a storage the worker processes share; {storage} is a database "
                          "of one process: use sqlite:///PATH, journal:PATH or postgresql://...")
    if n > 1 and backend == "real" and launcher in (None, "local"):
        raise ConfigError(f"--workers {n} with --backend real --launcher local: each trial runs on all of this "
                          f"host's GPUs, so {n} workers would share them and time each other's trials; use "
                          "--workers 1, or --launcher slurm (a job per trial)")
    return n


def print_outcomes(outcomes, say=click.echo):
    """One line per worker (through ``say``: stderr with --json): its own trials and outcomes; returns
    how many workers stopped on an error."""
    bad = 0
    for o in outcomes:
        st = o.own_states
        line = (f"worker {o.worker_id}: {o.n_new_trials} trial{'s' if o.n_new_trials != 1 else ''} run: "
                f"{st.get('feasible', 0)} feasible, "
                f"{st.get('infeasible', 0)} do not fit, {st.get('pruned', 0)} pruned, {st.get('failed', 0)} failed")
        if o.error:
            bad += 1
            line += f"; stopped: {o.error}"
        elif getattr(o, "stop_reason", None):
            line += "; stopped early (converged)"
        say(line)
    return bad


def prog_name() -> str:
    """How to invoke this command again: ``autotune`` when that is what PATH finds, else the path it
    was started by (e.g. ``.venv/bin/autotune`` under ``make run``, whose venv is not activated)."""
    import os
    import shutil
    import sys
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) != "autotune":
        return "autotune"
    found = shutil.which("autotune")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "autotune"
    return os.path.relpath(argv0) if not os.path.relpath(argv0).startswith("..") else argv0


def open_selected(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend,
                   engine=None):
    from autotune.search.space import SearchSpace
    from autotune.study.identity import load_study, study_name
    from autotune.study.storage_check import readonly_url
    from autotune.spec.engines import get_engine, resolve_engine
    storage = readonly_url(storage)
    if study:
        from autotune.study.identity import check_own_trials
        st, info = load_study(study, storage)
        if engine is not None and get_engine(engine).name != info.engine:
            # a study's plans were costed for its own engine; another engine's launch files would not
            # launch what was predicted
            raise ConfigError(f"--engine {engine}: study {study} was tuned for engine {info.engine}; export it "
                              f"with --engine {info.engine} (or leave --engine out), or tune a study for {engine}")
        check_own_trials(st.get_trials(deepcopy=False), name=study, storage=storage)
        return st, info
    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    loaded_space = SearchSpace.load(space)
    name = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                      engine=resolve_engine(engine, backend).name)
    st, info = load_study(name, storage)
    from autotune.study.identity import check_own_trials
    check_own_trials(st.get_trials(deepcopy=False), name=name, storage=storage)
    # the name holds the fabric's and space's names only: a file reusing a name with other links or knobs
    # must not be given another study's plan (run and retune refuse it the same way)
    from autotune.study.identity import check_identity
    check_identity(st.user_attrs, name=name, storage=storage, space=loaded_space, fabric=cluster.fabric)
    return st, info


