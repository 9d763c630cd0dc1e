"""Run a user's launch script under bash, with its launchers replaced by a recorder, to learn the command it
would run (``autotune simulate --from-megatron SCRIPT --run-script``).

Megatron-LM's own example scripts build their arguments with shell control flow (``if [[ "$DTYPE" == fp8 ]];
then DTYPE_ARGS+=( ... ); fi``, ``${1:-default}``, ``$((GPUS_PER_NODE*NUM_NODES))``, ``source common.sh``)
that no static reader follows faithfully; bash itself does. Only when the user asks (``--run-script``), the
script runs:

* in a child process (``bash --noprofile --norc SCRIPT ARGS...``), never inside autotune's process;
* with ``torchrun``, ``python``, ``python3``, ``srun``, ``deepspeed``, ``uv``, ``nsys``, ``mpirun`` on
  ``PATH`` replaced by a recorder that writes its argv and the environment it sees as one JSON line and
  exits 0 (so nothing is trained, no GPU is touched);
* in an empty temporary working directory (removed afterwards) holding only empty placeholder files of
  Megatron-LM's entry scripts (``pretrain_gpt.py``, ...), so a script's "am I in the Megatron-LM checkout"
  check passes; ``HOME`` and ``TMPDIR`` point there too;
* with stdin from ``/dev/null``, a wall-clock timeout (:data:`TIMEOUT_S`, the whole process group is killed
  after it), an address-space limit (:data:`MAX_CHILD_BYTES`), a file-size limit and a CPU-time limit;
* with a minimal environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``) plus the user's ``--script-env
  NAME=VALUE`` overrides, not autotune's own environment: the result depends on the file and the arguments
  the user gave (``--script-args``, the script's positional arguments), nothing else.

The launch is the first recorded call whose argv holds a ``*.py`` word (``torchrun ... pretrain_gpt.py
...``, ``uv run python -m torch.distributed.run ... pretrain_gpt.py ...``). A script that launches nothing
(a model config that another script sources, such as Megatron-LM's ``examples/rl/model_configs/*.sh`` or
``examples/post_training/modelopt/conf/**.sh``) gives the variables it set at exit, through an ``EXIT``
trap in ``BASH_ENV``; the caller then reads the variables whose value starts with ``--`` options.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import ConfigError
from autotune.engines.shell_vars import MAX_WORD_CHARS, MAX_WORDS
from autotune.files import display_text

#: programs on PATH replaced by the recorder
RECORDED = ("torchrun", "python", "python3", "srun", "deepspeed", "uv", "nsys", "mpirun")
#: empty files put in the working directory (Megatron-LM's entry scripts, whose presence example scripts check)
PLACEHOLDERS = ("pretrain_gpt.py", "pretrain_mamba.py", "pretrain_bert.py", "pretrain_t5.py", "train_rl.py")
#: wall-clock limit of one script run, seconds
TIMEOUT_S = 20.0
#: address-space limit of the child (bash and the recorder), bytes (RLIMIT_AS, setrlimit(2)): an array that
#: doubles itself stops at it (bash: "xmalloc: cannot allocate"), its peak well under issue 37's 1 GiB bar (it was
#: 2 GiB: a 1.87 GB peak). bash 5.2 running Megatron-LM's launch scripts peaks at a few MiB, the recorder's
#: ``python -I -S`` at about 25 MiB of address space.
MAX_CHILD_BYTES = 512 * 2**20
#: words of bash's (and glibc's) out-of-memory messages, read in the child's output to say why it stopped
_OOM_WORDS = ("xmalloc", "cannot allocate", "Cannot allocate memory", "MemoryError")
#: the largest file the child may write (the record, the variable dump), bytes
MAX_RECORD_BYTES = 16 * 2**20

_RECORDER = r'''
import json, os, sys
rec = {"argv": [os.path.basename(sys.argv[1])] + sys.argv[2:], "env": dict(os.environ)}
with open(os.environ["AUTOTUNE_RECORD"], "a", encoding="utf-8", errors="surrogateescape") as f:
    f.write(json.dumps(rec, ensure_ascii=True) + "\n")
'''

# an EXIT trap that dumps every variable (name, number of elements, elements; NUL-separated) for a script
# that launches nothing; bash >= 4.3 (namerefs)
_PRELUDE = r'''
__autotune_dump() {
  local __n
  for __n in $(compgen -v); do
    case "$__n" in BASH*|FUNCNAME|PIPESTATUS|GROUPS|DIRSTACK|COMP_*|__*|AUTOTUNE_*) continue;; esac
    local -n __r="$__n" 2>/dev/null || continue
    printf '%s\0%s\0' "$__n" "${#__r[@]}" >> "$AUTOTUNE_VARS"
    printf '%s\0' "${__r[@]}" >> "$AUTOTUNE_VARS"
    unset -n __r
  done
}
trap __autotune_dump EXIT
unset BASH_ENV
'''


@dataclass(frozen=True)
class ScriptRun:
    """What the user gave for ``--run-script``: the positional arguments (``--script-args``, shell words) and
    the environment overrides (``--script-env NAME=VALUE``)."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = TIMEOUT_S

    @staticmethod
    def from_options(script_args: str | None, script_env: tuple[str, ...] | list[str] = ()) -> "ScriptRun":
        """Parse ``--script-args 'A B'`` (shell words, :func:`shlex.split`) and ``--script-env NAME=VALUE``.

        Raises:
            ConfigError: unbalanced quotes, or an override that is not ``NAME=VALUE`` with a shell name.
        """
        import re
        try:
            args = tuple(shlex.split(script_args or ""))
        except ValueError as e:
            raise ConfigError(f"--script-args {display_text(script_args)}: not shell words ({e})") from None
        env = []
        for item in script_env or ():
            name, eq, value = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "\0" in value:
                raise ConfigError(f"--script-env {display_text(item)}: give NAME=VALUE (NAME letters, digits, _)")
            env.append((name, value))
        return ScriptRun(args=args, env=tuple(env))

    def describe(self) -> str:
        """``bash SCRIPT 'a' 'b'`` with the overrides, for the import summary."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return " ".join(x for x in (env, "bash SCRIPT", " ".join(map(shlex.quote, self.args))) if x)


@dataclass(frozen=True)
class Recorded:
    """The result of one script run.

    Attributes:
        argv: the launch command (the recorded call with a ``*.py`` word), or None when none was made.
        env: the environment that call saw (the script's exports), ``{}`` without a launch.
        variables: name -> elements of every variable the script set, when it launched nothing.
        calls: every recorded call's argv (for messages).
        output: the script's stdout and stderr, at most 4 KiB (for messages).
        returncode: bash's exit status.
    """

    argv: tuple[str, ...] | None
    env: dict = field(default_factory=dict)
    variables: dict = field(default_factory=dict)
    calls: tuple[tuple[str, ...], ...] = ()
    output: str = ""
    returncode: int = 0


def _child_as_bytes() -> int:
    """The child's address-space limit, bytes: :data:`MAX_CHILD_BYTES`, or the hard ``RLIMIT_AS`` this
    process inherited when that is lower (a process cannot raise its hard limit, setrlimit(2))."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return MAX_CHILD_BYTES if hard == resource.RLIM_INFINITY else min(MAX_CHILD_BYTES, hard)


def _limits(as_bytes: int, cpu_s: int) -> None:     # runs in the child, before bash
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_RECORD_BYTES, MAX_RECORD_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))


