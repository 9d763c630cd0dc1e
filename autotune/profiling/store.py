"""SQLAlchemy tables of measured op timings, keyed by environment; calibration YAML export/import.

The tables live in the study database (default ``sqlite:///studies/autotune.db``) beside Optuna's;
every table name starts with ``profile_`` so the two never collide:

=========================  =================================================================
``profile_environment``    GPU name and count, driver, torch, CUDA, NCCL versions, host, date
``profile_gemm``           BF16 GEMM (m, n, k, pass = fwd | dgrad | wgrad): median ms, TFLOP/s
``profile_attention``      causal flash SDPA (batch, seq_len, heads, kv_heads, head_dim): fwd/bwd
``profile_memory_op``      memory-bound op (name, bytes moved): ms, GB/s
``profile_collective``     collective (tier, kind, group_size, bytes): ms, bus bandwidth GB/s
``profile_overlap``        GEMM loop alone vs beside an async all-reduce: compute_slowdown
``profile_reclaim``        ``torch.cuda.empty_cache()`` ms and re-allocation ms/GiB, +/- expandable
``profile_gemm_fp8``       FP8 ``torch._scaled_mm`` (scaling, m, n, k, pass): median ms, TFLOP/s
``profile_quantize``       FP8 dynamic quantization (scaling, mode, stage, rows, cols): ms, GB/s
``profile_block_op``       block op eager or compiled (op, mode, bytes charged): ms, GB/s
=========================  =================================================================

Shapes follow :mod:`autotune.cost.calibration`: a GEMM (m, n, k) is ``(m x k) @ (k x n)`` in the forward
pass (``F.linear(x, W)`` with x of m x k and W of n x k), 2 m n k FLOPs per pass; dgrad is
``dY @ W`` (m x n by n x k) and wgrad ``dY^T @ X`` (n x m by m x k), each with the same FLOPs and
stored under the forward shape. Attention FLOPs are those of :class:`autotune.cost.calibration.CalibratedCosts`:
forward ``2 s^2 d h b`` (causal half of 4 s^2 d h), backward 2.5x forward. Collective sizes and bus
bandwidth follow nccl-tests (see the :mod:`autotune.cost.calibration` docstring).

Every :func:`record` commits, so an interrupted ``autotune profile`` keeps what it measured.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from autotune.cost.calibration import (
    CALIBRATION_SCHEMA_VERSION,
    COLLECTIVE_KINDS,
    CalibrationProfile,
    default_calibration,
)
from autotune.cost.op_costs import collective_factors
from autotune.errors import ConfigError, StorageError

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
GEMM_PASSES = ("fwd", "dgrad", "wgrad")
#: tier -> fabric preset whose datasheet bandwidth is the tier's nominal ``link_bandwidth_gbs``
#: (nvlink: the GPU's own NVLink generation; host: PCIe Gen5 x16; sockets: 100 Gb Ethernet).
TIER_NOMINAL_PRESET = {"host": "pcie5", "sockets": "eth100"}
#: memory-bound op used as the "HBM copy" figure (read + write bytes of a device-to-device copy)
COPY_OP = "copy"


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    """Declarative base of the ``profile_*`` tables (own metadata: never touches Optuna's)."""


class ProfileEnvironment(Base):
    """One measuring environment; every timing row points at one."""

    __tablename__ = "profile_environment"
    __table_args__ = (UniqueConstraint("gpu_name", "gpu_count", "driver", "torch_version", "cuda", "nccl",
                                       name="uq_profile_environment"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String(128))
    gpu_count: Mapped[int] = mapped_column(Integer)
    driver: Mapped[str] = mapped_column(String(64))
    torch_version: Mapped[str] = mapped_column(String(64))
    cuda: Mapped[str] = mapped_column(String(32))
    nccl: Mapped[str] = mapped_column(String(32))
    hostname: Mapped[str] = mapped_column(String(256), default="")
    date: Mapped[str] = mapped_column(String(32), default="")
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=_now)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_name": self.gpu_name, "gpu_count": self.gpu_count, "driver": self.driver,
                "torch": self.torch_version, "cuda": self.cuda, "nccl": self.nccl,
                "hostname": self.hostname, "date": self.date}


class _Timing:
    env_id: Mapped[int] = mapped_column(ForeignKey("profile_environment.id"), index=True)
    measured_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=_now)


