"""The ``autotune`` command group: one clear error line for every failure, lazily imported GPU-host commands.

Commands live one module per group: :mod:`autotune.cli.tune` (``run``, ``retune``), :mod:`autotune.cli.inspect`
(``show``, ``plot``), :mod:`autotune.cli.export`, :mod:`autotune.cli.simulate`, :mod:`autotune.cli.profile` and
:mod:`autotune.cli.validate` (GPU host; imported on first use). Shared option sets are in
:mod:`autotune.cli.options`. Any :class:`~autotune.errors.AutotuneError`
prints ``error: ...`` to stderr and exits 2; an unexpected exception prints one line and a hint to
re-run with ``AUTOTUNE_DEBUG=1`` for the traceback, and exits 1. Nothing here imports torch.
"""

from __future__ import annotations

import re
from typing import Any

import click

from autotune.errors import AutotuneError, Interrupted, redact, register_secrets
from autotune.files import withhold_private


def debug_enabled_cli() -> bool:
    from autotune.logs import debug_enabled

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

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Remember every URL among the arguments and its passwords first (:func:`autotune.errors.register_secrets`),
        so no message shows them, however they are written (a space in a password, ``?password=``)."""
        register_secrets(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        from autotune.files import forget_private_files

        forget_private_files()      # one command's files (in-process callers, CliRunner, run one after another)
        try:
            _startup_signals_done(ctx)
            return super().invoke(ctx)
        except click.UsageError as e:
            # one line, like every other refusal (click would print the usage text and "Error: ...")
            click.echo(redact("error: " + " ".join(e.format_message().split())), err=True)
            ctx.exit(2)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:
            # the reader went away (`autotune export | head -1`): stop quietly, as a process killed by
            # SIGPIPE would (exit 141 = 128 + SIGPIPE); stdout goes to /dev/null so the interpreter's
            # final flush cannot raise again (Python docs, "Note on SIGPIPE", signal module)
            _silence_stdout()
            ctx.exit(141)
        except Interrupted as e:        # a child's process group killed on SIGINT / SIGTERM (autotune/signals.py)
            click.echo(redact(f"interrupted: {one_line(str(e))}"), err=True)
            ctx.exit(128 + e.signum)
        except AutotuneError as e:
            text = withhold_private(str(e)) if getattr(e, "quotes_input", True) else str(e)
            click.echo(redact(f"error: {one_line(text)}"), err=True)
            ctx.exit(2)
        except Exception as e:  # noqa: BLE001 - the CLI's last line of defence
            if debug_enabled_cli():
                raise
            fault = _storage_fault(e)
            if fault is not None:      # disk full, read-only, damaged file, server gone: not a bug
                click.echo(redact(f"error: {one_line(str(fault))}"), err=True)
                ctx.exit(2)
            path_error = _path_error(e)
            if path_error is not None:     # a name too long, a symbolic link loop: the user's path, not a bug
                click.echo(redact(f"error: {path_error}"), err=True)
                ctx.exit(2)
            msg = withhold_private(str(e).splitlines()[0]) if str(e) else ""
            click.echo(redact(f"error: unexpected {type(e).__name__}: {one_line(msg, 300)}\n")
                       + "(a bug; re-run with AUTOTUNE_DEBUG=1 for the traceback)", err=True)
            ctx.exit(1)


#: longest error line the CLI prints, characters (a message quoting an input is cut, never 200 KB long)
MAX_ERROR_CHARS = 2000


def one_line(msg: str, max_len: int = MAX_ERROR_CHARS) -> str:
    """``msg`` as one printable line of at most ``max_len`` characters: line breaks become spaces, other
    control characters (an escape sequence, a NUL) ``\\xNN`` escapes (:func:`autotune.files.display_text`).
    A line that would be longer first has each word over 124 characters (a path, a URL) cut to its first and
    last 60 characters, so what follows it (the cause) is kept.
    The CLI's last guard: each message already quotes inputs through :func:`autotune.files.excerpt`."""
    from autotune.files import display_text

    text = " ".join(msg.replace("\r", "\n").split("\n"))
    if len(text) > max_len:     # a long path or URL is cut in its middle, so the cause after it still shows
        text = redact(text)     # first: a URL cut between its password and "@" would no longer be masked
        text = _LONG_WORD.sub(lambda m: m.group(0)[:LONG_WORD_KEEP] + "..." + m.group(0)[-LONG_WORD_KEEP:], text)
    return display_text(text, max_len)


