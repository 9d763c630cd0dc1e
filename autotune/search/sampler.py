"""LayoutSampler: an Optuna sampler that uses the structure of the plan space.

TPE treats the knobs as independent categoricals; on the small space it re-proposed evaluated plans
(about 20 distinct plans in 40 trials, seed 0). This sampler instead proposes whole plans, never one
already in the study, in an order set by cheap screens (:class:`autotune.search.estimate.PlanScreen`):

1. **Layouts** (once per study). Every (tp, pp, cp, schedule, vpp, micro-batch size) the bound space
   allows, with dp, the micro-batch count and the layer split derived exactly as
   :meth:`BoundSearchSpace.suggest` does, is enumerated. Each layout gets settings: the preferred
   value of every other knob (:data:`PREFERENCES`, then one pass of coordinate descent on the
   closed-form estimate at the best layout), and the first (recompute, ZeRO stage) in preference
   order whose memory fits. Layouts where nothing fits are dropped (the simulator would record them
   infeasible); the rest are ranked by estimated step time.
2. **Trials.** The first :attr:`num_initial` trials are the best-ranked layouts. Then every
   :attr:`explore_every`-th trial is the next layout in rank order (so every layout that fits is
   reached eventually), the others a local-search step: among the evaluated plans, best MFU first,
   the first one with a neighbour not yet in the study; the proposal is the unseen neighbour with the
   lowest estimated step time. Neighbours differ in one knob, or in two of the layout knobs (tp, pp,
   cp, micro-batch size, vpp), or in a knob and the knob active only under its value
   (:data:`DEPENDENT_KNOBS`: grad-reduce overlap on with param-gather overlap); those that do not fit in
   memory are skipped.
3. When both lists are exhausted, a plan is drawn at random (Optuna's RandomSampler).

``seed``: the estimate is an estimate, so its order inside a +-:attr:`jitter` band is drawn from
``random.Random(seed)`` (per study, per trial number): the same seed and history give the same trials,
other seeds explore other near-ties. Parameters are set through ``sample_independent`` (the names are
the Plan field names the search space uses), so the study, storage, enqueued trials and
``plan_from_params`` work as with any Optuna sampler.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import random
from typing import Any, Iterator, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.search.bounds import LayoutBounds
from autotune.search.convergence import ConvergenceStop
from autotune.search.estimate import PlanScreen
from autotune.search.ranking import LazyRanking
from autotune.search.shared import NEIGHBOURS_ATTR, RANKING_ATTR, SharedSearch, trials_holding
from autotune.signals import interrupted
from autotune.search.space import KNOBS, BoundSearchSpace, Pruned, plan_params
from autotune.spec.plan import Plan

log = logging.getLogger(__name__)

#: trial system attribute: the plan a trial's sampler picked, written before its parameters
CLAIM_ATTR = "autotune:claimed_plan"
#: picks per trial when earlier trials claimed the pick (LayoutSampler._claimed_earlier)
CLAIM_RETRIES = 8
#: the parallel layout: what :func:`enumerate_layouts` spans
LAYOUT_KNOBS = ("tp_degree", "pp_degree", "cp_degree", "pipeline_schedule", "vpp_degree", "micro_batch_size")
#: knobs two of which may change in one neighbour move (dp, m and the split follow)
PAIR_KNOBS = ("tp_degree", "pp_degree", "cp_degree", "micro_batch_size", "vpp_degree")
#: settings knobs chosen per layout (each layout's plan takes the value of lowest estimated step time
#: among those that fit) rather than once for all layouts: precision (see LayoutSampler._best_per_layout)
PER_LAYOUT_KNOBS = ("precision",)
#: (knob, value) -> knobs active only under that value (BoundSearchSpace.suggest: ``param_gather_overlap`` only
#: with ``dp_grad_reduce_overlap``): a neighbour move that sets the value also tries each other value of those
#: knobs, as the interleaved schedule's moves carry their vpp. Without it a plan without grad-reduce overlap (the
#: dependent knob then reads its preferred value, False once the coordinate-descent pass chose no overlap) reaches
#: both overlaps on only through a plan with grad-reduce overlap alone, which can be slower than either (issue 40:
#: 70B x 256 H100 over 10 Gb/s, TP4 CP2 PP8 v2, simulated 33,474 ms off / 33,497 grad only / 33,118 both, bucket
#: 128 MiB; seeds 1-4 of bench/bench_search.py never left the plan without overlap)
DEPENDENT_KNOBS: Mapping[tuple[str, Any], tuple[str, ...]] = {("dp_grad_reduce_overlap", True): ("param_gather_overlap",)}
#: DP settings chosen per layout after the precision (LayoutSampler._tune_dp), in this order
DP_KNOBS = ("zero_stage", "bucket_size_mib")
#: preferred value order per settings knob (the first one the space has is the layout's default):
#: overlap everything (Megatron-LM defaults --overlap-grad-reduce/--overlap-param-gather with the
#: distributed optimizer), SP with TP (Korthikanti et al. 2022, Sec. 4.2.2: no extra communication),
#: ZeRO-1 (the distributed optimizer: same traffic as DP all-reduce, Rajbhandari et al. 2020 Sec. 5),
#: no recomputation before selective before full (extra FLOPs 0 < attention core < one forward), no
#: torch.compile before compile.
PREFERENCES: Mapping[str, tuple[Any, ...]] = {
    "sequence_parallel": (True, False),
    "recompute": ("none", "selective", "full"),
    "zero_stage": (1, 0, 2, 3),
    "async_collectives": (True, False),
    "tp_comm_overlap": (False, True),
    "dp_grad_reduce_overlap": (True, False),
    "param_gather_overlap": (True, False),
    "memory_reclaim": ("expandable_segments", "none", "empty_cache_per_step", "empty_cache_per_microbatch"),
    # no torch.compile first: engines that fuse the block's memory-bound kernels themselves (Megatron-LM
    # with Transformer Engine) gain nothing from it, and a preference the coordinate-descent pass changes
    # costs a second ranking pass (issue 26: 405B x 1,024 B200 switched to False every time)
    "compile": (False, True),
    # the chunked linear + cross-entropy first: the same GEMMs without the full-vocabulary logits (measured
    # on H200, issue 43: -11.6 ms and -19.5 GiB; docs/results/one-gpu-levers-h200x1-2026-12-03/)
    "loss_impl": ("chunked", "full"),
}


def plain_plan(plan: Plan) -> dict[str, Any]:
    """``plan.to_dict()`` as the ``plan`` user attribute stores it (JSON types)."""
    from autotune.files import plain

    return plain(plan.to_dict())


class LayoutSampler(LayoutBounds, SharedSearch, ConvergenceStop, optuna.samplers.BaseSampler):
    """Structured sampler over a :class:`BoundSearchSpace` (module docstring).

    Args:
        bound: the bound search space the objective samples from.
        screen: memory / step-time screens for the same target (:class:`PlanScreen`).
        seed: orders near-ties (module docstring); None = nondeterministic.
        num_initial: trials that go to the best-ranked layouts first.
        explore_every: after those, every n-th trial is the next-ranked layout (>= 2).
        jitter: relative width of the band inside which the estimate's order is drawn at random.
        patience: :meth:`convergence` needs this many finished trials after the best one.
        bound_slack: :meth:`convergence`'s margin on the estimate's bound (0.05: 5% below it).
        rank_basis: what the conservative ranking reads (:class:`autotune.spec.trust.RankBasis`, from
            ``autotune.study.trials.rank_basis``; None = plain MFU order): ``run`` reports the first plan of
            :func:`autotune.search.band.conservative_order`, and :meth:`convergence` waits for every layout,
            and every untried setting of the best plans, that could change that plan.

    Raises:
        ValueError: ``explore_every`` < 2 or ``num_initial`` < 1.
    """

    preferences, per_layout_knobs = PREFERENCES, PER_LAYOUT_KNOBS      # for LayoutBounds

    def __init__(self, bound: BoundSearchSpace, screen: PlanScreen, *, seed: int | None = None,
                 num_initial: int = 8, explore_every: int = 4, jitter: float = 0.03, patience: int = 16,
                 bound_slack: float = 0.05, rank_basis: Any = None) -> None:
        if explore_every < 2 or num_initial < 1:
            raise ValueError(f"explore_every must be >= 2 and num_initial >= 1, got {explore_every}, {num_initial}")
        self.bound, self.screen = bound, screen
        self.seed = seed if seed is not None else random.randrange(2**31)
        self.num_initial, self.explore_every, self.jitter = num_initial, explore_every, jitter
        self.patience, self.bound_slack, self.rank_basis = patience, bound_slack, rank_basis
        self._factors: dict[Plan, float] = {}
        self._step_ms: dict[int, float] = {}
        self._exposed_ms: dict[int, float] = {}     # step time with every overlapped collective exposed
        self._rh, self._rh_seen, self._own = 1.0, set(), set()      # ConvergenceStop._hidden_scale
        self._random = optuna.samplers.RandomSampler(seed=self.seed)
        self._ranking: LazyRanking | None = None
        self._entries: list[tuple[int, dict[str, Any], float]] = []
        self._prefs: dict[str, Any] = {}
        self._neighbours: dict[Plan, list[Plan]] = {}
        self._chosen: dict[int, dict[str, Any]] = {}
        self._history: dict[int, tuple[Plan | None, float | None]] = {}
        self._finished: set[int] = set()    # trial numbers _history holds as finished
        self._plan_cache: dict[Any, Plan | None] = {}
        self._base_plans: dict[tuple, Plan] = {}    # a plan per knob values but VARIANT_KNOBS (_plan)
        self._canon: dict[Plan, Plan] = {}
        self._ranked: dict[Plan, list[Plan]] = {}
        self._lost: set[Plan] = set()      # plans this worker picked and found claimed by an earlier trial
        self._yielded: set[Plan] = set()   # plans the current trial gave up for a later trial's claim
        self._study: optuna.Study | None = None     # where ranked neighbours are shared (next_plan's study)

    # ------------------------------------------------------------ Optuna sampler API
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._own.add(trial.number)
        try:
            plan = self.next_plan(study, trial.number)
        except Exception as e:      # a screen that cannot cost some plan must not stop the study
            log.warning("layout sampler: %s: %s; sampling trial %d at random", type(e).__name__, e, trial.number)
            plan = None
        if plan is None:
            # nothing left by rank or by local search: a random plan, but only one the screen accepts
            plan = self._random_fitting(trial.number)
        self._yielded = set()
        for attempt in range(CLAIM_RETRIES + 1):
            clash = None if plan is None else self._claimed_earlier(study, trial, plan)
            if clash is None:
                break
            if clash == "earlier":
                self._lost.add(plan)        # an earlier trial of another worker took it meanwhile
            else:
                self._yielded.add(plan)     # a later trial claimed it first: not this trial's (see below)
            if attempt == CLAIM_RETRIES:
                # every pick claimed: a plan the screen accepts, drawn at random (seeded by trial number)
                log.warning("layout sampler: trial %d found %d picks claimed by other trials; a random fitting "
                            "plan instead", trial.number, CLAIM_RETRIES + 1)
                plan = self._random_fitting(trial.number)
                break
            # the other workers' trials since the snapshot this trial started from (seeding.py _SnapshotStudy):
            # a worker that sampled slowly picked again from a stale history and took a finished trial's plan
            # (issue 26: a --workers 4 test drew trial 1's plan as trial 15's, 2 runs in 57 of a stress loop)
            refresh = getattr(study, "refresh_snapshot", None)
            if callable(refresh):
                refresh()
            plan = self.next_plan(study, trial.number)
        if plan is not None:
            self._chosen[trial.number] = plan_params(plan, moe=self.bound.model.is_moe)

    def _claimed_earlier(self, study: optuna.Study, trial: FrozenTrial, plan: Plan) -> str | None:
        """Claim ``plan`` for ``trial`` in the storage (trial system attribute :data:`CLAIM_ATTR`), then say
        whether another trial holds the same claim or plan: ``"earlier"`` (a trial of lower number),
        ``"later"`` (only trials of higher number), None (none). Concurrent workers that picked the same plan
        all write before they read (the storage orders the writes): whichever reads last sees the other's
        claim. Both kinds of clash make this trial pick again, so at most one of them keeps the plan: with
        the lower number alone winning, a later trial that wrote and read before the earlier one wrote
        kept the plan too (issue 26: a plan evaluated twice by ``--workers 4``). A plan given up for a later
        trial's claim is skipped by this trial only (that trial may give it up too). The read after the
        write is of the matching attributes only on RDB storages (:func:`trials_holding`), else of every trial."""
        storage = study._storage
        d = plain_plan(plan)
        try:
            storage.set_trial_system_attr(trial._trial_id, CLAIM_ATTR, d)
            holders = trials_holding(study, d, CLAIM_ATTR, "plan")
            if holders is None:
                holders = [t.number for t in storage.get_all_trials(study._study_id, deepcopy=False)
                           if t.system_attrs.get(CLAIM_ATTR) == d or t.user_attrs.get("plan") == d]
        except Exception as e:          # a storage that refuses it: the trial-number rule alone
            log.warning("layout sampler: cannot claim a plan (%s: %s)", type(e).__name__, e)
            return None
        clash = None
        for n in holders:
            if n != trial.number:
                if n < trial.number:
                    return "earlier"
                clash = "later"
        return clash

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        v = self._chosen.get(trial.number, {}).get(param_name, _MISSING)
        if v is not _MISSING and isinstance(param_distribution, CategoricalDistribution) \
                and v in param_distribution.choices:
            return v
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._chosen.pop(trial.number, None)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    # ------------------------------------------------------------ layouts
    def _rng(self, *salt: Any) -> random.Random:
        return random.Random(f"{self.seed}/" + "/".join(map(str, salt)))

    def _plan(self, assignment: Mapping[str, Any]) -> Plan | None:
        """``bound.suggest`` of ``assignment`` (a value per knob), or None when it is invalid; cached. A plan
        whose knobs but :data:`BoundSearchSpace.VARIANT_KNOBS` match one built before is derived from that one
        (:meth:`BoundSearchSpace.variant`: the same plan, 3.6 us instead of 64 us for a 405B plan of pp 16 x
        v 8, docs/search.md)."""
        try:
            key = _knob_values(assignment)
            base_key: tuple | None = _base_values(assignment)
        except KeyError:                # not every knob given: suggest says which (ValueError -> None)
            key, base_key = tuple(sorted(assignment.items())), None
        got = self._plan_cache.get(key, _MISSING)
        if got is not _MISSING:
            return got
        base = self._base_plans.get(base_key) if base_key is not None else None
        try:
            plan = self.bound.variant(base, assignment) if base is not None else self.bound.suggest(_Assigned(assignment))
        except (Pruned, ValueError):
            plan = None
        if plan is not None and base is None and base_key is not None:
            self._base_plans[base_key] = plan
        self._plan_cache[key] = plan
        return plan

    def assignment(self, plan: Plan) -> dict[str, Any]:
        """Every knob's value: the plan's where the knob is active, the preferred value elsewhere."""
        a = dict(self._prefs)
        a.update({k: v for k, v in plan_params(plan, moe=self.bound.model.is_moe).items() if v in self.bound.choices[k]})
        return a

    def _default_prefs(self) -> dict[str, Any]:
        c = self.bound.choices
        prefs: dict[str, Any] = {}
        for k in KNOBS:
            order = PREFERENCES.get(k, ())
            prefs[k] = next((v for v in order if v in c[k]), c[k][0])
        # the middle bucket size of the space (Megatron-LM's default bucket is 40M elements, ~ the middle)
        prefs["bucket_size_mib"] = sorted(c["bucket_size_mib"])[len(c["bucket_size_mib"]) // 2]
        return prefs

    def _fit_settings(self, assignment: dict[str, Any]) -> Plan | None:
        """The plan of ``assignment`` with the (recompute, ZeRO stage) of lowest estimated step time among those
        that fit (per stage the least recomputation that fits; the preferred stage on a tie), or None."""
        c = self.bound.choices
        rec = [v for v in PREFERENCES["recompute"] if v in c["recompute"]]
        zero = [v for v in PREFERENCES["zero_stage"] if v in c["zero_stage"]]
        if rec and zero:
            # memory falls with more recomputation and a higher ZeRO stage (Korthikanti et al. 2022 Table 2;
            # Rajbhandari et al. 2020 Fig. 1): when the plan does not fit at its own settings nor at the
            # most saving ones (full recompute, the highest stage), no combination fits
            saving = next((q for z in sorted(zero, reverse=True)
                           if (q := self._plan({**assignment, "recompute": rec[-1], "zero_stage": z})) is not None),
                          None)
            if saving is not None and not self.screen.fits(saving):
                return None
        # a combination that needs at least the memory of one that did not fit (no more recomputation,
        # no higher ZeRO stage) is not screened
        rec_saving = {v: i for i, v in enumerate(PREFERENCES["recompute"])}   # its order is by saving
        failed: list[tuple[int, int]] = []
        # per ZeRO stage the first recompute level that fits is that stage's fastest (recomputation only
        # adds work); the stages differ in exposed parameter gathers and gradient reductions, so the
        # fastest of them is taken, the preferred one on a tie
        best, best_ms = None, float("inf")
        done_zero: set[int] = set()
        for r, z in itertools.product(rec, zero):
            key = (rec_saving.get(r, 0), int(z))
            if z in done_zero or any(key[0] <= f[0] and key[1] <= f[1] for f in failed):
                continue
            plan = self._plan({**assignment, "recompute": r, "zero_stage": z})
            if plan is None:
                continue
            if self.screen.fits(plan):
                done_zero.add(z)
                if (e := self.screen.estimate_ms(plan)) < best_ms:
                    best, best_ms = plan, e
                continue
            failed.append(key)
        return best

    def _best_per_layout(self, assignment: dict[str, Any]) -> Plan | None:
        """The fitting plan of ``assignment`` (:meth:`_fit_settings`) with the :data:`PER_LAYOUT_KNOBS`
        value of lowest estimated step time: FP8 changes both the step time and the memory a layout
        needs (Transformer Engine keeps FP8 weight copies), so the precision that is best at one layout
        may not fit at another; one choice for all layouts missed FP8 plans 30% faster (70B on 64 B200)."""
        best, best_ms = None, float("inf")
        if not PER_LAYOUT_KNOBS:
            return self._fit_settings(assignment)
        for k in PER_LAYOUT_KNOBS:
            # branch and bound: without recomputation, at its fastest ZeRO stage, a value is the fastest it
            # gets (recomputation only adds work), so values are tried in that order, and one whose bound is
            # not below the best fitting plan so far is not screened for memory at all
            bounds = []
            zero = [z for z in PREFERENCES["zero_stage"] if z in self.bound.choices["zero_stage"]]
            rec0 = next((r for r in PREFERENCES["recompute"] if r in self.bound.choices["recompute"]), None)
            for v in self.bound.choices[k]:
                # the bound: the fastest ZeRO stage without recomputation (no memory check)
                ests = [self.screen.estimate_ms(q0) for z in zero
                        if (q0 := self._plan({**assignment, k: v, "zero_stage": z,
                                              **({"recompute": rec0} if rec0 is not None else {})})) is not None]
                if ests:
                    bounds.append((min(ests), v != assignment[k], repr(v), v))
            for lower_ms, _, _, v in sorted(bounds, key=lambda x: x[:3]):
                if lower_ms >= best_ms:
                    break
                q = self._fit_settings({**assignment, k: v})
                if q is not None and (e := self.screen.estimate_ms(q)) < best_ms:
                    best, best_ms = q, e
        return self._tune_dp(best) if best is not None else None

    def _tune_dp(self, plan: Plan) -> Plan:
        """``plan`` with the ZeRO stage, then the DP bucket size, of lowest estimated step time among those
        that fit (its precision and recomputation kept): one coordinate-descent pass per layout. The DP
        terms depend on the layout (bucket count and exposure per chunk, the DP group's links), so one
        setting for all layouts (ZeRO 1 and the middle bucket) ordered ZeRO 0 / 1 the wrong way on slow
        fabrics (issue 26)."""
        if plan.dp_degree * plan.cp_degree == 1:     # no DP group: the ZeRO stage and buckets are inactive
            return plan
        a = self.assignment(plan)
        best, best_ms = plan, self.screen.estimate_ms(plan)
        for k in DP_KNOBS:
            cands = []
            for v in self.bound.choices[k]:
                q = self._plan({**a, k: v})
                if q is not None and q != best:
                    cands.append((self.screen.estimate_ms(q), repr(v), q))
            for e, _, q in sorted(cands, key=lambda x: x[:2]):
                if e >= best_ms:
                    break
                if self.screen.fits(q):
                    best, best_ms = q, e
                    break
            a = self.assignment(best)
        return best

    def layouts(self, study: optuna.Study | None = None) -> list[Plan]:
        """One fitting plan per layout, best estimated step time first: every layout screened (for tests
        and ``bench/bench_search.py --rank-correlation``; the search itself screens lazily, :meth:`rank`)."""
        return self.rank(study).all()

    def rank(self, study: optuna.Study | None = None, places: int | None = None,
             prescreen: bool = False) -> LazyRanking:
        """The layouts in estimate order, screened as far as asked (:class:`LazyRanking`; built once).

        With ``study``: the ranking is shared through the study's storage (system attribute
        :data:`RANKING_ATTR`, keyed by :meth:`ranking_key`): the preferred settings, every layout's bound and
        the layouts screened so far (the first :attr:`num_initial` in order at least) are read from there when
        a worker stored them, else computed and stored, so concurrent workers (``--workers N``, or processes
        on other hosts) rank once; a stored ranking of another key (seed, space, calibration, code) is
        ignored and replaced. Layouts past the stored ones are screened by the worker that needs them (the
        same result in every worker). ``places``: how many layouts to place before storing (default
        :attr:`num_initial`; ``autotune run --workers N`` places what N workers' trials will take, once:
        :meth:`rank_for_workers`); ``prescreen``: also screen, before storing, what :meth:`rank_for_workers`
        says the stop will wait for.
        """
        if self._ranking is None and study is not None and self._load_ranking(study):
            return self._ranking        # type: ignore[return-value]
        if self._ranking is None:
            self._compute_layouts()
            if study is not None:
                for _ in itertools.islice(self._ranking, max(places or 0, self.num_initial)):  # type: ignore[arg-type]
                    pass
                first = self._ranking.first() if prescreen else None      # type: ignore[union-attr]
                if first is not None:
                    reach = self.screen.estimate_ms(first) / self.factor(first) * self.factor_max \
                        / (1 - self.bound_slack)
                    self._ranking.screen_below(reach)     # type: ignore[union-attr]
                self._store_ranking(study)
        return self._ranking            # type: ignore[return-value]

    def rank_for_workers(self, study: optuna.Study, num_workers: int, trials_per_worker: int | None) -> LazyRanking:
        """Rank once, before ``num_workers`` worker processes start on ``study`` (``autotune run --workers N``):
        place the layouts their trials take (one in :attr:`explore_every` after the first :attr:`num_initial`,
        of at most 100 trials), and screen every layout the convergence stop is expected to wait for: those
        whose bound is below the best-ranked layout's estimate / its conservative factor x the largest factor /
        (1 - :attr:`bound_slack`)
        (:meth:`ConvergenceStop.convergence`'s reach with the estimate taken at its word). They are stored with
        the ranking (and forked workers inherit the screen's caches), so the workers read them instead of each
        screening them again (issue 26: 70B x 64 B200, 4 workers x 25 trials took 1.4-1.7x one worker's CPU,
        most of it 4 workers screening the same layouts for the stop). The stop's reach also divides by the estimate's error seen in the trials, unknown
        here, so workers still screen some layouts past these, each for itself (sharing those through the study
        measured no gain: 70B x 64 B200, 4 x 25 trials, 9.3 / 10.7 s CPU shared against 9.1 / 10.9 s not)."""
        places = self.num_initial + min(num_workers * (trials_per_worker or 100), 100) // self.explore_every + 1
        return self.rank(study, places=places, prescreen=True)

    def _compute_layouts(self) -> None:
        self.ranking_source = "computed"
        self._prefs = self._default_prefs()
        # an MoE model with dense layers: the first ranking only picks the layout the descent starts from, so it
        # is refined by the bounds of LayoutBounds._fit_bound (DeepSeek-V3 x 256 B200: its layer bounds, the lesser
        # of a dense and an MoE layer for every layer, had it refine 2,349 of 2,373 layouts; 4.0 -> 2.4 s CPU);
        # the order, so its first layout, is the same (ranking.py). Unless a plan came up twice (then the
        # screening order chose its layout) or the ranking is kept (its bounds are stored): then the plain
        # ranking, as before. Without dense layers (Qwen3-30B-A3B x 16 B200: 0.71 s plain, 0.80 provisional)
        # both bounds are the MoE layer's and the plain refinement is the cheaper
        provisional = self.bound.model.is_moe and self.bound.model.num_dense_layers > 0
        ranking = self._make_ranking(provisional=provisional)
        best = ranking.first()
        if provisional and ranking.duplicates:
            provisional = False
            ranking = self._make_ranking(entries=self._entries)
            best = ranking.first()
        if best is not None:        # one pass of coordinate descent on the estimate at the best layout
            a = self.assignment(best)
            for k in KNOBS:
                if k in self._layout_knobs or k in PER_LAYOUT_KNOBS or k in DP_KNOBS or len(self.bound.choices[k]) < 2:
                    continue
                cands = [self._plan({**a, k: v}) for v in self.bound.choices[k]]
                cands = [p for p in cands if p is not None and self.screen.fits(p)]
                if cands:
                    pick = min(cands, key=lambda p: (self.screen.estimate_ms(p), p != best))
                    a[k] = getattr(pick, k)
                    best = pick
            settings = [k for k in KNOBS if k not in self._layout_knobs and k not in PER_LAYOUT_KNOBS
                        and k not in DP_KNOBS]
            if any(self._prefs[k] != a[k] for k in settings):
                self._prefs.update({k: a[k] for k in settings})
                self._plan_cache.clear()
                ranking = self._make_ranking()
            elif provisional:
                ranking = self._make_ranking(entries=self._entries)
                ranking.first()
        self._ranking = ranking

    @property
    def _layout_knobs(self) -> tuple[str, ...]:
        """:data:`LAYOUT_KNOBS`, and ``ep_degree`` for a mixture-of-experts model (a dense model's layouts, keys
        and jitter are unchanged)."""
        return LAYOUT_KNOBS + ("ep_degree",) if self.bound.model.is_moe else LAYOUT_KNOBS

    def _layout_assignments(self) -> Iterator[dict[str, Any]]:
        """Every layout's assignment (the preferred settings elsewhere), in enumeration order."""
        c = self.bound.choices
        for tp, pp, cp in itertools.product(c["tp_degree"], c["pp_degree"], c["cp_degree"]):
            scheds = c["pipeline_schedule"] if pp > 1 else ("1f1b",)
            for sched in scheds:
                vpps = c["vpp_degree"] if sched == "interleaved_1f1b" else (self._prefs["vpp_degree"],)
                for vpp, mbs in itertools.product(vpps, c["micro_batch_size"]):
                    # an MoE model: every expert-parallel degree is a layout of its own (the dispatch
                    # traffic, the experts' memory and their GEMM shapes all follow EP)
                    eps = c["ep_degree"] if self.bound.model.is_moe else (self._prefs["ep_degree"],)
                    for ep in eps:
                        yield {**self._prefs, "tp_degree": tp, "pp_degree": pp, "cp_degree": cp,
                               "pipeline_schedule": sched, "vpp_degree": vpp, "micro_batch_size": mbs,
                               "ep_degree": ep}

    def _make_ranking(self, entries: list[tuple[int, dict[str, Any], float]] | None = None,
                      known: dict[int, Plan | None] | None = None,
                      refined: set[int] | None = None, provisional: bool = False) -> LazyRanking:
        """A :class:`LazyRanking` of every layout of the space (``entries``: (index, layout knobs, bound)
        as stored, else enumerated here). A layout's jitter is drawn from its own knob values (seeded),
        so it does not depend on which other layouts fit. ``provisional``: refined by the bounds of
        :meth:`_fit_bound` instead of :meth:`_memory_bound` (the same order, other bounds: for
        :meth:`_compute_layouts`' first ranking only, whose bounds are not kept)."""
        if entries is None:
            entries = []
            for i, a in enumerate(self._layout_assignments()):
                if interrupted():       # SIGINT / SIGTERM noted by the CLI or the tuner: stop ranking
                    raise KeyboardInterrupt
                if self._plan(a) is not None:
                    entries.append((i, {k: a[k] for k in self._layout_knobs}, self._layout_bound(a)))
        self._entries = entries
        knobs = {i: a for i, a, _ in entries}

        def screen(i: int) -> Plan | None:
            if interrupted():
                raise KeyboardInterrupt
            return self._best_per_layout({**self._prefs, **knobs[i]})

        def jitter(i: int) -> float:
            a = knobs[i]
            return 1 + self.jitter * self._rng("layout", *(a[k] for k in self._layout_knobs)).uniform(-1, 1)

        if provisional:     # each layout: its kinds bound, then its fit bound (final), LayoutBounds
            return LazyRanking({i: b for i, _, b in entries}, screen, self.screen.estimate_ms, jitter, 1 - self.jitter,
                               prerefine=lambda i: self._layout_bound({**self._prefs, **knobs[i]}, kinds=True),
                               refine=lambda i, need: self._fit_bound({**self._prefs, **knobs[i]}, need))
        return LazyRanking({i: b for i, _, b in entries}, screen, self.screen.estimate_ms, jitter,
                           1 - self.jitter, known,
                           refine=lambda i, need: self._memory_bound({**self._prefs, **knobs[i]}, need), refined=refined)

    # ------------------------------------------------------------ neighbours
    def neighbours(self, plan: Plan) -> list[Plan]:
        """Plans one knob (or two layout knobs) away from ``plan`` that fit in memory (cached)."""
        got = self._neighbours.get(plan)
        if got is not None:
            return got
        c = self.bound.choices
        a = self.assignment(plan)
        moves: list[dict[str, Any]] = []
        for k in KNOBS:
            for v in c[k]:
                if v != a[k]:
                    moves.append({k: v})
                    if k == "pipeline_schedule" and v == "interleaved_1f1b":
                        moves.extend({k: v, "vpp_degree": x} for x in c["vpp_degree"])
                    # a knob active only under another's value moves with it (DEPENDENT_KNOBS)
                    for dep in DEPENDENT_KNOBS.get((k, v), ()):
                        moves.extend({k: v, dep: x} for x in c[dep] if x != a[dep])
        for k1, k2 in itertools.combinations(PAIR_KNOBS, 2):
            for v1, v2 in itertools.product(c[k1], c[k2]):
                if v1 != a[k1] and v2 != a[k2]:
                    moves.append({k1: v1, k2: v2})
        out: list[Plan] = []
        seen = {plan}
        for mv in moves:
            q = self._plan({**a, **mv})
            if q is not None and q not in seen:
                seen.add(q)
                if not self.screen.fits(q):
                    # more memory than there is: try the (recompute, ZeRO) that fits, as layouts do
                    q = self._fit_settings({**a, **mv}) if set(mv) & set(PAIR_KNOBS + PER_LAYOUT_KNOBS) else None
                    if q is None or q in seen:
                        continue
                    seen.add(q)
                out.append(q)
        self._neighbours[plan] = out
        return out

    # ------------------------------------------------------------ the proposal
    def _update_history(self, study: optuna.Study) -> None:
        for t in study.get_trials(deepcopy=False):
            if t.number in self._finished:     # recorded finished: final (one recorded running is read again)
                continue
            d = t.user_attrs.get("plan")
            plan = None
            if d is not None:
                key = json.dumps(d, sort_keys=True, default=str)
                plan = self._plan_cache.get("plan:" + key)
                if plan is None:
                    try:
                        plan = Plan.from_dict(d)
                    except Exception:       # a plan stored by another version: only blocks nothing
                        plan = None
                    self._plan_cache["plan:" + key] = plan
            elif (c := t.system_attrs.get(CLAIM_ATTR)) is not None and not t.state.is_finished():
                # another worker's trial still being sampled: the plan it claimed (_claimed_earlier)
                plan = self._plan_cache.get("claim:" + json.dumps(c, sort_keys=True))
                if plan is None:
                    try:
                        plan = Plan.from_dict(c)
                    except Exception:
                        plan = None
                    self._plan_cache["claim:" + json.dumps(c, sort_keys=True)] = plan
            elif t.params and t.state.is_finished():
                # a running trial without its plan attribute is still being sampled by another worker: its
                # params are partial, so it stays invisible (next_plan counts it among the concurrent ones)
                plan = self._plan({**self._prefs, **t.params})
            value = None
            if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible", True) is True and t.value is not None \
                    and all(v <= 0.0 for v in t.constraints.values()):
                value = float(t.value)
            if t.state.is_finished() or plan is not None:
                self._history[t.number] = (plan, value)
                if t.state.is_finished():
                    self._finished.add(t.number)
                if value is not None and value > 0 and isinstance(t.user_attrs.get("step_time_ms"), (int, float)):
                    step = self._step_ms[t.number] = float(t.user_attrs["step_time_ms"])
                    exp = t.user_attrs.get("step_time_exposed_ms")
                    self._exposed_ms[t.number] = max(step, float(exp)) if isinstance(exp, (int, float)) else step

    def next_plan(self, study: optuna.Study, number: int) -> Plan | None:
        """The plan trial ``number`` should evaluate (module docstring), or None to sample at random."""
        layouts = self.rank(study)
        self._study = study
        self._update_history(study)
        seen = {p for p, _ in self._history.values() if p is not None} | self._lost | self._yielded
        seen.update(p for n, prm in self._chosen.items() if n != number
                    for p in [self._plan({**self._prefs, **prm})] if p is not None)
        # Which trials take a layout, and which one, is a function of the trial number alone (trial numbers
        # are unique in the storage), so concurrent workers take different layouts: trial n < num_initial
        # takes layout n; after that every explore_every-th trial the next layout in rank order. The
        # other trials search locally among plans that are not layouts (the layout trials reach those),
        # and skip as many candidates as there are earlier local-search trials this worker cannot see
        # yet (other workers sampling at this moment); sequentially that is 0.
        n0, k = self.num_initial, self.explore_every

        def layout_index(n: int) -> int | None:
            return n if n < n0 else (n0 + (n - n0) // k if (n - n0) % k == k - 1 else None)

        idx = layout_index(number)
        if idx is not None and number >= n0 and self.rank_basis is not None:
            # conservative ranking: a layout trial takes an untried layout the convergence stop waits for first
            if (p := self._stalled_candidate(layouts, seen, wait=False)) is not None:
                return p
        if idx is not None:
            p = next((q for q in layouts.iter_from(idx) if q not in seen), None)
            if p is not None:
                return p
        if number >= n0 and (p := self._stalled_candidate(layouts, seen)) is not None:
            return p
        skip = sum(1 for n in range(number) if n not in self._history and n not in self._chosen
                   and layout_index(n) is None)
        # local search around the best plans by the order run reports them in (the conservative estimate)
        bases = [p for _, _, p in sorted(((v * self.factor(p), n, p) for n, (p, v) in self._history.items()
                                          if p is not None and v is not None), key=lambda x: (-x[0], x[1]))]
        base_set = set(bases)
        seen_ids = {id(self._canonical(p)) for p in seen}
        # before any plan is scored (workers starting together), around the best-ranked layouts: among the
        # unseen neighbours of the first base that has any, the skip-th in the base's ranking
        for base in itertools.chain(bases, (q for q in layouts if q not in base_set)):
            for q in self._ranked_neighbours(base):
                if id(q) not in seen_ids:
                    if not skip:
                        return q
                    skip -= 1
        return next((q for q in layouts if q not in seen), None)

    def _random_fitting(self, number: int, tries: int = 200) -> Plan | None:
        """A plan drawn at random (seeded by trial number) that is valid, fits in memory and is not in the
        study yet; None after ``tries`` draws without one (Optuna's random sampler then draws)."""
        rng = self._rng("random", number)
        seen = {p for p, _ in self._history.values() if p is not None}
        for _ in range(tries):
            q = self._plan({k: rng.choice(list(v)) for k, v in self.bound.choices.items()})
            if q is not None and q not in seen and self.screen.fits(q):
                return q
        return None

    def _canonical(self, plan: Plan) -> Plan:
        """One object per distinct plan (so sets of ids stand for sets of plans without re-hashing)."""
        return self._canon.setdefault(plan, plan)

    def _ranked_neighbours(self, base: Plan) -> list[Plan]:
        """The neighbours of ``base`` that are not layouts, by estimated step time x the base's jitter
        (cached; canonical objects). The tie-breaking jitter is drawn per base plan (string-seeded: the
        same in every worker and every trial), so concurrent trials rank the same candidates alike and take
        different ones. Filtering this list keeps the order a sort of the filtered list would give (the
        sort is stable and the keys do not depend on the filter)."""
        got = self._ranked.get(base)
        if got is None and (got := self._load_neighbours(base)) is not None:
            self._ranked[base] = got
        if got is None:
            # the layouts screened so far (a neighbour that is an unscreened layout's plan stays a
            # candidate; it is never proposed twice either way)
            layout_set = {q for q in self.rank().screened.values() if q is not None}
            nbrs = self.neighbours(base)
            # (loss_impl at its default left out: the seed of every plan stays what it was before the knob)
            seed_params = {k: v for k, v in plan_params(base, moe=self.bound.model.is_moe).items()
                           if not (k == "loss_impl" and v == "full")}
            brng = self._rng("base", json.dumps(seed_params, sort_keys=True, default=str))
            jit = {q: 1 + self.jitter * brng.uniform(-1, 1) for q in nbrs}
            cands = [q for q in nbrs if q not in layout_set]
            ranked = sorted(cands, key=lambda q: self.screen.estimate_ms(q) * jit[q])
            got = self._ranked[base] = [self._canonical(q) for q in ranked]
            self._store_neighbours(base, got)
        return got

_MISSING = object()
_knob_values = operator.itemgetter(*KNOBS)        # an assignment -> its values in KNOBS order
_base_values = operator.itemgetter(*(k for k in KNOBS if k not in BoundSearchSpace.VARIANT_KNOBS))


class _Assigned:
    """What :meth:`BoundSearchSpace.suggest` reads from an ``optuna.trial.FixedTrial`` of ``params``: each
    knob's value, ValueError for a knob not given (FixedTrial's rule; a value outside the choices is
    returned as FixedTrial returns it, with its warning left out), without building a distribution per
    call (~40% of a layout ranking's plan building, profiled on 405B x 1,024 B200)."""

    __slots__ = ("params",)

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        try:
            return self.params[name]
        except KeyError:
            raise ValueError(f"The value of the parameter '{name}' is not found.") from None


def make_sampler(bound: BoundSearchSpace, *, model: Any, cluster: Any, workload: Any, engine: Any = None,
                 costs: Any = None, seed: int | None = 0, layers: int | None = None, **kw: Any) -> LayoutSampler:
    """A :class:`LayoutSampler` with a :class:`PlanScreen` for the target (``costs``: the evaluator's
    op costs when it has them, else the shipped calibration).

    ``layers``: the real backend runs a depth-truncated proxy of ``model`` with this many layers
    (``--layers N``), so the screen judges that proxy (its memory decides whether ``recompute: none``
    fits; issue 43: the full 32-layer 8B did not fit without recomputation, so the 16-layer proxy was
    screened into selective recomputation, 67.7% MFU, against 71.0% without it)."""
    if layers:
        model = model.truncated(layers)
    screen = PlanScreen(model=model, cluster=cluster, workload=workload, engine=engine, costs=costs)
    return LayoutSampler(bound, screen, seed=seed, **kw)


__all__ = ["LayoutSampler", "make_sampler", "LAYOUT_KNOBS", "PREFERENCES"]
