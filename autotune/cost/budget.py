"""Training-budget arithmetic of ``autotune plan``: tokens and a throughput -> days, GPU-hours, cost, energy, CO2.

Pure functions, no I/O. Units: tokens (plain count), tokens/s per GPU, days (86,400 s), GPU-hours, US dollars,
watts per GPU, kWh / MWh, kg and tonnes CO2. The formulas (docs/planner.md):

* wall time (s) = tokens / (tokens/s per GPU x GPUs x goodput); days = that / 86,400;
* GPU-hours = GPUs x days x 24;
* energy (kWh) = GPU-hours x watts per GPU x PUE / 1,000;
* cost (USD) = GPU-hours x USD per GPU-hour;
* CO2 (kg) = energy (kWh) x grid kg CO2 per kWh.

``goodput`` is the share of wall time spent in productive training steps (restarts after failures, lost work
since the last checkpoint, checkpoint stalls, evaluation pauses and queueing are the rest).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from autotune.errors import ConfigError

SECONDS_PER_DAY = 86_400.0
HOURS_PER_DAY = 24.0

#: Default goodput: the Llama 3 405B pre-training reached "higher than 90% effective training time" over a
#: 54-day snapshot on 16,384 H100 (466 job interruptions; Llama 3 Herd of Models, arXiv 2407.21783, Sec. 3.3.4).
DEFAULT_GOODPUT = 0.90
GOODPUT_SOURCE = ("Llama 3 Herd of Models (arXiv 2407.21783) Sec. 3.3.4: more than 90% effective training time "
                  "over 54 days on 16,384 H100")
#: Default power usage effectiveness: 1.0 counts the GPUs' power only (no cooling or facility overhead).
DEFAULT_PUE = 1.0

#: decimal suffixes of ``--tokens`` (SI: T = 10^12; unlike ``--global-batch``, whose K/M/G are binary)
TOKEN_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_token_count(text: str | int | float, what: str = "--tokens") -> int:
    """``15.6T`` -> 15,600,000,000,000; ``800B`` -> 8 x 10^11; ``2e12`` and ``1000000`` as written (tokens).

    Suffixes are decimal (SI): K = 10^3, M = 10^6, B or G = 10^9, T = 10^12, as model cards state token
    counts ("15T+ tokens").

    Raises:
        ConfigError: not a number, not finite, or <= 0 (names the value and the accepted forms).
    """
    s = str(text).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)", s)
    hint = "e.g. 15.6T, 800B, 2e12 (K = 10^3, M = 10^6, B = G = 10^9, T = 10^12)"
    if s.startswith("-"):
        raise ConfigError(f"{what} {s!r}: must be a positive number of tokens, {hint}")
    if not m:
        raise ConfigError(f"{what} {s!r}: expected a positive number of tokens, {hint}")
    value = float(m.group(1)) * TOKEN_SUFFIXES[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{what} {s!r}: must be a positive number of tokens (at least 1), {hint}")
    if value > 1e18:
        raise ConfigError(f"{what} {s!r}: {value:.3g} tokens is beyond any training run; at most 10^18")
    return int(round(value))


def parse_per_gpu(text: str, what: str, known: Sequence[str], *, lo: float = 0.0, lo_open: bool = False,
                  hi: float = 1e9, allow_all: bool = True) -> dict[str, float]:
    """``h100=2.5,b200=5.9`` -> {"h100": 2.5, "b200": 5.9}; with ``allow_all`` a bare ``700`` -> every GPU of
    ``known``. GPU names are the catalogue's (case-insensitive, :func:`autotune.spec.hardware.get_gpu` forms).

    Raises:
        ConfigError: a malformed item, a GPU outside ``known`` (lists them), a value that is not a finite number
            in [``lo``, ``hi``] (``lo`` excluded when ``lo_open``), or one GPU given twice.
    """
    from autotune.spec.hardware import get_gpu

    s = str(text).strip()
    if not s:
        raise ConfigError(f"{what}: empty; expected GPU=VALUE[,GPU=VALUE...], e.g. h100=2.5,b200=5.9")
    out: dict[str, float] = {}
    if allow_all and "=" not in s:
        v = _number(s, what, lo, lo_open, hi)
        return {g: v for g in known}
    for item in s.split(","):
        name, eq, val = item.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"{what} {item.strip()!r}: expected GPU=VALUE, e.g. h100=2.5")
        try:
            g = get_gpu(name.strip()).name
        except ConfigError:
            raise ConfigError(f"{what}: unknown GPU {name.strip()!r}; known GPUs: {', '.join(known)}") from None
        if g not in known:
            raise ConfigError(f"{what}: GPU {g!r} is not in this plan's --gpu list ({', '.join(known)})")
        if g in out:
            raise ConfigError(f"{what}: GPU {g!r} is given twice")
        out[g] = _number(val, f"{what} {g}", lo, lo_open, hi)
    return out


def _number(text: str, what: str, lo: float, lo_open: bool, hi: float) -> float:
    from autotune.spec.validate import ASCII_FLOAT_PATTERN

    try:
        if not re.fullmatch(ASCII_FLOAT_PATTERN, str(text).strip()):     # float() reads "٧٠٠" as 700.0
            raise ValueError(text)
        v = float(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what} {str(text).strip()!r}: not a number") from None
    bad = not math.isfinite(v) or v > hi or (v <= lo if lo_open else v < lo)
    if bad:
        rng = f"{'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
        raise ConfigError(f"{what} {str(text).strip()!r}: must be a finite number {rng}")
    return v


def check_fraction(value: float, what: str, *, lo: float = 0.0, hi: float = 1.0) -> float:
    """``value`` when lo < value <= hi (a share such as ``--goodput``).

    Raises:
        ConfigError: outside (lo, hi], not finite.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not lo < value <= hi:
        raise ConfigError(f"{what} {value!r}: must be a number > {lo:g} and <= {hi:g}")
    return float(value)