class GemmTiming(_Timing, Base):
    """BF16 GEMM pass (fwd / dgrad / wgrad) of forward shape (m, n, k)."""

    __tablename__ = "profile_gemm"
    __table_args__ = (UniqueConstraint("env_id", "m", "n", "k", "pass", name="uq_profile_gemm"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    pass_: Mapped[str] = mapped_column("pass", String(8))
    median_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class AttentionTiming(_Timing, Base):
    """Causal flash SDPA forward and backward."""

    __tablename__ = "profile_attention"
    __table_args__ = (UniqueConstraint("env_id", "batch", "seq_len", "heads", "kv_heads", "head_dim",
                                       name="uq_profile_attention"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    kv_heads: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    fwd_ms: Mapped[float] = mapped_column(Float)
    bwd_ms: Mapped[float] = mapped_column(Float)
    fwd_tflops: Mapped[float] = mapped_column(Float)
    bwd_tflops: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class MemoryOpTiming(_Timing, Base):
    """A memory-bound op moving ``nbytes`` (reads + writes)."""

    __tablename__ = "profile_memory_op"
    __table_args__ = (UniqueConstraint("env_id", "op", "nbytes", name="uq_profile_memory_op"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String(64))
    nbytes: Mapped[int] = mapped_column(BigInteger)
    median_ms: Mapped[float] = mapped_column(Float)
    gbs: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class CollectiveTiming(_Timing, Base):
    """One collective at one message size S (nccl-tests convention) on one tier and group size."""

    __tablename__ = "profile_collective"
    __table_args__ = (UniqueConstraint("env_id", "tier", "kind", "group_size", "nbytes",
                                       name="uq_profile_collective"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tier: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(32))
    group_size: Mapped[int] = mapped_column(Integer)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    median_ms: Mapped[float] = mapped_column(Float)
    busbw_gbs: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class OverlapTiming(_Timing, Base):
    """GEMM loop time alone and beside async all-reduces covering it, on one tier."""

    __tablename__ = "profile_overlap"
    __table_args__ = (UniqueConstraint("env_id", "tier", name="uq_profile_overlap"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tier: Mapped[str] = mapped_column(String(16))
    gemm_ms_alone: Mapped[float] = mapped_column(Float)
    gemm_ms_overlapped: Mapped[float] = mapped_column(Float)
    comm_ms: Mapped[float] = mapped_column(Float)
    comm_nbytes: Mapped[int] = mapped_column(BigInteger)
    compute_slowdown: Mapped[float] = mapped_column(Float)


class ReclaimTiming(_Timing, Base):
    """``empty_cache`` cost and allocation cost after it, with or without expandable segments."""

    __tablename__ = "profile_reclaim"
    __table_args__ = (UniqueConstraint("env_id", "expandable_segments", name="uq_profile_reclaim"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    expandable_segments: Mapped[bool] = mapped_column(Boolean)
    empty_cache_ms: Mapped[float] = mapped_column(Float)
    alloc_ms_per_gib: Mapped[float] = mapped_column(Float)
    nbytes: Mapped[int] = mapped_column(BigInteger)


class GemmFp8Timing(_Timing, Base):
    """FP8 GEMM pass of forward shape (m, n, k) with ``scaling`` tensorwise | rowwise
    (:func:`autotune.profiling.measure.measure_gemm_fp8`)."""

    __tablename__ = "profile_gemm_fp8"
    __table_args__ = (UniqueConstraint("env_id", "scaling", "m", "n", "k", "pass", name="uq_profile_gemm_fp8"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scaling: Mapped[str] = mapped_column(String(16))
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    pass_: Mapped[str] = mapped_column("pass", String(8))
    median_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class QuantizeTiming(_Timing, Base):
    """One stage (amax | scale | cast | total) of FP8 quantization of a rows x cols BF16 tensor, eager or
    compiled; ``nbytes`` the bytes charged (:data:`autotune.profiling.measure.QUANTIZE_STAGE_BYTES`)."""

    __tablename__ = "profile_quantize"
    __table_args__ = (UniqueConstraint("env_id", "scaling", "mode", "stage", "rows", "cols",
                                       name="uq_profile_quantize"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scaling: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    stage: Mapped[str] = mapped_column(String(16))
    rows: Mapped[int] = mapped_column(BigInteger)
    cols: Mapped[int] = mapped_column(BigInteger)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    median_ms: Mapped[float] = mapped_column(Float)
    gbs: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


class BlockOpTiming(_Timing, Base):
    """A transformer-block memory-bound op (:data:`autotune.profiling.shapes.BLOCK_OPS`), ``mode`` eager
    or compiled; ``nbytes`` the bytes the cost model charges it."""

    __tablename__ = "profile_block_op"
    __table_args__ = (UniqueConstraint("env_id", "op", "mode", "nbytes", name="uq_profile_block_op"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))
    nbytes: Mapped[int] = mapped_column(BigInteger)
    median_ms: Mapped[float] = mapped_column(Float)
    gbs: Mapped[float] = mapped_column(Float)
    repeats: Mapped[int] = mapped_column(Integer, default=0)


#: table name -> (ORM class, key columns besides env_id)
TABLES: dict[str, tuple[type, tuple[str, ...]]] = {
    "gemm": (GemmTiming, ("m", "n", "k", "pass_")),
    "attention": (AttentionTiming, ("batch", "seq_len", "heads", "kv_heads", "head_dim")),
    "memory_op": (MemoryOpTiming, ("op", "nbytes")),
    "collective": (CollectiveTiming, ("tier", "kind", "group_size", "nbytes")),
    "overlap": (OverlapTiming, ("tier",)),
    "reclaim": (ReclaimTiming, ("expandable_segments",)),
    "gemm_fp8": (GemmFp8Timing, ("scaling", "m", "n", "k", "pass_")),
    "quantize": (QuantizeTiming, ("scaling", "mode", "stage", "rows", "cols")),
    "block_op": (BlockOpTiming, ("op", "mode", "nbytes")),
}


# ----------------------------------------------------------------------------- environment
@dataclass(frozen=True)
class EnvironmentInfo:
    """What the timings depend on. ``date`` is ISO (YYYY-MM-DD); versions are strings."""

    gpu_name: str
    gpu_count: int
    driver: str
    torch: str
    cuda: str
    nccl: str
    hostname: str = ""
    date: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnvironmentInfo":
        return cls(gpu_name=str(d.get("gpu_name", "unknown")), gpu_count=int(d.get("gpu_count", 1)),
                   driver=str(d.get("driver", "unknown")), torch=str(d.get("torch", "unknown")),
                   cuda=str(d.get("cuda", "unknown")), nccl=str(d.get("nccl", "unknown")),
                   hostname=str(d.get("hostname", "")), date=str(d.get("date", "")))


def catalog_gpu(gpu_name: str) -> str | None:
    """Catalog key (:func:`autotune.spec.hardware.get_gpu`) of a CUDA device name, or None.

    ``"NVIDIA H200"`` -> ``h200``, ``"NVIDIA H100 80GB HBM3"`` -> ``h100``,
    ``"NVIDIA A100-SXM4-80GB"`` -> ``a100-80gb``, ``"NVIDIA B200"`` -> ``b200``, ``"NVIDIA GB200"`` -> ``gb200``.
    """
    s = gpu_name.lower()
    for token, key in (("gb200", "gb200"), ("b200", "b200"), ("h200", "h200"), ("h100", "h100"),
                       ("a100", "a100-80gb")):
        if token in s:
            return key
    return None


# ----------------------------------------------------------------------------- engine / sessions
_ENGINES: dict[str, Any] = {}


def open_store(url: str = DEFAULT_STORAGE) -> sessionmaker:
    """Open (creating tables if needed) the profile store at SQLAlchemy ``url``; a session factory.

    For a relative ``sqlite:///`` path the parent directory is created.

    Raises:
        StorageError: the URL is malformed or the database cannot be opened.
    """
    if url not in _ENGINES:
        try:
            if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
                Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url)
            Base.metadata.create_all(engine)
        except (SQLAlchemyError, OSError, ValueError) as e:
            raise StorageError(f"cannot open profile storage {url!r}: {e}") from None
        _ENGINES[url] = sessionmaker(bind=engine, expire_on_commit=False)
    return _ENGINES[url]


@contextlib.contextmanager
def _session(session_or_url: Session | str) -> Iterator[Session]:
    if isinstance(session_or_url, Session):
        yield session_or_url
        return
    s = open_store(session_or_url)()
    try:
        yield s
    finally:
        s.close()


def get_or_create_environment(session: Session, info: EnvironmentInfo) -> ProfileEnvironment:
    """The row for ``info`` (matched on GPU name and count, driver, torch, CUDA, NCCL), created if new."""
    row = session.scalars(select(ProfileEnvironment).filter_by(
        gpu_name=info.gpu_name, gpu_count=info.gpu_count, driver=info.driver, torch_version=info.torch,
        cuda=info.cuda, nccl=info.nccl)).first()
    if row is None:
        row = ProfileEnvironment(gpu_name=info.gpu_name, gpu_count=info.gpu_count, driver=info.driver,
                                 torch_version=info.torch, cuda=info.cuda, nccl=info.nccl,
                                 hostname=info.hostname, date=info.date)
        session.add(row)
        session.commit()
    return row


def find_environment(session: Session, info: EnvironmentInfo) -> ProfileEnvironment | None:
    """The stored environment of ``info``; else one with the same GPU name and driver, torch, CUDA and
    NCCL versions but another GPU count (the largest: kernel timings do not depend on the count); else None."""
    same = list(session.scalars(select(ProfileEnvironment).filter_by(
        gpu_name=info.gpu_name, driver=info.driver, torch_version=info.torch, cuda=info.cuda, nccl=info.nccl)))
    exact = [e for e in same if e.gpu_count == info.gpu_count]
    if exact:
        return exact[0]
    return max(same, key=lambda e: (e.gpu_count, e.id)) if same else None


def environments(session: Session, *, gpu: str | None = None) -> list[ProfileEnvironment]:
    """Stored environments, newest first; ``gpu`` (catalog key) keeps those of that GPU only."""
    rows = list(session.scalars(select(ProfileEnvironment).order_by(ProfileEnvironment.created_at.desc(),
                                                                    ProfileEnvironment.id.desc())))
    if gpu is not None:
        rows = [r for r in rows if catalog_gpu(r.gpu_name) == gpu]
    return rows


def _table(table: str) -> tuple[type, tuple[str, ...]]:
    try:
        return TABLES[table]
    except KeyError:
        raise ConfigError(f"unknown profile table {table!r}; valid: {', '.join(TABLES)}") from None


def record(session: Session, env: ProfileEnvironment, table: str, **values: Any) -> Any:
    """Insert or replace (same key) one timing row of ``table`` and commit.

    ``values`` are the row's columns (for GEMM the pass column is ``pass_``). Returns the row.

    Raises:
        ConfigError: unknown table or a key column missing from ``values``.
    """
    cls, keys = _table(table)
    missing = [k for k in keys if k not in values]
    if missing:
        raise ConfigError(f"record({table!r}): missing key column(s) {missing}; keys are {list(keys)}")
    row = lookup(session, env, table, **{k: values[k] for k in keys})
    if row is None:
        row = cls(env_id=env.id, **values)
        session.add(row)
    else:
        for k, v in values.items():
            setattr(row, k, v)
        row.measured_at = _now()
    session.commit()
    return row


def lookup(session: Session, env: ProfileEnvironment, table: str, **key: Any) -> Any | None:
    """The row of ``table`` for ``env`` whose key columns equal ``key``, or None."""
    cls, _ = _table(table)
    return session.scalars(select(cls).filter_by(env_id=env.id, **key)).first()


def rows(session: Session, env: ProfileEnvironment, table: str) -> list[Any]:
    """All rows of ``table`` for ``env``, ordered by id."""
    cls, _ = _table(table)
    return list(session.scalars(select(cls).filter_by(env_id=env.id).order_by(cls.id)))


# ----------------------------------------------------------------------------- FLOP conventions
def gemm_flops(m: int, n: int, k: int) -> float:
    """FLOPs of one GEMM pass: 2 m n k."""
    return 2.0 * m * n * k


def attention_flops(*, batch: int, seq_len: int, heads: int, head_dim: int, backward: bool = False) -> float:
    """Causal attention FLOPs: forward 2 b s^2 d h (half of 4 b s^2 d h, FlashAttention-2 paper Sec. 4.1
    counting), backward 2.5x forward (5 vs 2 matmuls, Dao 2023 Sec. 3.1)."""
    f = 2.0 * batch * seq_len * seq_len * head_dim * heads
    return f * 2.5 if backward else f


def tflops_of(flops: float, ms: float) -> float:
    """Achieved TFLOP/s of ``flops`` in ``ms`` milliseconds."""
    return flops / (ms * 1e9)


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw for nccl-tests' convention: 2(n-1)/n all-reduce, (n-1)/n all-gather,
    reduce-scatter and all-to-all, 1 send/recv (nccl-tests PERFORMANCE.md)."""
    return collective_factors(kind, n)[0] if n > 1 else 1.0


# ----------------------------------------------------------------------------- export / import
def _r(x: float, nd: int = 4) -> float:
    return float(round(float(x), nd))


def nominal_tier_bandwidth(tier: str, gpu: str, fallback: float) -> float:
    """Nominal (datasheet) bandwidth of the path a tier measures, GB/s; see TIER_NOMINAL_PRESET."""
    from autotune.spec.hardware import get_fabric, get_gpu

    try:
        if tier == "nvlink":
            return float(get_fabric(get_gpu(gpu).default_intra_node).intra_node.bandwidth_gbs)
        if tier in TIER_NOMINAL_PRESET:
            preset = TIER_NOMINAL_PRESET[tier]
            spec = get_fabric(preset) if tier == "host" else get_fabric(f"nvlink4+{preset}")
            link = spec.intra_node if tier == "host" else spec.inter_node
            return float(link.bandwidth_gbs)
    except ConfigError:
        pass
    return fallback


def measured_tier_busbw(colls: list[CollectiveTiming], tier: str) -> float | None:
    """Large-message bus bandwidth of a tier: all-reduce at the largest size on the largest group."""
    ar = [c for c in colls if c.tier == tier and c.kind == "all_reduce"]
    if not ar:
        return None
    g = max(c.group_size for c in ar)
    return max((c for c in ar if c.group_size == g), key=lambda c: c.nbytes).busbw_gbs


def export_profile(session_or_url: Session | str, env: ProfileEnvironment) -> dict[str, Any]:
    """The calibration profile (schema version 1, see :mod:`autotune.cost.calibration`) of ``env``'s timings.

    ``measured: true``, ``label`` ``<gpu>-<date>``. Derived fields: ``gemm`` = forward TFLOP/s per
    shape; ``gemm_backward_factor`` = mean over shapes of mean(dgrad, wgrad) ms / fwd ms;
    ``memory_bound_bandwidth_gbs`` = median over the Llama memory-bound ops (not the raw copy) of GB/s
    at each op's largest size; per tier the curves of the largest group measured (send/recv: group 2),
    ``link_bandwidth_gbs`` = the path's nominal bandwidth (:data:`TIER_NOMINAL_PRESET`) and
    ``measured_busbw_gbs`` = all-reduce busbw at the largest size. Tiers, overlap, reclaim and
    fragmentation not measured are copied from the shipped calibration (tiers with ``measured: false``).
    FP8 / compile keys, written only when measured: ``gemm_fp8.<scaling>`` = forward TFLOP/s per shape;
    ``quantize.<scaling>_gbs`` / ``<scaling>_eager_gbs`` = median over the tensors of the ``total``
    stage's GB/s, compiled / eager (5 bytes charged per element, :data:`QUANTIZE_STAGE_BYTES` of
    :mod:`autotune.profiling.measure`); ``memory_bound_ops`` / ``memory_bound_ops_compiled`` = block ops'
    GB/s eager / compiled at their largest size (eager table also holds the other memory ops' figures).
    The lossless ``measurements`` section holds every stored row (:func:`import_profile` reads it).

    Raises:
        ConfigError: unknown GPU, or no GEMM or attention timings stored for ``env``.
    """
    from autotune.spec.hardware import get_gpu

    with _session(session_or_url) as s:
        gpu = catalog_gpu(env.gpu_name)
        if gpu is None:
            raise ConfigError(f"cannot export a profile for GPU {env.gpu_name!r}: not in the GPU catalog "
                              "(autotune/data/gpus.yaml)")
        spec = get_gpu(gpu)
        gem = rows(s, env, "gemm")
        att = rows(s, env, "attention")
        mem = rows(s, env, "memory_op")
        col = rows(s, env, "collective")
        ovl = rows(s, env, "overlap")
        rec = rows(s, env, "reclaim")
        g8 = rows(s, env, "gemm_fp8")
        qz = rows(s, env, "quantize")
        blk = rows(s, env, "block_op")
    if not gem or not att:
        raise ConfigError(f"environment {env.gpu_name} x{env.gpu_count} (torch {env.torch_version}) has "
                          f"{len(gem)} GEMM and {len(att)} attention timings; run `autotune profile` first")
    shipped = default_calibration()
    raw = shipped.raw

    fwd = {(g.m, g.n, g.k): g for g in gem if g.pass_ == "fwd"}
    gemm_rows = sorted([m, n, k, _r(g.tflops, 2)] for (m, n, k), g in fwd.items())
    ratios = []
    for key, g in sorted(fwd.items()):
        bw = [x.median_ms for x in gem if (x.m, x.n, x.k) == key and x.pass_ in ("dgrad", "wgrad")]
        if bw and g.median_ms > 0:
            ratios.append(statistics.fmean(bw) / g.median_ms)
    attn: dict[tuple, AttentionTiming] = {}
    for a in sorted(att, key=lambda a: a.batch, reverse=True):  # batch 1 wins when duplicated
        attn[(a.seq_len, a.heads, a.kv_heads, a.head_dim)] = a
    attn_rows = sorted([*key, _r(a.fwd_tflops, 2), _r(a.bwd_tflops, 2)] for key, a in attn.items())

    largest: dict[str, MemoryOpTiming] = {}
    for r in mem:
        if r.op not in largest or r.nbytes > largest[r.op].nbytes:
            largest[r.op] = r
    llama_ops = [r.gbs for op, r in largest.items() if op != COPY_OP]
    if llama_ops:
        mem_bw = _r(statistics.median(llama_ops), 1)
    elif COPY_OP in largest:
        mem_bw = _r(largest[COPY_OP].gbs, 1)
    else:
        mem_bw = float(shipped.memory_bound_bandwidth_gbs)

    collectives: dict[str, Any] = {}
    for tier in sorted({c.tier for c in col}):
        tc = [c for c in col if c.tier == tier]
        if not any(c.kind == "all_reduce" for c in tc):
            continue
        g = max(c.group_size for c in tc if c.kind == "all_reduce")
        busbw = measured_tier_busbw(col, tier)
        entry: dict[str, Any] = {"link_bandwidth_gbs": nominal_tier_bandwidth(tier, gpu, _r(busbw, 2)),
                                 "group_size": g, "measured": True, "measured_busbw_gbs": _r(busbw, 2)}
        for kind in COLLECTIVE_KINDS:
            sizes = sorted({c.group_size for c in tc if c.kind == kind})
            if not sizes:
                continue
            gk = g if g in sizes else max(sizes)
            pts = sorted((c.nbytes, _r(c.busbw_gbs, 3)) for c in tc if c.kind == kind and c.group_size == gk)
            entry[kind] = [[int(b), v] for b, v in pts if v > 0]
            if not entry[kind]:
                del entry[kind]
        collectives[tier] = entry
    for tier, td in (raw.get("collectives") or {}).items():
        if tier not in collectives:
            collectives[tier] = {**td, "measured": False}

    if ovl:
        o = next((o for o in ovl if o.tier == "nvlink"), ovl[0])
        overlap = {"compute_slowdown": _r(max(0.0, o.compute_slowdown), 4)}
    else:
        overlap = dict(raw.get("overlap") or {})
    recl = {r.expandable_segments: r for r in rec}
    if False in recl:
        reclaim: dict[str, Any] = {"empty_cache_ms": _r(recl[False].empty_cache_ms, 4),
                                   "alloc_after_empty_cache_ms_per_gib": _r(recl[False].alloc_ms_per_gib, 4)}
        if True in recl:
            reclaim["expandable_segments"] = {
                "empty_cache_ms": _r(recl[True].empty_cache_ms, 4),
                "alloc_after_empty_cache_ms_per_gib": _r(recl[True].alloc_ms_per_gib, 4)}
    else:
        reclaim = dict(raw.get("reclaim") or {})

    gemm_fp8: dict[str, list] = {}
    for sc in sorted({r.scaling for r in g8}):
        gemm_fp8[sc] = sorted([r.m, r.n, r.k, _r(r.tflops, 2)] for r in g8 if r.scaling == sc and r.pass_ == "fwd")
    quantize: dict[str, float] = {}
    for sc in ("tensorwise", "rowwise"):
        for mode, key in (("compiled", f"{sc}_gbs"), ("eager", f"{sc}_eager_gbs")):
            v = [r.gbs for r in qz if r.scaling == sc and r.mode == mode and r.stage == "total"]
            if v:
                quantize[key] = _r(statistics.median(v), 1)
    mops: dict[str, float] = {}
    mops_c: dict[str, float] = {}
    for mode, dst in (("eager", mops), ("compiled", mops_c)):
        big: dict[str, BlockOpTiming] = {}
        for r in blk:
            if r.mode == mode and (r.op not in big or r.nbytes > big[r.op].nbytes):
                big[r.op] = r
        dst.update({op: _r(r.gbs, 1) for op, r in sorted(big.items())})
    if mops:   # eager per-op table: the legacy memory_ops rows' figures, block ops (cost-model bytes) over them
        mops = {**{op: _r(r.gbs, 1) for op, r in sorted(largest.items()) if op != COPY_OP}, **mops}

    date = env.date or env.created_at.date().isoformat()
    envd = env.to_dict()
    envd["date"] = date
    fp8_part: dict[str, Any] = {}
    if gemm_fp8:
        fp8_part["gemm_fp8"] = gemm_fp8
    if quantize:
        fp8_part["quantize"] = quantize
    if mops:
        fp8_part["memory_bound_ops"] = mops
    if mops_c:
        fp8_part["memory_bound_ops_compiled"] = mops_c
    extra_meas: dict[str, Any] = {}
    if g8:
        extra_meas["gemm_fp8"] = [[r.scaling, r.m, r.n, r.k, r.pass_, r.median_ms, r.tflops, r.repeats] for r in g8]
    if qz:
        extra_meas["quantize"] = [[r.scaling, r.mode, r.stage, r.rows, r.cols, r.nbytes, r.median_ms, r.gbs,
                                   r.repeats] for r in qz]
    if blk:
        extra_meas["block_ops"] = [[r.op, r.mode, r.nbytes, r.median_ms, r.gbs, r.repeats] for r in blk]
    return {
        "schema_version": CALIBRATION_SCHEMA_VERSION,
        "label": f"{gpu}-{date}",
        "measured": True,
        "source": (f"autotune profile on {env.hostname or 'unknown host'} ({env.gpu_count}x {env.gpu_name}): "
                   "CUDA-event timing after warm-up, median of repeats, fresh random inputs; NCCL bus "
                   "bandwidth per nccl-tests' convention. Unmeasured tiers/fields copied from the shipped "
                   f"calibration {shipped.label!r}."),
        "environment": envd,
        "gpu": gpu,
        "peak_bf16_tflops": float(spec.bf16_tflops),
        "hbm_bandwidth_gbs": float(spec.hbm_bandwidth_gbs),
        "gemm": gemm_rows,
        "gemm_backward_factor": _r(statistics.fmean(ratios), 4) if ratios else 1.0,
        "attention": attn_rows,
        "memory_bound_bandwidth_gbs": mem_bw,
        **fp8_part,
        "collectives": collectives,
        "overlap": overlap,
        "reclaim": reclaim,
        "fragmentation": dict(raw.get("fragmentation") or {}),
        "measurements": {
            "gemm": [[g.m, g.n, g.k, g.pass_, g.median_ms, g.tflops, g.repeats] for g in gem],
            "attention": [[a.batch, a.seq_len, a.heads, a.kv_heads, a.head_dim, a.fwd_ms, a.bwd_ms,
                           a.fwd_tflops, a.bwd_tflops, a.repeats] for a in att],
            "memory_ops": [[r.op, r.nbytes, r.median_ms, r.gbs, r.repeats] for r in mem],
            "collectives": [[c.tier, c.kind, c.group_size, c.nbytes, c.median_ms, c.busbw_gbs, c.repeats]
                            for c in col],
            "overlap": [[o.tier, o.gemm_ms_alone, o.gemm_ms_overlapped, o.comm_ms, o.comm_nbytes,
                         o.compute_slowdown] for o in ovl],
            "reclaim": [[r.expandable_segments, r.empty_cache_ms, r.alloc_ms_per_gib, r.nbytes] for r in rec],
            **extra_meas,
        },
    }


def import_profile(d: Mapping[str, Any], session_or_url: Session | str = DEFAULT_STORAGE) -> ProfileEnvironment:
    """Store a calibration profile's timings under its ``environment``; returns the environment row.

    A profile written by :func:`export_profile` is imported losslessly from its ``measurements``
    section. Any other profile (e.g. the shipped ``h200.yaml``) is converted: GEMM rows become fwd
    rows (ms = 2mnk / TFLOP/s) and dgrad/wgrad rows at TFLOP/s / ``gemm_backward_factor``; attention
    rows batch-1 rows; ``memory_bound_bandwidth_gbs`` a ``memory_bound`` op at 1 GiB; measured tiers'
    curves collective rows on the tier's group size (ms = f(n) S / busbw); overlap and reclaim rows.
    Repeats of converted rows are 0.

    Raises:
        ConfigError: the mapping is not a valid calibration profile (:meth:`CalibrationProfile.from_dict`).
    """
    prof = CalibrationProfile.from_dict(d, source="imported profile")
    info = EnvironmentInfo.from_dict(prof.environment)
    with _session(session_or_url) as s:
        env = get_or_create_environment(s, info)
        meas = d.get("measurements")
        if meas:
            for m, n, k, p, ms, tf, rep in meas.get("gemm", []):
                record(s, env, "gemm", m=m, n=n, k=k, pass_=p, median_ms=ms, tflops=tf, repeats=rep)
            for b, sl, h, kv, hd, fms, bms, ftf, btf, rep in meas.get("attention", []):
                record(s, env, "attention", batch=b, seq_len=sl, heads=h, kv_heads=kv, head_dim=hd, fwd_ms=fms,
                       bwd_ms=bms, fwd_tflops=ftf, bwd_tflops=btf, repeats=rep)
            for op, nb, ms, gbs, rep in meas.get("memory_ops", []):
                record(s, env, "memory_op", op=op, nbytes=nb, median_ms=ms, gbs=gbs, repeats=rep)
            for tier, kind, g, nb, ms, bb, rep in meas.get("collectives", []):
                record(s, env, "collective", tier=tier, kind=kind, group_size=g, nbytes=nb, median_ms=ms,
                       busbw_gbs=bb, repeats=rep)
            for tier, ga, go, cm, cb, sl in meas.get("overlap", []):
                record(s, env, "overlap", tier=tier, gemm_ms_alone=ga, gemm_ms_overlapped=go, comm_ms=cm,
                       comm_nbytes=cb, compute_slowdown=sl)
            for ex, ec, al, nb in meas.get("reclaim", []):
                record(s, env, "reclaim", expandable_segments=bool(ex), empty_cache_ms=ec, alloc_ms_per_gib=al,
                       nbytes=nb)
            for sc, m, n, k, p, ms, tf, rep in meas.get("gemm_fp8", []):
                record(s, env, "gemm_fp8", scaling=sc, m=m, n=n, k=k, pass_=p, median_ms=ms, tflops=tf, repeats=rep)
            for sc, mode, st, r_, c_, nb, ms, gbs, rep in meas.get("quantize", []):
                record(s, env, "quantize", scaling=sc, mode=mode, stage=st, rows=r_, cols=c_, nbytes=nb,
                       median_ms=ms, gbs=gbs, repeats=rep)
            for op, mode, nb, ms, gbs, rep in meas.get("block_ops", []):
                record(s, env, "block_op", op=op, mode=mode, nbytes=nb, median_ms=ms, gbs=gbs, repeats=rep)
            return env
        bf = prof.gemm_backward_factor or 1.0
        for m, n, k, tf in prof.gemm:
            fl = gemm_flops(m, n, k)
            record(s, env, "gemm", m=m, n=n, k=k, pass_="fwd", median_ms=fl / (tf * 1e9), tflops=tf, repeats=0)
            for p in ("dgrad", "wgrad"):
                record(s, env, "gemm", m=m, n=n, k=k, pass_=p, median_ms=fl / (tf / bf * 1e9), tflops=tf / bf,
                       repeats=0)
        for sl, h, kv, hd, ftf, btf in prof.attention:
            ff = attention_flops(batch=1, seq_len=sl, heads=h, head_dim=hd)
            record(s, env, "attention", batch=1, seq_len=sl, heads=h, kv_heads=kv, head_dim=hd,
                   fwd_ms=ff / (ftf * 1e9), bwd_ms=2.5 * ff / (btf * 1e9), fwd_tflops=ftf, bwd_tflops=btf,
                   repeats=0)
        nb = 2**30
        record(s, env, "memory_op", op="memory_bound", nbytes=nb,
               median_ms=nb / (prof.memory_bound_bandwidth_gbs * 1e6), gbs=prof.memory_bound_bandwidth_gbs,
               repeats=0)
        for tier, tc in prof.collectives.items():
            if not tc.measured:
                continue
            for kind, curve in tc.curves.items():
                g = 2 if kind == "send_recv" else tc.group_size
                for S, bb in zip(curve.sizes_bytes, curve.busbw_gbs):
                    record(s, env, "collective", tier=tier, kind=kind, group_size=g, nbytes=int(S),
                           median_ms=S * bus_factor(kind, g) / (bb * 1e6), busbw_gbs=bb, repeats=0)
        if "overlap" in d:
            record(s, env, "overlap", tier="nvlink", gemm_ms_alone=0.0, gemm_ms_overlapped=0.0, comm_ms=0.0,
                   comm_nbytes=0, compute_slowdown=prof.overlap_compute_slowdown)
        if "reclaim" in d:
            record(s, env, "reclaim", expandable_segments=False, empty_cache_ms=prof.empty_cache_ms,
                   alloc_ms_per_gib=prof.alloc_after_empty_cache_ms_per_gib, nbytes=0)
        return env


def dump_profile_yaml(d: Mapping[str, Any]) -> str:
    """YAML text of a profile mapping, table rows in flow style (``[m, n, k, tflops]``)."""
    import yaml

    head = ("# Calibration profile written by `autotune profile` (schema: autotune/cost/calibration.py).\n"
            "# Per-row units: gemm [m, n, k, fwd TFLOP/s]; attention [seq, heads, kv_heads, head_dim, fwd\n"
            "# TFLOP/s, bwd TFLOP/s]; collectives [bytes S, busbw GB/s]; measurements.* are raw rows (ms).\n")
    return head + yaml.safe_dump(dict(d), sort_keys=False, default_flow_style=None, width=120)