def _check_words(argv: list[str], source: str) -> None:
    if len(argv) > MAX_WORDS:
        raise ConfigError(f"{source}: the recorded command has {len(argv):,} words; the limit is {MAX_WORDS:,}")
    long = next((w for w in argv if len(w) > MAX_WORD_CHARS), None)
    if long is not None:
        raise ConfigError(f"{source}: a word of the recorded command is {len(long):,} characters "
                          f"({display_text(long, 40)}); the limit is {MAX_WORD_CHARS:,}")


def _read_capped(p: Path, source: str, what: str) -> bytes:
    if not p.exists():
        return b""
    if p.stat().st_size > MAX_RECORD_BYTES:
        raise ConfigError(f"{source}: the script's {what} is over {MAX_RECORD_BYTES:,} bytes; refused")
    return p.read_bytes()


def _parse_vars(data: bytes, source: str) -> dict[str, list[str]]:
    parts = data.split(b"\0")
    out: dict[str, list[str]] = {}
    i = 0
    total = 0
    while i + 1 < len(parts):
        name = parts[i].decode("utf-8", "replace")
        try:
            n = int(parts[i + 1])
        except ValueError:
            break
        vals = [x.decode("utf-8", "replace") for x in parts[i + 2:i + 2 + n]]
        total += n
        if total > MAX_WORDS:
            raise ConfigError(f"{source}: the script's variables hold over {MAX_WORDS:,} words; refused")
        out[name] = vals
        i += 2 + n
    return out


