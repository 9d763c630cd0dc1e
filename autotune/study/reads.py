"""Reading trials from an RDB storage without building SQLAlchemy ORM objects.

Optuna's ``RDBStorage`` reads a trial as one ORM object per row (the trial, each parameter, value, user and
system attribute, intermediate value; ``selectinload``, optuna/storages/_rdb/storage.py ``_get_trials`` and
``get_trial``, Optuna 5.0) and decodes each parameter's distribution JSON once per row. An autotune trial has
~32 such rows (12 parameters, 16 user attributes, 3 system attributes, 1 value), so reading one cost 2-3 ms CPU
on the dev machine, and a run reads every trial several times (``ask`` re-reads the study before each trial;
``Trial.__init__``, ``tell`` and the callbacks read the trial itself): in a 60-trial run of 8B x 8 H200, 180
``get_trial`` calls took 0.58 s and 120 trials read by ``_get_trials`` 0.40 s of 3.8 s CPU (process-time
wrappers, 2026-12-02), and
with ``--workers N`` every worker reads every other worker's trials too (issue 26).

:class:`TrialReadingRDBStorage` reads the same rows with SQLAlchemy Core selects (rows as tuples), one select
per table as Optuna's ``selectinload`` does, in a session of Optuna's own (so each select sees what it would
have seen: on SQLite, whose driver opens no transaction for a select, what was committed when it ran), and
builds the same :class:`~optuna.trial.FrozenTrial` objects; decoded distributions are cached by their JSON
text. ``tests/study/test_reads.py`` checks it against Optuna's own reader on studies with every kind of row.

On a SQLite file its writes (:data:`WRITE_METHODS`) are guarded (issue 37): a file made read-only since it
was opened is refused before the write, and a write refused with "database is locked" is retried
(:data:`LOCKED_RETRIES`), then reported naming the file and the storages made for many writers.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Container

import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import FrozenTrial, TrialState


@functools.lru_cache(maxsize=4096)
def _distribution(distribution_json: str) -> BaseDistribution:
    """A parameter's distribution from its stored JSON (the same text always decodes to an equal one)."""
    return json_to_distribution(distribution_json)


def _trials_where(where: Any) -> Any:
    """The select of the trials' own columns matching ``where`` (a condition on the trials table), by id."""
    import sqlalchemy as sa
    from optuna.storages._rdb.models import TrialModel

    t = TrialModel.__table__
    return sa.select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
                     t.c.datetime_complete).where(where).order_by(t.c.trial_id)


