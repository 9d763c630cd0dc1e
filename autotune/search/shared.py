"""What workers on one study share through its storage (issue 26): the layout ranking and each base plan's
ranked neighbours, so that ``--workers N`` screens them once rather than N times. A mixin of
:class:`autotune.search.sampler.LayoutSampler` (moved out of ``sampler.py``); everything here is keyed by
:meth:`SharedSearch.ranking_key`, so a worker with another seed, space, calibration or code ignores it.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna

from autotune.spec.plan import Plan

log = logging.getLogger("autotune.search.sampler")

#: study system attribute holding the shared layout ranking (:meth:`LayoutSampler.rank`)
RANKING_ATTR = "autotune:layout_ranking"
#: study system attribute prefix of a base plan's ranked neighbours (:meth:`SharedSearch._load_neighbours`)
NEIGHBOURS_ATTR = "autotune:neighbours:"
#: suffix of the attribute saying which worker is screening a base plan's neighbours, and since when
BUSY_SUFFIX = ":busy"
#: how long (s) a worker waits for another worker's neighbours of a base plan before screening them itself,
#: and the age (s) past which a busy mark is ignored (its worker died or is stuck); screening a base's
#: neighbours takes ~0.1-0.3 s CPU (70B x 64 H100, issue 26)
NEIGHBOURS_WAIT_S, BUSY_STALE_S = 3.0, 20.0

#: the sampler that last stored a ranking in this process, with the process id: a worker forked from this
#: process (``autotune run --workers N``, :mod:`autotune.tune.workers`) takes over its warm caches
#: (:meth:`SharedSearch._adopt_warm`)
_RANKED_HERE: list[tuple[int, Any]] = []


class SharedSearch:
    """The storage side of :class:`autotune.search.sampler.LayoutSampler` (see the module docstring)."""

    seed: int
    jitter: float
    bound: Any
    screen: Any
    _prefs: dict[str, Any]
    _ranking: Any
    _entries: list[tuple[int, dict[str, Any], float]]
    _study: optuna.Study | None
    _plan_cache: dict[Any, Any]
    ranking_source: str

    def _make_ranking(self, entries: Any = None, known: Any = None, refined: Any = None) -> Any:
        raise NotImplementedError

    def _canonical(self, plan: Plan) -> Plan:
        raise NotImplementedError

    def ranking_key(self) -> str:
        """What the layout ranking depends on besides the study's target: the seed, jitter, the space's
        choices, the screen's op costs (provenance) and the source of :mod:`autotune.search` and
        :mod:`autotune.cost` (SHA-256, first 16 hex digits)."""
        got = getattr(self, "_ranking_key", None)
        if got is not None:
            return got
        import hashlib
        from pathlib import Path

        h = hashlib.sha256(repr((self.seed, self.jitter, sorted((k, tuple(map(repr, v)))
                                                                for k, v in self.bound.choices.items()),
                                 sorted(map(repr, dict(self.screen.costs.provenance()).items())))).encode())
        pkg = Path(__file__).resolve().parent.parent
        for d in ("search", "cost"):
            for f in sorted((pkg / d).glob("*.py")):
                h.update(f.read_bytes())
        self._ranking_key: str | None = h.hexdigest()[:16]
        return self._ranking_key

    def _load_ranking(self, study: optuna.Study) -> bool:
        try:
            got = study._storage.get_study_system_attrs(study._study_id).get(RANKING_ATTR)
            if not isinstance(got, dict) or got.get("key") != self.ranking_key():
                return False
            prefs = dict(got["prefs"])
            entries = [(int(i), dict(a), float(b)) for i, a, b, _ in got["layouts"]]
            refined = {int(i) for i, _, _, final in got["layouts"] if final}
            known = {int(i): (Plan.from_dict(d) if d is not None else None) for i, d, _ in got["screened"]}
            ests = {int(i): e for i, d, e in got["screened"] if d is not None}
        except Exception as e:          # unreadable: rank here instead (the result is the same)
            log.warning("layout sampler: stored ranking unreadable (%s: %s); ranking here", type(e).__name__, e)
            return False
        self._adopt_warm()
        self._prefs = {k: (v if k not in self.bound.choices else
                           next((c for c in self.bound.choices[k] if c == v), v)) for k, v in prefs.items()}
        for i, q in known.items():
            if q is not None:
                self.screen.remember(q, fits=True, estimate_ms=float(ests[i]))
        self._ranking = self._make_ranking(entries, known, refined)
        self.ranking_source = "storage"
        return True

    def _adopt_warm(self) -> bool:
        """In a process forked from one that ranked the layouts for the same target, space and
        :meth:`ranking_key` (``autotune run --workers N``: the parent ranks, then forks the workers), take
        over that sampler's screen (its memory fits, estimates, chunk bounds and cost memos) and its
        space's plan cache: the same pure functions of the plan, already computed for the ranked layouts
        and their settings, which a worker otherwise recomputes when it screens neighbours (issue 26:
        ``neighbours`` of 70B x 64 H100 took ~0.16 s CPU in a worker, ~0.07 s in the process that ranked).
        Only across a fork (another process id: the objects are the child's own copies), so two samplers
        of one process never share a cache. True when adopted."""
        import os

        if not _RANKED_HERE:
            return False
        pid, other = _RANKED_HERE[0]
        if pid == os.getpid() or other is self:
            return False
        mine, theirs = self.screen, other.screen
        try:
            same = (other.ranking_key() == self.ranking_key() and other.bound.choices == self.bound.choices
                    and (theirs.model, theirs.cluster, theirs.workload, theirs.engine)
                    == (mine.model, mine.cluster, mine.workload, mine.engine))
        except Exception:       # noqa: BLE001 - a target that cannot be compared: no adoption
            same = False
        if not same:
            return False
        self.screen = theirs
        self._plan_cache = other._plan_cache
        return True

    def _store_ranking(self, study: optuna.Study) -> None:
        from autotune.files import plain

        r = self._ranking
        assert r is not None
        knobs = {i: a for i, a, _ in self._entries}
        doc = {"key": self.ranking_key(), "prefs": plain(self._prefs),
               "layouts": [[i, plain(knobs[i]), b, final] for i, b, final in r.state()],
               "screened": [[i, plain(q.to_dict()) if q is not None else None,
                             self.screen.estimate_ms(q) if q is not None else None]
                            for i, q in sorted(r.screened.items())]}
        try:
            study._storage.set_study_system_attr(study._study_id, RANKING_ATTR, doc)
        except Exception as e:          # a storage that refuses it: every worker ranks for itself
            log.warning("layout sampler: cannot store the ranking (%s: %s)", type(e).__name__, e)
        import os

        _RANKED_HERE[:] = [(os.getpid(), self)]

    def _neighbours_key(self, base: Plan) -> str:
        import hashlib

        import json

        key = json.dumps(base.to_dict(), sort_keys=True, default=str)
        return NEIGHBOURS_ATTR + hashlib.sha256(key.encode()).hexdigest()[:16]

    def _load_neighbours(self, base: Plan) -> list[Plan] | None:
        """The ranked neighbours of ``base`` another worker stored (study system attribute
        :data:`NEIGHBOURS_ATTR` + a hash of the plan, under this ranking's key), or None: workers share the
        neighbours' screening (memory checks and estimates of ~100-400 plans per base) as they share the
        layout ranking; their estimates are remembered by this worker's screen."""
        study = self._study
        if study is None:
            return None
        try:
            key = self._neighbours_key(base)
            got = study_attr(study, key)    # one attribute, not every base's neighbours and the ranking
            if not isinstance(got, dict) or got.get("key") != self.ranking_key():
                got = self._wait_for_neighbours(study, key, study_attr(study, key + BUSY_SUFFIX))
            if got is None:
                return None
            out = []
            for d, e in got["plans"]:
                q = self._canonical(Plan.from_dict(d))
                self.screen.remember(q, fits=True, estimate_ms=float(e))
                out.append(q)
            return out
        except Exception as e:          # unreadable: compute here (the same result)
            log.warning("layout sampler: stored neighbours unreadable (%s: %s)", type(e).__name__, e)
            return None

    def _wait_for_neighbours(self, study: optuna.Study, key: str, busy: Any) -> dict[str, Any] | None:
        """The neighbours document ``key`` once the worker that marked itself screening them (``busy``: its
        :data:`BUSY_SUFFIX` attribute) has stored it, or None, then marked as this worker's to screen.

        Why (issue 26): workers reach local search together (trials 8-11 of ``--workers 4``) and each
        screened the best plan's neighbours at once (3-4 times, ~0.1-0.3 s CPU each on 70B). A worker that
        sees another's fresh mark polls the stored neighbours (one study attribute every 50 ms, sleeping in
        between) for up to :data:`NEIGHBOURS_WAIT_S`; a mark older than :data:`BUSY_STALE_S` (its worker died)
        or a wait that runs out means screening here. Two workers that mark at once both screen (the same
        result, as before); nothing is decided by the mark but who computes."""
        import os
        import time

        me = f"{os.uname().nodename}:{os.getpid()}"
        deadline = time.monotonic() + NEIGHBOURS_WAIT_S
        if isinstance(busy, dict) and busy.get("by") != me and busy.get("key") == self.ranking_key() \
                and 0 <= time.time() - float(busy.get("at", 0)) < BUSY_STALE_S:
            while time.monotonic() < deadline:
                from autotune.signals import interrupted

                if interrupted():
                    raise KeyboardInterrupt
                time.sleep(0.05)
                got = study_attr(study, key)
                if isinstance(got, dict) and got.get("key") == self.ranking_key():
                    return got
        study._storage.set_study_system_attr(study._study_id, key + BUSY_SUFFIX,
                                             {"by": me, "at": time.time(), "key": self.ranking_key()})
        return None

    def _store_neighbours(self, base: Plan, ranked: list[Plan]) -> None:
        study = self._study
        if study is None:
            return
        from autotune.files import plain

        doc = {"key": self.ranking_key(), "plans": [[plain(q.to_dict()), self.screen.estimate_ms(q)] for q in ranked]}
        try:
            study._storage.set_study_system_attr(study._study_id, self._neighbours_key(base), doc)
        except Exception as e:          # a storage that refuses it: every worker screens for itself
            log.warning("layout sampler: cannot store neighbours (%s: %s)", type(e).__name__, e)


def rdb_internals(storage: Any) -> tuple[Any, Any, Any] | None:
    """(the ``RDBStorage`` behind ``storage``, ``optuna.storages._rdb.models``, ``_create_scoped_session``) for
    reading or writing Optuna's tables in one session (Optuna 5.0, optuna/storages/_rdb/storage.py), or None
    where ``storage`` (an ``RDBStorage`` or the ``_CachedStorage`` around one) is another kind or Optuna's
    internals moved: the caller then goes through the public storage API. Used by :func:`study_attr`,
    :func:`trials_holding` and :func:`autotune.study.trials.write_trial`."""
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, optuna.storages.RDBStorage):
        return None
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
    except ImportError:
        return None
    return backend, models, _create_scoped_session


def study_attr(study: Any, key: str) -> Any:
    """The study system attribute ``key`` of ``study`` (None if unset): on RDB storages read alone (Optuna's
    ``get_study_system_attrs`` reads and parses every one, the layout ranking and every base's neighbours
    included), elsewhere through the storage."""
    import json

    rdb = rdb_internals(study._storage)
    if rdb is None:
        return study._storage.get_study_system_attrs(study._study_id).get(key)
    backend, models, session_of = rdb
    m = models.StudySystemAttributeModel
    with session_of(backend.scoped_session) as session:
        row = session.query(m.value_json).filter(m.study_id == study._study_id, m.key == key).one_or_none()
    return None if row is None else json.loads(row[0])


def trials_holding(study: Any, value: Any, system_key: str, user_key: str) -> list[int] | None:
    """Numbers of the trials of ``study`` whose system attribute ``system_key`` or user attribute ``user_key``
    is ``value`` (JSON), read straight from Optuna's RDB tables; None where the storage is not an
    ``RDBStorage`` (or its internals differ): read every trial instead.

    Why (issue 26): the claim check (:meth:`autotune.search.sampler.LayoutSampler._claimed_earlier`) read
    every trial, and ``_CachedStorage`` re-reads every RUNNING trial in full (its parameters and attributes):
    with ``--workers 4`` on SQLite ~12 ms per check, here two indexed queries (~1 ms). The attributes hold
    ``json.dumps`` of the value (``RDBStorage._set_trial_attr_without_commit``, optuna/storages/_rdb/storage.py,
    Optuna 5.0), so the same text finds the same value when both were written from the same kind of
    dict (here :func:`autotune.search.sampler.plain_plan`, the ``plan`` user attribute's form too)."""
    import json

    rdb = rdb_internals(study._storage)
    if rdb is None:
        return None
    backend, models, session_of = rdb
    text = json.dumps(value)
    trial = models.TrialModel
    out: list[int] = []
    with session_of(backend.scoped_session) as session:
        for model, key in ((models.TrialSystemAttributeModel, system_key), (models.TrialUserAttributeModel, user_key)):
            out += [n for (n,) in session.query(trial.number).join(model, model.trial_id == trial.trial_id)
                    .filter(trial.study_id == study._study_id, model.key == key, model.value_json == text)]
    return out


__all__ = ["NEIGHBOURS_ATTR", "RANKING_ATTR", "SharedSearch", "rdb_internals", "study_attr", "trials_holding"]