@dataclass(frozen=True)
class _Ended:
    output: bytes
    returncode: int


def _kill_group(pgid: int) -> None:
    """SIGKILL to process group ``pgid`` (the script's bash and whatever it started, its background jobs too),
    at most once it is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_bash(argv: list[str], work: Path, env: dict, timeout_s: float, source: str) -> _Ended:
    """Run ``argv`` (bash and the script) in a session and process group of its own under the limits of
    :func:`_limits`; its output (stdout and stderr) and exit status. The whole group is killed on every way
    out: the end of bash (a job it left in the background), the time limit, SIGINT / SIGTERM of autotune
    (issue 37 F5: bash outlived a SIGTERM, re-parented to init), any error.

    Raises:
        ConfigError: bash cannot start; the time limit.
        Interrupted: SIGINT or SIGTERM arrived (the group is killed first; exit 130 / 143 in the CLI).
    """
    from autotune.errors import Interrupted
    from autotune.signals import child_signals, signal_name

    cpu = int(timeout_s) + 1
    limit = _child_as_bytes()
    with child_signals() as sigs:
        try:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: _limits(limit, cpu))
        except OSError as e:
            raise ConfigError(f"{source}: cannot run bash: {e.strerror or e}") from None
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise ConfigError(f"{source}: the script ran past {timeout_s:g} s under --run-script (no launch "
                              "recorded in time); autotune stopped it") from None
        except KeyboardInterrupt:
            _kill_group(proc.pid)
            proc.wait()
            sig = sigs.signum or signal.SIGINT
            raise Interrupted(sig, f"{signal_name(sig)} arrived while --run-script ran {source}; the script and "
                                   "everything it started were stopped, nothing was done") from None
        finally:
            _kill_group(proc.pid)       # also after bash's own end: its background jobs are in the group
            if proc.poll() is None:
                proc.wait()
    return _Ended(output=out, returncode=proc.returncode)


def run_script(path: str | Path, run: ScriptRun) -> Recorded:
    """Run the launch script ``path`` as the module docstring says and return what it launched.

    Raises:
        ConfigError: bash is missing, the file is not a regular file, the run timed out or hit a limit, or a
            recorded command is too large (over :data:`MAX_WORDS` words or a word over :data:`MAX_WORD_CHARS`).
    """
    from autotune.files import read_bytes_file

    source = str(path)
    read_bytes_file(path, what="launch script")       # a regular file within the size cap
    script = str(Path(path).resolve())
    bash = shutil.which("bash", path=os.defpath + ":/usr/bin:/bin")
    if bash is None:
        raise ConfigError(f"{source}: --run-script needs bash, which is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="autotune-script-"))
    try:
        bindir, work = tmp / "bin", tmp / "work"
        bindir.mkdir()
        work.mkdir()
        rec_py = tmp / "recorder.py"
        rec_py.write_text(_RECORDER)
        prelude = tmp / "prelude.sh"
        prelude.write_text(_PRELUDE)
        for name in RECORDED:
            exe = bindir / name
            exe.write_text(f"#!{bash}\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(rec_py))} "
                           '"$0" "$@"\n')
            exe.chmod(0o755)
        for name in PLACEHOLDERS:
            (work / name).write_text("")
        record, dump = tmp / "record.jsonl", tmp / "vars.bin"
        env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work),
               "LANG": "C.UTF-8", "AUTOTUNE_RECORD": str(record), "AUTOTUNE_VARS": str(dump),
               "BASH_ENV": str(prelude)}
        env.update(dict(run.env))
        env.update({"AUTOTUNE_RECORD": str(record), "AUTOTUNE_VARS": str(dump), "BASH_ENV": str(prelude)})
        proc = _run_bash([bash, "--noprofile", "--norc", script, *run.args], work, env, run.timeout_s, source)
        output = proc.output[-4096:].decode("utf-8", "replace")
        if proc.returncode != 0 and any(w in output for w in _OOM_WORDS):
            raise ConfigError(f"{source}: the script used more than {_child_as_bytes() / 2**20:.0f} MiB of memory under "
                              "--run-script and was stopped (its output is not shown: run it yourself to see why)")
        if proc.returncode < 0:
            raise ConfigError(f"{source}: the script was stopped by signal {-proc.returncode} under --run-script "
                              f"(a limit: {_child_as_bytes() / 2**20:.0f} MiB of memory, {MAX_RECORD_BYTES // 2**20} MiB "
                              "files, CPU time)")
        calls, launch, launch_env = [], None, {}
        for line in _read_capped(record, source, "recorded commands").decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            argv = [str(a) for a in rec.get("argv", [])]
            _check_words(argv, source)
            calls.append(tuple(argv))
            if launch is None and any(a.endswith(".py") for a in argv[1:]):
                launch, launch_env = tuple(argv), {str(k): str(v) for k, v in (rec.get("env") or {}).items()}
        variables = {}
        if launch is None:
            variables = _parse_vars(_read_capped(dump, source, "variables"), source)
        for k in ("AUTOTUNE_RECORD", "AUTOTUNE_VARS", "BASH_ENV"):
            launch_env.pop(k, None)
        return Recorded(argv=launch, env=launch_env, variables=variables, calls=tuple(calls), output=output,
                        returncode=proc.returncode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def looks_like_script(path: str | Path) -> bool:
    """A shell script (a ``#!`` line, shell control flow or a ``$`` expansion), not a plain argument list."""
    import os
    import stat
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):      # a FIFO or device would block or never end
            return False
        with open(path, "rb") as fh:
            head = fh.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    return head.startswith("#!") or "$" in head or bool(
        re.search(r"^\s*(if|for|while|case|function|source|then|fi|done)\b", head, re.M))


