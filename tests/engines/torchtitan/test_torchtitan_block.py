"""torchtitan 0.2.x's measured block accounting (autotune/engines/torchtitan/block_saved.py) and the peak memory the
torchtitan runner's profile predicts with it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.cost import memory as _memory
from autotune.engines.torchtitan.block_saved import TORCHTITAN_BLOCK_SAVED, block_factors, param_mode, residual_bytes
from autotune.spec.engines import get_engine, resolve_engine
from autotune.spec.hardware import get_gpu
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload

RESULTS = (Path(__file__).resolve().parents[3] / "docs" / "results" / "engines"
           / "torchtitan-saved-activations-h200x1-2026-12-02" / "torchtitan-saved-activations.json")
GIB = 2**30


def _rows():
    return json.loads(RESULTS.read_text())["rows"]


def test_every_table_entry_is_the_measurement():
    # re-derived from the JSON: per-sequence bytes (mb 2 minus mb 1) over the minimal count of the same
    # recompute mode for one 8,192-token sequence of the 8B block, and the weight-sized term over the
    # layer's 2 bytes per parameter
    m, w = get_model("8b"), Workload(seq_len=8192, global_batch_size=1)
    minimal = get_engine("torchtitan")          # accounting "minimal": the derived set
    seen = set()
    for r in _rows():
        assert "error" not in r, r
        kind = "bf16" if r["precision"] == "bf16" else "fp8"
        key = (r["mode"], kind, r["compile"], r["recompute"])
        base = _memory.activation_bytes_per_layer(m, Plan(recompute=r["recompute"]), w, engine=minimal)
        ratio, copies = TORCHTITAN_BLOCK_SAVED[key]
        assert r["per_seq_bytes"] / base == pytest.approx(ratio, abs=5e-4), key
        assert r["const_bytes"] / (2 * m.params_per_layer) == pytest.approx(copies, abs=1e-3), key
        # activations grow linearly: the three blocks keep the same, and mb 2 keeps twice mb 1's
        # per-sequence part
        assert len(set(r["mb2"]["kept_by_block"])) == 1
        seen.add(key)
    assert seen == set(TORCHTITAN_BLOCK_SAVED)


def test_rowwise_measured_as_tensorwise():
    rows = {(r["mode"], r["precision"], r["compile"], r["recompute"]): r for r in _rows()}
    assert (rows["autocast", "fp8_rowwise", True, "none"]["per_seq_bytes"]
            == rows["autocast", "fp8_tensorwise", True, "none"]["per_seq_bytes"])


def test_param_mode_follows_fsdp():
    assert param_mode(Plan()) == "autocast" and residual_bytes(Plan()) == 4
    assert param_mode(Plan(dp_degree=2, zero_stage=3)) == "bf16" and residual_bytes(Plan(dp_degree=2, zero_stage=3)) == 2
    assert param_mode(Plan(dp_degree=2, zero_stage=0)) == "autocast"      # DDP: autocast
    assert param_mode(Plan(cp_degree=2)) == "bf16"                        # CP runs on the FSDP mesh
    # bf16 mode with selective recompute was not measured: the autocast ratio, no weight copies
    assert block_factors(Plan(dp_degree=2, zero_stage=3, recompute="selective", compile=True)) == (
        TORCHTITAN_BLOCK_SAVED["autocast", "bf16", True, "selective"][0], 0.0)


def test_real_runner_profile_peak_of_a_compiled_fp8_step():
    # torchtitan 0.2.2 on one GPU, 8B widths at 16 layers, seq 8192, micro-batch 2, FP8 tensorwise, compile,
    # no recompute. Derived term by term (GiB = 2^30 bytes):
    #   FP32 weights 4 N and Adam 8 N, N = 16 x 218,112,000 + 2 x 128,256 x 4,096 + 4,096 = 4,540,469,248;
    #   no gradients at the peak (0.2.2 sets them to None; one micro-batch);
    #   16 layers x 2 sequences x 0.7356 x 1,141,899,264 (TORCHTITAN_BLOCK_SAVED, FP8 compiled, autocast);
    #   the FP32 embedding output 4 x 2 x 8192 x 4096; the LM head's BF16 weight cast 2 x 128,256 x 4,096;
    #   compiled loss: 4 bytes per logit, 2 x 8192 x 128,256; no layer weight copies (torchao saves the FP32
    #   weight); expandable segments' allocator fraction over the sum.
    m = get_model("8b").truncated(16)
    eng = resolve_engine("torchtitan", "real")
    assert eng.activation_accounting == "torchtitan_block" and eng.frees_grads_between_steps
    plan = Plan(micro_batch_size=2, precision="fp8_tensorwise", compile=True, memory_reclaim="expandable_segments")
    w = Workload(seq_len=8192, global_batch_size=2)
    est = _memory.estimate_memory(m, plan, get_gpu("h200"), w, engine=eng)
    n = 16 * 218_112_000 + 2 * 128_256 * 4_096 + 4_096
    assert m.num_params == n
    acts = 16 * math.ceil(2 * 1_141_899_264 * 0.7356) + 4 * 2 * 8192 * 4096
    transient = 2 * 128_256 * 4_096 + 4 * 2 * 8192 * 128_256
    s = est.stages[0]
    assert (s.weights_bytes, s.grads_bytes, s.optimizer_bytes) == (4 * n, 0, 8 * n)
    assert s.activations_bytes == pytest.approx(acts, abs=16)
    assert s.transient_bytes == transient
    subtotal = 12 * n + acts + transient
    frac = _memory.DEFAULT_FRAGMENTATION["expandable_segments"]
    assert s.total_bytes == pytest.approx(subtotal * (1 + frac), rel=1e-6)
    # the simulated profile (torchtitan @ 0.3-era commit, minimal accounting, gradients kept) predicts more
    sim = _memory.estimate_memory(m, plan, get_gpu("h200"), w, engine=get_engine("torchtitan"))
    assert sim.peak_bytes > est.peak_bytes + 16 * GIB


def test_autocast_bf16_keeps_the_layers_weight_casts():
    # BF16 under autocast: every matmul keeps its BF16 weight cast (measured 2 bytes per layer parameter,
    # eager and compiled) besides the LM head's; with compile and selective AC the casts are recomputed
    # (16 layers, micro-batch 2: the peak is the activation peak, not the end of the last backward)
    m = get_model("8b").truncated(16)
    eng = resolve_engine("torchtitan", "real")
    w = Workload(seq_len=8192, global_batch_size=2)
    head = 2 * 128_256 * 4_096
    for compile_, rc, copies in ((True, "none", 2 * 16 * 218_112_000 + head), (True, "selective", head),
                                 (False, "selective", 2 * 16 * 218_112_000 + head)):
        plan = Plan(precision="bf16", compile=compile_, recompute=rc, micro_batch_size=2)
        s = _memory.estimate_memory(m, plan, get_gpu("h200"), w, engine=eng).stages[0]
        assert s.activations_bytes > 0
        logits = 2 * 8192 * 128_256 * (4 if compile_ else 12)
        assert s.transient_bytes == copies + logits, (compile_, rc)
