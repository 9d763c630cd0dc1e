"""Text from an input, made safe for the language of the file it is written into.

Every generated file (the launch scripts, the torchtitan config module and job file, the Slurm trial job) takes
strings that came from a user's file or a study (study, model, GPU and fabric names, paths). Each reaches the
file through one of these functions, chosen by where it lands:

* :func:`comment_text`: inside a ``#`` comment (bash, TOML, YAML, Python) or a Python docstring line: one
  line of printable characters, every other character shown as a backslash escape, so the text cannot end
  the comment and start a command (bash and TOML end a comment at a newline only; Python also at ``\\r`` and
  form feed; all of those are escaped here);
* :func:`slurm_job_name`: the value of ``#SBATCH --job-name=``: letters, digits, ``_ . -`` only (sbatch(1)'s
  ``#SBATCH`` parser splits a value at white space, drops backslashes and ends it at an unquoted ``#``);
* :func:`toml_string`: a TOML basic string (TOML 1.0.0, "String": ``"``, ``\\`` and the control characters
  U+0000-U+001F and U+007F must be escaped; ``\\uXXXX`` escapes any of them);
* :func:`python_docstring_text`: text inside a ``\"\"\"`` docstring (comment text with backslashes and quotes
  escaped);
* shell words: :func:`shlex.quote` (used directly by the writers), and :func:`shell_name` for the name of an
  ``export NAME=...`` line.
"""

from __future__ import annotations

import re

from autotune.errors import ConfigError

#: the most characters of one input string written into a comment line (longer text is cut, with "...")
COMMENT_MAX_CHARS = 200
#: the most characters of the text after ``autotune-`` in ``#SBATCH --job-name`` (squeue shows the first 8-20;
#: Slurm stores the whole name, and a short one is easier to read in sacct)
JOB_NAME_MAX_CHARS = 64
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]")
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def comment_text(s: object, max_chars: int = COMMENT_MAX_CHARS) -> str:
    """``str(s)`` as one line of printable characters: each character that is not printable
    (``str.isprintable``: newlines, carriage returns, tabs, NUL, escape, the Unicode line and paragraph
    separators, bidirectional overrides ...) is written as its Python escape (``\\n``, ``\\x1b``, ``\\u2028``),
    and the result is cut to ``max_chars`` characters (ending ``...``). Safe inside a ``#`` comment of bash,
    TOML, YAML or Python."""
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(s))
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def python_docstring_text(s: object, max_chars: int = COMMENT_MAX_CHARS) -> str:
    """:func:`comment_text` of ``s`` with ``\\`` and ``"`` escaped, for a line inside a ``\"\"\"`` docstring:
    the docstring then reads back (``ast.get_docstring``) as exactly :func:`comment_text`'s text."""
    return comment_text(s, max_chars).replace("\\", "\\\\").replace('"', '\\"')


def slurm_job_name(s: object) -> str:
    """``str(s)`` with every character other than ASCII letters, digits, ``_``, ``.`` and ``-`` replaced by
    ``_``, cut to :data:`JOB_NAME_MAX_CHARS` (a job name is a label: nothing else is needed, and nothing sbatch's
    ``#SBATCH`` parser treats specially, white space, ``#``, quotes or backslashes, is left)."""
    return _JOB_NAME_BAD.sub("_", str(s))[:JOB_NAME_MAX_CHARS] or "_"


def toml_string(s: str) -> str:
    """``s`` as a TOML basic string (``"..."``): ``\\`` and ``"`` escaped, control characters (U+0000-U+001F,
    U+007F; tab, newline and the rest) as ``\\uXXXX``, so :mod:`tomllib` reads back exactly ``s``."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def shell_name(name: str) -> str:
    """``name`` if it is a valid shell variable name (``[A-Za-z_][A-Za-z0-9_]*``, POSIX "Name"), for an
    ``export NAME=value`` line.

    Raises:
        ConfigError: any other text (the engine's environment is written by autotune: this is a bug guard).
    """
    if not isinstance(name, str) or not _SHELL_NAME.fullmatch(name):
        raise ConfigError(f"environment variable name {comment_text(repr(name), 60)} is not a shell name "
                          "([A-Za-z_][A-Za-z0-9_]*)")
    return name


__all__ = ["COMMENT_MAX_CHARS", "JOB_NAME_MAX_CHARS", "comment_text", "python_docstring_text", "shell_name",
           "slurm_job_name", "toml_string"]
