"""A guard between the tuner and a launched job (torchrun and its ranks, an engine's torchrun, the NCCL
bench): the job never outlives the tuner, even one killed with ``kill -9``.

``python -I autotune/launchers/reaper.py --parent PID [--grace-s S] [--on-stop] -- CMD ...`` (:func:`guarded` builds
this command line; the file imports only the standard library, and ``-I`` keeps the script's folder off
``sys.path``, so it runs with any interpreter and environment).

Lifecycle of one guard process:

1. ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, then ``getppid() == PID`` is checked: a tuner that died between
   its fork and the ``prctl`` is seen here, and the guard exits 1 before starting anything, or in the
   ``--on-stop`` form below runs its command at once (prctl(2)'s race-free idiom).
2. ``prctl(PR_SET_CHILD_SUBREAPER)``: a descendant orphaned by its own parent's death (a rank whose
   torchrun was killed) is re-parented to the guard, not to init, so the guard still finds it.
3. ``CMD`` is started (it gets SIGTERM if the guard itself dies) and waited for.
4. SIGTERM, SIGINT or SIGHUP of the guard (the kernel's, when the tuner dies; the tuner's own on a
   timeout or Ctrl-C): every descendant gets SIGTERM, those left after ``--grace-s`` seconds SIGKILL, and
   the guard ends by the same signal. torchrun's own SIGTERM path is not relied on: in CI it once stopped
   the ranks but left torchrun running over 60 s, and an engine's ranks (torchtitan, Megatron) run in
   sessions of their own with no parent-death signal (``torch/distributed/elastic/multiprocessing/
   subprocess_handler`` starts them with ``start_new_session=True``).
5. When ``CMD`` ends by itself, any descendant it left is ended the same way, and the guard exits with
   ``CMD``'s status (by the same signal when ``CMD`` was killed by one), so the caller sees torchrun's.

With ``--on-stop`` the guard starts nothing and only waits: ``CMD`` runs when the guard is stopped as in
4 (the Slurm launcher's ``scancel ID`` of a trial job: a job outlives its submitter otherwise, holding its
nodes until its time limit); the tuner ends such a guard with SIGKILL when the job is over.

Linux only (``prctl``, ``/proc``); where ``prctl`` is missing the guard says so on stderr and still
ends the job on a signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1          # linux/prctl.h
_PR_SET_CHILD_SUBREAPER = 36   # linux/prctl.h (Linux 3.4)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL_S = 0.1                  # s between checks of the job and of the tuner
#: seconds between SIGTERM and SIGKILL of what is left (torchrun's own grace is 30 s: ``_shutdown`` in
#: ``torch/distributed/elastic/agent/server/api.py``; a guard ended by its tuner's timeout gets the tuner's
#: SIGKILL after ``autotune.runtime.launch._kill_tree``'s 5 s anyway)
GRACE_S = 5.0


def descendants(pid: int) -> list[int]:
    """All descendant pids of ``pid`` (Linux ``/proc``), children before grandchildren; ``[]`` where
    ``/proc`` cannot be read."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def guarded(argv: list[str], *, grace_s: float = GRACE_S, on_stop: bool = False) -> list[str]:
    """The command line of a guard whose parent is this process (the tuner) for ``argv`` (run now, or with
    ``on_stop`` only when the guard is stopped); start it with ``subprocess.Popen`` from this process, no
    ``preexec_fn`` needed."""
    return [sys.executable, "-I", os.path.abspath(__file__), "--parent", str(os.getpid()),
            "--grace-s", str(grace_s), *(["--on-stop"] if on_stop else []), "--", *argv]


