"""Megatron-LM's log parser on a recorded H200 run (Llama 3.1 8B widths x 16 layers, --transformer-impl local,
docs/results/engines/megatron-h200x1-2026-12-02/megatron-8b-l16.log) (issue 23)."""

from __future__ import annotations

from pathlib import Path

from autotune.engines.megatron.log import parse_arguments, parse_facts, parse_iterations, parse_memory

LOG = Path(__file__).resolve().parents[3] / "docs" / "results" / "engines" / "megatron-h200x1-2026-12-02" / "megatron-8b-l16.log"


def _text() -> str:
    return LOG.read_text()


def test_iterations_of_the_recorded_run():
    its = parse_iterations(_text())
    # the log's ten "iteration N/ 10" lines (--train-iters 10, --log-interval 1)
    assert [r.iteration for r in its] == list(range(1, 11)) and {r.total for r in its} == {10}
    first, fifth, last = its[0], its[4], its[-1]
    # values as printed on lines 1060, "iteration 5/10" and "iteration 10/10"
    assert (first.elapsed_ms, first.tflops_per_gpu, first.loss, first.grad_norm) == (4755.1, 94.1, 12.57677, 17.104)
    assert (fifth.elapsed_ms, fifth.tflops_per_gpu, fifth.loss) == (2902.7, 154.2, 1.504291)
    assert (last.elapsed_ms, last.global_batch_size, last.skipped, last.nan) == (2894.0, 2, 0, 0)
    # warm-up apart: the first two iterations are slower than every later one
    assert min(r.elapsed_ms for r in its[:2]) > max(r.elapsed_ms for r in its[2:])


def test_memory_reports_in_bytes():
    mem = parse_memory(_text())
    assert [m.when for m in mem] == ["after 1 iterations", "after 2 iterations"]
    # "max reserved: 128434.00" MB on the second report, MB = 2^20 bytes (report_memory divides by 1024 x 1024)
    assert mem[1].max_reserved_bytes == 128434 * 2**20
    assert mem[1].max_allocated_bytes == round(123547.36 * 2**20)
    assert mem[0].reserved_bytes == 99762 * 2**20 and mem[0].rank == 0


def test_arguments_and_facts():
    args = parse_arguments(_text())
    assert args["transformer_impl"] == "local" and args["num_layers"] == "16" and args["seq_length"] == "8192"
    f = parse_facts(_text())
    assert f["transformer_impl"] == "local" and f["recompute_granularity"] == "selective" and f["fp8"] == "None"
    assert f["theoretical_memory_mib"] == {"weight_and_optimizer": 77942.32, "activation": 20483.47,
                                           "total": 98425.79}
    assert f["oom"] is False


def test_no_iterations_in_an_unrelated_text():
    assert parse_iterations("step:  1  loss: 12.0 memory: 1GiB") == [] and parse_memory("") == []
    assert parse_facts("torch.OutOfMemoryError: CUDA out of memory.")["oom"] is True
    assert parse_arguments("no dump") == {}
