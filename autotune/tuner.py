"""The tuner: one Optuna study per model, cluster and workload, maximizing MFU.

Study name: ``<model>/<gpu>x<count>/<fabric>/<workload.label>`` (e.g.
``llama3.1-405b/b200x1024/nvlink5+ib-ndr400/seq8192-gbs2048``), with ``/space=<name>`` and
``/backend=<name>`` appended when they are not ``default`` / ``simulated`` (a different space has
different parameter choices, which one Optuna study cannot mix). The study's ``user_attrs`` hold the
model, GPU, GPU count, fabric, workload, space and backend, so a study can be re-opened (``export``,
``show``, ``retune``) from the storage alone. Storage: ``sqlite:///studies/autotune.db`` by default.

Per trial (:meth:`Tuner.objective`):

* the plan is sampled from the search space (:class:`~autotune.search_space.BoundSearchSpace`);
  an invalid combination is pruned (``TrialPruned``) with ``user_attrs['pruned_reason']``;
* the evaluator (``simulated`` | ``measured`` | ``real``, :func:`make_evaluator`) returns a
  :class:`~autotune.evaluator.StepResult`; a plan that does not fit in memory is COMPLETE with value 0,
  ``user_attrs['feasible'] = False`` and ``infeasible_reason``, and the Optuna constraint
  ``memory_over_capacity_gib`` > 0 (``trial.set_constraint``, Optuna 5), so it is never the best;
* the value is the MFU (causal convention, :mod:`autotune.flops`); user_attrs hold ``step_time_ms``,
  ``mfu``, ``mfu_palm``, ``hfu``, ``tokens_per_s_per_gpu``, ``tflops_per_gpu``, ``peak_memory_bytes``,
  ``memory_per_stage_bytes``, ``breakdown_ms``, ``backend``, ``details`` and ``plan`` (the full plan);
* an unexpected exception marks the trial FAIL with ``user_attrs['fail_reason']`` and the study goes on.

The best plan is the highest MFU among COMPLETE feasible trials (:func:`best_trial`). If there is none,
:meth:`Tuner.optimize` raises :class:`~autotune.errors.NoFeasiblePlanError` ("N/N trials failed:
<most common reason>"); the study stays saved.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import re
import signal
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.engines import DEFAULT_ENGINE, resolve_engine
from autotune.errors import AutotuneError, ConfigError, NoFeasiblePlanError, PlanError, StorageError
from autotune.evaluator import Evaluator, StepResult
from autotune.hardware import ClusterSpec, FabricSpec, fabric_from_dict, get_gpu, make_cluster
from autotune.models import ModelSpec
from autotune.plan import Plan, PlanDocument, Workload, _plain
from autotune.search_space import BoundSearchSpace, Pruned, SearchSpace
from autotune.storage_check import user_url

log = logging.getLogger(__name__)

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
DEFAULT_BACKEND = "simulated"
MEMORY_CONSTRAINT = "memory_over_capacity_gib"
#: The objective's name in optuna-dashboard (``study.set_metric_names``).
METRIC_NAMES = ["MFU (causal)"]
DASHBOARD_CONSTRAINTS_KEY = "constraints"
#: samplers a Tuner can use (Tuner._sampler)
SAMPLERS = ("layout", "tpe")
GIB = 2**30

#: backend name -> (module, class) imported lazily, or a factory ``f(*, model, cluster, workload, **opts)``.
BACKENDS: dict[str, tuple[str, str] | Callable[..., Evaluator]] = {
    "simulated": ("autotune.simulator", "SimulatedEvaluator"),
    "measured": ("autotune.profiling.measured", "MeasuredEvaluator"),
    "real": ("autotune.runtime.evaluator", "RealEvaluator"),
}


def debug_enabled() -> bool:
    return os.environ.get("AUTOTUNE_DEBUG", "") not in ("", "0")


# ------------------------------------------------------------------ evaluators
def make_evaluator(backend: str, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                   **opts: Any) -> Evaluator:
    """Build the evaluator for ``backend`` (``simulated``, ``measured`` or ``real``).

    The implementation module is imported only here, so the CLI starts without torch.

    Raises:
        ConfigError: unknown backend (lists the known ones).
        AutotuneError: the backend's module is not installed in this checkout (names the module).
    """
    entry = BACKENDS.get(backend)
    if entry is None:
        raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    if callable(entry):
        return entry(model=model, cluster=cluster, workload=workload, **opts)
    mod_name, cls_name = entry
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise AutotuneError(f"backend {backend!r} is not available: cannot import {mod_name} ({e})") from None
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise AutotuneError(f"backend {backend!r} is not available: {mod_name} has no {cls_name}")
    return cls(model=model, cluster=cluster, workload=workload, **opts)


# ------------------------------------------------------------------ storage
_STORAGES: dict[tuple[str, int | None], optuna.storages.BaseStorage] = {}

#: Errors of concurrent first use of one database (two processes creating Optuna's tables or the same
#: study at once): SQLite "table ... already exists" / "UNIQUE constraint failed: alembic_version",
#: PostgreSQL UniqueViolation / "duplicate key"; seen with 32 processes on a fresh file (issue 11).
_RACE_MARKERS = ("already exists", "unique constraint", "uniqueviolation", "duplicate key", "database is locked",
                 "integrityerror")
_RACE_RETRIES = 20

#: ``pip install`` hint per SQLAlchemy dialect whose driver is missing.
_DRIVER_EXTRAS = {"postgresql": "autotune[postgres]  (psycopg 3; or use postgresql+psycopg2:// with psycopg2)"}


def _is_race(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(m in text for m in _RACE_MARKERS)


#: the signal (SIGINT / SIGTERM) received while tuning, once one arrived: a signal that lands inside an
#: SQLite call surfaces there as ``sqlite3.OperationalError: interrupted`` (wrapped by SQLAlchemy and
#: Optuna), which a trial's ``catch=(Exception,)`` would record as a failed trial and tuning would go
#: on; the flag makes the next trial boundary (and the study opening) raise KeyboardInterrupt instead.
_INTERRUPT: dict[str, int] = {}


def note_interrupt(signum: int) -> None:
    """Record that ``signum`` arrived (the CLI's and :meth:`Tuner.optimize`'s signal handlers call it)."""
    _INTERRUPT["sig"] = int(signum)


def interrupted() -> int | None:
    """The signal number recorded by :func:`note_interrupt` since :func:`clear_interrupt`, or None."""
    return _INTERRUPT.get("sig")


def clear_interrupt() -> None:
    _INTERRUPT.clear()


#: path fragments of code a KeyboardInterrupt must not be raised into: SQLAlchemy's connection pool
#: returns and resets connections from garbage-collector finalizers (pool/base.py ``_finalize_fairy``),
#: catches what they raise and logs it as "Exception during reset or similar" with a traceback, so an
#: interrupt raised there is both printed and lost; its event registry runs weakref callbacks
#: (event/registry.py ``_collection_gced``, whose interrupt Python prints as "Exception ignored in"), and a
#: transaction cut in the middle leaves a trial half written: no SQLAlchemy code is interrupted.
_NO_RAISE_PATHS = (f"{os.sep}sqlalchemy{os.sep}",)

#: set while :meth:`Tuner.objective` evaluates a plan: only then does the tuning signal handler raise
#: (:func:`_trial_interrupt_handler`); elsewhere (the sampler, Optuna's ask/tell storage writes) a signal is
#: only noted, and the next trial boundary raises it, so a trial is never left RUNNING in the storage.
_IN_OBJECTIVE: dict[str, bool] = {}


def safe_to_raise(frame: Any) -> bool:
    """Whether a signal handler may raise KeyboardInterrupt into ``frame`` (the frame a signal
    interrupted): False when any frame on its stack runs code under :data:`_NO_RAISE_PATHS` or is a
    ``__del__`` finalizer. The interrupt is then only noted (:func:`note_interrupt`), and the next
    trial boundary (the ``count`` callback in :meth:`Tuner.optimize`) raises it."""
    f = frame
    while f is not None:
        code = f.f_code
        if code.co_name == "__del__" or any(m in code.co_filename for m in _NO_RAISE_PATHS):
            return False
        f = f.f_back
    return True


def _interrupt_handler(signum: int, frame: Any) -> None:
    note_interrupt(signum)
    if safe_to_raise(frame):
        raise KeyboardInterrupt


def _trial_interrupt_handler(signum: int, frame: Any) -> None:
    """SIGINT / SIGTERM while :meth:`Tuner.optimize` runs: noted; raised (KeyboardInterrupt) only inside a
    trial's objective (Optuna then tells the trial FAIL, optuna/study/_optimize.py ``_run_trial``) and
    where :func:`safe_to_raise` allows; otherwise the next trial boundary raises it."""
    note_interrupt(signum)
    if _IN_OBJECTIVE.get("on") and safe_to_raise(frame):
        raise KeyboardInterrupt


def _retry_races(fn: Callable[[], Any], what: str) -> Any:
    """Call ``fn`` again (up to :data:`_RACE_RETRIES` times, 0.05-1 s apart, jittered) while it fails with
    a concurrent-creation error (:data:`_RACE_MARKERS`); other errors and the last one propagate."""
    import random
    import time

    for attempt in range(_RACE_RETRIES):
        try:
            return fn()
        except optuna.exceptions.DuplicatedStudyError:
            raise
        except Exception as e:  # sqlalchemy IntegrityError / OperationalError / ProgrammingError
            if not _is_race(e) or attempt == _RACE_RETRIES - 1:
                raise
            log.debug("%s: concurrent creation (%s), retrying", what, e)
            time.sleep(min(1.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def storage_kind(url: str) -> str:
    """``sqlite``, ``postgresql``, ``journal`` or the URL's SQLAlchemy dialect (``mysql`` ...)."""
    if url.startswith("journal:"):
        return "journal"
    return url.split(":", 1)[0].split("+", 1)[0]


