"""Hardware catalog: GPUs, interconnect fabrics and clusters, loaded from ``autotune/data/*.yaml``.

Units: TFLOP/s for compute peaks, GiB (2^30 bytes) for memory capacity, GB/s (1e9 bytes/s, per GPU,
per direction) for link bandwidth, microseconds for latency.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping


from autotune.errors import ConfigError
from autotune.files import load_shipped_yaml, plain

GIB = 1024**3
#: GPUs of a host node that share its NICs when a fabric does not say (an HGX/DGX board: 8 GPUs)
DEFAULT_GPUS_PER_HOST = 8
#: GPU architectures, oldest first (``GPUSpec.arch``).
GPU_ARCHS = ("ampere", "hopper", "blackwell")

#: NCCL environment that makes GPUs of one host talk over each interconnect tier (calibration_tier):
#: ``host`` through host shared memory (no peer-to-peer), ``sockets`` through TCP (no shared memory and
#: no InfiniBand either). Used by ``autotune profile`` and by the real runtime's workers.
NCCL_TIER_ENV: dict[str, dict[str, str]] = {
    "nvlink": {},
    "host": {"NCCL_P2P_DISABLE": "1"},
    "sockets": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
}


@lru_cache(maxsize=None)
def _load_data(name: str) -> dict[str, Any]:
    text = resources.files("autotune").joinpath("data", name).read_text()
    return load_shipped_yaml(text)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model (datasheet figures, dense math).

    Attributes:
        name: catalog key (``h200``).
        bf16_tflops: dense BF16 peak, TFLOP/s (the MFU denominator).
        fp8_tflops: dense FP8 peak, TFLOP/s, or None.
        hbm_gib: device memory, GiB.
        hbm_bandwidth_gbs: HBM bandwidth, GB/s.
        cuda_context_gib: memory taken before the first tensor (context, cuBLAS, NCCL), GiB.
        default_intra_node: the fabric preset inside a node when ``--interconnect`` names none.
        arch: architecture, one of :data:`GPU_ARCHS` (``ampere``, ``hopper``, ``blackwell``; NVIDIA
            datasheets, CUDA compute capability 8.0 / 9.0 / 10.0); ``unknown`` when not given.
        sm_count: streaming multiprocessors (0 = not known): how many SMs a communication kernel's share is of.
        bf16_gemm_reference / fp8_gemm_reference: a published kernel benchmark of this GPU, ``(m, n, k,
            achieved TFLOP/s)`` of one dense GEMM (cuBLAS), with its source in gpus.yaml; a GPU that was
            never measured by autotune is scaled from the calibration GPU by the ratio of these rates
            rather than by datasheet peaks (:class:`autotune.cost.op_costs.CalibratedCosts`).
        gemm_reference_from: another catalog GPU whose references this one takes (the same silicon at another
            power limit: GB200 from B200), scaled by :meth:`sustained_clock_ratio`.
        tdp_watts: maximum thermal design power of the module, W (datasheet; source per row in gpus.yaml), or
            None: the default power per GPU of ``autotune plan``'s energy estimate.
        host_link_gbs: the GPU's link to its host CPU's memory, GB/s per direction (datasheet: PCIe Gen4 /
            Gen5 / Gen6 x16, or NVLink-C2C on Grace-Blackwell; source per row in gpus.yaml), or None: not known.
            What CPU activation offloading moves over (:mod:`autotune.cost.offload`).
    """

    name: str
    display_name: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gib: float
    hbm_bandwidth_gbs: float
    cuda_context_gib: float = 1.0
    default_intra_node: str = "nvlink4"
    arch: str = "unknown"
    sm_count: int = 0
    bf16_gemm_reference: tuple[float, ...] | None = None
    fp8_gemm_reference: tuple[float, ...] | None = None
    gemm_reference_from: str | None = None
    tdp_watts: float | None = None
    host_link_gbs: float | None = None

    def __post_init__(self) -> None:
        for f in ("bf16_gemm_reference", "fp8_gemm_reference"):
            v = getattr(self, f)
            if v is None:
                continue
            try:
                t = tuple(float(x) for x in v)
            except (TypeError, ValueError):
                t = ()
            if len(t) != 4 or min(t) <= 0:
                raise ConfigError(f"GPU {self.name}: {f} must be [m, n, k, TFLOP/s] with positive values, got {v!r}")
            object.__setattr__(self, f, t)

    def gemm_reference(self, precision: str = "bf16") -> tuple[float, ...] | None:
        """The published ``(m, n, k, TFLOP/s)`` kernel benchmark for ``bf16`` or ``fp8``, following
        ``gemm_reference_from`` (scaled by :meth:`sustained_clock_ratio`), or None."""
        own = self.bf16_gemm_reference if precision == "bf16" else self.fp8_gemm_reference
        if own is not None or not self.gemm_reference_from:
            return own
        base = get_gpu(self.gemm_reference_from)
        ref = base.gemm_reference(precision)
        if ref is None:
            return None
        return ref[:3] + (ref[3] * self.sustained_clock_ratio(base),)

    def sustained_clock_ratio(self, base: "GPUSpec") -> float:
        """Tensor-core rate of this GPU over ``base``'s under sustained load, for the same silicon at another
        power limit (``gemm_reference_from``): ``min(peak ratio, (tdp / base tdp) ** (1/3))``.

        Mechanism: a datasheet dense peak is SMs x FLOPs per clock x the maximum tensor clock (B200 2250
        TFLOP/s and GB200 2500 over 148 SMs x 8192 FLOP/clk: 1.86 and 2.06 GHz), but GEMMs run at the power
        limit, not at that clock. Measured on the H200 (``bench/sustained_gemm.py``, 40 s of 8192^3 BF16
        GEMMs, docs/results/profile-fp8-plans-h200x1-2026-12-01.json ``sustained``): 682-690 W of its 700 W
        limit at 1455-1470 MHz, 0.80 of the 1830 MHz its 989 TFLOP/s peak counts (132 SMs x 4096 FLOP/clk).
        At the power limit the clock follows the power through voltage-frequency scaling: dynamic power
        C V^2 f with V roughly proportional to f, so f ~ P^(1/3) (ASSUMPTION: the cube law, with the
        module's whole TDP taken as scaling). Checked on NVIDIA's one datasheet pair of one die at two
        limits: H100 NVL (400 W) against H100 SXM (700 W, 989 TFLOP/s): 989 x (400/700)^(1/3) = 821 against
        the NVL datasheet's 835 TFLOP/s (-1.7%). GB200 (1200 W) over B200 (1000 W): 1.2^(1/3) = 1.063, not
        the datasheet's 2500 / 2250 = 1.111. Without both TDPs, or for another architecture or SM count,
        the datasheet peak ratio."""
        peak = self.bf16_tflops / base.bf16_tflops
        if (self.tdp_watts and base.tdp_watts and self.arch == base.arch and self.sm_count
                and self.sm_count == base.sm_count):
            return min(peak, (self.tdp_watts / base.tdp_watts) ** (1.0 / 3.0))
        return peak

    @property
    def sustained_bf16_tflops(self) -> float:
        """The dense BF16 rate kernel costs scale by, TFLOP/s: the datasheet peak, except for a GPU that takes
        another's kernel references (``gemm_reference_from``): that GPU's peak x :meth:`sustained_clock_ratio`.
        The MFU denominator stays ``bf16_tflops``."""
        if not self.gemm_reference_from:
            return self.bf16_tflops
        base = get_gpu(self.gemm_reference_from)
        return base.bf16_tflops * self.sustained_clock_ratio(base)

    @property
    def arch_rank(self) -> int:
        """Position of ``arch`` in :data:`GPU_ARCHS` (older = smaller); -1 when unknown."""
        return GPU_ARCHS.index(self.arch) if self.arch in GPU_ARCHS else -1

    @property
    def supports_fp8(self) -> bool:
        """FP8 (e4m3/e5m2) tensor cores: Hopper or newer (H100 datasheet; ``torch._scaled_mm`` needs
        compute capability >= 8.9) and a datasheet FP8 peak."""
        return self.arch_rank >= GPU_ARCHS.index("hopper") and bool(self.fp8_tflops)

    @property
    def supports_mxfp8(self) -> bool:
        """MXFP8 block-scaled tensor cores: Blackwell (B200 datasheet; TE MXFP8BlockScaling)."""
        return self.arch_rank >= GPU_ARCHS.index("blackwell") and bool(self.fp8_tflops)

    @property
    def usable_hbm_bytes(self) -> int:
        """Capacity a plan may use: HBM minus the CUDA context, bytes."""
        return int((self.hbm_gib - self.cuda_context_gib) * GIB)


