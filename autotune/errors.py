"""Exceptions that carry a message meant for the user.

The CLI turns any :class:`AutotuneError` into a one-paragraph error and a non-zero exit code (never a
traceback). :class:`PlanError` is also a :class:`ValueError`, so library users can catch the standard
exception for invalid plans.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class for errors whose message is written for the user of the CLI."""


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


#: ``scheme://user:password@host``: the password part of a URL's authority (RFC 3986 section 3.2.1,
#: "userinfo"; SQLAlchemy URLs follow it: ``postgresql://user:pw@host/db``)
_URL_PASSWORD = None


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``postgresql://me:s3cret@h/db`` ->
    ``postgresql://me:***@h/db``); a URL without a password, and any other text, is unchanged.

    Used for every storage URL the CLI prints (messages, ``run``'s study line, the export hint) and on
    every ``error:`` line, so a PostgreSQL password never reaches a terminal or a log (issue 25).
    """
    import re

    global _URL_PASSWORD
    if _URL_PASSWORD is None:
        # userinfo = user ":" password "@"; the password may hold any character but "@" and whitespace
        # (a percent-encoded "@" is %40); the last "@" before the host ends it
        _URL_PASSWORD = re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<pw>[^\s]*)@(?=[^@\s]*)")
    if not isinstance(text, str) or "://" not in text:
        return text
    return _URL_PASSWORD.sub(lambda m: m.group("pre") + "***@" if m.group("pw") else m.group(0), text)
