"""The shell variables of a Megatron-LM launch script that autotune may expand without running the script,
and the world size its launcher words give.

Megatron-LM's own example scripts (``examples/gpt3/train_gpt3_175b_distributed.sh``,
``examples/llama/train_llama3_8b_h100_fp8.sh``) collect the arguments in bash arrays, ``GPT_MODEL_ARGS=(
--num-layers 96 ... )``, and launch ``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${GPT_MODEL_ARGS[@]}
...``. An array defined once (``NAME=( ... )`` over one or several lines, ``#`` comments and ``\\``
continuations inside) and never appended to (``NAME+=(``) is expanded where ``${NAME[@]}`` or
``"${NAME[@]}"`` is a whole word (bash: each element becomes one word); its elements' own ``$NAME`` are
expanded as the scalars below. A scalar ``NAME=value`` assigned
exactly once in the script, to a value with no ``$`` or backquote, is expanded where ``$NAME`` or ``${NAME}``
appears. Anything else (a variable set twice, by ``for``/``read``, from the environment or from another
variable) is left as it is, and the caller refuses it.
"""

from __future__ import annotations

import re
import shlex

_DEF = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
_SCALAR_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_LOOP = re.compile(r"\b(?:for|read(?:\s+-\w+)*)\s+([A-Za-z_][A-Za-z0-9_]*)")


def _split(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def script_values(lines: list[str]) -> tuple[dict[str, list[str]], dict[str, str], set[int]]:
    """(arrays, scalars, indices of the lines inside a multi-line array definition) of the logical shell
    ``lines`` (``\\`` continuations joined): only the names defined once, to literal words."""
    arrays: dict[str, list[str] | None] = {}
    scalars: dict[str, str | None] = {}
    inside: set[int] = set()

    def put(d: dict, name: str, value) -> None:
        d[name] = None if (name in arrays or name in scalars) else value

    i = 0
    while i < len(lines):
        line = lines[i]
        for m in _LOOP.finditer(line.split("#", 1)[0]):
            scalars[m.group(1)] = None
        m = _DEF.match(line)
        if m and m.group(3).startswith("("):
            body, j = m.group(3)[1:], i
            while not ((w := _split(body)) and w[-1].endswith(")")):
                j += 1
                if j >= len(lines):
                    break
                inside.add(j)
                body += "\n" + lines[j]
            words = _split(body) or []
            if words and words[-1].endswith(")"):
                words[-1] = words[-1][:-1]
                if not words[-1]:
                    words.pop()
            literal = m.group(2) == "" and not any("$(" in w or "`" in w for w in words)
            put(arrays, m.group(1), words if literal else None)
            if m.group(2):
                arrays[m.group(1)] = None
            i = j + 1
            continue
        found, words = [], _split(line) or []
        for k, w in enumerate(words):
            d = _DEF.match(w)
            if w in ("export", "readonly"):
                continue
            if not d:
                if k and not words[k - 1].endswith(";"):
                    found = []          # NAME=value command ...: the command's environment, not a variable
                break
            found.append((d.group(1), d.group(2), d.group(3).rstrip(";")))
        for name, plus, value in found:
            put(scalars, name, None if (plus or "$" in value or "`" in value) else value)
        i += 1
    return ({k: v for k, v in arrays.items() if v is not None},
            {k: v for k, v in scalars.items() if v is not None}, inside)


def expand(words: list[str], arrays: dict[str, list[str]], scalars: dict[str, str]) -> list[str]:
    """``words`` with the ``${NAME[@]}`` words of ``arrays`` spliced in and the ``$NAME`` / ``${NAME}`` of
    ``scalars`` replaced (where every reference in a word is known; else the word is kept as it is)."""
    out: list[str] = []
    for w in words:
        m = _ARRAY_REF.match(w)
        items = arrays[m.group(1)] if m and m.group(1) in arrays else [w]
        for x in items:
            refs = [a or b for a, b in _SCALAR_REF.findall(x)]
            if refs and all(r in scalars for r in refs):
                x = _SCALAR_REF.sub(lambda r: scalars[r.group(1) or r.group(2)], x)
            out.append(x)
    return out


def launcher_world(launcher: list[str]) -> tuple[int, str] | None:
    """(GPU count, how) when the launcher words give torchrun's ``--nnodes N`` and ``--nproc-per-node G``
    (or ``--nproc_per_node``; ``--opt=value`` too) as plain integers: N x G processes, one GPU each
    (torch.distributed.run: world size = nnodes x nproc_per_node); else None (an elastic ``1:4`` range, a
    variable, ``gpu``/``auto``, or one of the two missing)."""
    got: dict[str, str] = {}
    for k, w in enumerate(launcher):
        opt, eq, val = w.partition("=")
        key = opt.replace("_", "-")
        if key in ("--nnodes", "--nproc-per-node"):
            got[key] = val if eq else (launcher[k + 1] if k + 1 < len(launcher) else "")
    n, g = got.get("--nnodes", ""), got.get("--nproc-per-node", "")
    if not (n.isdigit() and g.isdigit()):
        return None
    return int(n) * int(g), f"--nnodes {n} x --nproc-per-node {g}"


__all__ = ["expand", "launcher_world", "script_values"]