@dataclass(frozen=True)
class LinkSpec:
    """One tier of the interconnect.

    Attributes:
        name: preset name (``nvlink4``, ``ib-ndr400``) or a user label.
        bandwidth_gbs: intra-node tiers: per GPU, per direction, GB/s; inter-node tiers: per NIC, per
            direction, GB/s (one NIC per GPU on the shipped presets, so the two agree there).
        latency_us: per-step latency of a collective (one ring hop), microseconds.
        gpus_per_node: intra-node tiers: GPUs joined by this tier (the NVLink domain: 8 on HGX, 72 on
            NVL72). Inter-node tiers: GPUs of the host node whose ``nics_per_node`` NICs they share
            (8 on an HGX/DGX board); 0 (plan files written before NICs were modelled) reads as 8.
        calibration_tier: which measured efficiency curve of the calibration profile applies
            (``nvlink``, ``host``, ``network``, ``sockets``).
        nics_per_node: inter-node tiers only: NICs of one host node of ``gpus_per_node`` GPUs (8 on
            DGX H100/H200/B200: eight single-port ConnectX-7 400 Gb/s, DGX datasheets); 0 for
            intra-node tiers.
        gpus_per_host: intra-node tiers only: GPUs of one host (OS node, Slurm node) inside the NVLink
            domain when the domain holds several hosts: 4 on GB200 NVL72 (a compute tray holds 2 Grace
            CPUs and 4 Blackwell GPUs, NVIDIA GB200 NVL72 datasheet); 0: the domain is one host (HGX).
    """

    name: str
    bandwidth_gbs: float
    latency_us: float
    gpus_per_node: int = 0
    calibration_tier: str = "nvlink"
    nics_per_node: int = 0
    gpus_per_host: int = 0

    @property
    def nics_per_gpu(self) -> float:
        """NICs per GPU of an inter-node tier (``nics_per_node / gpus_per_node``; 1.0 on HGX), else 0."""
        if not self.nics_per_node or not self.gpus_per_node:
            return 0.0
        return self.nics_per_node / self.gpus_per_node