#: a word (no blank) of more than 2 x LONG_WORD_KEEP + 3 characters: kept as its first and last
#: LONG_WORD_KEEP characters in an error line that would be too long (issue 37 F9: a 4,041-character SQLite
#: path filled the 2,000-character line and cut off the reason)
LONG_WORD_KEEP = 60
_LONG_WORD = re.compile(r"\S{%d,}" % (2 * LONG_WORD_KEEP + 4))


def _path_error(e: BaseException) -> str | None:
    """The error line for an OSError about a path the user gave (a name longer than NAME_MAX / PATH_MAX:
    ENAMETOOLONG, a symbolic link loop: ELOOP, a component that is a file: ENOTDIR), else None."""
    import errno

    if not isinstance(e, OSError) or e.errno not in (errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR):
        return None
    from autotune.files import excerpt

    name = f" {excerpt(str(e.filename))}" if e.filename is not None else ""
    why = {errno.ENAMETOOLONG: "a name in it is longer than 255 bytes or the whole longer than 4096 (NAME_MAX, "
                               "PATH_MAX); give a shorter path",
           errno.ELOOP: "it is a symbolic link loop (a link that leads back to itself); give a file",
           errno.ENOTDIR: "a component of it is not a directory"}[e.errno]
    return f"path{name}: {why}"


def _storage_fault(e: BaseException):
    """The :class:`~autotune.errors.StorageError` for a storage exception that reached the CLI (named after
    the storage opened last), else None."""
    import sys
    if "sqlalchemy" not in sys.modules and "optuna" not in sys.modules:
        return None
    from autotune.study.faults import storage_fault
    from autotune.study.storage import LAST_URL
    return storage_fault(e, LAST_URL[0])


#: commands that take the startup signal handlers over (``run`` / ``retune`` call
#: :func:`autotune.cli.options.early_signals` first, which keeps a signal noted at startup)
TAKES_SIGNALS_OVER = ("run", "retune")


def _startup_signals_done(ctx: click.Context) -> None:
    """Before a command starts: a SIGINT / SIGTERM that arrived while autotune started (noted by
    :func:`autotune.signals.install_startup_handlers`) ends it now with the "interrupted:" line and exit 130 /
    143, nothing done; else the default handlers come back, except for the commands of
    :data:`TAKES_SIGNALS_OVER`, which install their own at once."""
    from autotune.signals import restore_startup_handlers, startup_signal

    sig = startup_signal()
    if sig is not None:
        import signal as _signal

        name = "SIGTERM" if sig == _signal.SIGTERM else "SIGINT"
        click.echo(f"interrupted: {name} arrived while autotune was starting; nothing was done", err=True)
        ctx.exit(128 + int(sig))
    args = [*getattr(ctx, "_protected_args", []), *ctx.args]
    if not args or args[0] not in TAKES_SIGNALS_OVER:
        restore_startup_handlers()


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


@click.group(cls=AutotuneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autotune", prog_name="autotune", message="%(prog)s %(version)s")
def main() -> None:
    """autotune: find the parallelism plan with the highest MFU for an LLM on a GPU cluster.

    MFU = model FLOPs of a step / (step time x GPUs x dense BF16 peak), with causal attention FLOPs
    (the PaLM convention is shown beside it). Studies live in sqlite:///studies/autotune.db unless
    --storage says otherwise. Set AUTOTUNE_DEBUG=1 to see tracebacks.
    """



#: name -> (module, attribute, one-line help); imported on first use (see AutotuneGroup).
LAZY_COMMANDS = {
    "profile": ("autotune.cli.profile", "profile",
                "GPU host: time kernels and collectives, store them, export a calibration profile."),
    "validate": ("autotune.cli.validate", "validate",
                 "GPU host: run a plan file for real and compare with the simulator's prediction."),
}

