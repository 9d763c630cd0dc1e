"""Issue 40: a neighbour move that turns DP grad-reduce overlap on also sets param-gather overlap (the knob
active only under it, BoundSearchSpace.suggest), so a plan without overlap reaches both overlaps in one move.

Derivation by hand: in the default space ``param_gather_overlap`` is read only when ``dp_grad_reduce_overlap`` is
true and ZeRO >= 1 (autotune/search/space.py, suggest). A plan without grad-reduce overlap stores no
param-gather value, so its assignment takes the sampler's preferred one; once the coordinate-descent pass chose
False there (70B x 256 H100 over 10 Gb/s, seed 1), the one-knob move ``dp_grad_reduce_overlap -> True`` gives
(True, False) only, and (True, True) is two moves away. With the dependent move it is one: exactly the base plan
with both flags True, every other field equal."""

from __future__ import annotations

import dataclasses

from autotune.search import make_sampler
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Workload
from autotune.tune.tuner import Tuner

MODEL = get_model("8b")
CLUSTER = make_cluster("h200", 8)
W = Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)


def _sampler():
    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, storage="sqlite:///:memory:")
    s = make_sampler(t.bound, model=MODEL, cluster=CLUSTER, workload=W, engine=t.engine, seed=0)
    s.rank()
    return s


def _base_without_overlap(s):
    """A ranked layout's plan with DP > 1 and ZeRO >= 1, its grad-reduce overlap off, the preferred param-gather
    overlap False (what the coordinate-descent pass chose on the slow fabric)."""
    lay = next(p for p in s.layouts() if p.dp_degree * p.cp_degree > 1 and p.zero_stage >= 1
               and p.dp_grad_reduce_overlap and p.param_gather_overlap)
    s._prefs["param_gather_overlap"] = False
    s._plan_cache.clear()
    s._base_plans.clear()
    s._neighbours.clear()
    base = s._plan({**s.assignment(lay), "dp_grad_reduce_overlap": False})
    assert base is not None and not base.dp_grad_reduce_overlap and not base.param_gather_overlap
    assert s.screen.fits(base)
    return lay, base


def test_grad_overlap_move_also_sets_param_gather_overlap():
    s = _sampler()
    lay, base = _base_without_overlap(s)
    both = dataclasses.replace(base, dp_grad_reduce_overlap=True, param_gather_overlap=True)
    grad_only = dataclasses.replace(base, dp_grad_reduce_overlap=True, param_gather_overlap=False)
    nbrs = s.neighbours(base)
    assert grad_only in nbrs            # the one-knob move, as before
    assert both in nbrs                 # the dependent move: both overlaps in one step
    # and the plan reached is the layout's own plan with its overlaps (the same fields otherwise)
    assert both.to_dict() == {**base.to_dict(), "dp_grad_reduce_overlap": True, "param_gather_overlap": True}