@dataclass(frozen=True)
class FabricSpec:
    """The cluster's interconnect: a tier inside a node (NVLink domain) and one between nodes.

    ``gpus_per_node`` is the NVLink domain size (the GPUs the intra-node tier joins: 8 on HGX, 72 on
    NVL72); process groups larger than it cross the inter-node tier (:mod:`autotune.cost.topology`). The
    inter-node tier attaches ``nics_per_node`` NICs of ``inter_node.bandwidth_gbs`` each to every host
    of ``inter_node.gpus_per_node`` GPUs.
    """

    name: str
    intra_node: LinkSpec
    inter_node: LinkSpec | None

    @property
    def gpus_per_node(self) -> int:
        """GPUs of one NVLink domain (the intra-node tier's ``gpus_per_node``)."""
        return self.intra_node.gpus_per_node

    @property
    def nvlink_domain_size(self) -> int:
        """Same as :attr:`gpus_per_node`: GPUs joined by the intra-node tier (8 on HGX, 72 on NVL72)."""
        return self.intra_node.gpus_per_node

    @property
    def gpus_per_host(self) -> int:
        """GPUs of one host inside the NVLink domain: 4 on NVL72, else the whole domain (HGX: 8)."""
        return self.intra_node.gpus_per_host or self.intra_node.gpus_per_node

    @property
    def nics_per_node(self) -> int:
        """NICs per host node of the inter-node tier (0 without one)."""
        return self.inter_node.nics_per_node if self.inter_node is not None else 0

    @property
    def nics_per_gpu(self) -> float:
        """Inter-node NICs per GPU (1.0 with one NIC per GPU; 0 without an inter-node tier)."""
        return self.inter_node.nics_per_gpu if self.inter_node is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClusterSpec:
    """``num_gpus`` identical GPUs joined by ``fabric``.

    NVLink domains in use: a cluster of at most one domain uses ``num_gpus`` GPUs of it; a whole number
    of domains fills each. On a domain of several hosts (NVL72: 18 trays of 4 GPUs) another count is
    spread over equal segments of hosts, each inside one domain, as Megatron-Bridge launches GB200 jobs:
    ``sbatch --segment`` = the largest divisor of the host count that is at most the hosts per domain
    (Megatron-Bridge scripts/performance/utils/executors.py; Slurm topology/block places a segment in
    one block): 256 GPUs = 64 trays -> 4 domains of 16 trays (64 GPUs). :attr:`nvlink_domain_size` is
    the GPUs used per domain.

    Raises:
        ConfigError: num_gpus < 1; a cluster larger than one NVLink domain that is not a whole number
            of domains (one-host domains, HGX) or of hosts (NVL72); or a multi-node cluster whose fabric
            has no inter-node tier.
    """

    gpu: GPUSpec
    num_gpus: int
    fabric: FabricSpec

    def __post_init__(self) -> None:
        n, per = self.num_gpus, self.fabric.gpus_per_node
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"--gpus must be a positive integer, got {n!r}")
        from autotune.spec.validate import MAX_NUM_GPUS
        if n > MAX_NUM_GPUS:      # any source (an imported launch's world size too), before any work
            raise ConfigError(f"a cluster of {n:,} GPUs: at most {MAX_NUM_GPUS:,} (autotune.spec.validate.MAX_NUM_GPUS)")
        host = self.fabric.gpus_per_host
        if n > per and n % per and (host >= per or n % host):
            unit, what = (per, "nodes") if host >= per else (host, "hosts (NVLink domains hold "
                                                                     f"{per // host} hosts of {host})")
            lo, hi = (n // unit) * unit, (n // unit + 1) * unit
            raise ConfigError(
                f"--gpus {n} is not a whole number of {unit}-GPU {what} on {self.fabric.name}; "
                f"use at most {per} or a multiple of {unit} (e.g. {lo or unit} or {hi})")
        if n > per and self.fabric.inter_node is None:
            raise ConfigError(
                f"--gpus {n} spans {math.ceil(n / per)} nodes but fabric {self.fabric.name!r} has no "
                f"inter-node tier; {self.multi_node_suggestion()}")

    def multi_node_suggestion(self) -> str:
        """``name one, e.g. <intra>+ib-ndr400`` with an interconnect that :func:`get_fabric` accepts: the
        fabric's own intra-node preset when it is one (``nvlink4``), else (a measured tier such as
        ``h200-host`` or a YAML file, which cannot be combined with ``+``) the GPU's default preset, or
        a fabric YAML file with an ``inter_node`` section."""
        presets, _ = known_fabrics()
        intra = self.fabric.intra_node.name
        if intra in presets and self.fabric.name == intra:
            return f"name one, e.g. {intra}+ib-ndr400"
        return (f"use a preset with one, e.g. {self.gpu.default_intra_node}+ib-ndr400, or a fabric YAML file "
                f"with an inter_node section ({self.fabric.name!r} cannot be combined with '+')")

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs of one NVLink domain that this cluster uses (class docstring: the whole cluster when it
        fits one domain, the whole domain for a whole number of domains, else the segment rule)."""
        n, per = self.num_gpus, self.fabric.nvlink_domain_size
        if n <= per or n % per == 0:
            return min(n, per)
        host = self.fabric.gpus_per_host
        hosts, cap = n // host, per // host
        return host * max(s for s in range(1, cap + 1) if hosts % s == 0)

    @property
    def num_nodes(self) -> int:
        """NVLink domains the cluster spans."""
        return max(1, math.ceil(self.num_gpus / self.nvlink_domain_size))

    @property
    def gpus_per_node(self) -> int:
        """Same as :attr:`nvlink_domain_size` (GPUs of the cluster per NVLink domain)."""
        return self.nvlink_domain_size

    @property
    def nics_per_node(self) -> int:
        """NICs per host node (0 when the fabric has no inter-node tier)."""
        return self.fabric.nics_per_node

    @property
    def label(self) -> str:
        return f"{self.gpu.name}x{self.num_gpus}/{self.fabric.name}"


def known_gpus() -> list[str]:
    return list(_load_data("gpus.yaml")["gpus"])


def get_gpu(name: str) -> GPUSpec:
    """GPU by catalog name (case-insensitive; ``H100``, ``h100-sxm`` and ``h100`` are the same).

    Raises:
        ConfigError: unknown GPU; lists the known ones.
    """
    gpus = _load_data("gpus.yaml")["gpus"]
    key = name.strip().lower().replace("_", "-")
    for suffix in ("-sxm", "-sxm5"):
        if key.endswith(suffix) and key[: -len(suffix)] in gpus:
            key = key[: -len(suffix)]
    if key not in gpus:
        raise ConfigError(f"unknown GPU {name!r}; known GPUs: {', '.join(gpus)}")
    return GPUSpec(name=key, **gpus[key])


def gpu_family(name: str | None) -> str | None:
    """The catalog GPU whose name is the longest prefix of ``name`` (``h100-96gb-500w`` -> ``h100``; ``gb200``
    stays ``gb200``), or None: the family an error band (autotune/data/error_bands.yaml ``by_gpu``) is kept for."""
    if not name:
        return None
    key = str(name).strip().lower()
    return next((n for n in sorted(_load_data("gpus.yaml")["gpus"], key=len, reverse=True) if key.startswith(n)), None)


def known_fabrics() -> tuple[list[str], list[str]]:
    d = _load_data("fabrics.yaml")
    return list(d["intra_node"]), list(d["inter_node"])


#: keys of one tier (``intra_node`` / ``inter_node``) in a fabric YAML file, a plan file's
#: ``cluster.fabric`` and autotune/data/fabrics.yaml: the :class:`LinkSpec` fields, plus
#: ``measured_busbw_gbs`` (a documentation figure that ``autotune profile`` writes into measured tiers,
#: autotune/profiling/fabrics/*.yaml; not read)
LINK_KEYS = ("name", "bandwidth_gbs", "latency_us", "gpus_per_node", "calibration_tier", "nics_per_node",
             "gpus_per_host", "measured_busbw_gbs")
#: top-level keys of a fabric YAML file / a plan file's ``cluster.fabric``
FABRIC_KEYS = ("name", "intra_node", "inter_node")


def check_keys(d: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    """Refuse keys of ``d`` outside ``valid``.

    Raises:
        ConfigError: ``<where>: unknown key 'k'; valid keys: a, b, c`` (the first unknown keys named).
    """
    unknown = [str(k) for k in d if k not in valid]
    if unknown:
        from autotune.files import display_text

        ks = ", ".join(repr(display_text(k, 40)) for k in unknown[:5])
        raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {ks}; valid keys: "
                          f"{', '.join(valid)}")


def _link_from_mapping(d: Mapping[str, Any], *, name: str, where: str, intra: bool) -> LinkSpec:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping with bandwidth_gbs and latency_us, got {d!r}")
    check_keys(d, LINK_KEYS, where)
    from autotune.spec.validate import require_number

    if "bandwidth_gbs" not in d:
        raise ConfigError(f"{where}: missing field 'bandwidth_gbs' (a number, GB/s per GPU per direction)")
    # finite numbers only: NaN/inf or a string would reach the cost model and fail every trial later
    bw = require_number(d["bandwidth_gbs"], f"{where}: bandwidth_gbs (GB/s)", lo=0, hi=1e6, lo_open=True)
    lat = require_number(d.get("latency_us", 5.0), f"{where}: latency_us", lo=0, hi=1e7)
    per, nics = 0, 0
    if intra:
        per = d.get("gpus_per_node")
        if not isinstance(per, int) or isinstance(per, bool) or not 1 <= per <= 2**20:
            raise ConfigError(f"{where}: gpus_per_node must be an integer between 1 and 1,048,576, got {per!r}")
    else:
        # host node the NICs belong to; 0 / missing: the 8-GPU HGX board with one NIC per GPU
        per = d.get("gpus_per_node") or DEFAULT_GPUS_PER_HOST
        if not isinstance(per, int) or isinstance(per, bool) or per < 1:
            raise ConfigError(f"{where}: gpus_per_node (GPUs sharing the node's NICs) must be a positive "
                              f"integer, got {per!r}")
        nics = d.get("nics_per_node", per)
        if not isinstance(nics, int) or isinstance(nics, bool) or not 1 <= nics <= 2**20:
            raise ConfigError(f"{where}: nics_per_node must be a positive integer (e.g. 8, one NIC per GPU "
                              f"of an HGX node), got {nics!r}")
    tier = d.get("calibration_tier", "nvlink" if intra else "network")
    if tier not in ("nvlink", "host", "network", "sockets"):
        raise ConfigError(f"{where}: calibration_tier must be one of nvlink, host, network, sockets; got {tier!r}")
    from autotune.spec.validate import require_name

    host = 0
    if intra and d.get("gpus_per_host"):
        host = d["gpus_per_host"]
        if not isinstance(host, int) or isinstance(host, bool) or not 1 <= host <= per or per % host:
            raise ConfigError(f"{where}: gpus_per_host must be a positive integer dividing gpus_per_node "
                              f"({per}), got {host!r}")
    return LinkSpec(name=require_name(d.get("name", name), f"{where}: name"), bandwidth_gbs=bw, latency_us=lat, gpus_per_node=per,
                    calibration_tier=tier, nics_per_node=nics, gpus_per_host=host)


def get_fabric(spec: str) -> FabricSpec:
    """Parse ``--interconnect``: ``nvlink4+ib-ndr400``, a single intra-node preset, or a YAML file.

    A YAML file holds ``name``, ``intra_node: {bandwidth_gbs, latency_us, gpus_per_node}`` and
    optionally ``inter_node: {bandwidth_gbs, latency_us, nics_per_node, gpus_per_node}`` (bandwidth per
    NIC; ``nics_per_node`` NICs per host of ``gpus_per_node`` GPUs, both default 8: one NIC per GPU).

    Raises:
        ConfigError: unknown preset (lists the known ones) or a malformed file (names file and field).
    """
    p = Path(spec)
    if spec.endswith((".yaml", ".yml")) or p.is_file():
        return _fabric_from_file(p)
    shipped = _shipped_measured_fabric(spec)
    if shipped is not None:
        return _fabric_from_file(shipped)
    data = _load_data("fabrics.yaml")
    intra_names, inter_names = list(data["intra_node"]), list(data["inter_node"])
    parts = [s.strip().lower() for s in spec.split("+")]
    if len(parts) > 2 or not parts[0]:
        raise ConfigError(f"interconnect {spec!r}: expected <intra-node>[+<inter-node>], "
                          f"e.g. nvlink4+ib-ndr400")
    if parts[0] not in data["intra_node"]:
        raise ConfigError(f"unknown intra-node fabric {parts[0]!r} in {spec!r}; known: {', '.join(intra_names)} "
                          f"(inter-node: {', '.join(inter_names)}), measured tiers: "
                          f"{', '.join(shipped_measured_fabrics()) or 'none'}, or a YAML file")
    intra = _link_from_mapping(data["intra_node"][parts[0]], name=parts[0], where=parts[0], intra=True)
    inter = None
    if len(parts) == 2:
        if parts[1] not in data["inter_node"]:
            raise ConfigError(f"unknown inter-node fabric {parts[1]!r} in {spec!r}; known: {', '.join(inter_names)}")
        inter = _link_from_mapping(data["inter_node"][parts[1]], name=parts[1], where=parts[1], intra=False)
    return FabricSpec(name="+".join(parts), intra_node=intra, inter_node=inter)


def _shipped_measured_fabric(name: str):
    """Interconnect tiers measured by ``autotune profile`` and shipped with the package
    (``autotune/profiling/fabrics/<name>.yaml``, e.g. ``h200-nvlink``, ``h200-host``, ``h200-sockets``)."""
    key = name.strip().lower()
    if "/" in key or "+" in key:
        return None
    f = resources.files("autotune").joinpath("profiling", "fabrics", f"{key}.yaml")
    return Path(str(f)) if f.is_file() else None


def shipped_measured_fabrics() -> list[str]:
    d = resources.files("autotune").joinpath("profiling", "fabrics")
    return sorted(x.name[:-5] for x in d.iterdir() if x.name.endswith(".yaml")) if d.is_dir() else []


def _fabric_from_file(p: Path) -> FabricSpec:
    """An interconnect YAML file (:func:`get_fabric`); refused when named like a built-in with other links."""
    return _fabric_from_file_unchecked(p, check_name=True)


def _fabric_from_file_unchecked(p: Path, *, check_name: bool = False) -> FabricSpec:
    from autotune.files import read_yaml_file

    d = read_yaml_file(p, what="interconnect file")
    if not isinstance(d, Mapping) or "intra_node" not in d:
        raise ConfigError(f"interconnect file {p}: expected a mapping with 'intra_node' "
                          "({bandwidth_gbs, latency_us, gpus_per_node}) and optional 'inter_node'")
    check_keys(d, FABRIC_KEYS, f"interconnect file {p}")
    from autotune.spec.validate import require_name

    name = require_name(d.get("name", p.stem), f"interconnect file {p}: name")
    intra = _link_from_mapping(d["intra_node"], name=f"{name}-intra", where=f"{p}: intra_node", intra=True)
    inter = None
    if d.get("inter_node") is not None:
        inter = _link_from_mapping(d["inter_node"], name=f"{name}-inter", where=f"{p}: inter_node", intra=False)
    fabric = FabricSpec(name=name, intra_node=intra, inter_node=inter)
    if check_name:
        _refuse_builtin_name(fabric, p)
    return fabric


def _builtin_fabric(name: str) -> FabricSpec | None:
    """The preset fabric (autotune/data/fabrics.yaml, ``intra[+inter]``) called ``name``, or None.

    Shipped measured tiers (``h200-nvlink`` ...) are not counted: ``autotune profile`` writes its own
    measurement under that name on purpose (a study's fabric fingerprint still keeps the two apart).
    """
    if name.endswith((".yaml", ".yml")) or _shipped_measured_fabric(name) is not None or Path(name).is_file():
        return None
    try:
        return get_fabric(name)
    except ConfigError:
        return None


def _refuse_builtin_name(fabric: FabricSpec, p: Path) -> None:
    """A study is named after its fabric's name: a file called like a built-in with other links would create
    (on a fresh storage) the built-in's study, and the real built-in would be refused there afterwards.

    Raises:
        ConfigError: ``fabric`` (read from ``p``) has a built-in's name but other link values.
    """
    builtin = _builtin_fabric(fabric.name)
    if builtin is None or builtin.name != fabric.name:
        return      # no preset has this name (names are case-sensitive: another study name)

    if fabric_fingerprint(builtin) != fabric_fingerprint(fabric):
        diff = fabric_differences(builtin.to_dict(), fabric.to_dict())
        raise ConfigError(f"fabric file {p} is named like the built-in {fabric.name!r} but its links differ "
                          f"({diff}, built-in vs file); give it another name")


def fabric_from_dict(d: Mapping[str, Any], *, where: str = "fabric") -> FabricSpec:
    """Inverse of :meth:`FabricSpec.to_dict` (used by plan YAML files)."""
    if not isinstance(d, Mapping) or "intra_node" not in d:
        raise ConfigError(f"{where}: expected a mapping with name, intra_node and inter_node")
    check_keys(d, FABRIC_KEYS, where)
    if not isinstance(d["intra_node"], Mapping):
        raise ConfigError(f"{where}.intra_node: expected a mapping with bandwidth_gbs and latency_us, got "
                          f"{type(d['intra_node']).__name__}")
    if d.get("inter_node") is not None and not isinstance(d["inter_node"], Mapping):
        raise ConfigError(f"{where}.inter_node: expected a mapping with bandwidth_gbs and latency_us, got "
                          f"{type(d['inter_node']).__name__}")
    intra = _link_from_mapping(d["intra_node"], name=d["intra_node"].get("name", "intra"),
                               where=f"{where}.intra_node", intra=True)
    inter = None
    if d.get("inter_node") is not None:
        inter = _link_from_mapping(d["inter_node"], name=d["inter_node"].get("name", "inter"),
                                   where=f"{where}.inter_node", intra=False)
    from autotune.spec.validate import require_name

    return FabricSpec(name=require_name(d.get("name", intra.name), f"{where}.name"), intra_node=intra, inter_node=inter)


def make_cluster(gpu: str, num_gpus: int, interconnect: str | None = None) -> ClusterSpec:
    """Build a :class:`ClusterSpec`; ``interconnect`` defaults to the GPU's NVLink + ib-ndr400."""
    g = get_gpu(gpu)
    fabric = get_fabric(interconnect or f"{g.default_intra_node}+ib-ndr400")
    return ClusterSpec(gpu=g, num_gpus=num_gpus, fabric=fabric)


# ------------------------------------------------------------------ fingerprints (moved from tune/tuner.py)
_LINK_FIELDS = ("bandwidth_gbs", "latency_us", "gpus_per_node", "calibration_tier", "nics_per_node", "gpus_per_host")


def _link_values(link: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {k: link.get(k) for k in _LINK_FIELDS}


def fabric_fingerprint(fabric: FabricSpec | Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the fabric's link specs (intra- and inter-node tier, every
    :data:`_LINK_FIELDS` value; not the names): a study remembers which links it was tuned on, so two
    fabric files with one ``name:`` (or a file named like a built-in preset) never share a study.

    ``fabric``: a :class:`FabricSpec` or its ``to_dict()`` form (a study's ``user_attrs['fabric']``).
    """
    import hashlib

    d = fabric.to_dict() if isinstance(fabric, FabricSpec) else fabric
    blob = {"intra_node": _link_values(d.get("intra_node")), "inter_node": _link_values(d.get("inter_node"))}
    return hashlib.sha256(json.dumps(plain(blob), sort_keys=True, default=str).encode()).hexdigest()[:12]


def fabric_differences(stored: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """``intra_node.bandwidth_gbs 900 vs 100, ...``: the link fields where ``stored`` and ``given`` differ."""
    out = []
    for tier in ("intra_node", "inter_node"):
        a, b = _link_values(stored.get(tier)), _link_values(given.get(tier))
        if a is None or b is None:
            if (a is None) != (b is None):
                out.append(f"{tier} {'none' if a is None else 'present'} vs {'none' if b is None else 'present'}")
            continue
        out += [f"{tier}.{k} {a[k]:g} vs {b[k]:g}" if isinstance(a[k], (int, float)) and isinstance(b[k], (int, float))
                else f"{tier}.{k} {a[k]} vs {b[k]}" for k in _LINK_FIELDS if a[k] != b[k]]
    return ", ".join(out)


def fabric_speed(fabric: Mapping[str, Any] | FabricSpec) -> tuple[float, float]:
    """Sort key, larger = faster: (inter-node GB/s, intra-node GB/s); no inter-node tier counts as 0."""
    d = fabric.to_dict() if isinstance(fabric, FabricSpec) else fabric
    inter = d.get("inter_node") or {}
    return (float(inter.get("bandwidth_gbs", 0.0)), float((d.get("intra_node") or {}).get("bandwidth_gbs", 0.0)))