def _children(ids: Any) -> Any:
    """The five child tables of the trials whose id is ``ids`` (a bound parameter) or in it (a subquery), in
    one UNION ALL select of (kind, trial id, row id, text key, int, float, text): one statement where Optuna's
    selectinload issues five; enum columns come back as their member's name."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    str_, int_, float_ = sa.String(), sa.Integer(), sa.Float()

    def part(kind: int, model: Any, row_id: str, key: Any, num: Any, val: Any, text: Any) -> Any:
        tab = model.__table__
        cols = [sa.literal(kind, int_), tab.c.trial_id, tab.c[row_id]] + [
            sa.cast(tab.c[c] if isinstance(c, str) else sa.null(), ty)
            for c, ty in ((key, str_), (num, int_), (val, float_), (text, str_))]
        return sa.select(*cols).where(tab.c.trial_id.in_(ids) if isinstance(ids, sa.ScalarSelect)
                                      else tab.c.trial_id == ids)

    return sa.union_all(
        part(0, models.TrialParamModel, "param_id", "param_name", None, "param_value", "distribution_json"),
        part(1, models.TrialValueModel, "trial_value_id", None, "objective", "value", "value_type"),
        part(2, models.TrialUserAttributeModel, "trial_user_attribute_id", "key", None, None, "value_json"),
        part(3, models.TrialSystemAttributeModel, "trial_system_attribute_id", "key", None, None, "value_json"),
        part(4, models.TrialIntermediateValueModel, "trial_intermediate_value_id", None, "step",
             "intermediate_value", "intermediate_value_type"))


@functools.lru_cache(maxsize=1)
def _statements() -> dict[str, Any]:
    """:meth:`TrialReadingRDBStorage.get_trial`'s two statements, built once with a bound ``trial_id``
    (3 of a simulated trial's 4 reads): building them per read was ~40% of its CPU (process-time cProfile of
    200 ``get_trial`` calls on an 8B study, 2026-12-02: 1.1-1.2 -> 0.31-0.38 ms a read). Reads of several
    trials keep a statement per call: their condition varies, and binding their ids as a list instead measured
    slower (4.7-6.1 ms against 3.8-4.4 ms to read 20 trials; the SQL text then changes with the ids' number)."""
    import sqlalchemy as sa
    from optuna.storages._rdb.models import TrialModel

    tid = sa.bindparam("trial_id")
    return {"one": _trials_where(TrialModel.__table__.c.trial_id == tid), "children": _children(tid)}


class TrialReadingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's :class:`~optuna.storages.RDBStorage` whose trial reads (``get_trial``, ``_get_trials``, used by
    ``get_all_trials`` and by Optuna's ``_CachedStorage``) select rows with SQLAlchemy Core instead of loading
    ORM objects (module docstring). Same arguments, same results, same errors: a missing trial or study raises
    ``KeyError``, a database error Optuna's ``StorageInternalError`` (both through Optuna's own session helper).
    Writes are Optuna's."""

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        #: the SQLite file of a writable ``sqlite:///PATH`` URL (writes are checked and retried: WRITE_METHODS)
        self._sqlite_file: str | None = None
        if url.startswith("sqlite:///") and "mode=ro" not in url and ":memory:" not in url:
            import urllib.parse
            path = url[len("sqlite:///"):].partition("?")[0]
            path = urllib.parse.unquote(path[len("file:"):]) if path.startswith("file:") else path
            self._sqlite_file = path or None
        super().__init__(url, *args, **kwargs)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        from optuna.storages._rdb.models import NOT_FOUND_MSG
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(self.scoped_session) as session:
            trials = self._read(session, _statements()["one"], {"trial_id": trial_id})
        if not trials:
            raise KeyError(NOT_FOUND_MSG)
        return trials[0]

    def _get_trials(self, study_id: int, states: Container[TrialState] | None, included_trial_ids: set[int],
                    trial_id_greater_than: int) -> list[FrozenTrial]:
        """Optuna's ``RDBStorage._get_trials``: the study's trials (in ``states``, if given) whose id is
        > ``trial_id_greater_than`` or in ``included_trial_ids`` (ids <= it), by trial id; all of them when
        ``trial_id_greater_than`` is -1. ``KeyError`` if the study does not exist."""
        import sqlalchemy as sa
        from optuna.storages._rdb.models import StudyModel, TrialModel
        from optuna.storages._rdb.storage import _create_scoped_session

        t = TrialModel.__table__
        included = sorted(i for i in included_trial_ids if i <= trial_id_greater_than)
        cond = t.c.study_id == study_id
        if states is not None:
            cond = sa.and_(cond, t.c.state.in_(list(states)))   # type: ignore[call-overload]
        with _create_scoped_session(self.scoped_session) as session:
            StudyModel.find_or_raise_by_id(study_id, session)
            if included and trial_id_greater_than > -1:
                try:
                    return self._read(session, _trials_where(sa.and_(cond, sa.or_(
                        t.c.trial_id.in_(included), t.c.trial_id > trial_id_greater_than))))
                except sa.exc.OperationalError:
                    # too many ids for one IN (the database's limit on bound variables): as Optuna does,
                    # read the study's trials and keep the wanted ones
                    session.rollback()
                    keep = set(included)
                    return [x for x in self._read(session, _trials_where(cond))
                            if x._trial_id in keep or x._trial_id > trial_id_greater_than]
            if trial_id_greater_than > -1:
                cond = sa.and_(cond, t.c.trial_id > trial_id_greater_than)
            return self._read(session, _trials_where(cond))

    @staticmethod
    def _read(session: Any, trials_select: Any, params: dict[str, Any] | None = None) -> list[FrozenTrial]:
        """The trials ``trials_select`` selects (:func:`_trials_where`, or :func:`_statements`' ``one`` with
        ``params``, its ``trial_id``), by trial id, read in ``session``: the trials, then their child rows in one
        statement."""
        from optuna.storages._rdb import models

        rows = session.execute(trials_select, params or {}).all()
        if not rows:
            return []
        if params is not None:          # get_trial's
            children = session.execute(_statements()["children"], params)
        else:
            children = session.execute(_children(trials_select.with_only_columns(
                trials_select.selected_columns[0]).order_by(None).scalar_subquery()))
        got: list[dict[int, list[Any]]] = [{}, {}, {}, {}, {}]
        for kind, trial_id, row_id, key, num, val, text in sorted(children, key=lambda r: (r[0], r[2])):
            got[kind].setdefault(trial_id, []).append((key, num, val, text))
        params_ = {t: [(k, v, dj) for k, _, v, dj in rs] for t, rs in got[0].items()}
        value_type = models.TrialValueModel.TrialValueType
        values = {t: [(n, v, value_type[vt]) for _, n, v, vt in rs] for t, rs in got[1].items()}
        user = {t: [(k, j) for k, _, _, j in rs] for t, rs in got[2].items()}
        system = {t: [(k, j) for k, _, _, j in rs] for t, rs in got[3].items()}
        inter_type = models.TrialIntermediateValueModel.TrialIntermediateValueType
        inter = {t: [(n, v, inter_type[vt]) for _, n, v, vt in rs] for t, rs in got[4].items()}
        to_value = models.TrialValueModel.stored_repr_to_value
        to_inter = models.TrialIntermediateValueModel.stored_repr_to_intermediate_value
        trials = []
        for trial_id, number, state, start, complete in rows:
            vs = values.get(trial_id)
            vals: list[float] | None = None
            if vs:
                vals = [0.0] * len(vs)
                for objective, v, vt in vs:
                    vals[objective] = to_value(v, vt)
            ps = params_.get(trial_id, ())
            dists = {name: _distribution(dj) for name, _, dj in ps}
            trials.append(FrozenTrial(
                number=number, state=state, value=None, values=vals, datetime_start=start,
                datetime_complete=complete,
                params={name: dists[name].to_external_repr(v) for name, v, _ in ps}, distributions=dists,
                user_attrs={k: json.loads(v) for k, v in user.get(trial_id, ())},
                system_attrs={k: json.loads(v) for k, v in system.get(trial_id, ())},
                intermediate_values={s: to_inter(v, vt) for s, v, vt in inter.get(trial_id, ())},
                trial_id=trial_id))
        return trials


