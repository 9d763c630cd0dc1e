"""The ``autotune`` command line (click).

Commands: ``run`` (tune), ``export`` (best plan -> YAML + launch hints), ``show`` (best plan per study),
``simulate`` (predict one plan file), ``retune`` (re-tune for a slower fabric, warm-started), and, when
those modules are present, ``profile`` and ``validate``. Any :class:`~autotune.errors.AutotuneError`
prints ``error: ...`` to stderr and exits 2; an unexpected exception prints one line and a hint to
re-run with ``AUTOTUNE_DEBUG=1`` for the traceback, and exits 1. Nothing here imports torch.
"""

from __future__ import annotations

import re
from typing import Any

import click

from autotune.errors import AutotuneError, ConfigError

#: --size -> (default GPU count, default global batch in tokens); M = 2**20 tokens.
SIZE_DEFAULTS = {"8b": (8, "1M"), "70b": (64, "4M"), "405b": (1024, "16M")}
DEFAULT_GPU = "b200"
DEFAULT_STORAGE = "sqlite:///studies/autotune.db"  # == autotune.tuner.DEFAULT_STORAGE (not imported: keeps --help fast)
DEFAULT_SEQ_LEN = 8192


def _debug() -> bool:
    from autotune.tuner import debug_enabled

    return debug_enabled()


class AutotuneGroup(click.Group):
    """A click group that turns errors into one clear line and a non-zero exit code.

    Commands in :data:`LAZY_COMMANDS` (GPU-host commands that import SQLAlchemy) are imported only when
    run or asked for help, so ``autotune --help`` lists them from their one-line summaries.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY_COMMANDS:
            return cmd
        mod_name, attr, _ = LAZY_COMMANDS[name]
        try:
            mod = __import__(mod_name, fromlist=[attr])
        except ImportError as e:
            raise click.UsageError(f"`autotune {name}` is unavailable: cannot import {mod_name} ({e})") from None
        cmd = getattr(mod, attr)
        self.add_command(cmd, name=name)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``autotune --help``, without importing the lazy commands."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                cmd = self.commands[name]
                if cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(formatter.width - 6 - len(name))))
            else:
                rows.append((name, LAZY_COMMANDS[name][2]))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            # one line, like every other refusal (click would print the usage text and "Error: ...")
            click.echo("error: " + " ".join(e.format_message().split()), err=True)
            ctx.exit(2)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:
            # the reader went away (`autotune export | head -1`): stop quietly, as a process killed by
            # SIGPIPE would (exit 141 = 128 + SIGPIPE); stdout goes to /dev/null so the interpreter's
            # final flush cannot raise again (Python docs, "Note on SIGPIPE", signal module)
            _silence_stdout()
            ctx.exit(141)
        except AutotuneError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)
        except Exception as e:  # noqa: BLE001 - the CLI's last line of defence
            if _debug():
                raise
            msg = str(e).splitlines()[0] if str(e) else ""
            click.echo(f"error: unexpected {type(e).__name__}: {msg}\n"
                       "(a bug; re-run with AUTOTUNE_DEBUG=1 for the traceback)", err=True)
            ctx.exit(1)


def _silence_stdout() -> None:
    """Point file descriptors 1 and 2 at /dev/null (after a closed pipe); ignores a failure to do so."""
    import os
    import sys
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass        # not a real file (CliRunner's buffer): nothing to flush later
    except OSError:
        pass


def parse_tokens(text: str) -> int:
    """``16M`` -> 16 x 2^20, ``512K`` -> 512 x 2^10, ``524288`` -> 524288 (tokens).

    Raises:
        ConfigError: not a positive integer with an optional K/M/G suffix (binary multiples).
    """
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", str(text))
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"--global-batch {text!r}: expected a positive number of tokens, e.g. 16M, 4M, 1M, "
                          "524288 (K = 2^10, M = 2^20, G = 2^30)")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]


def resolve_target(*, size: str | None, model_path: str | None, gpu: str | None, gpus: int | None,
                   interconnect: str | None, seq_len: int | None, global_batch: str | None):
    """(ModelSpec, ClusterSpec, Workload) from the CLI options with the per-size defaults.

    Defaults: B200 on nvlink5+ib-ndr400; 1024 GPUs and 16M tokens for 405b, 64 and 4M for 70b, 8 and 1M
    for 8b (a ``--model`` config takes the defaults of the nearest size by parameter count); seq 8192.

    Raises:
        ConfigError: unknown size/GPU/fabric (lists the known ones), both or neither of --size/--model,
            a batch that is not a whole number of sequences.
    """
    from autotune.hardware import make_cluster
    from autotune.models import CATALOG, get_model, model_from_hf_config
    from autotune.plan import Workload

    from autotune.validate import MAX_GLOBAL_BATCH_SEQUENCES, MAX_NUM_GPUS, MAX_SEQ_LEN, require_int, require_name

    size = require_name(size, "--size") if size is not None else None
    model_path = require_name(model_path, "--model") if model_path is not None else None
    gpu = require_name(gpu, "--gpu") if gpu is not None else None
    interconnect = require_name(interconnect, "--interconnect") if interconnect is not None else None
    if global_batch is not None:
        require_name(global_batch, "--global-batch")
    if gpus is not None:
        require_int(gpus, "--gpus", hi=MAX_NUM_GPUS)
    if seq_len is not None:
        require_int(seq_len, "--seq-len", hi=MAX_SEQ_LEN)
    if size and model_path:
        raise ConfigError("give either --size or --model, not both")
    if not size and not model_path:
        raise ConfigError(f"give --size ({', '.join(CATALOG)}) or --model path/to/config.json")
    if size:
        model = get_model(size)
        key = next(k for k, v in CATALOG.items() if v == model)
    else:
        model = model_from_hf_config(model_path)
        n = model.num_params
        key = "8b" if n < 20e9 else "70b" if n < 150e9 else "405b"
    d_gpus, d_batch = SIZE_DEFAULTS[key]
    cluster = make_cluster(gpu or DEFAULT_GPU, gpus if gpus is not None else d_gpus, interconnect)
    seq = seq_len if seq_len is not None else DEFAULT_SEQ_LEN
    tokens = parse_tokens(global_batch if global_batch is not None else d_batch)
    if tokens // seq > MAX_GLOBAL_BATCH_SEQUENCES:
        top = MAX_GLOBAL_BATCH_SEQUENCES * seq
        hint = ""
        g = re.fullmatch(r"\s*(\d+)\s*[gG]\s*", str(global_batch))
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

    Bounds: 1 <= --trials <= MAX_TRIALS; 0 < --timeout <= 30 days; 0 <= --seed < 2**32 (numpy
    RandomState, which Optuna's samplers seed); --top-k >= 1; --real-steps >= 1; --trial-timeout > 0;
    --layers >= 1; a writable --storage (``mode=ro`` is refused for commands that add trials).

    Raises:
        ConfigError: naming the option, the value and the valid range.
    """
    from autotune.storage_check import is_readonly_url
    from autotune.validate import MAX_SEED, MAX_TIMEOUT_S, MAX_TRIALS, require_int, require_name, require_number

    if space is not None:
        require_name(space, "--space")
    if backend is not None:
        require_name(backend, "--backend")
    if trials is not None:
        require_int(trials, "--trials", hi=MAX_TRIALS)
    if timeout is not None:
        require_number(timeout, "--timeout (seconds)", lo=0, hi=MAX_TIMEOUT_S, lo_open=True)
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
        require_name(storage, "--storage")
        if is_readonly_url(storage):
            raise ConfigError(f"--storage {storage} is read-only (mode=ro); this command adds trials, give a "
                              "writable storage")
        from pathlib import Path

        from autotune.storage_check import readonly_url, sqlite_path
        sp = sqlite_path(storage)
        if sp is not None and Path(sp[0]).exists():
            readonly_url(storage)       # an existing file must already be an Optuna storage (never adopted)
        from autotune.storage_check import check_journal_file
        check_journal_file(storage)     # likewise a journal:PATH file


