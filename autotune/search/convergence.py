"""The convergence stop of ``autotune run`` (issue 26): when no untried plan could change the plan ``run``
reports, the search ends before ``--trials``. A mixin of :class:`autotune.search.sampler.LayoutSampler`
(its history, ranking and screen are the sampler's); :meth:`ConvergenceStop.convergence` says why the search
may stop, :meth:`ConvergenceStop._stalled_candidate` proposes the layouts the stop still waits for.

The reported plan is the first of the within-band order (:func:`autotune.search.band.band_order`, the rule
``run`` / ``show`` / ``export`` report by), so the stop waits both for layouts that could be faster than the
fastest plan and for those that could win the within-band choice (docs/search.md, "Convergence stop").
"""

from __future__ import annotations

import dataclasses

import optuna

from autotune.search.band import band_order
from autotune.search.estimate import PlanScreen
from autotune.search.ranking import LazyRanking
from autotune.spec.plan import Plan


@dataclasses.dataclass(frozen=True)
class _BoundState:
    """:meth:`ConvergenceStop._bound_state`: trial numbers of the fastest plan (``best_n``, step time
    ``best_ms``), of the reported one (``pick_n``, exposed step time ``pick_exposed_ms``) and of the later of
    the two (``last_n``); the slowest step time within the error band (``band_ms``); the step time (ms) an
    untried plan must reach to change the report (``threshold_ms``); the estimate's correction ``r`` and
    ``scale`` = ``r`` x (1 - bound_slack). Without a band, ``pick_n`` = ``best_n`` and the three step times
    are ``best_ms``."""

    best_n: int
    best_ms: float
    pick_n: int
    last_n: int
    threshold_ms: float
    band_ms: float
    pick_exposed_ms: float
    r: float
    scale: float


