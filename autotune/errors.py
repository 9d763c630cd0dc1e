"""Exceptions that carry a message meant for the user.

The CLI turns any :class:`AutotuneError` into a one-paragraph error and a non-zero exit code (never a
traceback). :class:`PlanError` is also a :class:`ValueError`, so library users can catch the standard
exception for invalid plans.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class for errors whose message is written for the user of the CLI.

    ``quotes_input`` (default True): the message may quote text read from a user's file, so the CLI passes
    it through :func:`autotune.files.withhold_private`; False for a message made only of autotune's own
    words and an OS error (a worker that could not start), which is printed as it is."""

    quotes_input: bool = True


class PlanError(AutotuneError, ValueError):
    """A parallelism plan is invalid for the model, cluster or workload (names the numbers)."""


class ConfigError(AutotuneError, ValueError):
    """A YAML file, catalog name or option value is malformed or unknown."""


class StorageError(AutotuneError):
    """The study storage (an SQLAlchemy URL) cannot be opened."""


class NoFeasiblePlanError(AutotuneError):
    """Every trial of a study failed, was pruned or did not fit in memory."""


class NoGPUError(AutotuneError):
    """A command that needs an NVIDIA GPU ran on a machine without one."""


class Interrupted(AutotuneError):
    """SIGINT or SIGTERM stopped a child process autotune was waiting for (a config module loading, a
    ``--run-script`` script); the child's process group is already killed. The CLI prints
    ``interrupted: <message>`` and exits ``128 + signum`` (130 / 143, as ``run`` does)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = int(signum)


#: ``scheme://user:password@host``: the password part of a URL's authority (RFC 3986 section 3.2.1,
#: "userinfo"; SQLAlchemy URLs follow it: ``postgresql://user:pw@host/db``), in free text (no whitespace)
_URL_PASSWORD = None
#: a query parameter that carries a secret, any case: libpq's ``password`` and ``sslpassword`` connection
#: keywords (PostgreSQL docs, "Parameter Key Words", section 32.1.2; a URI's query parameters are those
#: keywords, and SQLAlchemy's psycopg dialects pass every query parameter on as one), ``passwd``/``pwd``
#: (MySQL drivers), ``secret``/``token`` (cloud auth plugins)
SECRET_QUERY_KEY = r"[A-Za-z_]*(?:pass(?:word|wd)?|pwd|secret|token)[A-Za-z_]*"
_QUERY_SECRET = None
#: a whole URL as SQLAlchemy's ``make_url`` splits it (sqlalchemy/engine/url.py ``_parse_url``: user up to
#: the first ":" or "/", password ``[^@]*``); the password here also takes any further "@" before the last one
#: of the authority (an un-encoded "@" in a password shows as the host in SQLAlchemy's split), so it is hidden
_WHOLE_URL = None
#: URL as given (command line) -> the same with every password masked; secrets seen in those URLs
_KNOWN_URLS: dict[str, str] = {}
_SECRETS: set[str] = set()
#: shortest secret also masked where it appears outside its URL (a shorter one would mask ordinary text)
MIN_LITERAL_SECRET = 4


def _patterns() -> None:
    import re

    global _URL_PASSWORD, _QUERY_SECRET, _WHOLE_URL
    if _URL_PASSWORD is None:
        # userinfo = user ":" password "@"; the password may hold any character but a line break (a space too:
        # libpq takes it; at most 256) and ends at the last "@" before the host (a host holds no "@")
        _URL_PASSWORD = re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)"
                                   r"(?P<pw>[^@\n]{0,256}?(?:@[^@\s/?#]*)*?)@(?![^\s/?#]*@)")
        # the value ends at "&", a space or quote; a ":" right before those is the sentence's ("URL: cause")
        _QUERY_SECRET = re.compile(rf"(?P<pre>[?&;](?i:{SECRET_QUERY_KEY})=)(?P<v>[^&\s'\"]+?)(?=:?(?:[&\s'\"]|$))")
        _WHOLE_URL = re.compile(r"(?P<head>[A-Za-z][\w+.\-]*://[^:/]*):(?P<pw>[^@]*(?:@[^@/?#]*)*?)@"
                                r"(?P<host>[^@/?#]*)(?P<rest>(?:[/?#].*)?)", re.S)


def mask_url(url: str) -> str:
    """``url`` (a whole URL, as given to ``--storage``) with its password and every secret query parameter
    (:data:`SECRET_QUERY_KEY`, any case) shown as ``***``; any character may be in them (a space too).
    ``postgresql://me:pa ss@h/db`` -> ``postgresql://me:***@h/db``; ``...?password=x&sslmode=require`` ->
    ``...?password=***&sslmode=require``."""
    import re

    _patterns()
    m = _WHOLE_URL.fullmatch(url)
    if m:
        url = f"{m.group('head')}:{'***' if m.group('pw') else ''}@{m.group('host')}{m.group('rest')}"
    if "?" in url:
        base, q = url.split("?", 1)
        parts = [re.sub(r"=.*", "=***", kv, flags=re.S) if re.fullmatch(rf"(?i:{SECRET_QUERY_KEY})=.+", kv, re.S)
                 else kv for kv in q.split("&")]
        url = base + "?" + "&".join(parts)
    return url


def url_secrets(url: str) -> set[str]:
    """The passwords in ``url`` (as :func:`mask_url` hides them), as written and percent-decoded."""
    import re
    from urllib.parse import unquote, unquote_plus

    _patterns()
    found: set[str] = set()
    m = _WHOLE_URL.fullmatch(url)
    if m and m.group("pw"):
        found |= {m.group("pw"), m.group("pw").split("@")[0]}
    if "?" in url:
        for kv in url.split("?", 1)[1].split("&"):
            if re.fullmatch(rf"(?i:{SECRET_QUERY_KEY})=.+", kv, re.S):
                found.add(kv.split("=", 1)[1])
    return {y for x in found for y in (x, unquote(x), unquote_plus(x)) if y}


def register_secrets(args) -> None:
    """Remember every URL in ``args`` (command-line words; ``--storage=URL`` too) and its secrets, so that
    :func:`redact` hides them wherever they appear later, in any message (a password with a space in it
    cannot be found in free text by a pattern)."""
    import re

    _patterns()
    for a in args:
        if not isinstance(a, str) or "://" not in a:
            continue
        m = re.search(r"[A-Za-z][\w+.\-]*://", a)
        if m is None:
            continue
        url = a[m.start():]
        masked = mask_url(url)
        if masked != url:
            _KNOWN_URLS[url] = masked
            _SECRETS.update(url_secrets(url))


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``postgresql://me:s3cret@h/db`` ->
    ``postgresql://me:***@h/db``, ``...?password=s3cret`` -> ``...?password=***``, any case); a URL without a
    password, and any other text, is unchanged. URLs and passwords registered by :func:`register_secrets`
    (the CLI registers its arguments) are hidden wherever they appear, whole or alone (passwords of at least
    :data:`MIN_LITERAL_SECRET` characters).

    Used for every storage URL the CLI prints (messages, ``run``'s study line, the export hint) and on
    every ``error:`` line, so a PostgreSQL password never reaches a terminal or a log (issue 25).
    """
    if not isinstance(text, str):
        return text
    _patterns()
    for url in sorted(_KNOWN_URLS, key=len, reverse=True):
        if url in text:
            text = text.replace(url, _KNOWN_URLS[url])
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if len(secret) >= MIN_LITERAL_SECRET and secret in text:
            text = text.replace(secret, "***")
    if "://" not in text and "=" not in text:
        return text
    if "://" in text and _WHOLE_URL.fullmatch(text):
        return mask_url(text)           # the text is one URL: split as SQLAlchemy does
    text = _URL_PASSWORD.sub(lambda m: m.group("pre") + "***@" if m.group("pw") else m.group(0), text)
    # a value masked above ("***", then maybe the sentence's ":") is left as it is
    return _QUERY_SECRET.sub(lambda m: m.group(0) if m.group("v").startswith("***") else m.group("pre") + "***", text)