#: signals that arrived between the start of ``run`` / ``retune`` and its first :func:`_interruptible` (the imports of
#: Optuna and the simulator take a second or more): noted by :func:`_early_signals`' handler, acted on there
_EARLY: list[int] = []


def _early_signals() -> None:
    """Note SIGINT / SIGTERM from now on (only note: nothing is raised into the imports that follow), so
    a Ctrl-C in the first second of ``run`` is not lost; the first :func:`_interruptible` ends the command
    with it (exit 130 / 143 and the "interrupted:" line). The previous handlers come back when the command
    ends. A process that started with SIGINT ignored (``cmd &`` in a script) ignores it until here."""
    import signal

    _EARLY.clear()
    ctx = click.get_current_context(silent=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old = signal.signal(sig, lambda signum, frame: _EARLY.append(signum))
        except ValueError:      # not the main thread
            continue
        if ctx is not None:
            ctx.call_on_close(lambda sig=sig, old=old: signal.signal(sig, old))


def _interruptible(fn, *, storage: str, study: str):
    """Run ``fn()``; on SIGINT or SIGTERM print how many trials the study holds (each finished trial is
    already stored: Tuner.optimize persists it as it ends) and the best plan so far, then exit 130
    (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number convention."""
    import signal

    from autotune import tuner as _t

    def on_signal(signum, frame):
        _t.note_interrupt(signum)
        if _t.safe_to_raise(frame):     # never into SQLAlchemy's pool finalizers (they log a traceback)
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
        if isinstance(u.exc_value, KeyboardInterrupt) and _t.interrupted() is not None:
            return
        old_hook(u)

    sys.unraisablehook = unraisable
    try:
        if _EARLY:          # arrived before this command's first _interruptible (see _early_signals)
            _t.note_interrupt(_EARLY.pop())
            _EARLY.clear()
            raise KeyboardInterrupt
        r = fn()
        if _t.interrupted() is not None:    # noted inside a library call that went on (see safe_to_raise)
            raise KeyboardInterrupt
        return r
    except KeyboardInterrupt:
        code = 143 if _t.interrupted() == signal.SIGTERM else 130
        click.echo(_interrupted_line(storage, study), err=True)
        _t.clear_interrupt()    # acted on: later tuning in this process (the Python API) is not stopped by it
        raise click.exceptions.Exit(code) from None
    except Exception:
        if _t.interrupted() is None:
            raise
        # the signal landed inside a library call that turned it into its own error (SQLite: "interrupted")
        code = 143 if _t.interrupted() == signal.SIGTERM else 130
        click.echo(_interrupted_line(storage, study), err=True)
        _t.clear_interrupt()
        raise click.exceptions.Exit(code) from None
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        sys.unraisablehook = old_hook


def _interrupted_line(storage: str, study: str) -> str:
    try:
        from autotune.tuner import best_plan, load_study
        st, info = load_study(study, storage)
        trials = st.get_trials(deepcopy=False)
        n = sum(t.state.is_finished() for t in trials)      # RUNNING ones (other hosts' workers) are not saved yet
        running = len(trials) - n
        bp = best_plan(st, info)
        best = (f"best so far: trial {bp.trial_number}, MFU {100 * bp.result.mfu:.1f}%, step "
                f"{bp.result.step_time_ms:,.1f} ms" if bp else "no feasible plan yet")
        return (f"interrupted: {n} trials saved in {study} ({storage})"
                + (f", {running} still running or waiting" if running else "") + f"; {best}")
    except Exception:  # noqa: BLE001 - the study may not exist yet
        return f"interrupted: no trials saved in {study} ({storage})"


def target_options(f):
    """--size --model --gpu --gpus --interconnect --seq-len --global-batch."""
    opts = [
        click.option("--size", help="Llama 3.1 size: 8b, 70b or 405b."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False),
                     help="Hugging Face config.json of a dense decoder (instead of --size)."),
        click.option("--gpu", help=f"GPU: a100-80gb, h100, h200, b200, gb200 (default {DEFAULT_GPU})."),
        click.option("--gpus", type=int, help="GPU count (default: 8 for 8b, 64 for 70b, 1024 for 405b)."),
        click.option("--interconnect", help="Fabric <intra>[+<inter>], e.g. nvlink5+ib-ndr400, or a YAML file "
                                            "(default: the GPU's NVLink + ib-ndr400)."),
        click.option("--seq-len", type=int, help=f"Sequence length in tokens (default {DEFAULT_SEQ_LEN})."),
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


def _say(as_json: bool):
    """click.echo to stdout, or to stderr when stdout carries the JSON document."""
    return (lambda m="": click.echo(m, err=True)) if as_json else click.echo


def _entry(*, plan, result, info=None, model=None, cluster=None, workload=None, engine, label=None, study=None,
           trial=None, memory=None, extra=None):
    from autotune.report import result_entry

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
        click.option("--trials", type=int, default=200, show_default=True, help="Trials to run (added to the study)."),
        click.option("--timeout", type=float, default=None, help="Stop after this many seconds."),
        click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed (the layout sampler orders near-equal estimates with it; same seed and history, same trials)."),
        click.option("--workers", type=int, default=1, show_default=True,
                     help="Worker processes on this machine, all on one study (--trials is per worker)."),
        click.option("--worker-id", type=int, default=None,
                     help="This worker's index (seeds differ per worker; default $SLURM_ARRAY_TASK_ID, else 0; "
                          "with --workers N the workers get ID..ID+N-1)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.group(cls=AutotuneGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """autotune: find the parallelism plan with the highest MFU for an LLM on a GPU cluster.

    MFU = model FLOPs of a step / (step time x GPUs x dense BF16 peak), with causal attention FLOPs
    (the PaLM convention is shown beside it). Studies live in sqlite:///studies/autotune.db unless
    --storage says otherwise. Set AUTOTUNE_DEBUG=1 to see tracebacks.
    """


def _target_line(model, cluster, workload) -> str:
    return (f"{model.name} ({_params(model)}) on {cluster.num_gpus} x {cluster.gpu.name} ({cluster.fabric.name}"
            f"{_segment_note(cluster)}), seq {workload.seq_len}, "
            f"global batch {workload.global_batch_size} sequences = {workload.global_batch_tokens:,} tokens")


def _segment_note(cluster) -> str:
    """``; 4 NVLink domains of 64 GPUs`` when the cluster uses part of each multi-host domain (NVL72
    segments, :class:`autotune.hardware.ClusterSpec`), else empty."""
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


def _params(model) -> str:
    """``8.03B parameters`` (the exact count follows in export's output)."""
    n = model.num_params
    return f"{n / 1e9:.2f}B parameters" if n >= 1e9 else f"{n / 1e6:.1f}M parameters"


def real_options(f):
    opts = [
        click.option("--layers", type=int, default=None,
                     help="real backend: run depth-truncated proxies with N layers (true widths)."),
        click.option("--real-steps", type=int, default=3, show_default=True,
                     help="real backend: timed steps per trial (after 2 warm-up steps). With another backend "
                          "this, --trial-timeout and --heartbeat-interval change no prediction and only warn; "
                          "--layers and --launcher would change what is run, so they are refused."),
        click.option("--trial-timeout", type=float, default=900.0, show_default=True,
                     help="real backend: wall-clock limit per trial, s (a hung trial is killed and marked failed)."),
        click.option("--heartbeat-interval", type=int, default=None,
                     help="real backend: Optuna heartbeat of running trials, s (default 30; a killed worker's "
                          "trial fails after 2x this and is run once more by another worker)."),
        click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                     help="real backend: run each trial on this host's GPUs, or as a Slurm job (sbatch)."),
        click.option("--nodes", type=int, default=None, help="slurm launcher: nodes per trial job (default: "
                                                              "GPUs / --gpus-per-node)."),
        click.option("--gpus-per-node", type=int, default=None, help="slurm launcher: GPUs per node (default: "
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
_REAL_ONLY_PACING = ("real_steps", "trial_timeout", "heartbeat_interval")


def warn_real_only_options(backend: str | None) -> list[str]:
    """With ``--backend`` other than ``real``, print ``warning: --X has no effect with --backend B`` on
    stderr for each of --real-steps, --trial-timeout, --heartbeat-interval given on the command line (or
    by environment); returns the lines. Options left at their defaults say nothing."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None or backend == "real":
        return []
    lines = []
    for name in _REAL_ONLY_PACING:
        src = ctx.get_parameter_source(name)
        if src in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            line = (f"warning: --{name.replace('_', '-')} has no effect with --backend {backend or 'simulated'} "
                    "(it applies to --backend real only)")
            click.echo(line, err=True)
            lines.append(line)
    return lines


def _evaluator_options(backend, layers, real_steps, trial_timeout, launcher="local", nodes=None, gpus_per_node=None,
                       partition=None, account=None, time_limit=None):
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
    elif any(v is not None for v in slurm_opts.values()):
        raise click.UsageError("--nodes/--gpus-per-node/--partition/--account/--time need --launcher slurm")
    return opts


def _worker_id(worker_id):
    """--worker-id, else $SLURM_ARRAY_TASK_ID (a Slurm array task), else 0."""
    import os

    if worker_id is not None:
        return worker_id
    v = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    return int(v) if v.isdigit() else 0


def _print_outcomes(outcomes, say=click.echo):
    """One line per worker (through ``say``: stderr with --json): its own trials and outcomes; returns
    how many workers stopped on an error."""
    bad = 0
    for o in outcomes:
        st = o.own_states
        line = (f"worker {o.worker_id}: {o.n_new_trials} trials run: {st.get('feasible', 0)} feasible, "
                f"{st.get('infeasible', 0)} do not fit, {st.get('pruned', 0)} pruned, {st.get('failed', 0)} failed")
        if o.error:
            bad += 1
            line += f"; stopped: {o.error}"
        say(line)
    return bad


@main.command()
@target_options
@study_options
@tune_options
@real_options
@JSON_OPTION
def run(size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine, trials,
        timeout, seed, workers, worker_id, layers, real_steps, trial_timeout, heartbeat_interval, launcher, nodes,
        gpus_per_node, partition, account, time_limit, as_json):
    """Tune a plan (adds trials to the study, resuming it if it exists) and print the best plan.

    Example: autotune run --size 405b --trials 200
    """
    _early_signals()
    from autotune.report import format_best_plan
    from autotune.tuner import Tuner

    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    check_tune_options(space=space, backend=backend, trials=trials, timeout=timeout, seed=seed, storage=storage,
                       real_steps=real_steps, trial_timeout=trial_timeout, layers=layers)
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    from autotune.tuner import check_heartbeat
    check_heartbeat(heartbeat_interval, storage, backend)   # before any study is created
    warn_real_only_options(backend)
    wid = _worker_id(worker_id)
    tuner_kwargs = dict(model=model, cluster=cluster, workload=workload, space=space, storage=storage, backend=backend,
                        seed=seed, engine=engine,
                        evaluator_options=_evaluator_options(backend, layers, real_steps, trial_timeout, launcher,
                                                             nodes, gpus_per_node, partition, account, time_limit))
    say = _say(as_json)

    def _open() -> Tuner:
        t = Tuner(**tuner_kwargs)
        say(f"tuning {_target_line(model, cluster, workload)}")
        say(f"study {t.name!r} in {storage}; search space {t.space.name!r}; backend {backend}; "
            f"engine {t.engine.name}; {trials} trials" + (f" x {workers} workers" if workers > 1 else "")
            + (f", timeout {timeout:g} s" if timeout else ""))
        return t

    # a signal while the study is being opened (the storage file may already exist) ends the run the
    # same way as one during tuning, not with a traceback
    from autotune.engines import resolve_engine
    from autotune.search_space import SearchSpace
    from autotune.tuner import study_name
    loaded_space = SearchSpace.load(space)
    for line in loaded_space.no_effect_warnings():
        click.echo(f"warning: {line}", err=True)
    name = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                      engine=resolve_engine(engine, backend).name)
    from autotune.tuner import clear_interrupt
    clear_interrupt()   # one command, one interrupt: from here on every step is under _interruptible
    if workers > 1:
        from autotune.tuner import load_study, require_best_plan
        from autotune.workers import run_workers

        def _open_and_run():
            # opening the study, creating it and running the workers under one handler: a signal that
            # arrives between two of these steps is not lost (issue: Ctrl-C 0.8 s after start was ignored)
            t = _open()
            t.study  # noqa: B018 - create the study once here, before the workers race for it
            return t, run_workers(tuner_kwargs, workers, n_trials=trials, timeout=timeout,
                                  first_worker_id=wid, heartbeat_interval_s=heartbeat_interval)

        tuner, outcomes = _interruptible(_open_and_run, storage=storage, study=name)
        bad = _print_outcomes(outcomes, say)
        study, info = load_study(tuner.name, storage)
        trials_all = study.get_trials(deepcopy=False)
        n_new = sum(o.n_new_trials for o in outcomes)
        say(f"{n_new} trials run by {workers} workers, {len(trials_all)} in the study")
        best = require_best_plan(study, info, storage)
        if bad == workers:
            raise ConfigError(f"all {workers} workers stopped on an error (see above)")
        n_total, st = len(trials_all), {}
    else:
        tuner = _interruptible(_open, storage=storage, study=name)
        try:
            summary = _interruptible(lambda: tuner.optimize(trials, timeout=timeout, worker_id=wid,
                                                            heartbeat_interval_s=heartbeat_interval),
                                     storage=storage, study=tuner.name)
        finally:
            tuner.close()
        st, own = summary.states, summary.own_states
        say(f"{summary.n_new_trials} trials run by this worker (worker {summary.worker_id}: "
            f"{own.get('feasible', 0)} feasible, {own.get('infeasible', 0)} do not fit in memory, "
            f"{own.get('pruned', 0)} pruned (invalid), {own.get('failed', 0)} failed); "
            f"{summary.n_trials} in the study: {st.get('feasible', 0)} "
            f"feasible, {st.get('infeasible', 0)} do not fit in memory, {st.get('pruned', 0)} pruned (invalid), "
            f"{st.get('failed', 0)} failed")
        best = summary.best
        n_new, n_total = summary.n_new_trials, summary.n_trials
    if as_json:
        from autotune.report import json_document
        click.echo(json_document("run", [_entry(plan=best.plan, result=best.result, model=model, cluster=cluster,
                                                workload=workload, engine=tuner.engine.name, label="best",
                                                study=best.study, trial=best.trial_number)],
                                 trials={"new": n_new, "total": n_total, "states": dict(st)}))
        return
    click.echo("")
    click.echo(format_best_plan(plan=best.plan, result=best.result,
                                title=f"best plan: trial {best.trial_number} of {best.study}",
                                target=_target_line(model, cluster, workload), engine=tuner.engine.name))
    # the study name carries every option that selected it (GPU, fabric, workload, space, backend)
    import shlex
    click.echo(f"\nexport it: {_prog()} export --study {shlex.quote(tuner.name)}"
               + (f" --storage {shlex.quote(storage)}" if storage != DEFAULT_STORAGE else "") + " -o plan.yaml")


def _prog() -> str:
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


def _open_selected(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend,
                   engine=None):
    from autotune.engines import resolve_engine
    from autotune.search_space import SearchSpace
    from autotune.tuner import load_study, study_name

    from autotune.storage_check import readonly_url
    storage = readonly_url(storage)
    if study:
        return load_study(study, storage)
    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    loaded_space = SearchSpace.load(space)
    name = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                      engine=resolve_engine(engine, backend).name)
    st, info = load_study(name, storage)
    # the name holds the fabric's and space's names only: a file reusing a name with other links or knobs
    # must not be given another study's plan (run and retune refuse it the same way)
    from autotune.tuner import check_identity
    check_identity(st.user_attrs, name=name, storage=storage, space=loaded_space, fabric=cluster.fabric)
    return st, info


@main.command()
@click.option("--study", "study", help="Study name (instead of the target options).")
@target_options
@study_options
@click.option("-o", "--output", default="plan.yaml", show_default=True, type=click.Path(),
              help="Where to write the plan YAML (with --launcher: the directory for the launch files, created "
                   "or reused; only the files export writes are replaced).")
@click.option("--launcher", type=click.Choice(["torchrun", "slurm"]), default=None,
              help="Write launch files for the plan's engine into the -o directory: torchrun script, and with slurm "
                   "also an sbatch script.")
@click.option("--dry-run", "dry_run", is_flag=True, help="With --launcher: print the full command the script runs.")
@JSON_OPTION
def export(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine,
           output, launcher, dry_run, as_json):
    """Write the best plan of a study as YAML and print launch flags for Megatron-LM / torchtitan.

    Example: autotune export --size 405b -o plan.yaml
    """
    from autotune.report import launch_hints
    from autotune.storage_check import storage_errors
    from autotune.tuner import require_best_plan

    with storage_errors(storage):
        st, info = _open_selected(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage,
                                  space, backend, engine)
        best = require_best_plan(st, info, storage)
    doc = best.document()
    if dry_run and not launcher:
        raise click.UsageError("--dry-run needs --launcher torchrun|slurm")
    if launcher:
        from autotune.export import launch_file_names, write_launch_files
        from pathlib import Path

        out_dir = output if output != "plan.yaml" else "launch"
        if Path(out_dir).exists() and not Path(out_dir).is_dir():
            raise ConfigError(f"-o {out_dir}: with --launcher, -o names a directory (new or existing), not a file")
        existed = [p for p in launch_file_names(doc, launcher) if (Path(out_dir) / p).exists()]
        paths = write_launch_files(doc, out_dir, launcher)
        output = str(paths[0])
        say = _say(as_json)
        say(f"wrote {', '.join(str(p) for p in paths)} (engine {doc.engine}, {launcher})")
        if existed:
            say(f"replaced in {out_dir}: {', '.join(existed)} (other files there are untouched)")
        if dry_run:
            _dry_run(paths[-1], say)
    else:
        from pathlib import Path

        if Path(output).is_dir():
            raise ConfigError(f"-o {output}: is a directory; without --launcher -o names the plan YAML file "
                              f"(e.g. {Path(output) / 'plan.yaml'}), with --launcher torchrun|slurm a directory")
        try:
            doc.save(output)
        except OSError as e:
            raise ConfigError(f"cannot write {output}: {e}") from None
    from autotune.report import error_band_line

    if as_json:
        from autotune.report import json_document
        click.echo(json_document("export", [_entry(plan=best.plan, result=best.result, info=info, engine=info.engine,
                                                   label="best", study=best.study, trial=best.trial_number)],
                                 plan_file=output))
        return
    click.echo(f"model {info.model.name}: {info.model.num_params:,} parameters")
    click.echo(f"wrote {output}: trial {best.trial_number} of {best.study}, MFU {100 * best.result.mfu:.1f}%, "
               f"step {best.result.step_time_ms:,.1f} ms (engine {info.engine})")
    click.echo(error_band_line(info.engine))
    click.echo(launch_hints(best.plan, info.model, info.workload))


def _dry_run(script, say) -> None:
    """Print what ``bash SCRIPT --dry-run`` prints (the environment and the full command)."""
    import subprocess
    try:
        r = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"cannot run bash {script} --dry-run: {e}") from None
    if r.returncode != 0:
        raise ConfigError(f"bash {script} --dry-run failed: {r.stderr.strip()[:300]}")
    say(r.stdout.rstrip())


@main.command()
@click.option("--storage", default=None, help="Optuna storage URL (default sqlite:///studies/autotune.db).")
@click.option("--engine", default=None, help="Only studies of this engine (megatron, torchtitan, native).")
@JSON_OPTION
def show(storage, engine, as_json):
    """List the best plan per model size and interconnect found in the storage (one row per study)."""
    from autotune.report import format_studies, short_plan
    from autotune.tuner import best_plan, failure_summary, list_studies, load_study

    from pathlib import Path

    from autotune.storage_check import readonly_url, sqlite_path, storage_errors
    storage = storage if storage is not None else DEFAULT_STORAGE
    if storage == DEFAULT_STORAGE and not Path(sqlite_path(storage)[0]).exists():
        # the default storage before any `autotune run`: nothing to list, and nothing is created
        click.echo(f"no autotune studies in {storage}; run `autotune run --size 8b`")
        return
    ro_storage = readonly_url(storage)
    if engine is not None:
        from autotune.engines import get_engine
        get_engine(engine)
    with storage_errors(ro_storage):
        rows = []
        entries = []
        others: set[str] = set()
        for info in list_studies(ro_storage):
            if engine is not None and info.engine != engine:
                others.add(info.engine)
                continue
            st, info = load_study(info.name, ro_storage)
            bp = best_plan(st, info)
            trials = st.get_trials(deepcopy=False)
            if as_json:
                entries.append(_entry(plan=bp.plan if bp else None, result=bp.result if bp else None, info=info,
                                      engine=info.engine, label="best", study=info.name,
                                      trial=bp.trial_number if bp else None, extra={"n_trials": len(trials)}))
                continue
            row = {"model": info.model.name, "gpus": f"{info.num_gpus}x{info.gpu}", "fabric": info.fabric_name,
                   "engine": info.engine, "backend": info.backend, "workload": info.workload.label,
                   "n_trials": len(trials), "study": info.name}
            if bp is None:
                n_bad, n, _ = failure_summary(trials)
                row.update(mfu="none", step="-", plan=f"no feasible plan ({n_bad}/{n} trials pruned, OOM or failed)")
            else:
                row.update(mfu=f"{100 * bp.result.mfu:.1f}%", step=f"{bp.result.step_time_ms:,.0f}",
                           plan=short_plan(bp.plan))
            rows.append(row)
    if as_json:
        from autotune.report import json_document
        entries.sort(key=lambda e: (e["target"]["model"], e["target"]["num_gpus"], e["study"]))
        click.echo(json_document("show", entries, storage=storage))
        return
    rows.sort(key=lambda r: (r["model"], r["gpus"], r["workload"], r["fabric"]))
    if not rows and others:
        click.echo(f"no {engine} studies in {storage}; it holds studies of engine {', '.join(sorted(others))} "
                   "(leave --engine out to list them)")
        return
    click.echo(format_studies(rows) if rows else f"no autotune studies in {storage}; run `autotune run --size 8b`")


@main.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--backend", default="simulated", show_default=True, help="simulated, measured or real.")
@click.option("--interconnect", default=None, help="Evaluate on another fabric than the file's.")
@click.option("--engine", default=None, help="Evaluate for another engine than the file's (megatron, torchtitan, "
                                             "native).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated step as a Chrome/Perfetto trace (JSON): a process per pipeline stage, a track "
                   "per stream.")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart of the simulated step (.png, .svg or .pdf; needs matplotlib: autotune[plot]).")
@JSON_OPTION
def simulate(plan_file, backend, interconnect, engine, trace_path, gantt_path, as_json):
    """Predict one plan file (model, cluster and workload from the file) and print its memory table.

    Example: autotune simulate plan.yaml
    """
    from autotune.engines import resolve_engine
    from autotune.hardware import ClusterSpec, fabric_from_dict, get_fabric, get_gpu
    from autotune.memory import estimate_memory
    from autotune.plan import PlanDocument, validate_plan
    from autotune.report import format_best_plan
    from autotune.tuner import make_evaluator

    import os

    # output paths are checked before anything is written, so a bad one leaves no file behind
    for opt, path, suffixes in (("--trace", trace_path, (".json",)), ("--gantt", gantt_path, (".png", ".svg", ".pdf"))):
        if path is None:
            continue
        if not path.lower().endswith(suffixes):
            raise ConfigError(f"{opt} {path!r}: the file name must end in {' or '.join(suffixes)}")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise ConfigError(f"{opt} {path!r}: directory {d} does not exist or is not writable")
    doc = PlanDocument.load(plan_file)
    fabric = get_fabric(interconnect) if interconnect else fabric_from_dict(doc.fabric, where=f"{plan_file}: cluster.fabric")
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus, fabric=fabric)
    # the "has no effect" notes are printed here once, as warning: lines on stderr: validate_plan also
    # logs them and the evaluator (and --trace's timeline) validate again, so the autotune.plan logger
    # is quiet until this command ends
    import logging

    plan_log = logging.getLogger("autotune.plan")
    prev_level = plan_log.level
    plan_log.setLevel(logging.ERROR)
    click.get_current_context().call_on_close(lambda: plan_log.setLevel(prev_level))
    for w in validate_plan(doc.plan, doc.model, cluster.num_gpus, doc.workload,
                           gpus_per_node=cluster.gpus_per_node, gpu=cluster.gpu):
        click.echo(f"warning: {w}", err=True)
    seq_note = doc.model.check_sequence(doc.workload.seq_len)     # as `run` does for --seq-len
    if seq_note:
        click.echo(seq_note.replace("--seq-len", "seq_len"), err=True)
    eng = resolve_engine(engine if engine is not None else (None if backend == "real" else doc.engine), backend)
    ev = make_evaluator(backend, model=doc.model, cluster=cluster, workload=doc.workload, engine=eng.name)
    try:
        result = ev.evaluate(doc.plan)
        if (trace_path or gantt_path) and result.feasible:
            if not hasattr(ev, "step_timeline"):
                raise ConfigError(f"--trace/--gantt draw the simulator's timeline; backend {backend!r} has none "
                                  "(use --backend simulated or measured)")
            from autotune.trace import write_chrome_trace, write_gantt
            g, tl = ev.step_timeline(doc.plan)
            title = f"{doc.model.name} {cluster.num_gpus}x{cluster.gpu.name} {eng.name}: step {tl.step_time_ms:,.1f} ms"
            if trace_path:
                write_chrome_trace(trace_path, g, tl, title=title)
                _say(as_json)(f"wrote {trace_path} (Chrome trace: open in ui.perfetto.dev or chrome://tracing)")
            if gantt_path:
                write_gantt(gantt_path, g, tl, title=title)
                _say(as_json)(f"wrote {gantt_path}")
        elif trace_path or gantt_path:
            _say(as_json)("no trace: the plan does not fit in memory")
        frag = None
        costs = getattr(ev, "costs", None)
        if costs is not None and hasattr(costs, "fragmentation"):
            frag = costs.fragmentation()
    finally:
        ev.close()
    mem = estimate_memory(doc.model, doc.plan, cluster.gpu, doc.workload, fragmentation=frag, engine=eng)
    pred = doc.prediction or {}
    same = None
    if "mfu" in pred and "step_time_ms" in pred and not interconnect and eng.name == doc.engine:
        same = abs(float(pred["mfu"]) - result.mfu) <= 1e-9 * max(1.0, result.mfu) and \
            abs(float(pred["step_time_ms"]) - result.step_time_ms) <= 1e-6 * max(1.0, result.step_time_ms)
    if as_json:
        from autotune.report import json_document
        click.echo(json_document("simulate", [_entry(plan=doc.plan, result=result, model=doc.model, cluster=cluster,
                                                     workload=doc.workload, engine=eng.name, label=str(plan_file),
                                                     study=doc.study, trial=doc.trial_id, memory=mem,
                                                     extra={"stored_prediction_holds": same})]))
        return
    click.echo(format_best_plan(plan=doc.plan, result=result, title=f"plan {plan_file}",
                                target=_target_line(doc.model, cluster, doc.workload), engine=eng.name))
    click.echo("")
    click.echo(mem.describe())
    if same is not None:
        click.echo(f"\nprediction stored in the file ({pred.get('backend', '?')}): step {float(pred['step_time_ms']):,.1f} "
                   f"ms, MFU {100 * float(pred['mfu']):.1f}% -> " + ("same" if same else "DIFFERENT now"))


@main.command()
@target_options
@study_options
@tune_options
@real_options
@click.option("--top-k", type=int, default=5, show_default=True, help="Warm-start plans taken from the fast study.")
@JSON_OPTION
def retune(size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine, trials,
           timeout, seed, workers, worker_id, layers, real_steps, trial_timeout, heartbeat_interval, launcher, nodes,
           gpus_per_node, partition, account, time_limit, top_k, as_json):
    """Re-tune for a slower fabric, warm-started with the fastest fabric's best plans; compare both.

    Example: autotune retune --size 405b --interconnect pcie5+eth100
    """
    _early_signals()
    from autotune.report import format_side_by_side
    from autotune.tuner import explain_changes
    from autotune.tuner import retune as do_retune

    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    check_tune_options(space=space, backend=backend, trials=trials, timeout=timeout, seed=seed, storage=storage,
                       top_k=top_k,
                       real_steps=real_steps, trial_timeout=trial_timeout, layers=layers)
    warn_real_only_options(backend)
    from autotune.engines import resolve_engine
    from autotune.search_space import SearchSpace
    from autotune.tuner import study_name
    loaded_space = SearchSpace.load(space)
    for line in loaded_space.no_effect_warnings():
        click.echo(f"warning: {line}", err=True)
    slow_study = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                            engine=resolve_engine(engine, backend).name)
    say = _say(as_json)
    say(f"re-tuning {_target_line(model, cluster, workload)}")
    from autotune.tuner import clear_interrupt
    clear_interrupt()   # _interruptible does not clear: a signal of an earlier command in this process is gone
    r = _interruptible(lambda: do_retune(model=model, cluster=cluster, workload=workload, space=space, storage=storage, backend=backend,
                  seed=seed, n_trials=trials, timeout=timeout, top_k=top_k, log_fn=say,
                  evaluator_options=_evaluator_options(backend, layers, real_steps, trial_timeout, launcher, nodes,
                                                       gpus_per_node, partition, account, time_limit),
                  engine=engine, workers=workers, worker_id=_worker_id(worker_id),
                  heartbeat_interval_s=heartbeat_interval),
                       storage=storage, study=slow_study)
    fast_name, slow_name = r.fast.info.fabric_name, cluster.fabric.name
    if as_json:
        from autotune.report import json_document
        fi, si = r.fast.info, r.slow.info
        click.echo(json_document("retune", [
            _entry(plan=r.fast.plan, result=r.fast.result, info=fi, engine=fi.engine, label="fast_best",
                   study=r.fast.study, trial=r.fast.trial_number),
            _entry(plan=r.fast.plan, result=r.fast_on_slow, info=si, engine=si.engine, label="fast_plan_on_slow",
                   study=r.fast.study, trial=r.fast.trial_number),
            _entry(plan=r.slow.plan, result=r.slow.result, info=si, engine=si.engine, label="slow_best",
                   study=r.slow.study, trial=r.slow.trial_number)],
            mfu_lost=r.fast.result.mfu - r.slow.result.mfu, mfu_recovered=r.slow.result.mfu - r.fast_on_slow.mfu,
            changes=list(explain_changes(r.fast, r.slow, r.fast_on_slow)), n_enqueued=r.n_enqueued))
        return
    click.echo("")
    click.echo(format_side_by_side([(f"{fast_name} best", r.fast.plan, r.fast.result),
                                    (f"same plan on {slow_name}", r.fast.plan, r.fast_on_slow),
                                    (f"{slow_name} best", r.slow.plan, r.slow.result)], engine=r.slow.info.engine))
    lost = r.fast.result.mfu - r.slow.result.mfu
    gained = r.slow.result.mfu - r.fast_on_slow.mfu
    click.echo(f"\nMFU lost moving {fast_name} -> {slow_name}: {100 * lost:.1f} points "
               f"({100 * r.fast.result.mfu:.1f}% -> {100 * r.slow.result.mfu:.1f}%); re-tuning recovers "
               f"{100 * gained:.1f} points over running the {fast_name} plan unchanged "
               f"({100 * r.fast_on_slow.mfu:.1f}%).")
    for line in explain_changes(r.fast, r.slow, r.fast_on_slow):
        click.echo(line)
    click.echo(f"studies: {r.fast.study} (fast) and {r.slow.study} (slow), {r.n_enqueued} warm-start plan(s)")


@main.command()
@click.argument("study", required=False)
@click.option("--storage", default=DEFAULT_STORAGE, show_default=True, help="Optuna storage URL.")
@click.option("-o", "--output", "out_dir", default="plots", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the plots.")
def plot(study, storage, out_dir):
    """Plot a study: MFU history with best-so-far, parameter importances, MFU vs peak memory, per-knob effects.

    HTML (plotly) and PNG (matplotlib), whichever is installed (pip install 'autotune[plot]'). STUDY is a
    study name (see `autotune show`); without it, the storage must hold exactly one study.

    Example: autotune plot -o plots/
    """
    from autotune.plots import write_study_plots
    from autotune.storage_check import readonly_url, storage_errors
    from autotune.tuner import list_studies, load_study

    given, storage = storage, readonly_url(storage)
    with storage_errors(storage):
        if study is None:
            names = [i.name for i in list_studies(storage)]
            if not names:
                raise ConfigError(f"no studies in {given} yet; run `autotune run --size 8b` first")
            if len(names) != 1:
                shown = ", ".join(names[:10]) + (f", ... ({len(names) - 10} more)" if len(names) > 10 else "")
                flag = "" if given == DEFAULT_STORAGE else f" --storage {given}"
                raise ConfigError(f"{len(names)} studies in {given}; name one as the STUDY argument, e.g. "
                                  f"`autotune plot {names[0]}{flag} -o {out_dir}` (`autotune show{flag}` lists "
                                  f"them): {shown}")
            study = names[0]
        st, _ = load_study(study, storage)
        paths = write_study_plots(st, out_dir)
    click.echo(f"wrote {len(paths)} files to {out_dir}: " + ", ".join(p.name for p in paths))


#: name -> (module, attribute, one-line help); imported on first use (see AutotuneGroup).
LAZY_COMMANDS = {
    "profile": ("autotune.profiling.cli", "profile",
                "GPU host: time kernels and collectives, store them, export a calibration profile."),
    "validate": ("autotune.runtime.cli", "validate",
                 "GPU host: run a plan file for real and compare with the simulator's prediction."),
}