def recorded_launch(path: str | Path, script) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """(argument tokens, launcher words, environment, notes) of a launch script run under bash with a recorder
    (:func:`run_script`; ``script`` a :class:`ScriptRun`): the recorded ``*.py`` call, or, when the script launches
    nothing (a model config another script sources), the words of the variables it set whose value starts
    with ``--`` (sorted by name; an option that two of them give differently is refused).

    Raises:
        ConfigError: see run_script; no launch and no variable of options.
    """
    rec = run_script(path, script)
    how = f"read by running {script.describe().replace('SCRIPT', str(path))} with {', '.join(RECORDED)} recorded"
    if rec.argv is not None:
        argv = list(rec.argv)
        k = next(i for i, w in enumerate(argv) if i and w.endswith(".py"))
        return argv[k + 1:], argv[:k + 1], dict(rec.env), [how]
    opts = {n: v for n, v in rec.variables.items()
            if v and " ".join(v).split()[:1] and " ".join(v).split()[0].startswith("--")}
    if not opts:
        # which programs it called (their names only) and its exit status; neither its output nor its arguments
        # are echoed (a script can print any file it can read)
        calls = ", ".join(sorted({c[0] for c in rec.calls if c})) or "none"
        raise ConfigError(f"{path}: ran it under bash (exit {rec.returncode}): it launched no *.py through "
                          f"{'/'.join(RECORDED)} (recorded calls of: {calls}) and set no variable of --options (its "
                          "output is not shown: run it yourself to see why)")
    tokens: list[str] = []
    for name in sorted(opts):
        tokens += " ".join(opts[name]).split()
    env = {n: v[0] for n, v in rec.variables.items() if n == "PYTORCH_CUDA_ALLOC_CONF" and v}
    return tokens, [], env, [how + f"; it launches nothing (a config another script sources): the options of "
                                   f"its variables {', '.join(sorted(opts))}"]


__all__ = ["looks_like_script", "recorded_launch", "MAX_WORDS", "MAX_WORD_CHARS", "RECORDED", "Recorded", "ScriptRun", "TIMEOUT_S", "run_script"]
