"""The order in which plans are reported when their predictions overlap within the error band (issue 22).

Two plans whose predicted MFUs are within the engine's error band of each other cannot be told apart by the
prediction (autotune/data/error_bands.yaml: the held-out mean absolute error). Among those, the one whose MFU
holds up best with every overlapped collective exposed comes first: its advantage rests least on
communication the model says is hidden (docs/search.md, "Ranking within the error band").

One rule, two users: :func:`autotune.study.trials.robust_order` orders a study's trials by it (what ``run``,
``show`` and ``export`` report), and :meth:`autotune.search.convergence.ConvergenceStop.convergence` stops a run
only when no untried plan could change its first place.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def band_order(items: Sequence[T], band_frac: float, *, value: Callable[[T], float],
               exposed: Callable[[T], float], number: Callable[[T], int], k: int | None = None) -> list[T]:
    """The first ``k`` (all) of ``items`` best first: repeatedly, among the remaining items whose ``value``
    (MFU) is within ``band_frac`` of the highest remaining one (``value >= highest x (1 - band_frac)``), the
    one with the highest ``exposed`` (MFU with every overlapped collective exposed), ties by higher
    ``value``, then lower ``number``. ``band_frac`` <= 0: plain order by ``value`` (ties: lower ``number``).

    Args:
        items: feasible plans or trials (any objects; read only through the three callables).
        band_frac: the error band as a fraction (0.114 = 11.4%).
        value, exposed, number: an item's MFU, its MFU at the overlap-exposed bound (<= ``value``), its
            trial number.
        k: how many to return (None: all).
    """
    rest = sorted(items, key=lambda t: (-value(t), number(t)))
    if band_frac <= 0:
        return rest[:k] if k is not None else rest
    out: list[T] = []
    while rest and (k is None or len(out) < k):
        lim = value(rest[0]) * (1.0 - band_frac)
        within = [t for t in rest if value(t) >= lim]
        pick = max(within, key=lambda t: (exposed(t), value(t), -number(t)))
        out.append(pick)
        rest.remove(pick)
    return out


__all__ = ["band_order"]