def check_heartbeat(heartbeat_interval_s: int | None, storage: str, backend: str = DEFAULT_BACKEND) -> None:
    """Refuse a ``--heartbeat-interval`` that cannot be used, before any study is created or written.

    Valid: None (off; the real backend then uses :data:`REAL_HEARTBEAT_INTERVAL_S` on RDB storages), or an
    integer >= 1 s on an RDB storage (Optuna's heartbeat is implemented by ``RDBStorage`` only,
    optuna/storages/_rdb/storage.py ``heartbeat_interval``; ``JournalStorage`` has none).

    Raises:
        ConfigError: ``heartbeat_interval_s`` < 1 or not an integer; given with a ``journal:`` storage.
    """
    if heartbeat_interval_s is None:
        return
    if isinstance(heartbeat_interval_s, bool) or not isinstance(heartbeat_interval_s, int) or heartbeat_interval_s < 1:
        raise ConfigError(f"--heartbeat-interval must be an integer >= 1 s, got {heartbeat_interval_s!r}")
    if storage_kind(storage) == "journal":
        why = (", so a killed worker's real trial would never be retried" if backend == "real" else "")
        raise ConfigError(f"--heartbeat-interval {heartbeat_interval_s}: Optuna's journal storage ({storage}) has no "
                          f"heartbeat{why}; leave --heartbeat-interval out, or use sqlite:///PATH or postgresql://")