@dataclass(frozen=True)
class Budget:
    """What training ``tokens`` costs at one throughput.

    Attributes:
        days: wall-clock days (86,400 s each), goodput included.
        gpu_hours: GPUs x days x 24.
        energy_mwh: GPU-hours x watts x PUE / 10^6 (MWh); None without a wattage.
        cost_usd: GPU-hours x USD per GPU-hour; None without a price.
        co2_t: energy (kWh) x kg CO2 per kWh / 1,000 (tonnes); None without a grid intensity.
        days_range / cost_range / gpu_hours_range: (low, high) from the prediction's error band, or None.
    """

    days: float
    gpu_hours: float
    energy_mwh: float | None = None
    cost_usd: float | None = None
    co2_t: float | None = None
    days_range: tuple[float, float] | None = None
    gpu_hours_range: tuple[float, float] | None = None
    cost_range: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, object]:
        return {"days": self.days, "gpu_hours": self.gpu_hours, "energy_mwh": self.energy_mwh,
                "cost_usd": self.cost_usd, "co2_t": self.co2_t,
                "days_range": list(self.days_range) if self.days_range else None,
                "gpu_hours_range": list(self.gpu_hours_range) if self.gpu_hours_range else None,
                "cost_range": list(self.cost_range) if self.cost_range else None}


def training_days(tokens: float, tokens_per_s_per_gpu: float, num_gpus: int, goodput: float) -> float:
    """Wall-clock days = tokens / (tokens/s per GPU x GPUs x goodput) / 86,400.

    Raises:
        ConfigError: a throughput, GPU count or goodput that is not positive.
    """
    if not tokens_per_s_per_gpu > 0 or num_gpus < 1 or not goodput > 0:
        raise ConfigError(f"cannot turn {tokens_per_s_per_gpu!r} tokens/s per GPU on {num_gpus!r} GPUs at goodput "
                          f"{goodput!r} into days: all must be positive")
    return tokens / (tokens_per_s_per_gpu * num_gpus * goodput) / SECONDS_PER_DAY


def gpu_hours_of(num_gpus: int, days: float) -> float:
    """GPU-hours = GPUs x days x 24."""
    return num_gpus * days * HOURS_PER_DAY


def energy_mwh_of(gpu_hours: float, watts_per_gpu: float, pue: float = DEFAULT_PUE) -> float:
    """Energy (MWh) = GPU-hours x watts per GPU x PUE / 10^6 (W h -> MWh)."""
    return gpu_hours * watts_per_gpu * pue / 1e6


def cost_usd_of(gpu_hours: float, usd_per_gpu_hour: float) -> float:
    """Cost (USD) = GPU-hours x USD per GPU-hour."""
    return gpu_hours * usd_per_gpu_hour


