"""Lower bounds on a layout's estimated step time, for the layout ranking (:class:`autotune.search.ranking.
LazyRanking`): the per-layer bound every layout starts with, the refinement from the plans that can fit, and the
bounds of the provisional first ranking of a mixture-of-experts model. A mixin of
:class:`autotune.search.sampler.LayoutSampler` (moved from sampler.py, issue 38: the module was at its size cap);
it reads the sampler's ``bound``, ``screen`` and ``_plan``, and its preference orders as :attr:`preferences` and
:attr:`per_layout_knobs`.
"""

from __future__ import annotations

from typing import Any, Mapping

from autotune.spec.plan import Plan


class LayoutBounds:
    """Layout bounds of a :class:`autotune.search.sampler.LayoutSampler` (module docstring)."""

    #: the sampler's preferred value order per settings knob and its per-layout knobs (sampler.py
    #: ``PREFERENCES``, ``PER_LAYOUT_KNOBS``)
    preferences: Mapping[str, tuple[Any, ...]] = {}
    per_layout_knobs: tuple[str, ...] = ()
    bound: Any
    screen: Any

    def _plan(self, assignment: Mapping[str, Any]) -> Plan | None:      # LayoutSampler._plan
        raise NotImplementedError

    def _layout_bound(self, a: dict[str, Any], kinds: bool = False) -> float:
        """:meth:`PlanScreen.layout_bound_ms` of layout ``a`` over its per-layout precisions, without
        recomputation (the least per-layer time any of its screened plans can have); ``kinds``:
        :meth:`PlanScreen.kinds_bound_ms` instead (an MoE model's dense and MoE layers each at their own time)."""
        vals = self.bound.choices["precision"] if "precision" in self.per_layout_knobs else (a["precision"],)
        plans = [q for v in vals if (q := self._plan({**a, "precision": v, "recompute": "none"})) is not None]
        return self.screen.kinds_bound_ms(plans) if kinds else self.screen.layout_bound_ms(plans)

    def _memory_bound(self, a: dict[str, Any], need: float = float("inf")) -> tuple[float, bool]:
        """A tighter lower bound than :meth:`_layout_bound` on the estimate of layout ``a``'s plan, from the
        plans that can fit (+inf when none can: nothing of the layout is screened), and whether it is final:
        with ``need`` the search may stop once the bound is shown to be at least ``need`` (not final).

        The layout's plan (:meth:`_best_per_layout`, then :meth:`_tune_dp`) has some precision v, a
        recomputation level r and ZeRO stage z such that (v, r, z) fits at the preferred bucket size
        (:meth:`_fit_settings` picks it there; :meth:`_tune_dp` changes the stage before the bucket and
        keeps r). Memory falls with recomputation and with the ZeRO stage (the rule :meth:`_fit_settings`
        relies on), so per (v, z) r is at least r*(v, z), the first level that fits, and r*(v, z) only grows
        as z falls; :meth:`PlanScreen.chunk_bound_ms` of (v, r, z) bounds every bucket size. No
        recomputation's chunk bound is at most every level's (recomputation only adds work,
        CostBuilder._layer_cost). ZeRO 0 has ZeRO 1's chunk costs (CostBuilder: stage >= 2 changes them)
        and needs no less memory. Precisions are taken in the order of their per-layer bound and skipped
        once that is not below the best bound so far (a chunk bound is at least the layer bound). A candidate
        whose layer bound is below the threshold (the best bound so far, or ``need``) is checked for memory
        first and its chunk bound built only when it fits; one whose layer bound, or chunk bound, is not below
        the threshold counts with that bound, which makes the result not final."""
        c = self.bound.choices
        rec = [v for v in self.preferences["recompute"] if v in c["recompute"]]
        zero = sorted((v for v in self.preferences["zero_stage"] if v in c["zero_stage"]), reverse=True)
        vals = c["precision"] if "precision" in self.per_layout_knobs else (a["precision"],)
        if not rec or not zero:
            return self._layout_bound(a), True
        order = []
        for v in vals:
            q0 = self._plan({**a, "precision": v, "recompute": "none"})
            if q0 is not None:
                order.append((self.screen.layout_bound_ms([q0]), repr(v), v))
        best = float("inf")         # the least chunk bound of a candidate that fits
        unchecked = float("inf")    # the least chunk (or layer) bound of candidates not checked for memory
        for lb, _, v in sorted(order):
            if lb >= min(best, unchecked):
                break
            if lb >= need:          # this precision and the rest: at least need, not checked
                unchecked = min(unchecked, lb)
                break
            k = 0           # index into rec: the first level that may fit at this stage
            covered = False     # stage 1's candidates bound stage 0's (same chunk costs, no less memory)
            for z in zero:
                if z == 0 and covered:
                    break
                while k < len(rec):
                    q = self._plan({**a, "precision": v, "recompute": rec[k], "zero_stage": z})
                    if q is None:
                        break
                    # the layer bound first (a lookup), then memory, then the chunk bound (a CostBuilder)
                    # only for a candidate that fits: most candidates below the threshold do not fit
                    thr = min(best, need)
                    cb = self.screen.layout_bound_ms([q])
                    if cb < thr:
                        if not self.screen.fits(q):
                            k += 1
                            continue
                        cb = self.screen.chunk_bound_ms(q)
                    if cb >= thr:
                        # at least cb, counted as not checked (for no recomputation every level is too)
                        unchecked = min(unchecked, cb) if cb < best else unchecked
                    break
                else:
                    break           # nothing fits at this stage, nor at any lower one
                if q is None:
                    continue
                covered = z == 1 and k == 0
                if cb >= min(best, need):
                    if rec[k] == "none":
                        continue            # every level of this stage is at least cb
                    # selective / full: the other levels of this stage are bounded each, below
                    for r in rec[k + 1:]:
                        q2 = self._plan({**a, "precision": v, "recompute": r, "zero_stage": z})
                        if q2 is not None and (cb2 := self._cheap_chunk_bound(q2, min(best, unchecked))) < min(best, unchecked):
                            unchecked = cb2     # not checked either: counted with its bound
                    continue
                best = min(best, cb)        # rec[k] fits here; the levels above it fit too
                if rec[k] != "none":
                    for r in rec[k + 1:]:
                        q2 = self._plan({**a, "precision": v, "recompute": r, "zero_stage": z})
                        if q2 is not None:
                            best = min(best, self.screen.chunk_bound_ms(q2))
        if unchecked < best:
            return unchecked, False
        return best, True

    def _fit_bound(self, a: dict[str, Any], need: float = float("inf")) -> tuple[float, bool]:
        """A lower bound (ms) on the estimate of layout ``a``'s plan for the provisional ranking
        (:meth:`LayoutSampler._compute_layouts`), final: the least :meth:`PlanScreen.chunk_bound_ms` of
        (precision v, recomputation r*, ZeRO stage z) over v and z, r* the first recomputation level in
        preference order (none, selective, full) at which (v, z) fits; +inf when nothing fits.

        Why it bounds the plan :meth:`LayoutSampler._best_per_layout` returns, (v, r, z) with some bucket:
        that plan fits (``_fit_settings`` and ``_tune_dp`` keep only plans that fit), so r* exists for its
        (v, z) and r is r* or a later level; the chunk bound of (v, r*, z) bounds every plan that differs from
        it by the bucket or by more recomputation (:meth:`PlanScreen.chunk_bound_ms`). A precision whose
        saving plan (full recomputation, the highest stage) does not fit is one ``_fit_settings`` drops, and a
        precision whose :meth:`PlanScreen.kinds_bound_ms` is not below the bound so far cannot lower it (a
        chunk bound is at least it). ZeRO 0 and 1 have one chunk bound (:func:`autotune.search.estimate.
        _chunk_key`), so after the first of them only the levels before its r* are tried at the other. No
        rule about memory is assumed: every level is checked for memory until one fits.

        Returns (the bound, whether it is final): precisions are taken in the order of their kinds bound, and
        once that is at least ``need`` (and below the bound so far) the rest are not tried: the least of the
        bound so far and that kinds bound is returned, not final (it is at least ``need``; the ranking asks
        again if the layout comes up again). Unlike :meth:`_memory_bound` it reads no layer bound of the
        recomputed plans (DeepSeek-V3 x 256 B200: the first ranking refined 2,349 of 2,373 layouts)."""
        c = self.bound.choices
        rec = [v for v in self.preferences["recompute"] if v in c["recompute"]]
        zero = [v for v in self.preferences["zero_stage"] if v in c["zero_stage"]]
        vals = c["precision"] if "precision" in self.per_layout_knobs else (a["precision"],)
        order = []
        for v in vals:
            if (q0 := self._plan({**a, "precision": v, "recompute": "none"})) is not None:
                order.append((self.screen.kinds_bound_ms([q0]), repr(v), v))
        out = float("inf")
        for lb, _, v in sorted(order):
            if lb >= out:
                break
            if lb >= need:          # this precision and the rest: at least lb >= need, not tried
                return lb, False
            b = {**a, "precision": v}
            saving = next((q for z in sorted(zero, reverse=True)
                           if (q := self._plan({**b, "recompute": rec[-1], "zero_stage": z})) is not None), None)
            if saving is not None and not self.screen.fits(saving):
                continue
            below = len(rec)        # ZeRO 0 / 1: the levels before the other stage's r* (one chunk bound)
            for z in zero:
                for k, r in enumerate(rec[:below] if z < 2 else rec):
                    q = self._plan({**b, "recompute": r, "zero_stage": z})
                    if q is not None and self.screen.fits(q):
                        out = min(out, self.screen.chunk_bound_ms(q))
                        if z < 2:
                            below = k
                        break
        return out, True

    def _cheap_chunk_bound(self, q: Plan, threshold: float) -> float:
        """A lower bound (ms) on :meth:`PlanScreen.chunk_bound_ms` of ``q``'s estimate: the layer-level bound
        (:meth:`PlanScreen.layout_bound_ms` of ``q`` alone, its recomputation included: a lookup of one layer's
        cost, memoised per :data:`autotune.cost.chunk_costs.LAYER_FIELDS`, instead of a CostBuilder and its chunk
        costs) when that is
        already at least ``threshold``, else the chunk bound itself. :meth:`_memory_bound` only compares a
        candidate's bound with a threshold or keeps it as a (not final) lower bound, so either is exact for
        it; the chunk bound is built only for the candidates below the threshold."""
        lb = self.screen.layout_bound_ms([q])
        return lb if lb >= threshold else self.screen.chunk_bound_ms(q)



__all__ = ["LayoutBounds"]