class ConvergenceStop:
    """The stop rule over a :class:`autotune.search.sampler.LayoutSampler`'s state (module docstring)."""

    patience: int
    bound_slack: float
    band_frac: float
    screen: PlanScreen
    _history: dict[int, tuple[Plan | None, float | None]]
    _step_ms: dict[int, float]
    _exposed_ms: dict[int, float]
    _finished: set[int]
    _rh: float                  # _hidden_scale's rh so far, over the trials in _rh_seen
    _rh_seen: set[int]
    _own: set[int]              # trial numbers this sampler sampled (before_trial)

    def rank(self, study: optuna.Study | None = None, places: int | None = None) -> LazyRanking:
        """The sampler's layout ranking (``LayoutSampler.rank``)."""
        raise NotImplementedError

    def _update_history(self, study: optuna.Study) -> None:
        """Read the study's trials into the history (``LayoutSampler._update_history``)."""
        raise NotImplementedError

    def convergence(self, study: optuna.Study) -> str | None:
        """Why the search may stop now, or None to go on (the convergence stop of ``autotune run``).

        ``run`` reports the first plan of the within-band order (:func:`autotune.search.band.band_order`
        with :attr:`band_frac`): the highest exposed-bound MFU among the plans within the error band of the
        highest MFU (with no band: the highest MFU). Both must hold:

        1. **No layout left that could change the reported plan.** An untried plan changes it only if it is
           faster than the fastest plan (step time below ``best_ms``), or it is within the band of the
           fastest (step <= ``best_ms / (1 - band_frac)``) and keeps more with every collective exposed
           (exposed step time <= the reported plan's, ``pick_exposed_ms``). A layout's step-time bound is
           its estimate x ``r`` x (1 - :attr:`bound_slack`), ``r`` = min(1, the lowest simulated /
           estimated step time over the evaluated plans): the estimate corrected by its largest
           under-estimate seen so far (the measured error, not an assumed one), less a margin. Its exposed
           step time is its step time plus the communication the overlaps hide
           (:meth:`PlanScreen.hidden_ms`, the simulator's own term), bounded the same way (``rh``: the
           lowest simulated / screened hidden time seen). Every ranked layout whose bounds allow either
           (:meth:`_could_change`) has been tried (finished or running).
        2. **Local search stopped changing it.** At least :attr:`patience` trials have finished since the
           later of the fastest and the reported plan (with the sampler's mix, ~3 / 4 of them local-search
           steps around the best plans).

        MFU is inversely proportional to step time for one target, so the band and the exposed-bound MFU
        are compared as step times (``step_time_ms``, ``step_time_exposed_ms`` user attributes).
        ``--trials`` stays the upper bound.
        """
        layouts = self.rank(study)
        self._update_history(study)
        state = self._bound_state()
        if state is None:
            return None
        finished = self._finished        # read by _update_history above: one read of the study per check
        since = sum(1 for n in finished if n > state.last_n)
        if since < self.patience:
            return None
        seen = {p for p, _ in self._history.values() if p is not None}
        thr, scale = state.threshold_ms, state.scale
        # every layout whose estimate could be below thr / scale is screened (its bound is below that)
        cands = [q for q in layouts.screen_below(thr / scale * (1 + 1e-9)) if self._could_change(q, state)]
        if any(q not in seen for q in cands):
            return None
        hist = self._history
        which = f"the reported plan, trial {state.pick_n} (MFU {100 * hist[state.pick_n][1]:.2f}%"
        if state.pick_n != state.best_n:
            which += (f", chosen within the {100 * self.band_frac:.1f}% error band of the fastest, trial "
                      f"{state.best_n} at {100 * hist[state.best_n][1]:.2f}%")
        return (f"converged after {len(finished)} trials: {which}), has not changed in the last {since} trials, "
                f"and all {len(cands)} of {layouts.num_layouts} layouts that could still change it were tried "
                f"(each one's bound: its estimate x {state.scale:.2f}, the lowest simulated / estimated step-time "
                f"ratio seen, {state.r:.2f}, less {100 * self.bound_slack:g}%)")

    def converged_already(self, study: optuna.Study) -> str | None:
        """:meth:`convergence` before a run's first trial: a study an earlier run left converged gets no new
        trial (``autotune run`` again added one per run); None when trials wait in its queue (enqueued warm
        starts or screened plans run first)."""
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return None
        return self.convergence(study)

    def _bound_state(self) -> "_BoundState | None":
        """The fastest and the reported plan of the history, the step time an untried plan must be below to
        change the report, and the estimate's correction (:meth:`convergence`); None before a feasible plan
        with its step time is known."""
        done = [n for n, (p, v) in self._history.items() if p is not None and v is not None and v > 0
                and n in self._step_ms]
        if not done:
            return None
        hist = self._history
        best_n = max(done, key=lambda n: (hist[n][1], -n))
        best_ms = self._step_ms[best_n]
        pick_n = best_n
        thr = band_ms = pick_exposed_ms = best_ms
        if self.band_frac > 0:
            exp = self._exposed_ms
            # band_order's exposed-bound MFU is MFU x step / exposed step
            pick_n = band_order(done, self.band_frac, value=lambda n: hist[n][1],
                                exposed=lambda n: hist[n][1] * self._step_ms[n] / exp[n],
                                number=lambda n: n, k=1)[0]
            band_ms, pick_exposed_ms = best_ms / (1 - self.band_frac), exp[pick_n]
            thr = max(best_ms, min(band_ms, pick_exposed_ms))
        ratios = [self._step_ms[n] / e for n in done
                  if 0 < (e := self.screen.estimate_ms(hist[n][0])) < float("inf")]
        r = min([1.0] + ratios)
        return _BoundState(best_n=best_n, best_ms=best_ms, pick_n=pick_n, last_n=max(best_n, pick_n),
                           threshold_ms=thr, band_ms=band_ms, pick_exposed_ms=pick_exposed_ms, r=r,
                           scale=r * (1 - self.bound_slack))

    def _could_change(self, q: Plan, state: "_BoundState") -> bool:
        """Whether untried layout plan ``q`` could change the reported plan by :meth:`convergence`'s bounds:
        faster than the fastest, or within the band and no slower than the reported plan with every
        collective exposed (ties count: they could win on MFU)."""
        e = self.screen.estimate_ms(q) * state.scale
        if e < state.best_ms:
            return True
        if e > state.threshold_ms:
            return False
        return e + self.screen.hidden_ms(q) * self._hidden_scale() <= state.pick_exposed_ms

    def _hidden_scale(self) -> float:
        """``rh`` x (1 - bound_slack): ``rh`` = min(1, the lowest simulated / screened hidden communication
        over the plans this sampler's own trials evaluated), the simulated one being ``step_time_exposed_ms -
        step_time_ms``. Kept up to date incrementally and computed only when a layout within the band needs
        it (a screen of a plan's hidden communication costs a CostBuilder). Own trials only: with ``--workers
        4`` every worker screened every trial's plan for it, 4 times the single worker's screens (70B x 64
        B200: 1.3-1.4x one worker's CPU); a single worker's trials are all its own."""
        rh = self._rh
        for n, step in self._step_ms.items():
            if n in self._rh_seen or n not in self._own:
                continue
            self._rh_seen.add(n)
            plan = self._history[n][0]
            if plan is not None and (h := self.screen.hidden_ms(plan)) > 0:
                rh = min(rh, (self._exposed_ms[n] - step) / h)
        self._rh = rh
        return rh * (1 - self.bound_slack)

    def _stalled_candidate(self, layouts: LazyRanking, seen: set[Plan]) -> Plan | None:
        """When local search has not changed the fastest or the reported plan for ``patience // 2`` trials:
        the best-ranked unseen layout that could still change either (:meth:`convergence`'s bound), so that
        the layouts the stop rule waits for are tried next instead of one every ``explore_every`` trials;
        else None."""
        state = self._bound_state()
        if state is None:
            return None
        if sum(1 for n in self._history if n > state.last_n) < max(1, self.patience // 2):
            return None
        thr, scale = state.threshold_ms, state.scale
        return layouts.first_where(lambda q: q not in seen and self._could_change(q, state),
                                   thr / scale * (1 + 1e-9))


__all__ = ["ConvergenceStop"]
