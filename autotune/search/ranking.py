"""Layouts in the order of their screening estimate, screened only as far as the search asks (issue 26).

Ranking every layout of 405B on 1,024 B200 (739 that fit) took ~25 estimates and ~25 memory checks each,
about 20 s CPU, where a converged run looks at a few dozen. :class:`LazyRanking` keeps a lower bound per
layout (:meth:`autotune.search.estimate.PlanScreen.layout_bound_ms`, ~1% of a screen) and screens a layout
(its best fitting plan and estimate, :meth:`autotune.search.sampler.LayoutSampler._best_per_layout`) only
when the next place in the order, or a question about every layout below some step time, needs it.

The order is exactly that of screening everything and sorting by the jittered key ``estimate x (1 +
jitter x u)`` (u in [-1, 1], drawn per layout), ties by enumeration index: a layout's key is at least
``bound x (1 - jitter)``, so once the smallest screened key is not above the smallest unscreened
layout's key bound, it is the next one (tests/search/test_lazy_ranking.py compares with the full sort).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator

from autotune.spec.plan import Plan


class LazyRanking:
    """Layouts ``0 .. n-1`` (enumeration indices) in jittered-estimate order, screened on demand.

    Args:
        bounds: per layout index, a lower bound on its estimate (ms; 0 = none known).
        screen: index -> the layout's plan (its best fitting plan) or None when nothing fits.
        estimate: plan -> estimated step time (ms).
        jitter: index -> the key's factor ``1 + jitter x u``; its lower end ``low`` (``1 - jitter``).
        low: the smallest value ``jitter`` returns.
        known: screen results already computed (index -> plan or None), e.g. read from the storage.
        refine: (index, need) -> (a tighter lower bound in ms, whether it is final), asked only when a
            layout's bound would have it screened (a second, dearer bound: memory checks); ``need`` is the
            bound below which the layout would be screened now: a refinement may stop once it shows the
            bound is at least that (not final: refined again if the layout comes up again).
        refined: layouts whose bound is already final (read from the storage).
        prerefine: index -> a lower bound (ms), asked once per layout before ``refine`` (a cheaper first
            step); the layout is pushed back with the larger of the two bounds.

    Attributes:
        duplicates: layouts screened to a plan another layout had (ranked once, under the first one
            screened): only then does the order of screening, so the bounds, decide a place.
    """

    def __init__(self, bounds: dict[int, float], screen: Callable[[int], Plan | None],
                 estimate: Callable[[Plan], float], jitter: Callable[[int], float], low: float,
                 known: dict[int, Plan | None] | None = None,
                 refine: Callable[[int, float], tuple[float, bool]] | None = None,
                 refined: set[int] | None = None, prerefine: Callable[[int], float] | None = None) -> None:
        self._bounds = dict(bounds)
        self._screen_fn, self._estimate, self._jitter, self._low = screen, estimate, jitter, low
        self._refine = refine
        self._refined: set[int] = set(refined or ()) if refine is not None else set(self._bounds)
        self._pending = [(b * low, i) for i, b in self._bounds.items()]
        heapq.heapify(self._pending)
        self._ready: list[tuple[float, int]] = []
        self.screened: dict[int, Plan | None] = {}
        self._keys: dict[int, float] = {}       # a screened layout's key (its place in the order)
        self._plans: set[Plan] = set()
        self.ranked: list[Plan] = []
        self._known = dict(known or {})
        self._prerefine = prerefine
        self._prerefined: set[int] = set()
        self.duplicates = 0

    def _take(self, need: float) -> None:
        """Pop the pending layout of least bound: refine its bound (pushed back) or, refined, screen it.
        ``need``: the bound (ms) below which it would be screened now."""
        _, i = heapq.heappop(self._pending)
        if i in self._refined or i in self._known:
            self._screen(i)
            return
        if self._prerefine is not None and i not in self._prerefined:
            self._prerefined.add(i)
            b = self._bounds[i] = max(self._bounds[i], self._prerefine(i))
            heapq.heappush(self._pending, (b * self._low, i))
            return
        b, final = self._refine(i, need)        # type: ignore[misc]
        if not final and b <= need:             # (a partial bound is >= need; at need itself: no progress)
            b, final = self._refine(i, float("inf"))     # type: ignore[misc]
        if final:
            self._refined.add(i)
        b = max(self._bounds[i], b)
        self._bounds[i] = b
        heapq.heappush(self._pending, (b * self._low, i))

    def _screen(self, i: int) -> None:
        plan = self._known.pop(i) if i in self._known else self._screen_fn(i)
        if plan is not None and plan in self._plans:
            plan = None             # the same plan as another layout's: ranked once
            self.duplicates += 1
        self.screened[i] = plan
        if plan is not None:
            self._plans.add(plan)
            self._keys[i] = key = self._estimate(plan) * self._jitter(i)
            heapq.heappush(self._ready, (key, i))

    def _extend(self) -> bool:
        """Place the next layout in order; False when every layout is placed."""
        while self._pending and (not self._ready or self._pending[0] <= self._ready[0]):
            self._take(self._ready[0][0] / self._low if self._ready else float("inf"))
        if not self._ready:
            return False
        _, i = heapq.heappop(self._ready)
        self.ranked.append(self.screened[i])        # type: ignore[arg-type]
        return True

    def __iter__(self) -> Iterator[Plan]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[Plan]:
        """The layouts from place ``start`` on, in order, screening as the iteration goes."""
        k = start
        while k < len(self.ranked) or self._extend():
            if k >= len(self.ranked):
                continue
            yield self.ranked[k]
            k += 1

    def first(self) -> Plan | None:
        return next(iter(self), None)

    def all(self) -> list[Plan]:
        """Every layout that fits, in order (screens all of them)."""
        while self._extend():
            pass
        return list(self.ranked)

    def screen_below(self, ms: float) -> list[Plan]:
        """Screen every layout whose bound is below ``ms`` and return the screened layouts' plans (every
        layout with an estimate below ``ms`` is among them), in place order where placed."""
        while self._pending and self._bounds[self._pending[0][1]] < ms:
            self._take(ms)
        placed = set(self.ranked)
        return list(self.ranked) + [q for q in self.screened.values() if q is not None and q not in placed]

    def first_where(self, ok: Callable[[Plan], bool], below_ms: float) -> Plan | None:
        """The first layout in order with ``ok(plan)``, among those whose estimate is below ``below_ms``
        (the caller's ``ok`` must imply that), or None. Every such layout is screened (:meth:`screen_below`),
        so the first is the one of least (key, index), the order's own sort: found without placing the
        layouts before it, which would screen layouts whose bound is above ``below_ms`` (issue 26: with
        ``--workers 4`` on 70B x 64 B200 each worker screened the same 29 such layouts)."""
        self.screen_below(below_ms)
        keys = self._keys
        found = min(((keys[i], i) for i, q in self.screened.items() if q is not None and ok(q)), default=None)
        return self.screened[found[1]] if found is not None else None

    def state(self) -> list[tuple[int, float, bool]]:
        """(index, bound, whether the bound is final) of every layout, to rebuild this ranking elsewhere."""
        return [(i, b, i in self._refined) for i, b in self._bounds.items()]

    @property
    def num_layouts(self) -> int:
        """Layouts with a plan of the space (screened or not; some may not fit)."""
        return len(self._bounds)
