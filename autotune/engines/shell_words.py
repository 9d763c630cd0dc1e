"""Shell-word splitting in linear time: the words :func:`shlex.split` (POSIX mode, ``comments=True``) gives,
read with one regular expression that consumes a run of characters per step.

:mod:`shlex` grows each token one character at a time (``self.token += nextchar`` on an attribute, a new
string each time), so one word of n characters costs O(n^2): measured (issue 37 QA, 2026-12-04) a
260,000-character word took 8.4 s and 200,000 characters 5.2 s. Here the runs of a word are joined once.

The rules are shlex's POSIX ones (CPython Lib/shlex.py, ``read_token``; whitespace `` \\t\\r\\n``,
``whitespace_split=True`` as :func:`shlex.split` sets it): a ``'...'`` run is literal; inside ``"..."`` a
backslash escapes only ``"`` and ``\\`` (it is kept before any other character); outside quotes a backslash
escapes any character; ``#`` outside quotes, even inside a word, ends the word and starts a comment up to the
end of the line; an empty quoted string is a word; an unclosed quote or a trailing backslash is a
``ValueError`` ("No closing quotation", "No escaped character").

With ``mark_literal=True`` a ``$`` or backquote inside single quotes (literal in bash: no expansion, no command
substitution; bash(1), QUOTING) is returned as :data:`LITERAL_DOLLAR` / :data:`LITERAL_BACKQUOTE`, so a check
for shell variables or ``$(...)`` skips it; :func:`unmark` turns them back into the characters.
"""

from __future__ import annotations

import re

#: stand-ins for a ``$`` and a backquote that were inside single quotes (Unicode noncharacters U+FDD0 and
#: U+FDD1, never meaningful text: Unicode 15, section 23.7)
LITERAL_DOLLAR, LITERAL_BACKQUOTE = "\ufdd0", "\ufdd1"

_TOKEN = re.compile(r"""(?P<plain>[^ \t\r\n'"\\#]+)|(?P<space>[ \t\r\n]+)|'(?P<single>[^']*)'"""
                    r'''|"(?P<double>(?:[^"\\]|\\.)*)"|\\(?P<esc>.)|(?P<comment>#[^\n]*\n?)|(?P<bad>['"\\])''', re.S)
_DQ_ESCAPE = re.compile(r'\\([\\"])')
#: the rest of an unclosed double-quoted string that ends in an escape with nothing after it (shlex's
#: "No escaped character")
_LONE_ESCAPE = re.compile(r"(?:[^\\]|\\.)*\\", re.S)


def split_words(text: str, *, mark_literal: bool = False) -> list[str]:
    """The shell words of ``text`` as ``shlex.split(text, comments=True)`` gives them (see the module
    docstring), in time linear in ``len(text)``; ``mark_literal`` marks single-quoted ``$`` and backquotes.

    Raises:
        ValueError: an unclosed quote ("No closing quotation") or a backslash at the end ("No escaped
            character"), as shlex.
    """
    words: list[str] = []
    parts: list[str] = []
    in_word = False         # a word has started (an empty quoted string makes one)
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "plain":
            parts.append(m.group("plain"))
        elif kind == "single":
            s = m.group("single")
            if mark_literal:
                s = s.replace("$", LITERAL_DOLLAR).replace("`", LITERAL_BACKQUOTE)
            parts.append(s)
        elif kind == "double":
            parts.append(_DQ_ESCAPE.sub(r"\1", m.group("double")))
        elif kind == "esc":
            parts.append(m.group("esc"))
        elif kind == "bad":
            rest = text[m.end():]
            lone = m.group("bad") == "\\" or (m.group("bad") == '"' and _LONE_ESCAPE.fullmatch(rest))
            raise ValueError("No escaped character" if lone else "No closing quotation")
        else:               # blanks or a comment end the word
            if in_word:
                words.append("".join(parts))
                parts, in_word = [], False
            continue
        in_word = True
    if in_word:
        words.append("".join(parts))
    return words


def unmark(word: str) -> str:
    """``word`` with the stand-ins of :func:`split_words` (``mark_literal``) back as ``$`` and backquotes."""
    return word.replace(LITERAL_DOLLAR, "$").replace(LITERAL_BACKQUOTE, "`")


__all__ = ["LITERAL_BACKQUOTE", "LITERAL_DOLLAR", "split_words", "unmark"]