def start_time(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22, proc(5)); None
    when it has ended or is a zombie, or ``/proc`` cannot be read. With the pid it names one process: a pid
    the kernel reuses later has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def term_when_gone(pid: int, *, poll_s: float = 0.5) -> "threading.Thread | None":
    """Start a daemon thread that sends SIGTERM to this process within ``poll_s`` seconds of process ``pid``
    ending (at once if it has ended already): a ``--workers N`` worker whose parent tuner is killed with
    SIGKILL then stops like one sent SIGTERM (its trial failed, its guard ending the trial's torchrun),
    instead of running its trials to the end. Polls :func:`start_time`, so it does not depend on who
    started this process (fork, fork server or spawn). Returns None where ``/proc`` cannot be read."""
    import threading

    if not os.path.isdir("/proc/self"):
        return None
    first = start_time(pid)

    def watch() -> None:
        while first is not None and start_time(pid) == first:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=watch, name=f"autotune-watch-{pid}", daemon=True)
    t.start()
    return t


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)       # the C library this interpreter already loaded
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _term_with_parent() -> None:  # pragma: no cover - runs in the forked child before exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _reap(block: bool) -> list[tuple[int, int]]:
    """Wait for children (ours and orphans re-parented to us); (pid, status) of those that ended."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))
        if block:
            return out


def _end_all(grace_s: float) -> None:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s`` seconds, reap them all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = descendants(os.getpid())
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 30.0)
        while time.monotonic() < deadline:
            _reap(block=False)
            if not descendants(os.getpid()):
                break
            time.sleep(0.05)
    _reap(block=False)


def _exit_like(status_code: int) -> int:
    """Exit with ``status_code`` (``subprocess`` convention: negative = killed by that signal)."""
    if status_code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        if -status_code != signal.SIGKILL:
            signal.signal(-status_code, signal.SIG_DFL)
        os.kill(os.getpid(), -status_code)
        return 128 - status_code      # not reached for a deadly signal
    return status_code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cut = args.index("--")
        opts, cmd = args[:cut], args[cut + 1:]
        parent = int(opts[opts.index("--parent") + 1])
        grace_s = float(opts[opts.index("--grace-s") + 1]) if "--grace-s" in opts else GRACE_S
    except (ValueError, IndexError):
        print(f"reaper: usage: --parent PID [--grace-s S] [--on-stop] -- CMD ...; got {args!r}", file=sys.stderr)
        return 2
    if not cmd:
        print("reaper: no command after --", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        raise _Stop(signum)

    # a tuner started with SIGCHLD ignored passes that on, and then the kernel reaps the children itself:
    # waitpid() would never return the job's status (QA, session 8: the guard spun, the trial timed out)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for s in _STOP_SIGNALS:
        signal.signal(s, on_signal)
    try:
        if not _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM):
            print("reaper: prctl(PR_SET_PDEATHSIG) is not available: the job is not ended if the tuner is "
                  "killed with SIGKILL", file=sys.stderr)
        # polled with short sleeps, not pause() / a blocking waitpid(): a signal that lands just before such a
        # call would wait for the next one (the handler runs between bytecodes; a sleep is cut short by it)
        if "--on-stop" in opts:
            while os.getppid() == parent:             # (not yet, if the tuner died before the prctl above)
                time.sleep(_POLL_S)
            raise _Stop(signal.SIGTERM)
        if os.getppid() != parent:
            return 1                                  # the tuner died before the prctl above
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        child = subprocess.Popen(cmd, preexec_fn=_term_with_parent)   # this process runs no other thread
        code = None
        while code is None:
            ended = _reap(block=False)
            code = next((os.waitstatus_to_exitcode(st) for pid, st in ended if pid == child.pid), None)
            if code is None and not ended and not os.path.exists(f"/proc/{child.pid}"):
                code = 1                              # reaped elsewhere: no status to pass on
            if code is None:
                time.sleep(_POLL_S)
    except _Stop as e:
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if "--on-stop" in opts:
            try:
                return subprocess.run(cmd, timeout=120).returncode
            except (OSError, subprocess.TimeoutExpired) as err:
                print(f"reaper: {cmd[0]} failed: {err}", file=sys.stderr)
                return 1
        _end_all(grace_s)
        return _exit_like(-e.signum)
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    _end_all(grace_s)
    return _exit_like(code)


if __name__ == "__main__":
    sys.exit(main())
