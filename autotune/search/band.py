"""The order in which plans are reported: by the conservative estimate (issue 40).

A prediction's central 80% interval (autotune/spec/trust.py) is widest where the model is least sure (regimes
with few or no published runs: small TP on a large model, CP, TP without overlap, GPU families with few
runs). Plans are ranked by the low end of that interval, MFU / (1 + high): a plan whose advantage rests on a
regime the development set does not cover has to be faster by more to come first (docs/search.md, "Ranking by
the conservative estimate").

One rule, two users: :func:`autotune.study.trials.robust_order` orders a study's trials by it (what ``run``,
``show`` and ``export`` report), and :meth:`autotune.search.convergence.ConvergenceStop.convergence` stops a run
only when no untried plan could change its first place.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def conservative_order(items: Sequence[T], *, value: Callable[[T], float], factor: Callable[[T], float] | None,
                       number: Callable[[T], int], k: int | None = None) -> list[T]:
    """The first ``k`` (all) of ``items`` best first by ``value x factor`` (the low end of the MFU's interval),
    ties by higher ``value``, then lower ``number``. ``factor`` None: plain order by ``value``.

    Args:
        items: feasible plans or trials (read only through the callables).
        value: an item's predicted MFU (fraction).
        factor: 1 / (1 + the high end of its interval's residual) (:func:`autotune.spec.trust.conservative_factor`).
        number: its trial number.
        k: how many to return (None: all).
    """
    if factor is None:
        rest = sorted(items, key=lambda t: (-value(t), number(t)))
    else:
        rest = sorted(items, key=lambda t: (-value(t) * factor(t), -value(t), number(t)))
    return rest[:k] if k is not None else rest


__all__ = ["conservative_order"]
