"""torchtitan trainer log parser (autotune/engines/torchtitan/log.py), on the logs of a real run: torchtitan
0.2.2 on one H200, Llama 3.1 8B cut to 16 layers (docs/results/engines/torchtitan-h200x1-2026-12-01-*.log,
bench/engine_smoke/run_torchtitan.sh), and on hand-written lines for the forms that run did not print
(ANSI colours, torchrun's rank prefix, 0.3.0's ``mfu: N/A``, validation lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.engines.torchtitan.log import causal_mfu, parse_facts, parse_file, parse_steps, summarize

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "engines"
LOG = "torchtitan-h200x1-2026-12-01-{}.log"
VARIANTS = ("bf16-eager", "bf16-compile", "fp8rowwise-compile", "fp8tensorwise-compile")
# torchtitan's FLOPs per token for 8B_L16 at seq 8192 (tflops / tps of every line of these logs)
FLOPS_PER_TOKEN = 30_533_246_976


def _text(variant: str) -> str:
    return (RESULTS / LOG.format(variant)).read_text()


def test_every_step_of_the_real_log_is_read_with_its_values():
    recs = parse_steps(_text("bf16-eager"))
    assert [r.step for r in recs] == list(range(1, 13))
    last = recs[-1]
    # [titan] ... step: 12  loss:  8.15642  grad_norm:  7.1715  memory: 114.95GiB(82.22%)  tps: 17,388
    #   tflops: 530.92  mfu: 53.68%
    assert (last.loss, last.grad_norm, last.memory_gib, last.memory_pct) == (8.15642, 7.1715, 114.95, 82.22)
    assert (last.tps, last.tflops, last.mfu_pct) == (17388.0, 530.92, 53.68)
    assert recs[0].tps == 5169.0 and recs[0].memory_gib == 80.98   # step 1: warm-up


@pytest.mark.parametrize("variant", VARIANTS)
def test_tflops_are_flops_per_token_times_tps(variant):
    # metrics.py: tflops = num_flops_per_token * tps / 1e12, mfu = 100 * that / 989e12 (H200)
    for r in parse_steps(_text(variant)):
        assert r.tflops * 1e12 == pytest.approx(FLOPS_PER_TOKEN * r.tps, rel=1e-3)
        assert r.mfu_pct == pytest.approx(100 * r.tflops / 989, abs=0.01)


def test_facts_of_the_run():
    f = parse_facts(_text("fp8rowwise-compile"))
    assert f["torchtitan_version"] == "0.2.2" and f["model"] == "llama3 8B_L16" and f["params"] == 4_540_469_248
    assert (f["device"], f["device_gib"], f["peak_flops"]) == ("NVIDIA H200", 139.8, 989e12)
    assert (f["local_batch_size"], f["global_batch_size"], f["grad_accum_steps"], f["seq_len"], f["steps"]) \
        == (1, 2, 2, 8192, 12)
    assert f["float8_recipe"] == "rowwise" and f["compiled"] and not f["oom"]
    assert parse_facts(_text("fp8tensorwise-compile"))["float8_recipe"] == "tensorwise"
    eager = parse_facts(_text("bf16-eager"))
    assert "float8_recipe" not in eager and not eager["compiled"]


def test_summary_skips_warm_up_and_matches_the_committed_summary():
    recs = parse_steps(_text("fp8tensorwise-compile"))
    s = summarize(recs, skip=3)
    assert s["steps"] == 9 and s["memory_gib"] == 85.85 and s["final_loss"] == recs[-1].loss
    assert s["tps"] == sorted(r.tps for r in recs[3:])[4]          # median of 9
    # 16K tokens a step (local batch 1 x seq 8192 x 2 accumulation steps): 0.735 s
    assert recs[-1].step_time_s(2 * 8192) == pytest.approx(16384 / 22366)
    committed = json.loads((RESULTS / "torchtitan-h200x1-2026-12-01-summary.json").read_text())
    for v in VARIANTS:
        got = parse_file(RESULTS / LOG.format(v))
        assert got["summary"] == committed[v]["summary"]


def test_summary_needs_steps_after_the_skipped_ones():
    with pytest.raises(ValueError, match="none left"):
        summarize(parse_steps(_text("bf16-eager"))[:3], skip=3)


def test_colours_rank_prefix_na_and_validation_lines():
    text = (
        "[rank0]:[titan] 2026-12-01 12:00:01,123 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.25000  "
        "\x1b[38;2;180;60;0mgrad_norm:  3.1416  \x1b[38;2;54;234;195mmemory: 98.76GiB(70.64%)  "
        "\x1b[34mtps: 1,234  \x1b[36mtflops: 1,037.68  \x1b[35mmfu: 3.81%\x1b[39m\n"
        "[titan] 2026-12-01 12:00:02,000 - root - INFO - \x1b[33mvalidate step: 1  \x1b[32mloss: 7.5000  "
        "\x1b[38;2;54;234;195mmemory: 99.00GiB(70.81%)  \x1b[34mtps: 21,000\x1b[39m\n"
        "[titan] 2026-12-01 12:00:03,000 - root - INFO - step: 100  loss:  7.50000  grad_norm:  0.5000  "
        "memory: 99.00GiB(70.81%)  tps: 21,000  tflops: 641.20  mfu: N/A\n")
    a, b = parse_steps(text)
    assert (a.step, a.loss, a.tps, a.tflops, a.mfu_pct) == (1, 12.25, 1234.0, 1037.68, 3.81)
    assert (b.step, b.mfu_pct, b.memory_gib) == (100, None, 99.0)
    assert summarize([a, b], skip=1)["mfu_pct"] is None


def test_out_of_memory_is_flagged():
    assert parse_facts("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")["oom"]


def test_causal_mfu_removes_half_the_attention_flops():
    # 8B_L16, seq 8192: attention term 6 x 16 x 32 x (2 x 128) x 8192 = 6.44e9 of 30.53e9 FLOPs per token
    got = causal_mfu(68.78, flops_per_token=FLOPS_PER_TOKEN, layers=16, heads=32, head_dim=128, seq_len=8192)
    assert got == pytest.approx(68.78 * (FLOPS_PER_TOKEN - 6 * 16 * 32 * 128 * 8192) / FLOPS_PER_TOKEN)
    assert got == pytest.approx(61.52, abs=0.01)
