"""The convergence stop of ``autotune run`` (issues 26, 40): when no untried plan could change the plan ``run``
reports, the search ends before ``--trials``. A mixin of :class:`autotune.search.sampler.LayoutSampler`
(its history, ranking and screen are the sampler's); :meth:`ConvergenceStop.convergence` says why the search
may stop, :meth:`ConvergenceStop._stalled_candidate` proposes the plans the stop still waits for.

The reported plan is the first of the conservative order (:func:`autotune.search.band.conservative_order`: MFU x
the plan's conservative factor, the low end of its 80% interval), so the stop waits for every layout, and every
untried setting of the best plans found, whose bound could beat the reported plan's conservative estimate
(docs/search.md, "Convergence stop").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from autotune.search.estimate import PlanScreen
from autotune.search.ranking import LazyRanking
from autotune.spec.plan import Plan


@dataclasses.dataclass(frozen=True)
class _BoundState:
    """:meth:`ConvergenceStop._bound_state`: trial numbers of the fastest plan (``best_n``, step time
    ``best_ms``), of the reported one (``pick_n``; its conservative step time ``pick_cons_ms`` = step time /
    conservative factor) and of the later of the two (``last_n``); the step time (ms) an untried plan must reach
    to change the report with the largest factor any plan can have (``threshold_ms``); the estimate's correction
    ``r`` and ``scale`` = ``r`` x (1 - bound_slack). Without a rank basis, ``pick_n`` = ``best_n`` and both step
    times are ``best_ms``."""

    best_n: int
    best_ms: float
    pick_n: int
    last_n: int
    threshold_ms: float
    pick_cons_ms: float
    r: float
    scale: float


class ConvergenceStop:
    """The stop rule over a :class:`autotune.search.sampler.LayoutSampler`'s state (module docstring)."""

    patience: int
    bound_slack: float
    rank_basis: Any             # autotune.spec.trust.RankBasis or None
    screen: PlanScreen
    _history: dict[int, tuple[Plan | None, float | None]]
    _step_ms: dict[int, float]
    _exposed_ms: dict[int, float]
    _finished: set[int]
    _factors: dict[Plan, float]
    _own: set[int]              # trial numbers this sampler sampled (before_trial)

    def rank(self, study: optuna.Study | None = None, places: int | None = None) -> LazyRanking:
        """The sampler's layout ranking (``LayoutSampler.rank``)."""
        raise NotImplementedError

    def _update_history(self, study: optuna.Study) -> None:
        """Read the study's trials into the history (``LayoutSampler._update_history``)."""
        raise NotImplementedError

    def neighbours(self, plan: Plan) -> list[Plan]:
        """Plans one knob (or two layout knobs) away that fit (``LayoutSampler.neighbours``)."""
        raise NotImplementedError

    def factor(self, plan: Plan | None) -> float:
        """``plan``'s conservative factor (:meth:`autotune.spec.trust.RankBasis.factor`; 1 without a rank basis
        or plan), cached per plan."""
        if self.rank_basis is None or plan is None:
            return 1.0
        f = self._factors.get(plan)
        if f is None:
            f = self._factors[plan] = float(self.rank_basis.factor(plan))
        return f

    @property
    def factor_max(self) -> float:
        """The largest conservative factor any plan can have (1 without a rank basis)."""
        return float(self.rank_basis.factor_max) if self.rank_basis is not None else 1.0

    def convergence(self, study: optuna.Study) -> str | None:
        """Why the search may stop now, or None to go on (the convergence stop of ``autotune run``).

        ``run`` reports the first plan of the conservative order: the highest MFU x conservative factor (the low
        end of the plan's 80% interval; with no rank basis: the highest MFU). All three must hold:

        1. **No layout left that could change the reported plan.** An untried plan changes it only if its
           step time over its own conservative factor is at most the reported plan's (``pick_cons_ms``). A
           layout's step-time bound is its estimate x ``r`` x (1 - :attr:`bound_slack`), ``r`` = min(1, the
           lowest simulated / estimated step time over the evaluated plans): the estimate corrected by its
           largest under-estimate seen so far (the measured error, not an assumed one), less a margin. Every
           ranked layout whose bound allows it (:meth:`_could_change`) has been tried (finished or running).
        2. **No untried setting of the best plans left that could.** For the reported and the fastest plan,
           each plan one knob (or two layout knobs) away that fits (``LayoutSampler.neighbours``: its other
           settings, and the neighbouring layouts with its settings) whose bound allows it has been tried (issue 40: stopping after the layouts alone ended 2 of 13 seed pairs of
           ``bench/bench_search.py`` short of the optimum, e.g. 70B on 256 GPUs over 10 Gb/s).
        3. **Local search stopped changing it.** At least :attr:`patience` trials have finished since the
           later of the fastest and the reported plan.

        MFU is inversely proportional to step time for one target, so the estimates are compared as step
        times (``step_time_ms`` user attributes). ``--trials`` stays the upper bound.
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
        settings = self._untried_settings(state, seen)
        if settings is None:
            return None
        hist = self._history
        which = f"the reported plan, trial {state.pick_n} (MFU {100 * hist[state.pick_n][1]:.2f}%"
        if state.pick_n != state.best_n:
            which += (f", first by the conservative estimate, the low end of its 80% interval; the fastest is trial "
                      f"{state.best_n} at {100 * hist[state.best_n][1]:.2f}%")
        return (f"converged after {len(finished)} trials: {which}), has not changed in the last {since} trials, "
                f"and all {len(cands)} of {layouts.num_layouts} layouts and all {settings} untried settings of the "
                f"best plans that could still change it were tried (each one's bound: its estimate x "
                f"{state.scale:.2f}, the lowest simulated / estimated step-time ratio seen, {state.r:.2f}, less "
                f"{100 * self.bound_slack:g}%)")

    def _near_best(self, state: "_BoundState") -> list[Plan]:
        """The evaluated plans whose untried settings the stop checks: the reported plan and the fastest one
        (the best layouts; their settings neighbours are :meth:`_settings_neighbours`)."""
        hist = self._history
        return [hist[n][0] for n in dict.fromkeys((state.pick_n, state.best_n))]   # type: ignore[misc]

    def _settings_neighbours(self, base: Plan) -> list[Plan]:
        """The neighbours of ``base`` (``LayoutSampler.neighbours``: one knob, or two layout knobs, away, that
        fit): its untried settings, and the neighbouring layouts with its settings (a layout's ranked plan has
        the preferred settings, so the best plan's settings at the next PP or CP are not tried by the layout
        check: 405B x 1,024 B200, seeds 1 and 2 of bench/bench_search.py, stopped 0.1 points short by it)."""
        return self.neighbours(base)

    def _untried_settings(self, state: "_BoundState", seen: set[Plan]) -> int | None:
        """How many neighbours of the near-best plans (:meth:`_near_best`) could change the report and were all
        tried, or None when one of them is untried (the stop waits for it)."""
        count = 0
        for base in self._near_best(state):
            for q in self._settings_neighbours(base):
                if self._could_change(q, state):
                    if q not in seen:
                        return None
                    count += 1
        return count

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
        pick_cons_ms = thr = best_ms
        if self.rank_basis is not None:
            pick_n = max(done, key=lambda n: (hist[n][1] * self.factor(hist[n][0]), hist[n][1], -n))
            pick_cons_ms = self._step_ms[pick_n] / self.factor(hist[pick_n][0])
            thr = pick_cons_ms * self.factor_max
        ratios = [self._step_ms[n] / e for n in done
                  if 0 < (e := self.screen.estimate_ms(hist[n][0])) < float("inf")]
        r = min([1.0] + ratios)
        return _BoundState(best_n=best_n, best_ms=best_ms, pick_n=pick_n, last_n=max(best_n, pick_n),
                           threshold_ms=thr, pick_cons_ms=pick_cons_ms, r=r, scale=r * (1 - self.bound_slack))

    def _could_change(self, q: Plan, state: "_BoundState") -> bool:
        """Whether untried plan ``q`` could change the reported plan by :meth:`convergence`'s bounds: its
        step-time bound over its conservative factor at most the reported plan's (ties count)."""
        e = self.screen.estimate_ms(q) * state.scale
        if e > state.threshold_ms * (1 + 1e-12):
            return False
        if self.rank_basis is None:
            return e < state.best_ms
        return e / self.factor(q) <= state.pick_cons_ms

    def _stalled_candidate(self, layouts: LazyRanking, seen: set[Plan], wait: bool = True) -> Plan | None:
        """When local search has not changed the fastest or the reported plan for ``patience // 2`` trials:
        the best-ranked unseen layout that could still change either (:meth:`convergence`'s bound), else the
        untried setting of a near-best plan that could (condition 2, lowest estimate first), so that the plans
        the stop rule waits for are tried next instead of one every ``explore_every`` trials; else None.
        ``wait`` False: without the ``patience // 2`` condition (a layout trial of the conservative ranking)."""
        state = self._bound_state()
        if state is None:
            return None
        if wait and sum(1 for n in self._history if n > state.last_n) < max(1, self.patience // 2):
            return None
        thr, scale = state.threshold_ms, state.scale
        got = layouts.first_where(lambda q: q not in seen and self._could_change(q, state), thr / scale * (1 + 1e-9))
        if got is not None:
            return got
        # then the untried settings of the best plans the stop waits for (convergence, condition 2)
        for base in self._near_best(state):
            for q in sorted(self._settings_neighbours(base), key=self.screen.estimate_ms):
                if q not in seen and self._could_change(q, state):
                    return q
        return None


def _layout(p: Plan) -> tuple:
    return (p.tp_degree, p.pp_degree, p.cp_degree, p.dp_degree, p.pipeline_schedule if p.pp_degree > 1 else "",
            p.vpp_degree if p.pp_degree > 1 else 1, p.micro_batch_size)


__all__ = ["ConvergenceStop"]