#: Optuna ``RDBStorage`` methods that write (optuna/storages/_rdb/storage.py, Optuna 5.0)
WRITE_METHODS = ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
                 "create_new_trial", "set_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
                 "set_trial_user_attr", "set_trial_system_attr", "record_heartbeat")
#: times a write that SQLite refused with "database is locked" is tried again (each try already waits up to
#: the busy timeout, ``connect_args={"timeout": 60}`` in :func:`autotune.study.storage.open_storage`; SQLite
#: answers some conflicts at once, without waiting: a WAL reader that must become a writer after another
#: connection wrote, SQLITE_BUSY_SNAPSHOT, https://www.sqlite.org/rescode.html#busy_snapshot)
LOCKED_RETRIES = 8


def _locked(e: BaseException) -> bool:
    seen = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if "database is locked" in str(x).lower() or "database table is locked" in str(x).lower():
            return True
        x = x.__cause__ or x.__context__
    return False


def _guarded_write(name: str):
    base = getattr(optuna.storages.RDBStorage, name)

    @functools.wraps(base)
    def write(self, *args: Any, **kwargs: Any) -> Any:
        path = getattr(self, "_sqlite_file", None)
        if path is None:
            return base(self, *args, **kwargs)
        _check_writable(path)
        import random
        import time

        for attempt in range(LOCKED_RETRIES + 1):
            try:
                return base(self, *args, **kwargs)
            except Exception as e:
                if not _locked(e) or attempt == LOCKED_RETRIES:
                    if _locked(e):
                        from autotune.errors import StorageError
                        from autotune.files import excerpt
                        raise StorageError(
                            f"storage sqlite:///{excerpt(path)}: the SQLite file stayed locked by other processes "
                            f"through {LOCKED_RETRIES + 1} tries of up to 60 s each (database is locked); SQLite lets "
                            "one process write at a time: for many workers use journal:PATH (a file with locks, "
                            "no server) or postgresql:// (finished trials are kept)") from None
                    raise
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    return write


def _check_writable(path: str) -> None:
    """Refuse to write to the SQLite file ``path`` once it was made read-only (no write permission bit left,
    or this user may not write it): a process with the file open could otherwise go on writing through its
    open descriptor (and root ignores permission bits altogether), so a user's ``chmod a-w`` mid-run went
    unnoticed. Checked before each write (one ``stat``, ~2 us).

    Raises:
        StorageError: naming the file and its mode.
    """
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return          # gone or unreadable: the write itself reports it
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        from autotune.errors import StorageError
        from autotune.files import excerpt
        raise StorageError(f"storage sqlite:///{excerpt(path)}: the file was made read-only during the run (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); nothing more is written to it (the trials stored so far "
                           "are kept): make it writable (chmod u+w) and run again")


for _name in WRITE_METHODS:
    setattr(TrialReadingRDBStorage, _name, _guarded_write(_name))


__all__ = ["TrialReadingRDBStorage"]
