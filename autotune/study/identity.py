"""Study naming and identity: the study name of a target, what a study was tuned for (:class:`StudyInfo`),
listing and loading studies, and the fingerprint checks that keep two targets out of one study.

Moved from ``tune/tuner.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import optuna

from autotune.errors import AutotuneError, ConfigError
from autotune.logs import quiet
from autotune.search.space import SearchSpace
from autotune.study.storage import DEFAULT_BACKEND, DEFAULT_STORAGE, open_storage
from autotune.study.storage_check import user_url
from autotune.spec.engines import DEFAULT_ENGINE
from autotune.spec.hardware import (
    ClusterSpec,
    FabricSpec,
    fabric_differences,
    fabric_fingerprint,
    fabric_from_dict,
    get_gpu,
)
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Workload


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


#: the LinkSpec fields that decide a fabric's costs (autotune/spec/hardware.py ``LinkSpec``); the link names
#: are labels and are left out

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


def study_info(study: optuna.Study) -> StudyInfo | None:
    """The :class:`StudyInfo` an open autotune study records in its attributes (None: not an autotune study)."""
    return _study_info_from_attrs(study.study_name, study.user_attrs)


def list_studies(storage: str = DEFAULT_STORAGE) -> list[StudyInfo]:
    """Every autotune study in ``storage`` (studies made by other tools are skipped).

    Raises:
        StorageError: the storage cannot be opened.
    """
    st = open_storage(storage)
    out = []
    with quiet():
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
        with quiet():
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
    fingerprint in the model name, :func:`autotune.spec.hf_config.model_from_hf_config`.)

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
        diff = fabric_differences(stored, fabric.to_dict()) if isinstance(stored, Mapping) else ""
        raise ConfigError(
            f"study {name!r} in {user_url(storage)} was tuned on fabric {fabric.name!r} with "
            f"different links ({diff or f'fingerprint {ffp} vs {mine}'}, stored vs given); give the fabric "
            "another name, or use another --storage")


#: user_attrs one of which every trial autotune writes carries (:meth:`autotune.tune.tuner.Tuner._objective`: the
#: worker stamp with its first write, the plan, the reason of a pruned or failed trial; warm starts)
AUTOTUNE_TRIAL_KEYS = ("worker", "plan", "pruned_reason", "fail_reason", "warm_start_from")


def foreign_trials(trials) -> list[int]:
    """Numbers of the finished COMPLETE or PRUNED trials that autotune did not write (none of
    :data:`AUTOTUNE_TRIAL_KEYS` in their user_attrs): another tool's trials in an autotune study."""
    from optuna.trial import TrialState

    return [t.number for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and not any(k in t.user_attrs for k in AUTOTUNE_TRIAL_KEYS)]


def check_own_trials(trials, *, name: str, storage: str) -> None:
    """Refuse to tune on or export from a study holding trials another tool wrote (:func:`foreign_trials`):
    their values are not MFUs of autotune plans, and one could become the "best plan".

    Raises:
        ConfigError: naming the study, the storage and up to 5 trial numbers.
    """
    bad = foreign_trials(trials)
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise ConfigError(f"study {name!r} in {user_url(storage)} holds {len(bad)} trial(s) not made by autotune "
                          f"(trial {shown}: no plan or autotune attributes); refused, left untouched: delete them "
                          "or use another --storage")
