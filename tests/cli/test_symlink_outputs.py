"""Issue 25 QA: no file autotune writes for the user is written through a symbolic link. The CLI cases are in
the bad-input table (tests/cli/test_bad_inputs.py); here the writers themselves, so that a link planted after
the up-front check (or on a path no CLI test reaches without a GPU: profile --export / --merge-output, the
engine runners' --engine-logs) still writes nothing: autotune/files.py open_output opens with O_NOFOLLOW."""

from __future__ import annotations

import pytest

from autotune.errors import ConfigError
from autotune.files import check_output_path, copy_output_file, open_output, write_output_text

VICTIM = "precious bytes\n"


@pytest.fixture
def link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    ln = tmp_path / "out.yaml"
    ln.symlink_to(victim)
    return ln, victim


@pytest.mark.parametrize("writer", [
    lambda p: write_output_text(p, "new", what="-o"),
    lambda p: copy_output_file(__file__, p, what="--engine-logs"),
    lambda p: open_output(p, what="-o", binary=True).close(),
])
def test_writers_refuse_a_symlink_and_leave_its_target(link, writer):
    ln, victim = link
    with pytest.raises(ConfigError, match="symbolic link"):
        writer(ln)
    assert victim.read_text() == VICTIM and ln.is_symlink()


def test_dangling_symlink_is_refused_and_nothing_created(tmp_path):
    # a link to a file that does not exist yet: following it would create the file outside the target
    ln = tmp_path / "plan.yaml"
    ln.symlink_to(tmp_path / "elsewhere.yaml")
    with pytest.raises(ConfigError, match="symbolic link"):
        write_output_text(ln, "x", what="-o")
    assert not (tmp_path / "elsewhere.yaml").exists()


def test_plain_path_is_written_and_truncated(tmp_path):
    p = tmp_path / "o.json"
    p.write_text("a much longer old content")
    write_output_text(p, "new", what="--json")
    assert p.read_text() == "new"


def test_plan_save_refuses_a_symlink(link):
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, PlanDocument, Workload
    ln, victim = link
    cl = make_cluster("h200", 8, None)
    doc = PlanDocument(plan=Plan(dp_degree=8), model=get_model("8b"), gpu=cl.gpu.name, num_gpus=8,
                       fabric=cl.fabric.to_dict(), workload=Workload(seq_len=8192, global_batch_size=16),
                       engine="megatron")
    with pytest.raises(ConfigError, match="symbolic link"):
        doc.save(ln)
    assert victim.read_text() == VICTIM


def test_profile_merge_output_refuses_a_symlink(tmp_path, link):
    from autotune.profiling.merge import merge_files
    ln, victim = link
    # merging reads both profiles first; any valid calibration file will do (the shipped one)
    from pathlib import Path

    import autotune
    cal = sorted((Path(autotune.__file__).parent / "data" / "calibration").glob("*.yaml"))[0]
    with pytest.raises(ConfigError, match="symbolic link"):
        merge_files(cal, cal, output=ln)
    assert victim.read_text() == VICTIM


def test_gantt_and_trace_writers_refuse_a_symlink(tmp_path):
    # the writers themselves, not only simulate's up-front check (which the bad-input table covers)
    from autotune.cost.simulator import SimulatedEvaluator
    from autotune.report.trace import write_chrome_trace, write_gantt
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, Workload
    ev = SimulatedEvaluator(model=get_model("8b"), cluster=make_cluster("h200", 8, None),
                            workload=Workload(seq_len=8192, global_batch_size=16), engine="megatron")
    g, tl = ev.step_timeline(Plan(pp_degree=2, dp_degree=4, pipeline_schedule="1f1b", micro_batch_size=1,
                                  num_micro_batches=4))
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    (tmp_path / "t.json").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_chrome_trace(tmp_path / "t.json", g, tl)
    pytest.importorskip("matplotlib")
    (tmp_path / "g.png").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_gantt(tmp_path / "g.png", g, tl)
    assert victim.read_text() == VICTIM
    write_gantt(tmp_path / "plain.png", g, tl)        # a plain path still gets a PNG (savefig to a file object)
    assert (tmp_path / "plain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_engine_logs_directory_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "logs").symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        check_output_path(tmp_path / "logs", what="--engine-logs", directory=True)