def co2_t_of(energy_mwh: float, kg_co2_per_kwh: float) -> float:
    """CO2 (t) = energy (MWh) x 1,000 kWh/MWh x kg CO2 per kWh / 1,000 kg/t = MWh x kg/kWh."""
    return energy_mwh * kg_co2_per_kwh


def band_multipliers(band_fraction: float, quantity: str) -> tuple[float, float]:
    """(low, high) factors on a predicted duration from a prediction error band of ``band_fraction``.

    The band is predicted / measured - 1 within +-e (autotune/data/error_bands.yaml ``mean_abs_error_pct``).
    For a throughput band (``tokens/s per GPU``) the true duration is predicted x (1 + err), so the factors are
    (1 - e, 1 + e); for a step-time band the true duration is predicted / (1 + err): (1 / (1 + e), 1 / (1 - e)).

    Raises:
        ConfigError: a band outside [0, 1).
    """
    e = float(band_fraction)
    if not 0.0 <= e < 1.0:
        raise ConfigError(f"error band {e!r} must be in [0, 1)")
    if "step time" in quantity:
        return 1.0 / (1.0 + e), 1.0 / (1.0 - e)
    return 1.0 - e, 1.0 + e


def budget_for(*, tokens: float, tokens_per_s_per_gpu: float, num_gpus: int, goodput: float = DEFAULT_GOODPUT,
               watts_per_gpu: float | None = None, pue: float = DEFAULT_PUE, usd_per_gpu_hour: float | None = None,
               kg_co2_per_kwh: float | None = None, band: tuple[float, float] | None = None) -> Budget:
    """The :class:`Budget` of training ``tokens`` at ``tokens_per_s_per_gpu`` on ``num_gpus`` (module formulas);
    ``band``: (low, high) duration factors (:func:`band_multipliers`) carried into days, GPU-hours and cost."""
    days = training_days(tokens, tokens_per_s_per_gpu, num_gpus, goodput)
    gh = gpu_hours_of(num_gpus, days)
    energy = energy_mwh_of(gh, watts_per_gpu, pue) if watts_per_gpu is not None else None
    cost = cost_usd_of(gh, usd_per_gpu_hour) if usd_per_gpu_hour is not None else None
    co2 = co2_t_of(energy, kg_co2_per_kwh) if energy is not None and kg_co2_per_kwh is not None else None
    dr = ghr = cr = None
    if band is not None:
        lo, hi = band
        dr, ghr = (days * lo, days * hi), (gh * lo, gh * hi)
        cr = (cost * lo, cost * hi) if cost is not None else None
    return Budget(days=days, gpu_hours=gh, energy_mwh=energy, cost_usd=cost, co2_t=co2, days_range=dr,
                  gpu_hours_range=ghr, cost_range=cr)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates, both coordinates minimised (days, cost): a point is
    dominated when another is <= in both and < in one. Ties (equal in both) are all kept."""
    front = []
    for i, (a, b) in enumerate(points):
        if not any((c <= a and d <= b) and (c < a or d < b) for j, (c, d) in enumerate(points) if j != i):
            front.append(i)
    return front


@dataclass(frozen=True)
class Constraints:
    """Limits on an option: ``days`` (wall-clock), ``usd`` (cost), ``gpu_hours``; None = no limit."""

    days: float | None = None
    usd: float | None = None
    gpu_hours: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.days, self.usd, self.gpu_hours))

    def misses(self, b: Budget) -> dict[str, float]:
        """{constraint: by how much ``b`` exceeds it (days, USD or GPU-hours)} for each limit ``b`` breaks; a
        cost limit with no cost known counts as broken by ``inf``."""
        out = {}
        if self.days is not None and b.days > self.days:
            out["days"] = b.days - self.days
        if self.usd is not None and (b.cost_usd is None or b.cost_usd > self.usd):
            out["usd"] = math.inf if b.cost_usd is None else b.cost_usd - self.usd
        if self.gpu_hours is not None and b.gpu_hours > self.gpu_hours:
            out["gpu_hours"] = b.gpu_hours - self.gpu_hours
        return out

    def to_dict(self) -> dict[str, float | None]:
        return {"days": self.days, "budget_usd": self.usd, "budget_gpu_hours": self.gpu_hours}


def check_limit(value: float | None, what: str) -> float | None:
    """A constraint value: None, or a finite number > 0.

    Raises:
        ConfigError: zero, negative or not finite.
    """
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} {value!r}: must be a positive finite number")
    return float(value)

