"""Per-trial sampler seeding for workers that share one study, and the redraw of repeated proposals.

Moved from ``tune/tuner.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState


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

    ``redraw=False``: no redraws, for a sampler that never repeats a plan itself
    (:class:`autotune.search.LayoutSampler`). Its parameters arrive one at a time while other workers'
    trials are RUNNING with partial parameters, so the repeat test matched those partial sets and replaced
    screened proposals by random draws (issue 26: 0-4 repeated, 1-8 unfit, 0-5 invalid plans per
    ``--workers 4`` run, none in 80 single-worker runs).
    """

    def __init__(self, make: Callable[[int | None], optuna.samplers.BaseSampler], seed: int | None,
                 redraw: bool = True) -> None:
        self._make, self._seed, self._redraw = make, seed, redraw
        self._inner = make(seed)
        self._view: _SnapshotStudy | None = None
        self._index: tuple[Any, Any] | None = None
        self._finished_sets: dict[int, frozenset] = {}      # by trial id: a finished trial's params stay
        self._popped: tuple[Any, list[FrozenTrial]] | None = None   # (study, its trials) read by pop_waiting

    def share_reads(self, study: optuna.Study) -> None:
        """Make ``study.ask`` read the study's trials once per trial (:meth:`pop_waiting`) where it read them
        twice: Optuna's ``Study._pop_waiting_trial_id`` (optuna/study/study.py, Optuna 5.0; ``ask`` calls it
        before it creates the trial) re-read every trial from the storage to find the WAITING ones, then
        :meth:`before_trial`'s snapshot re-read them all. Each read re-reads every RUNNING trial in full
        (``_CachedStorage`` caches finished trials only), other workers' included: with ``--workers 4`` ~12 ms
        per read on SQLite, issue 26. A ``study`` whose Optuna has no such method is left alone (two reads)."""
        if callable(getattr(study, "_pop_waiting_trial_id", None)):
            study._pop_waiting_trial_id = lambda: self.pop_waiting(study)   # type: ignore[method-assign]

    def pop_waiting(self, study: optuna.Study) -> int | None:
        """Optuna's ``Study._pop_waiting_trial_id`` (the first WAITING trial this process sets RUNNING, or
        None: ``ask`` then creates a trial), reading every trial rather than the WAITING ones only and keeping
        that read for :meth:`before_trial`'s snapshot of the same trial (:meth:`share_reads`)."""
        storage = study._storage
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
        self._popped = (study, trials)
        for t in trials:
            if t.state != TrialState.WAITING:
                continue
            try:        # another process that set it RUNNING first: False; finished it: the error
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            return t._trial_id
        return None

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self._seed is not None:
            self._inner = self._make(trial_seed(self._seed, trial.number))
        popped, self._popped = self._popped, None
        self._view = _SnapshotStudy(study, popped[1] if popped is not None and popped[0] is study else None, trial)
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
        if not self._redraw:
            return out
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
        if not self._redraw:
            return v
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

    ``trials``: the read :meth:`TrialSeededSampler.pop_waiting` made for this trial just before Optuna
    created it (else the storage is read here); ``current``, the trial being sampled, takes its place there
    (created since, or popped from WAITING).
    """

    def __init__(self, study: optuna.Study, trials: list[FrozenTrial] | None = None,
                 current: FrozenTrial | None = None) -> None:
        self._study = study
        if trials is None:
            self._trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        elif current is None:
            self._trials = list(trials)
        elif not trials or trials[-1].number < current.number:
            self._trials = [*trials, current]
        else:
            self._trials = sorted([t for t in trials if t.number != current.number] + [current],
                                  key=lambda t: t.number)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def refresh_snapshot(self) -> None:
        """Read the study's trials again (the trial being sampled is stored by now): for a sampler that found
        its pick claimed by another worker meanwhile (``LayoutSampler.before_trial``), so that it picks again
        from what the other workers have done since the snapshot, not from the snapshot."""
        self._trials = self._study._storage.get_all_trials(self._study._study_id, deepcopy=False)

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
