"""A bounded pre-scan of TOML text before :mod:`tomllib` parses it (issue 37): an upper bound of its nesting
depth and a cap on its tokens, in one pass without recursion (split from
:mod:`autotune.engines.torchtitan.importer`, which calls :func:`_toml_depth_bound` before parsing a job file)."""

from __future__ import annotations

import re

from autotune.errors import ConfigError

#: a token of TOML text that matters for its nesting: string and comment openers, brackets, dots, separators
_TOML_TOKEN = re.compile(r'"""|\'\'\'|["\'#\n\[\]{}.=,]')
# possessive (Python 3.11): the alternation form held ~1.2 GB for a 10 MiB string (issue 37 QA); same matches
_TOML_BASIC_REST = re.compile(r'[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"')


#: most tokens of :data:`_TOML_TOKEN` a TOML file may hold (torchtitan's job files: < 500); checked in the
#: depth pass, before :mod:`tomllib` (pure Python in 3.11) parses: a 16 MiB array of 8M numbers took 69 s
MAX_TOML_TOKENS = 200_000


def _toml_depth_bound(text: str, stop_above: int | None = None, source: str = "TOML file") -> int:
    """An upper bound of the deepest nesting on any line of TOML ``text``: open ``[`` / ``{`` plus the dots
    of the key or header being read (strings and comments skipped; a float's dot counts too, so it may
    overcount by one per value), in one pass with no recursion; returns as soon as it passes ``stop_above``.

    Raises:
        ConfigError: more than :data:`MAX_TOML_TOKENS` tokens (``source`` names the file)."""
    depth = run = best = tokens = 0
    pos, n = 0, len(text)
    while True:
        m = _TOML_TOKEN.search(text, pos)
        if m is None:
            return best
        tokens += 1
        if tokens > MAX_TOML_TOKENS:
            raise ConfigError(f"{source}: more than {MAX_TOML_TOKENS:,} TOML keys, values, brackets and lines; "
                              "refused (a torchtitan job file has a few hundred)")
        t, pos = m.group(), m.end()
        if t in ('"""', "'''"):
            end = text.find(t, pos)
            pos = n if end < 0 else end + 3
        elif t == '"':
            m2 = _TOML_BASIC_REST.match(text, pos)
            pos = m2.end() if m2 else pos
        elif t in ("'", "#"):
            end = text.find("\n" if t == "#" else "'", pos)
            pos = n if end < 0 else end + (t != "#")
        elif t in "[{":
            depth, run = depth + 1, 0
        elif t in "]}":
            depth, run = max(depth - 1, 0), 0
        elif t == ".":
            run += 1
        else:                       # "=", ",", newline: the key (or value) ends
            run = 0
        best = max(best, depth + run)
        if stop_above is not None and best > stop_above:
            return best