def open_storage(url: str = DEFAULT_STORAGE, *, heartbeat_interval_s: int | None = None
                 ) -> optuna.storages.BaseStorage:
    """Open (and cache per process) the Optuna storage at ``url``.

    ``url``: an SQLAlchemy URL (``sqlite:///PATH``, ``postgresql://user@host:port/db``: psycopg 3 from the
    ``autotune[postgres]`` extra, ``postgresql+psycopg2://`` for psycopg2, ...) or ``journal:PATH``:
    Optuna's :class:`~optuna.storages.JournalStorage` on a :class:`~optuna.storages.journal.JournalFileBackend`
    file (append-only log with file locks; for clusters with a shared file system and no database server).
    For the default URL the ``studies/`` directory is created if missing; for any other SQLite or journal
    path the directory must exist and be writable. Creating the tables is retried when another process
    creates them at the same time.

    ``heartbeat_interval_s``: RDB storages only (Optuna's heartbeat is implemented by RDBStorage, not by
    JournalStorage): each running trial records a heartbeat every that many seconds; a trial whose last
    heartbeat is older than 2 x the interval is failed by the next worker that asks for a trial and
    re-enqueued once with the same parameters (``RetryHeartbeatStaleTrialCallback(max_retry=1)``;
    optuna/storages/_rdb/storage.py ``heartbeat_interval``, optuna/storages/_callbacks.py).

    Raises:
        StorageError: the URL and the cause (missing or read-only directory, bad URL, missing database driver:
            names the extra to install, server unreachable).
    """
    key = (url, heartbeat_interval_s)
    if key in _STORAGES:
        return _STORAGES[key]
    from autotune.storage_check import is_readonly_url
    shown = user_url(url)       # errors name the user's --storage, not the internal read-only URL
    readonly = is_readonly_url(url)   # mode=ro: opened as is (never created, never switched to WAL)
    kind = storage_kind(url)
    if (kind == "sqlite" and not readonly) or kind == "journal":
        path = url[len("sqlite:///"):] if kind == "sqlite" else url[len("journal:"):]
        if kind == "sqlite" and not url.startswith("sqlite:///"):
            raise StorageError(f"cannot open study storage {shown}: expected sqlite:///PATH")
        if kind == "journal" and not path:
            raise StorageError(f"cannot open study storage {shown}: expected journal:PATH (a log file)")
        if path and path != ":memory:":
            d = Path(path).parent if Path(path).parent != Path("") else Path(".")
            if url == DEFAULT_STORAGE:
                with contextlib.suppress(OSError):
                    d.mkdir(parents=True, exist_ok=True)
            if not d.is_dir():
                raise StorageError(f"cannot open study storage {shown}: directory {d} does not exist")
            if not os.access(d, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
                raise StorageError(f"cannot open study storage {shown}: {Path(path) if Path(path).exists() else d} "
                                   "is not writable")
    if kind == "journal":
        from autotune.storage_check import check_journal_file
        check_journal_file(url)     # a directory or a foreign file is refused before Optuna appends to it
        if heartbeat_interval_s is not None:
            raise StorageError(f"{shown}: Optuna's journal storage has no heartbeat, so a killed worker's real trial "
                               "would never be retried; use sqlite:///PATH or postgresql:// for --backend real")
        from optuna.storages.journal import JournalFileBackend

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage: optuna.storages.BaseStorage = optuna.storages.JournalStorage(
                JournalFileBackend(url[len("journal:"):]))
        _STORAGES[key] = storage
        return storage
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine_kwargs = None
            if kind == "sqlite":
                engine_kwargs = {"connect_args": {"timeout": 60}}
            hb: dict[str, Any] = {}
            if heartbeat_interval_s is not None:
                hb = {"heartbeat_interval": int(heartbeat_interval_s),
                      "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)}
            storage = _retry_races(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **hb),
                                   f"open {url}")
            if kind == "sqlite" and ":memory:" not in url and not readonly:
                _fast_sqlite(storage)
    except ModuleNotFoundError as e:
        raise StorageError(_missing_driver(shown, kind, e)) from None
    except Exception as e:  # sqlalchemy ArgumentError/OperationalError, missing driver ...
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "import" in cause.lower() and ("dbapi" in cause.lower() or "db access module" in cause.lower()
                                          or "no module" in cause.lower()):
            raise StorageError(_missing_driver(shown, kind, e)) from None
        raise StorageError(f"cannot open study storage {shown}: {cause}") from None
    _STORAGES[key] = storage
    return storage


def _missing_driver(url: str, kind: str, e: BaseException) -> str:
    extra = _DRIVER_EXTRAS.get(kind)
    hint = f"pip install '{extra.split('  ')[0]}'" + (f" {extra.split('  ', 1)[1]}" if "  " in extra else "") \
        if extra else "install the SQLAlchemy driver for this dialect"
    return f"cannot open study storage {url}: the database driver is not installed ({e}); {hint}"


def _fast_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """WAL journal + synchronous=NORMAL: a commit no longer waits for fsync (~8 ms each, ~40 per trial).

    Durable against a crash of this process (SQLite WAL guarantees); only a power loss may drop the last
    commits. Applies to every connection the engine opens from now on.
    """
    import sqlalchemy

    engine = storage.engine
    engine.dispose()

    @sqlalchemy.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:  # pragma: no cover - trivial
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


# ------------------------------------------------------------------ naming and study identity
def study_name(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, space_name: str = "default",
               backend: str = DEFAULT_BACKEND, engine: str = DEFAULT_ENGINE) -> str:
    """``<model>/<gpu>x<count>/<fabric>/<engine>/<workload.label>`` (+ ``/space=..``, ``/backend=..`` if
    not default)."""
    name = (f"{model.name.replace('/', '--')}/{cluster.gpu.name}x{cluster.num_gpus}/{cluster.fabric.name}/"
            f"{engine}/{workload.label}")
    if space_name != "default":
        name += f"/space={space_name}"
    if backend != DEFAULT_BACKEND:
        name += f"/backend={backend}"
    return name


@dataclass(frozen=True)
class StudyInfo:
    """What a study was tuned for, read back from its user_attrs (see the module docstring)."""

    name: str
    model: ModelSpec
    gpu: str
    num_gpus: int
    fabric: Mapping[str, Any]
    workload: Workload
    space: str
    backend: str
    n_trials: int = 0
    engine: str = "native"

    @property
    def cluster(self) -> ClusterSpec:
        return ClusterSpec(gpu=get_gpu(self.gpu), num_gpus=self.num_gpus,
                           fabric=fabric_from_dict(self.fabric, where=f"study {self.name}: fabric"))

    @property
    def fabric_name(self) -> str:
        return str(self.fabric.get("name", "?"))

    def same_target(self, other: "StudyInfo") -> bool:
        """Same model, GPU, GPU count, workload, space and backend (the fabric may differ)."""
        return (self.model == other.model and self.gpu == other.gpu and self.num_gpus == other.num_gpus
                and self.workload == other.workload and self.space == other.space
                and self.backend == other.backend and self.engine == other.engine)


#: the LinkSpec fields that decide a fabric's costs (autotune/hardware.py ``LinkSpec``); the link names
#: are labels and are left out
_LINK_FIELDS = ("bandwidth_gbs", "latency_us", "gpus_per_node", "calibration_tier", "nics_per_node", "gpus_per_host")


def _link_values(link: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {k: link.get(k) for k in _LINK_FIELDS}


def fabric_fingerprint(fabric: FabricSpec | Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the fabric's link specs (intra- and inter-node tier, every
    :data:`_LINK_FIELDS` value; not the names): a study remembers which links it was tuned on, so two
    fabric files with one ``name:`` (or a file named like a built-in preset) never share a study.

    ``fabric``: a :class:`FabricSpec` or its ``to_dict()`` form (a study's ``user_attrs['fabric']``).
    """
    import hashlib

    d = fabric.to_dict() if isinstance(fabric, FabricSpec) else fabric
    blob = {"intra_node": _link_values(d.get("intra_node")), "inter_node": _link_values(d.get("inter_node"))}
    return hashlib.sha256(json.dumps(_plain(blob), sort_keys=True, default=str).encode()).hexdigest()[:12]


def _fabric_differences(stored: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """``intra_node.bandwidth_gbs 900 vs 100, ...``: the link fields where ``stored`` and ``given`` differ."""
    out = []
    for tier in ("intra_node", "inter_node"):
        a, b = _link_values(stored.get(tier)), _link_values(given.get(tier))
        if a is None or b is None:
            if (a is None) != (b is None):
                out.append(f"{tier} {'none' if a is None else 'present'} vs {'none' if b is None else 'present'}")
            continue
        out += [f"{tier}.{k} {a[k]:g} vs {b[k]:g}" if isinstance(a[k], (int, float)) and isinstance(b[k], (int, float))
                else f"{tier}.{k} {a[k]} vs {b[k]}" for k in _LINK_FIELDS if a[k] != b[k]]
    return ", ".join(out)


def fabric_speed(fabric: Mapping[str, Any] | FabricSpec) -> tuple[float, float]:
    """Sort key, larger = faster: (inter-node GB/s, intra-node GB/s); no inter-node tier counts as 0."""
    d = fabric.to_dict() if isinstance(fabric, FabricSpec) else fabric
    inter = d.get("inter_node") or {}
    return (float(inter.get("bandwidth_gbs", 0.0)), float((d.get("intra_node") or {}).get("bandwidth_gbs", 0.0)))


def _study_info_from_attrs(name: str, attrs: Mapping[str, Any], n_trials: int = 0) -> StudyInfo | None:
    if attrs.get("autotune_schema") != 1:
        return None
    try:
        return StudyInfo(name=name, model=ModelSpec.from_dict(attrs["model"], source=f"study {name}: model"),
                         gpu=attrs["gpu"], num_gpus=int(attrs["num_gpus"]), fabric=dict(attrs["fabric"]),
                         workload=Workload(**attrs["workload"]), space=attrs.get("space", "default"),
                         backend=attrs.get("backend", DEFAULT_BACKEND), n_trials=n_trials,
                         # studies from before engines were modelled were costed as the native runtime
                         engine=attrs.get("engine", "native"))
    except (KeyError, TypeError, AutotuneError):
        return None


def list_studies(storage: str = DEFAULT_STORAGE) -> list[StudyInfo]:
    """Every autotune study in ``storage`` (studies made by other tools are skipped).

    Raises:
        StorageError: the storage cannot be opened.
    """
    st = open_storage(storage)
    out = []
    with _quiet():
        summaries = optuna.get_all_study_summaries(st, include_best_trial=False)
    for s in summaries:
        info = _study_info_from_attrs(s.study_name, s.user_attrs, s.n_trials)
        if info is not None:
            out.append(info)
    return sorted(out, key=lambda i: i.name)


def load_study(name: str, storage: str = DEFAULT_STORAGE) -> tuple[optuna.Study, StudyInfo]:
    """Open an existing autotune study by name.

    Raises:
        ConfigError: no such study (lists up to 10 that exist); StorageError: storage unreachable.
    """
    st = open_storage(storage)
    try:
        with _quiet():
            study = optuna.load_study(study_name=name, storage=st)
    except KeyError:
        known = [i.name for i in list_studies(storage)]
        raise ConfigError(f"no study named {name!r} in {user_url(storage)}; "
                          + (f"studies there: {', '.join(known[:10])}" if known else "the storage has no studies yet "
                             "(run `autotune run` first)")) from None
    info = _study_info_from_attrs(name, study.user_attrs, len(study.trials))
    if info is None:
        raise ConfigError(f"study {name!r} in {user_url(storage)} was not made by autotune (no autotune user_attrs)")
    return study, info


def check_identity(attrs: Mapping[str, Any], *, name: str, storage: str, space: SearchSpace, fabric: FabricSpec,
                   n_trials: Callable[[], int] | None = None) -> None:
    """Refuse to add trials to a study whose stored fingerprints differ from the given space's and fabric's
    (what ``run``, ``retune`` and ``export`` select the study with).

    The study name holds the search space's and the fabric's *names* only; files may reuse a name with
    other contents. ``space_fingerprint`` (:attr:`SearchSpace.fingerprint`) and ``fabric_fingerprint``
    (:func:`fabric_fingerprint`) in the study's user_attrs must match; a study without them (written
    before they were recorded) is accepted. (A ``--model`` config.json carries its architecture's
    fingerprint in the model name, :func:`autotune.models.model_from_hf_config`.)

    ``n_trials`` (called only for a study without autotune's user_attrs): its number of trials. A study
    with trials and no ``autotune_schema`` was made by another tool (a plain Optuna study that happens to
    have this name): it is refused, not adopted (its trials would be reported as infeasible autotune
    trials, and autotune's attrs written into it). One without trials is one autotune is creating.

    Raises:
        ConfigError: a fingerprint differs (names the study, the storage and what differs), or the study
            was not made by autotune.
    """
    if n_trials is not None and "autotune_schema" not in attrs:
        n = n_trials()
        if n:
            raise ConfigError(f"study {name!r} in {user_url(storage)} was not made by autotune (it has {n} "
                              "trial(s) and no autotune user_attrs); refused, left untouched: use another --storage")
    fp = attrs.get("space_fingerprint")
    if fp is not None and fp != space.fingerprint:
        raise ConfigError(
            f"study {name!r} in {user_url(storage)} was tuned on a different version of search space "
            f"{space.name!r} (fingerprint {fp} vs {space.fingerprint}); give the space "
            "another name, or use another --storage")
    ffp = attrs.get("fabric_fingerprint")
    mine = fabric_fingerprint(fabric)
    if ffp is not None and ffp != mine:
        stored = attrs.get("fabric")
        diff = _fabric_differences(stored, fabric.to_dict()) if isinstance(stored, Mapping) else ""
        raise ConfigError(
            f"study {name!r} in {user_url(storage)} was tuned on fabric {fabric.name!r} with "
            f"different links ({diff or f'fingerprint {ffp} vs {mine}'}, stored vs given); give the fabric "
            "another name, or use another --storage")


# ------------------------------------------------------------------ trials
def is_feasible(trial: FrozenTrial) -> bool:
    """COMPLETE, ``user_attrs['feasible']`` is true and every Optuna constraint is <= 0."""
    return (trial.state == TrialState.COMPLETE and trial.user_attrs.get("feasible") is True
            and all(v <= 0.0 for v in trial.constraints.values()))


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible COMPLETE trials, highest MFU first (ties: earlier trial first)."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible(t)]
    return sorted(trials, key=lambda t: (-float(t.value), t.number))


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The highest-MFU feasible COMPLETE trial, or None (never an infeasible or failed one)."""
    f = feasible_trials(study)
    return f[0] if f else None


def top_feasible_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best distinct feasible plans (a plan evaluated twice counts once)."""
    out, seen = [], set()
    for t in feasible_trials(study):
        key = json.dumps(t.user_attrs.get("plan"), sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(t)
        if len(out) >= k:
            break
    return out


def trial_reason(t: FrozenTrial) -> str | None:
    """Why a trial gives no feasible plan, or None if it does."""
    if is_feasible(t):
        return None
    ua = t.user_attrs
    if t.state == TrialState.PRUNED:
        return f"pruned: {ua.get('pruned_reason', 'no reason recorded')}"
    if t.state == TrialState.FAIL:
        # "failed: ...", not "error: ...": the CLI prints the whole message after its own "error: "
        return f"failed: {ua.get('fail_reason') or t.system_attrs.get('fail_reason', 'unknown error')}"
    if t.state == TrialState.COMPLETE:
        return f"does not fit in memory: {ua.get('infeasible_reason', 'no reason recorded')}"
    return f"not finished ({t.state.name.lower()})"


def was_interrupted(t: FrozenTrial) -> bool:
    """A FAIL trial stopped by a signal (``fail_reason`` "interrupted (signal N)", :meth:`Tuner._objective`
    and :meth:`Tuner._fail_running`), not by its plan."""
    reason = t.user_attrs.get("fail_reason") or t.system_attrs.get("fail_reason") or ""
    return t.state == TrialState.FAIL and isinstance(reason, str) and reason.startswith("interrupted")


def _reason_kind(reason: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def failure_summary(trials: Sequence[FrozenTrial]) -> tuple[int, int, str]:
    """(trials without a feasible plan, all trials, most common reason (an example of the commonest kind)).

    Reasons are grouped with their numbers masked, so "stage 0 needs 190.2 GiB" and "... 201.7 GiB"
    count as one kind.
    """
    reasons = [r for r in (trial_reason(t) for t in trials) if r is not None]
    if not reasons:
        return 0, len(trials), ""
    kinds = Counter(_reason_kind(r) for r in reasons)
    top_kind, count = kinds.most_common(1)[0]
    example = next(r for r in reasons if _reason_kind(r) == top_kind)
    suffix = f" ({count} of them)" if count != len(reasons) else ""
    return len(reasons), len(trials), example + suffix


def trial_result(t: FrozenTrial) -> StepResult:
    """The :class:`StepResult` stored in a COMPLETE trial's user_attrs."""
    ua = t.user_attrs
    return StepResult(backend=ua.get("backend", "?"), feasible=bool(ua.get("feasible")),
                      step_time_ms=float(ua.get("step_time_ms", 0.0)), mfu=float(ua.get("mfu", 0.0)),
                      mfu_palm=float(ua.get("mfu_palm", 0.0)), hfu=float(ua.get("hfu", 0.0)),
                      tokens_per_s_per_gpu=float(ua.get("tokens_per_s_per_gpu", 0.0)),
                      tflops_per_gpu=float(ua.get("tflops_per_gpu", 0.0)),
                      peak_memory_bytes=int(ua.get("peak_memory_bytes", 0)),
                      memory_per_stage_bytes=tuple(ua.get("memory_per_stage_bytes", ())),
                      breakdown_ms=dict(ua.get("breakdown_ms", {})),
                      infeasible_reason=ua.get("infeasible_reason"), details=dict(ua.get("details", {})))


def trial_plan(t: FrozenTrial) -> Plan:
    """The full plan stored in a trial's ``user_attrs['plan']``."""
    d = t.user_attrs.get("plan")
    if d is None:
        raise ConfigError(f"trial {t.number} has no stored plan (it was pruned before a plan was formed)")
    return Plan.from_dict(d, source=f"trial {t.number}")


def prediction_of(result: StepResult) -> dict[str, Any]:
    """The ``prediction`` mapping of a :class:`PlanDocument` (JSON/YAML-safe)."""
    d = result.to_dict()
    return _plain(d)


@dataclass(frozen=True)
class BestPlan:
    """A study's best plan: where it came from, the plan and its evaluation."""

    study: str
    trial_number: int
    plan: Plan
    result: StepResult
    info: StudyInfo

    def document(self) -> PlanDocument:
        """The :class:`PlanDocument` ``autotune export`` writes."""
        return PlanDocument(plan=self.plan, model=self.info.model, gpu=self.info.gpu, num_gpus=self.info.num_gpus,
                            fabric=dict(self.info.fabric), workload=self.info.workload, study=self.study,
                            trial_id=self.trial_number, prediction=prediction_of(self.result),
                            engine=self.info.engine)


def best_plan(study: optuna.Study, info: StudyInfo) -> BestPlan | None:
    t = best_trial(study)
    if t is None:
        return None
    return BestPlan(study=study.study_name, trial_number=t.number, plan=trial_plan(t), result=trial_result(t),
                    info=info)


def require_best_plan(study: optuna.Study, info: StudyInfo, storage: str) -> BestPlan:
    """The best plan or :class:`NoFeasiblePlanError` ("N/N trials gave no feasible plan ...: <most common reason>")."""
    bp = best_plan(study, info)
    if bp is None:
        trials = study.get_trials(deepcopy=False)
        if not trials:
            raise NoFeasiblePlanError(f"study {study.study_name!r} in {user_url(storage)} has no trials yet; run "
                                      "`autotune run` with the same options first")
        stopped = [t for t in trials if was_interrupted(t)]
        if len(stopped) == len(trials):
            # nothing was learnt about the space: widening it would be the wrong advice
            raise NoFeasiblePlanError(
                f"study {study.study_name!r} in {user_url(storage)} has no feasible plan: the only "
                + ("trial was " if len(trials) == 1 else f"{len(trials)} trials were ")
                + (trial_reason(stopped[0]) or "failed: interrupted").removeprefix("failed: ")
                + "; run again (`autotune run` with the same options) to tune it")
        n_bad, n, reason = failure_summary(trials)
        raise NoFeasiblePlanError(f"{n_bad}/{n} trials gave no feasible plan (pruned, out of memory or failed): "
                                  f"{reason}. Study {study.study_name!r} is kept in "
                                  f"{user_url(storage)}; widen the search space (--space), add GPUs or shrink the batch")
    return bp


# ------------------------------------------------------------------ quiet context
@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence Optuna's per-trial INFO logs, experimental warnings and plan "no effect" warnings.

    With ``AUTOTUNE_DEBUG=1`` Optuna keeps WARNING level (failed trials print their traceback).
    """
    prev = optuna.logging.get_verbosity()
    plan_log = logging.getLogger("autotune.plan")
    prev_plan = plan_log.level
    optuna.logging.set_verbosity(optuna.logging.WARNING if debug_enabled() else optuna.logging.ERROR)
    if not debug_enabled():
        plan_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.filterwarnings("ignore", message=".*[Ff]ixed parameter.*")
            warnings.filterwarnings("ignore", message=".*enqueue.*")
            yield
    finally:
        optuna.logging.set_verbosity(prev)
        plan_log.setLevel(prev_plan)


# ------------------------------------------------------------------ the tuner
@dataclass(frozen=True)
class TuneSummary:
    """What one :meth:`Tuner.optimize` call did.

    Attributes:
        study: study name; storage: its URL.
        n_new_trials: trials run by this call; n_trials: trials in the study now.
        states: count per outcome over the whole study: feasible, infeasible, pruned, failed.
        best: the best plan of the whole study.
        own_states: the same counts over this call's trials only; worker_id: this worker's index.
    """

    study: str
    storage: str
    n_new_trials: int
    n_trials: int
    states: Mapping[str, int]
    best: BestPlan
    own_states: Mapping[str, int] = field(default_factory=dict)
    worker_id: int = 0


class Tuner:
    """Tunes one model on one cluster for one workload in one Optuna study (module docstring).

    Args (keyword-only):
        model, cluster, workload: what to tune for.
        space: a :class:`SearchSpace`, a space name or YAML path; default ``default``.
        storage: SQLAlchemy URL of the study storage.
        backend: ``simulated`` (default), ``measured`` or ``real``.
        seed: sampler seed (same seed and same study history -> the same trials).
        evaluator: an evaluator to use instead of building one for ``backend``.
        evaluator_options: extra keyword arguments for the backend's evaluator.
        engine: the engine that runs the plans (:mod:`autotune.engines`); None = ``native`` for the
            real backend, else :data:`autotune.engines.DEFAULT_ENGINE`.
        sampler: ``layout`` (default, :class:`autotune.search.LayoutSampler`) or ``tpe``.

    Raises:
        ConfigError: bad space or engine (the real backend runs only ``native``); StorageError: storage unreachable; AutotuneError: backend unavailable
            (when the first plan is evaluated).
    """

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 space: SearchSpace | str | None = None, storage: str = DEFAULT_STORAGE,
                 backend: str = DEFAULT_BACKEND, seed: int | None = 0, evaluator: Evaluator | None = None,
                 evaluator_options: Mapping[str, Any] | None = None, engine: str | None = None,
                 sampler: str = "layout") -> None:
        if sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {sampler!r}; known samplers: {', '.join(SAMPLERS)}")
        self.sampler_name = sampler
        self.model, self.cluster, self.workload = model, cluster, workload
        # an evaluator given without an engine name brings its own
        given = getattr(evaluator, "engine", None) if engine is None else None
        self.engine = given if given is not None else resolve_engine(engine, backend)
        self.space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
        self.bound: BoundSearchSpace = self.space.bind(model=model, num_gpus=cluster.num_gpus, workload=workload,
                                                       gpu=cluster.gpu, engine=self.engine)
        self.storage = storage
        if backend not in BACKENDS:
            raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
        self.backend = backend
        self.seed = seed
        self._evaluator = evaluator
        self._evaluator_options = dict(evaluator_options or {})
        self._cache: dict[Plan, StepResult] = {}
        self.name = study_name(model, cluster, workload, space_name=self.space.name, backend=backend,
                               engine=self.engine.name)
        self._study: optuna.Study | None = None
        self._pending: list[tuple[dict[str, Any], dict[str, Any]]] = []

    # ---- identity
    @property
    def info(self) -> StudyInfo:
        return StudyInfo(name=self.name, model=self.model, gpu=self.cluster.gpu.name, num_gpus=self.cluster.num_gpus,
                         fabric=self.cluster.fabric.to_dict(), workload=self.workload, space=self.space.name,
                         backend=self.backend, engine=self.engine.name)

    def _study_attrs(self) -> dict[str, Any]:
        return {"autotune_schema": 1, "model": self.model.to_dict(), "gpu": self.cluster.gpu.name,
                "num_gpus": self.cluster.num_gpus, "fabric": _plain(self.cluster.fabric.to_dict()),
                "workload": {"seq_len": self.workload.seq_len, "global_batch_size": self.workload.global_batch_size,
                             "dtype": self.workload.dtype},
                "fabric_fingerprint": fabric_fingerprint(self.cluster.fabric),
                "space": self.space.name, "space_fingerprint": self.space.fingerprint, "backend": self.backend,
                "engine": self.engine.name, "excluded_values": self.bound.excluded}

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (created, or resumed if it exists)."""
        if self._study is None:
            st = open_storage(self.storage)
            with _quiet():
                sampler = self._sampler()
                def create() -> optuna.Study:
                    try:
                        return optuna.create_study(study_name=self.name, storage=st, direction="maximize",
                                                   sampler=sampler, load_if_exists=True)
                    except optuna.exceptions.DuplicatedStudyError:  # created by another worker meanwhile
                        return optuna.load_study(study_name=self.name, storage=st, sampler=sampler)
                try:
                    study = _retry_races(create, f"create study {self.name}")
                except Exception as e:
                    if interrupted():       # the interrupt landed inside SQLite (see _INTERRUPT)
                        raise KeyboardInterrupt from None
                    raise StorageError(f"cannot open study {self.name!r} in {self.storage}: {e}") from None
                self._check_identity(study.user_attrs, lambda: len(study.get_trials(deepcopy=False)))
                if study.metric_names is None:
                    study.set_metric_names(METRIC_NAMES)
                if "autotune_schema" not in study.user_attrs:
                    # several workers may do this at once: the same values, retried on a key race
                    for k, v in self._study_attrs().items():
                        _retry_races(lambda k=k, v=v: study.set_user_attr(k, v), f"study {self.name} attrs")
                elif "fabric_fingerprint" not in study.user_attrs:
                    # a study written before fabrics were fingerprinted: accepted, and its fabric recorded now
                    fp = fabric_fingerprint(self.cluster.fabric)
                    _retry_races(lambda: study.set_user_attr("fabric_fingerprint", fp), f"study {self.name} attrs")
            self._study = study
        return self._study

    def _check_identity(self, attrs: Mapping[str, Any], n_trials: Callable[[], int] | None = None) -> None:
        """:func:`check_identity` for this tuner's study, space and fabric.

        Raises:
            ConfigError: a fingerprint differs, or the study has trials but was not made by autotune.
        """
        check_identity(attrs, name=self.name, storage=self.storage, space=self.space, fabric=self.cluster.fabric,
                       n_trials=n_trials)

    def check_existing_study(self) -> None:
        """If this tuner's study already exists in the storage, check it is the same target
        (:meth:`_check_identity`); creates and writes nothing.

        Raises:
            ConfigError: a fingerprint differs; StorageError: the storage cannot be opened.
        """
        st = open_storage(self.storage)
        with _quiet():
            try:
                study_id = st.get_study_id_from_name(self.name)
            except KeyError:
                return
            self._check_identity(st.get_study_user_attrs(study_id),
                                 lambda: len(st.get_all_trials(study_id, deepcopy=False)))

    def _sampler(self) -> optuna.samplers.BaseSampler:
        """The study's sampler (``self.sampler_name``):

        * ``layout`` (default): :class:`autotune.search.LayoutSampler`, seeded; it screens plans with the
          evaluator's op costs when it has them (``costs``), else the shipped calibration;
        * ``tpe``: seeded multivariate TPE with group decomposition (conditional knobs form groups).
        """
        with _quiet():
            if self.sampler_name == "tpe":
                return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True)
            from autotune.search import make_sampler

            costs = getattr(self._evaluator, "costs", None) if self._evaluator is not None else None
            return make_sampler(self.bound, model=self.model, cluster=self.cluster, workload=self.workload,
                                engine=self.engine, costs=costs, seed=self.seed)

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = make_evaluator(self.backend, model=self.model, cluster=self.cluster,
                                             workload=self.workload, engine=self.engine.name,
                                             **self._evaluator_options)
        return self._evaluator

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()

    # ---- evaluation
    def evaluate(self, plan: Plan) -> StepResult:
        """Evaluate ``plan`` on this tuner's cluster (cached per plan within this tuner).

        Raises:
            PlanError: invalid plan.
        """
        if plan not in self._cache:
            with _quiet():
                self._cache[plan] = self.evaluator.evaluate(plan)
        return self._cache[plan]

    def objective(self, trial: optuna.Trial) -> float:
        """Sample, evaluate and record one plan; returns its MFU (0 when it does not fit).

        Inside :meth:`optimize` a SIGINT / SIGTERM raises KeyboardInterrupt only here
        (:func:`_trial_interrupt_handler`): the trial is recorded FAIL with ``fail_reason`` "interrupted
        (signal N)"; one noted before the objective starts (or during a storage write) raises at its next check.
        """
        if not hasattr(self, "_started"):
            self._started: set[int] = set()
        self._started.add(trial._trial_id)
        _IN_OBJECTIVE["on"] = True
        try:
            if interrupted():
                raise KeyboardInterrupt
            return self._objective(trial)
        except KeyboardInterrupt:
            _IN_OBJECTIVE.clear()
            with contextlib.suppress(Exception):
                trial.set_user_attr("fail_reason", f"interrupted (signal {interrupted() or int(signal.SIGINT)})")
            raise
        finally:
            _IN_OBJECTIVE.clear()

    def _objective(self, trial: optuna.Trial) -> float:
        try:
            plan = self.bound.suggest(trial)
        except Pruned as e:
            trial.set_user_attr("pruned_reason", e.reason)
            raise optuna.TrialPruned(e.reason) from None
        trial.set_user_attr("plan", _plain(plan.to_dict()))
        if interrupted():       # noted while the storage write above ran (not raised into SQLAlchemy)
            raise KeyboardInterrupt
        if plan in self._cache:             # the sampler proposed a plan already evaluated in this run
            trial.set_user_attr("reused_result", True)
        try:
            result = self.evaluate(plan)
        except PlanError as e:
            trial.set_user_attr("pruned_reason", str(e))
            raise optuna.TrialPruned(str(e)) from None
        except Exception as e:
            trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}")
            raise
        return record_result(trial, result, capacity_bytes=self.cluster.gpu.usable_hbm_bytes)

    def enqueue(self, trials: Sequence[FrozenTrial], *, source: str) -> int:
        """Queue other trials' params as warm starts for the next :meth:`optimize` (run first, in order).

        Param sets already in the study are skipped when they run (``skip_if_exists``). Returns how many
        were queued.
        """
        for t in trials:
            self._pending.append((dict(t.params), {"warm_start_from": f"{source}#{t.number}"}))
        return len(trials)

    def optimize(self, n_trials: int | None = 200, *, timeout: float | None = None,
                 show_progress_bar: bool | None = None, worker_id: int | None = None,
                 heartbeat_interval_s: int | None = None) -> TuneSummary:
        """Run ``n_trials`` more trials in this process (or until ``timeout`` seconds) and return the study's
        best plan.

        Any number of workers (processes, here or on other hosts) may run this on the same storage at once:
        each samples straight against the shared storage (Optuna's ``_CachedStorage`` over the RDB, re-read
        before every suggestion), so it sees every other worker's finished and running trials. Each trial's
        sampler RNG is seeded from (``seed``, ``worker_id``, trial number) (:func:`trial_seed`): trial numbers
        are unique in a study, so concurrent workers never draw the same random stream, and one worker with
        the same seed on the same history proposes the same trials.

        Args:
            worker_id: this worker's index (``--worker-id``; ``--workers N`` gives 0..N-1); None = 0.
            heartbeat_interval_s: real backend: Optuna heartbeat interval (s) for this process's trials
                (RDB storages); None = :data:`REAL_HEARTBEAT_INTERVAL_S` for ``real``, off otherwise.

        Returns:
            :class:`TuneSummary`: ``n_new_trials`` and ``own_states`` count this call's trials only;
            ``n_trials`` and ``states`` the whole study.

        Raises:
            NoFeasiblePlanError: the study has no feasible plan ("N/N trials failed: <reason>").
            StorageError, ConfigError, AutotuneError: storage, space or backend problems.
        """
        if n_trials is not None and n_trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {n_trials}")
        if n_trials is None and timeout is None:
            raise ConfigError("give a number of trials or a timeout")
        if worker_id is not None and worker_id < 0:
            raise ConfigError(f"--worker-id must be >= 0, got {worker_id}")
        # every option and the backend first: a run that cannot evaluate anything (no GPU for --backend
        # real) or was given a bad option must not leave an empty study behind
        check_heartbeat(heartbeat_interval_s, self.storage, self.backend)
        self.evaluator  # noqa: B018 - fail fast on an unavailable backend, before any trial
        study = self.study
        if heartbeat_interval_s is None and self.backend == "real" and storage_kind(self.storage) != "journal":
            heartbeat_interval_s = REAL_HEARTBEAT_INTERVAL_S
        if show_progress_bar is None:
            show_progress_bar = sys.stdout.isatty()
        self._worker_seed = worker_seed(self.seed, worker_id)
        self._layout_sampler = None
        sampler = TrialSeededSampler(self._seeded_sampler, self._worker_seed)
        with _quiet():
            st = open_storage(self.storage, heartbeat_interval_s=heartbeat_interval_s)
            worker_study = optuna.load_study(study_name=self.name, storage=st, sampler=sampler)
            for params, attrs in self._pending:
                worker_study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            self._pending.clear()

            # With the real backend a trial costs minutes of GPU time while an invalid combination is
            # pruned before anything runs, so there --trials counts the plans that were run (at most
            # REAL_MAX_ATTEMPTS_FACTOR x trials attempts in all); a plan proposed again reuses its result
            # and does not count either.
            count_run = self.backend == "real" and n_trials is not None
            ran = [0]
            mine: list[FrozenTrial] = []

            def count(st_: optuna.Study, ft: FrozenTrial) -> None:
                mine.append(ft)
                if interrupted():           # a signal swallowed inside a trial's storage write
                    raise KeyboardInterrupt
                if count_run and ft.state != TrialState.PRUNED and not ft.user_attrs.get("reused_result"):
                    ran[0] += 1
                    if ran[0] >= n_trials:
                        st_.stop()

            import signal
            import threading

            handlers = {}
            if threading.current_thread() is threading.main_thread():
                # SIGINT (Ctrl-C) and SIGTERM (kill, scancel, run_workers stopping a worker) end the run at a
                # trial boundary or inside the objective, never inside Optuna's ask/tell (a trial created
                # there would stay RUNNING forever); an ignored signal stays ignored
                for sig in (signal.SIGINT, signal.SIGTERM):
                    if signal.getsignal(sig) is not signal.SIG_IGN:
                        handlers[sig] = signal.signal(sig, _trial_interrupt_handler)
            import time as _time

            budget = n_trials * REAL_MAX_ATTEMPTS_FACTOR if count_run else n_trials
            started = _time.monotonic()
            try:
                while True:
                    left = None if budget is None else budget - len(mine)
                    time_left = None if timeout is None else timeout - (_time.monotonic() - started)
                    if (left is not None and left <= 0) or (time_left is not None and time_left <= 0) \
                            or (count_run and ran[0] >= n_trials):
                        break
                    try:
                        worker_study.optimize(self.objective, n_trials=left, timeout=time_left, catch=(Exception,),
                                              show_progress_bar=show_progress_bar, callbacks=[count])
                        break
                    except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as e:
                        if not _lost_enqueued_race(e):
                            raise
                        # another worker finished the same enqueued trial first: on SQLite two workers can
                        # both pop one WAITING trial (Optuna's pop relies on SELECT ... FOR UPDATE, which
                        # SQLite ignores), and telling it again fails. That trial is recorded once, by
                        # the other worker; this one goes on with its remaining trials.
                        continue
            except BaseException:
                self._fail_running(worker_study, "interrupted" if interrupted() else "stopped on an error")
                raise
            finally:
                _IN_OBJECTIVE.clear()
                for sig, h in handlers.items():
                    signal.signal(sig, h)
            if interrupted():
                self._fail_running(worker_study, "interrupted")
                raise KeyboardInterrupt
        trials = self._wait_for_others(study)
        best = require_best_plan(study, self.info, self.storage)
        return TuneSummary(study=self.name, storage=self.storage, n_new_trials=len(mine),
                           n_trials=len(trials), states=_outcome_counts(trials), best=best,
                           own_states=_outcome_counts(mine), worker_id=worker_id or 0)

    def _fail_running(self, study: optuna.Study, why: str) -> None:
        """Mark FAIL (with ``user_attrs['fail_reason']``) the trials this tuner started that are still
        RUNNING in the storage, e.g. when a signal stopped the run between Optuna's ask and tell; other
        workers' trials are left alone. Storage errors here are ignored (the run is ending anyway)."""
        ids = getattr(self, "_started", set())
        if not ids:
            return
        sig = interrupted()
        reason = f"{why} (signal {sig})" if sig else why
        with contextlib.suppress(Exception):
            for t in study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                if t._trial_id in ids:
                    with contextlib.suppress(Exception):
                        study._storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
                        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)

    def _wait_for_others(self, study: optuna.Study, poll_s: float = 0.5) -> list[FrozenTrial]:
        """The study's trials, once it has a feasible one or no other worker's trial is still running.

        A worker whose own trials found nothing feasible does not declare the study hopeless while other
        workers' trials are still running (issue 11: 1 of 32 concurrent runs exited with "no feasible
        plan" while 23 trials were running); it waits for them (their evaluators enforce their own
        timeouts; a killed worker's trial is failed by the heartbeat, or stays RUNNING without one:
        that is why the wait also ends when the running set stops changing for 10 minutes).
        """
        import time

        last, since = None, time.monotonic()
        while True:
            trials = study.get_trials(deepcopy=False)
            running = frozenset(t.number for t in trials if t.state == TrialState.RUNNING)
            if not running or any(is_feasible(t) for t in trials):
                return trials
            if running != last:
                last, since = running, time.monotonic()
            elif time.monotonic() - since > 600:
                return trials
            if interrupted():       # noted while a finalizer ran (see safe_to_raise): stop waiting
                raise KeyboardInterrupt
            time.sleep(poll_s)

    def _seeded_sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        """:meth:`_sampler` built with ``seed`` instead of ``self.seed``.

        The layout sampler keeps what it computed once per study (the ranked layouts, screened plans,
        neighbours), so it is built once per :meth:`optimize` call, seeded per worker; only its random
        fallback takes the per-trial seed; its ranking uses the study's seed in every worker.
        """
        if self.sampler_name == "layout":
            # the layout ranking (and its seeded tie-breaking) is the study's, the same in every worker, so
            # that trial n means the same layout everywhere; only the random fallback is per trial
            inst = getattr(self, "_layout_sampler", None)
            if inst is None:
                inst = self._layout_sampler = self._sampler()
            inst._random = optuna.samplers.RandomSampler(seed=seed)
            return inst
        saved = self.seed
        self.seed = seed
        try:
            return self._sampler()
        finally:
            self.seed = saved


def _outcome_counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
    """feasible / infeasible / pruned / failed counts of ``trials`` (running and waiting ones are not counted)."""
    states: Counter = Counter()
    for t in trials:
        if is_feasible(t):
            states["feasible"] += 1
        elif t.state == TrialState.COMPLETE:
            states["infeasible"] += 1
        elif t.state == TrialState.PRUNED:
            states["pruned"] += 1
        elif t.state == TrialState.FAIL:
            states["failed"] += 1
    return dict(states)


def _mix(*keys: Any) -> int:
    """A 32-bit seed from ``keys`` (SHA-256 of their repr; stable across processes, unlike ``hash``)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(repr(keys).encode()).digest()[:4], "little")


def worker_seed(seed: int | None, worker_id: int | None) -> int | None:
    """The seed of worker ``worker_id``: ``seed`` itself for worker 0 (or None), else a 32-bit mix of both;
    None when ``seed`` is None (unseeded)."""
    if seed is None:
        return None
    return seed if not worker_id else _mix("worker", seed, worker_id)


def _lost_enqueued_race(e: BaseException) -> bool:
    """True if ``e`` is Optuna refusing to finish a trial that another worker already finished
    (``optuna/study/_tell.py``: "Cannot tell a COMPLETE trial."; the storage's
    ``UpdateFinishedTrialError``): the SQLite race on a shared enqueued trial, not a failure."""
    if isinstance(e, optuna.exceptions.UpdateFinishedTrialError):
        return True
    return isinstance(e, ValueError) and str(e).startswith("Cannot tell a ")


def trial_seed(seed: int | None, trial_number: int) -> int | None:
    """The sampler seed for trial ``trial_number`` of a worker whose seed is ``seed`` (None: unseeded)."""
    return None if seed is None else _mix("trial", seed, trial_number)


#: random redraws of a proposal that repeats an existing trial (:class:`TrialSeededSampler`)
REDRAWS = 8


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """Delegates to ``make(trial_seed(seed, trial.number))``, a sampler built anew before every trial;
    a proposal that would repeat an existing trial's parameters (finished or running, any worker's) is
    redrawn at random (seeded from the trial number) up to :data:`REDRAWS` times.

    Why: workers sharing one study must not draw the same random numbers (issue 11: 32 workers with one
    seed evaluated 4 distinct plans), and ``--seed`` must stay reproducible. Trial numbers are unique within
    a study (Optuna assigns them in the storage), so seeding each trial's draw from its number gives every
    concurrent trial its own stream; the history the sampler models comes from the storage every time.
    ``make`` must return a sampler whose only state across trials is its RNG (TPE, random, QMC ...).
    """

    def __init__(self, make: Callable[[int | None], optuna.samplers.BaseSampler], seed: int | None) -> None:
        self._make, self._seed = make, seed
        self._inner = make(seed)
        self._view: _SnapshotStudy | None = None
        self._index: tuple[Any, Any] | None = None
        self._finished_sets: dict[int, frozenset] = {}      # by trial id: a finished trial's params stay

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self._seed is not None:
            self._inner = self._make(trial_seed(self._seed, trial.number))
        self._view = _SnapshotStudy(study)
        self._inner.before_trial(self._view, trial)

    def _study(self, study: optuna.Study) -> Any:
        v = self._view
        return v if v is not None and v._study is study else study

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return self._inner.infer_relative_search_space(self._study(study), trial)

    def _repeats(self, params: Mapping[str, Any], number: int) -> bool:
        """``params`` contain every parameter of another trial with the same values, so this trial would
        follow that trial's path through the conditional space to the same plan (or the same pruning).

        The other trials' parameter sets are indexed once per snapshot by their first (name, value) item
        (:meth:`_param_index`), so only trials sharing an item with ``params`` are compared (a 3,000-trial
        study made the plain scan, 16 per trial over every trial, quadratic); unhashable values fall back to
        the plain scan. Same answer either way."""
        trials = self._view._trials if self._view is not None else ()
        index = self._param_index(trials)
        if index is not None:
            try:
                have = frozenset(params.items())
            except TypeError:
                index = None
        if index is None:
            items = params.items()
            return any(t.number != number and t.params and t.state != TrialState.FAIL and t.params.items() <= items
                       for t in trials)
        for item in have:
            for n, ps in index.get(item, ()):
                if n != number and ps <= have:
                    return True
        return False

    def _param_index(self, trials: Sequence[FrozenTrial]) -> dict[tuple[str, Any], list[tuple[int, frozenset]]] | None:
        """{first (name, value) of a trial's params: [(trial number, frozenset of its params' items)]} over the
        trials with parameters that did not fail; built once per snapshot list (finished trials' sets kept);
        None if some value is unhashable."""
        cached = self._index
        if cached is not None and cached[0] is trials:
            return cached[1]
        index: dict[tuple[str, Any], list[tuple[int, frozenset]]] | None = {}
        done = self._finished_sets
        try:
            for t in trials:
                if not t.params or t.state == TrialState.FAIL:
                    continue
                ps = done.get(t._trial_id) if t.state.is_finished() else None
                if ps is None:
                    ps = frozenset(t.params.items())
                    if t.state.is_finished():
                        done[t._trial_id] = ps
                index.setdefault(next(iter(t.params.items())), []).append((t.number, ps))
        except TypeError:
            index = None
        self._index = (trials, index)
        return index

    def _random(self, trial: FrozenTrial, attempt: int) -> optuna.samplers.RandomSampler:
        return optuna.samplers.RandomSampler(seed=_mix("redraw", self._seed, trial.number, attempt))

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        s = self._study(study)
        out = self._inner.sample_relative(s, trial, search_space)
        # a model-based proposal that repeats a trial of this or another worker (TPE's argmax is the same for
        # every worker that sees the same history) is redrawn at random, up to REDRAWS times
        for attempt in range(REDRAWS):
            if not out or not self._repeats({**trial.params, **out}, trial.number):
                break
            rs = self._random(trial, attempt)
            out = {k: rs.sample_independent(s, trial, k, d) for k, d in search_space.items()}
        return out

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        s = self._study(study)
        v = self._inner.sample_independent(s, trial, param_name, param_distribution)
        # a value that completes another trial's parameters (e.g. the same invalid tp x pp x cp again) is
        # redrawn at random, up to REDRAWS times; if every draw repeats, the repeat stands
        for attempt in range(REDRAWS):
            if not self._repeats({**trial.params, param_name: v}, trial.number):
                break
            v = self._random(trial, attempt).sample_independent(s, trial, param_name, param_distribution)
        return v

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


class _SnapshotStudy:
    """A study seen through one read of its trials (every state, RUNNING ones of other workers included),
    taken when a trial starts: the sampler's many reads while it suggests that trial's parameters use it.

    Why: Optuna 5's TPE (``constant_liar=True`` by default, optuna/samplers/_tpe/sampler.py ``_sample``)
    re-reads the running trials from the storage for every parameter group, ~10 reads of ~14 ms each
    per trial on SQLite (measured: 100 trials of ``autotune run --size 8b`` took 22.5 s that way, 10.0 s
    with the former private in-memory copy). Everything else is the real study.
    """

    def __init__(self, study: optuna.Study) -> None:
        self._study = study
        self._trials = study._storage.get_all_trials(study._study_id, deepcopy=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        import copy

        out = [t for t in self._trials if states is None or t.state in states]
        return copy.deepcopy(out) if deepcopy else out

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self._get_trials()


#: --trials with the real backend counts plans run; invalid ones are pruned for free, up to this many x.
REAL_MAX_ATTEMPTS_FACTOR = 20

#: Heartbeat of real trials (s): a worker killed during a trial is noticed 2 x this later (Optuna's default
#: grace period) by another worker, which fails the trial and runs its parameters once more.
REAL_HEARTBEAT_INTERVAL_S = 30


def record_result(trial: optuna.Trial, result: StepResult, *, capacity_bytes: int) -> float:
    """Store ``result`` in ``trial``'s user_attrs and memory constraint; return the objective value.

    Constraint ``memory_over_capacity_gib`` = (peak - capacity) / GiB: <= 0 for a feasible plan;
    an infeasible plan gets at least 0.001 (so a plan the evaluator rejects for memory is never
    feasible even if the estimate was under the capacity). Value: MFU, or 0 when infeasible.
    """
    over = (result.peak_memory_bytes - capacity_bytes) / GIB
    cval = min(over, 0.0) if result.feasible else max(over, 1e-3)
    trial.set_constraint(MEMORY_CONSTRAINT, cval)
    # optuna-dashboard (0.21) reads constraints from the pre-Optuna-5 list form, system attr
    # "constraints" (optuna_dashboard/_serializer.py CONSTRAINTS_KEY); Optuna 5 reads that list too
    # (optuna/study/_constrained_optimization.py) as constraint "0", with the same value here
    trial.storage.set_trial_system_attr(trial._trial_id, DASHBOARD_CONSTRAINTS_KEY, [cval])
    attrs = {"feasible": bool(result.feasible), "step_time_ms": result.step_time_ms, "mfu": result.mfu,
             "mfu_palm": result.mfu_palm, "hfu": result.hfu, "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
             "tflops_per_gpu": result.tflops_per_gpu, "peak_memory_bytes": int(result.peak_memory_bytes),
             "memory_per_stage_bytes": [int(x) for x in result.memory_per_stage_bytes],
             "breakdown_ms": dict(result.breakdown_ms), "backend": result.backend,
             "details": _json_safe(result.details)}
    # readable in the dashboard's trial table: out-of-memory trials are not slow plans scoring 0.0
    attrs["outcome"] = "feasible" if result.feasible else "out_of_memory"
    if not result.feasible:
        attrs["infeasible_reason"] = result.infeasible_reason or "does not fit in GPU memory"
    set_user_attrs(trial, {k: _plain(v) for k, v in attrs.items()})
    value = float(result.mfu) if result.feasible else 0.0
    if not math.isfinite(value):
        raise AutotuneError(f"evaluator returned a non-finite MFU {result.mfu!r}")
    return value


def set_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """Set every item of ``attrs`` (JSON-serializable values) as a user attribute of ``trial``.

    On Optuna's RDB storage (SQLite, PostgreSQL, MySQL) they are written in one transaction: the same
    per-key upsert ``RDBStorage.set_trial_user_attr`` runs (``_set_trial_attr_without_commit``,
    optuna/storages/_rdb/storage.py, Optuna 5.0), one commit instead of one per key (measured 12 vs 21 ms
    CPU for the 14 attributes of a trial, SQLite WAL, this project's 2-core dev machine). Elsewhere, or
    if those internals are missing, one ``trial.set_user_attr`` per key.
    """
    backend = getattr(trial.storage, "_backend", trial.storage)
    cached = getattr(trial, "_cached_frozen_trial", None)
    if isinstance(backend, optuna.storages.RDBStorage) and hasattr(backend, "_set_trial_attr_without_commit") \
            and cached is not None:
        try:
            from optuna.storages._rdb import models
            from optuna.storages._rdb.storage import _create_scoped_session
        except ImportError:
            pass
        else:
            with _create_scoped_session(backend.scoped_session, True) as session:
                for k, v in attrs.items():
                    backend._set_trial_attr_without_commit(session, models.TrialUserAttributeModel,
                                                           trial._trial_id, k, v)
            cached.user_attrs.update(attrs)      # what Trial.set_user_attr keeps beside the storage
            return
    for k, v in attrs.items():
        trial.set_user_attr(k, v)


def _json_safe(x: Any) -> Any:
    x = _plain(x)
    try:
        json.dumps(x)
        return x
    except (TypeError, ValueError):
        return json.loads(json.dumps(x, default=str))


# ------------------------------------------------------------------ retune
@dataclass(frozen=True)
class RetuneResult:
    """Outcome of :func:`retune`.

    Attributes:
        fast: the fast fabric's best plan (on the fast fabric).
        slow: the slow fabric's best plan after the warm-started search.
        fast_on_slow: the fast plan evaluated on the slow fabric.
        n_enqueued: warm-start plans enqueued; tuned_fast_first: the fast study had to be tuned first.
        summary: the slow study's :class:`TuneSummary`.
    """

    fast: BestPlan
    slow: BestPlan
    fast_on_slow: StepResult
    n_enqueued: int
    tuned_fast_first: bool
    summary: TuneSummary


def find_fastest_study(storage: str, target: StudyInfo) -> tuple[optuna.Study, StudyInfo] | None:
    """The study in ``storage`` for the same model, GPUs, workload, space and backend on the fastest
    other fabric (highest inter-node, then intra-node bandwidth) that has a feasible plan, or None."""
    cands = [i for i in list_studies(storage) if i.same_target(target) and i.fabric_name != target.fabric_name]
    cands.sort(key=lambda i: fabric_speed(i.fabric), reverse=True)
    for info in cands:
        study, info = load_study(info.name, storage)
        if best_trial(study) is not None:
            return study, info
    return None


def retune(*, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace | str | None = None,
           storage: str = DEFAULT_STORAGE, backend: str = DEFAULT_BACKEND, seed: int | None = 0,
           n_trials: int = 200, timeout: float | None = None, top_k: int = 5,
           show_progress_bar: bool | None = None, evaluator_options: Mapping[str, Any] | None = None,
           log_fn: Callable[[str], None] | None = None, engine: str | None = None, workers: int = 1,
           worker_id: int = 0, heartbeat_interval_s: int | None = None) -> RetuneResult:
    """Re-tune for the (slower) fabric of ``cluster``, warm-started from the fastest fabric's study.

    Steps: find the same target's study on the fastest other fabric in ``storage`` (if none, tune the
    GPU's default fabric first with ``n_trials``); enqueue its ``top_k`` feasible plans into the slow
    study; evaluate its best plan on the slow fabric; run ``n_trials`` trials on the slow study.
    Because the fast best plan is among the enqueued trials, the slow study's best MFU is at least the
    fast plan's MFU on the slow fabric.

    ``workers`` > 1: the slow study is tuned by that many local worker processes
    (:func:`autotune.workers.run_workers`, ``n_trials`` each, ids from ``worker_id``), the warm starts
    enqueued in the storage before they start; the fast study (if it must be tuned first) by this process.

    Raises:
        ConfigError: no faster study and the requested fabric is the default one; ``workers`` < 1.
        NoFeasiblePlanError: a study ends with no feasible plan.
    """
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    check_heartbeat(heartbeat_interval_s, storage, backend)
    say = log_fn or (lambda s: None)
    space_obj = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    slow = Tuner(model=model, cluster=cluster, workload=workload, space=space_obj, storage=storage,
                 backend=backend, seed=seed, evaluator_options=evaluator_options, engine=engine)
    # the slow study, if it exists, must be this target (fabric links, space) before anything is tuned
    slow.check_existing_study()
    found = find_fastest_study(storage, slow.info)
    tuned_fast_first = False
    if found is None:
        fast_cluster = make_cluster(cluster.gpu.name, cluster.num_gpus, None)
        if fast_cluster.fabric.name == cluster.fabric.name:
            raise ConfigError(f"retune needs a study on a faster fabric than {cluster.fabric.name} for the same "
                              f"model, GPUs and workload in {storage}; run `autotune run --interconnect <fabric>` "
                              "first")
        say(f"no study on another fabric in {storage}; tuning {fast_cluster.fabric.name} first")
        fast_tuner = Tuner(model=model, cluster=fast_cluster, workload=workload, space=space_obj, storage=storage,
                           backend=backend, seed=seed, evaluator_options=evaluator_options, engine=engine)
        fast_tuner.optimize(n_trials, timeout=timeout, show_progress_bar=show_progress_bar, worker_id=worker_id,
                            heartbeat_interval_s=heartbeat_interval_s)
        fast_tuner.close()
        tuned_fast_first = True
        found = find_fastest_study(storage, slow.info)
        assert found is not None
    fast_study, fast_info = found
    if fabric_speed(fast_info.fabric) <= fabric_speed(cluster.fabric):
        say(f"note: {fast_info.fabric_name} is not faster than {cluster.fabric.name}; warm-starting from it anyway")
    fast_best = require_best_plan(fast_study, fast_info, storage)
    top = top_feasible_trials(fast_study, top_k)
    n_enq = slow.enqueue(top, source=fast_study.study_name)
    say(f"warm start: {n_enq} best plan(s) of {fast_study.study_name} enqueued")
    try:
        fast_on_slow = slow.evaluate(fast_best.plan)
        if workers == 1:
            summary = slow.optimize(max(n_trials, n_enq), timeout=timeout, show_progress_bar=show_progress_bar,
                                    worker_id=worker_id, heartbeat_interval_s=heartbeat_interval_s)
        else:
            from autotune.workers import run_workers

            with _quiet():
                for params, attrs in slow._pending:
                    slow.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            slow._pending.clear()
            outcomes = run_workers(dict(model=model, cluster=cluster, workload=workload, space=space_obj,
                                        storage=storage, backend=backend, seed=seed,
                                        evaluator_options=evaluator_options, engine=engine),
                                   workers, n_trials=max(n_trials, n_enq), timeout=timeout,
                                   first_worker_id=worker_id, heartbeat_interval_s=heartbeat_interval_s)
            for o in outcomes:
                say(f"worker {o.worker_id}: {o.n_new_trials} trials" + (f"; stopped: {o.error}" if o.error else ""))
            trials = slow.study.get_trials(deepcopy=False)
            summary = TuneSummary(study=slow.name, storage=storage, n_new_trials=sum(o.n_new_trials for o in outcomes),
                                  n_trials=len(trials), states=_outcome_counts(trials),
                                  best=require_best_plan(slow.study, slow.info, storage))
    finally:
        slow.close()
    return RetuneResult(fast=fast_best, slow=summary.best, fast_on_slow=fast_on_slow, n_enqueued=n_enq,
                        tuned_fast_first=tuned_fast_first, summary=summary)


def explain_changes(fast: BestPlan, slow: BestPlan, fast_on_slow: StepResult, *, top: int = 3) -> list[str]:
    """Which plan fields changed and why, from the breakdown differences (ms), as text lines.

    "why": the terms that grew most when the fast plan moved to the slow fabric (fast plan on fast ->
    fast plan on slow), and what the retuned plan brings them to.
    """
    lines = []
    a, b = fast.plan.to_dict(), slow.plan.to_dict()
    changed = [k for k in a if a[k] != b[k]]
    if changed:
        lines.append("changed: " + ", ".join(f"{k} {a[k]} -> {b[k]}" for k in changed))
    else:
        lines.append("changed: nothing (the fast fabric's plan is also the best found on the slow fabric)")
    f0, f1, s1 = fast.result.breakdown_ms, fast_on_slow.breakdown_ms, slow.result.breakdown_ms
    keys = sorted(set(f0) | set(f1) | set(s1), key=lambda k: -(f1.get(k, 0.0) - f0.get(k, 0.0)))
    grew = [k for k in keys if f1.get(k, 0.0) - f0.get(k, 0.0) > 0.05][:top]
    for k in grew:
        lines.append(f"why: {k} {f0.get(k, 0.0):.1f} -> {f1.get(k, 0.0):.1f} ms with the fast plan on the slow "
                     f"fabric; the retuned plan: {s1.get(k, 0.0):.1f} ms")
    return lines


__all__ = ["storage_kind", "check_heartbeat", "worker_seed", "trial_seed", "TrialSeededSampler", "REAL_HEARTBEAT_INTERVAL_S",
           "DEFAULT_STORAGE", "DEFAULT_BACKEND", "BACKENDS", "make_evaluator", "open_storage", "study_name",
           "StudyInfo", "list_studies", "load_study", "best_trial", "feasible_trials", "top_feasible_trials",
           "failure_summary", "trial_result", "trial_plan", "BestPlan", "best_plan", "require_best_plan",
           "TuneSummary", "Tuner", "record_result", "RetuneResult", "find_fastest_study", "retune",
           "explain_changes", "fabric_speed", "fabric_fingerprint"]
