"""CLI through click's CliRunner: run, export -> simulate round trip, show, retune, and error handling."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from autotune.cost.evaluator import BACKENDS
from autotune.study.storage import DEFAULT_STORAGE
from autotune.tune.retune import retune
from autotune.cli.app import main
from autotune.cli.options import parse_tokens
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import PlanDocument, Workload


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    url = f"sqlite:///{d}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "12", "--storage", url])
    assert r.exit_code == 0, r.output
    return url


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_run_prints_best_plan_table(storage):
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "3", "--storage", storage)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "15 in the study" in out  # resumed: 12 + 3
    for s in ("best plan: trial", "degrees", "TP ", "pipeline schedule", "step time", "tokens/s per GPU",
              "MFU", "PaLM convention", "peak memory per GPU", "exposed_dp_comm", "simulated with"):
        assert s in out, s


def test_export_then_simulate_reads_back_the_same_prediction(storage, tmp_path):
    out = tmp_path / "plan.yaml"
    r = invoke("export", "--size", "8b", "--space", "small", "--storage", storage, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size" in r.output and "tensor_parallel_degree" in r.output
    doc = PlanDocument.load(out)
    # the default engine (megatron) is part of the study name and of the plan file
    assert doc.study == "llama3.1-8b/b200x8/nvlink5+ib-ndr400/megatron/seq8192-gbs128/space=small"
    assert doc.engine == "megatron"
    assert isinstance(doc.trial_id, int)
    from autotune.cost.simulator import SimulatedEvaluator
    cl = make_cluster("b200", 8, "nvlink5+ib-ndr400")
    again = SimulatedEvaluator(model=doc.model, cluster=cl, workload=doc.workload,
                               engine=doc.engine).evaluate(doc.plan)
    assert again.mfu == pytest.approx(doc.prediction["mfu"], rel=1e-12)
    assert again.step_time_ms == pytest.approx(doc.prediction["step_time_ms"], rel=1e-12)
    r = invoke("simulate", str(out))
    assert r.exit_code == 0, r.output
    assert "-> same" in r.output and "memory per GPU by pipeline stage" in r.output
    assert f"{100 * doc.prediction['mfu']:.1f}%" in r.output


def test_show_lists_one_row_per_study(storage):
    r = invoke("show", "--storage", storage)
    assert r.exit_code == 0, r.output
    assert "llama3.1-8b" in r.output and "nvlink5+ib-ndr400" in r.output and "%" in r.output
    # the study's backend is simulated: its row says so, and the pooled 80% interval follows the table
    row = next(ln for ln in r.output.splitlines() if ln.startswith("llama3.1-8b"))
    assert " simulated " in row, row
    assert "80% interval (megatron): measured throughput within predicted / " in r.output


def test_retune_to_slower_fabric(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    # no study on a faster fabric yet: retune tunes the default fabric first
    r = invoke("retune", "--size", "8b", "--space", "small", "--interconnect", "pcie5+eth100", "--trials", "10",
               "--storage", url)
    assert r.exit_code == 0, r.output
    for s in ("nvlink5+ib-ndr400 best", "same plan on pcie5+eth100", "pcie5+eth100 best", "MFU lost", "changed:"):
        assert s in r.output, s
    # all three columns are simulator predictions: a 'numbers' row says so, the footer names the
    # calibration and the engine's (megatron, the default) error band
    numbers = next(ln for ln in r.output.splitlines() if ln.startswith("numbers"))
    assert numbers.split() == ["numbers", "simulated", "simulated", "simulated"], numbers
    assert "(simulated with " in r.output and "80% interval (megatron): measured throughput" in r.output
    # acceptance: the retuned plan's MFU on the slow fabric >= the fast plan simulated on the slow fabric
    m, w = get_model("8b"), Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)
    res = retune(model=m, cluster=make_cluster("b200", 8, "pcie5+eth100"), workload=w, space="small",
                   storage=url, n_trials=3)
    # the fast plan runs in the slow study too (a warm start), so the re-tuned best is never ranked below it:
    # a higher MFU, or (issue 40, study/trials.py robust_order) a higher conservative estimate (MFU at the
    # low end of its 80% interval)
    from autotune.study.trials import rank_basis

    slow, fos = res.slow.result, res.fast_on_slow
    b = rank_basis(res.slow.info)
    assert slow.mfu >= fos.mfu or slow.mfu * b.factor(res.slow.plan) >= fos.mfu * b.factor(res.fast.plan)
    assert res.fast.info.fabric_name == "nvlink5+ib-ndr400" and not res.tuned_fast_first


@pytest.mark.parametrize("args,match", [
    (["run", "--size", "3b"], "known sizes: 8b, 70b, 405b"),
    (["run", "--size", "8b", "--gpu", "tpu"], "known GPUs: a100-80gb, h100, h800, h200, b200, b300, gb200, gb300"),
    (["run", "--size", "8b", "--interconnect", "nvlink9"], "known: nvlink5"),
    (["run", "--size", "8b", "--global-batch", "1000"], "not a whole number of 8192-token sequences"),
    (["run", "--size", "8b", "--global-batch", "lots"], "expected a positive number of tokens"),
    # at most 2^20 sequences (validate.MAX_GLOBAL_BATCH_SEQUENCES) of 8192 tokens = 8,589,934,592 tokens
    (["run", "--size", "8b", "--global-batch", "99999999999999999999999M"],
     "valid: 8,192 to 8,589,934,592 tokens (1 to 1,048,576 sequences of 8192)"),
    # 9G = 9 x 2^30 tokens is over the bound, 9M would be valid: only then the M-for-G hint
    (["run", "--size", "8b", "--global-batch", "9G"], "sequences of 8192); did you mean 9M?"),
    (["run", "--size", "8b", "--storage", "sqlite:////nonexistent/dir/x.db"],
     "cannot open study storage sqlite:////nonexistent/dir/x.db: directory /nonexistent/dir does not exist"),
    (["simulate", "/nonexistent.yaml"], "plan file /nonexistent.yaml does not exist"),
    (["run", "--size", "8b", "--backend", "quantum"], "known backends: simulated, measured, real"),
])
def test_errors_are_one_clear_line_exit_2(args, match):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output
    if "9G" not in args:                 # no "M instead of G" hint for a value that has no G
        assert "did you mean" not in r.output, r.output


def test_malformed_plan_yaml_names_field(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"schema_version": 1, "model": {}, "cluster": {"gpu": "b200"}, "workload": {},
                                 "plan": {}}))
    r = invoke("simulate", str(f))
    assert r.exit_code == 2 and "cluster.num_gpus" in r.output and str(f) in r.output


def test_export_refuses_without_feasible_plan(tmp_path):
    url = f"sqlite:///{tmp_path}/e.db"
    r = invoke("export", "--size", "8b", "--storage", url, "-o", str(tmp_path / "p.yaml"))
    # a read-only command never creates the storage it is pointed at
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "e.db").exists()
    BACKENDS["oom"] = lambda **kw: _Oom(**kw)
    try:
        r = invoke("run", "--size", "8b", "--space", "small", "--backend", "oom", "--trials", "4", "--storage", url)
        assert r.exit_code == 2 and re.search(r"error: 4/4 trials gave no feasible plan ", r.output), r.output
        r = invoke("export", "--size", "8b", "--space", "small", "--backend", "oom", "--storage", url,
                   "-o", str(tmp_path / "p.yaml"))
        assert r.exit_code == 2 and "4/4 trials gave no feasible plan" in r.output and not (tmp_path / "p.yaml").exists()
    finally:
        del BACKENDS["oom"]


def test_unexpected_exception_gives_hint_not_traceback(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)

    def boom(**kw):
        raise KeyError("surprise")

    BACKENDS["boom"] = boom
    try:
        r = invoke("run", "--size", "8b", "--backend", "boom", "--trials", "1", "--storage", "sqlite:///:memory:")
    finally:
        del BACKENDS["boom"]
    assert r.exit_code == 1 and "AUTOTUNE_DEBUG=1" in r.output and "Traceback" not in r.output


def test_cli_default_storage_matches_tuner():
    from autotune.cli import options as cli
    assert cli.DEFAULT_STORAGE == DEFAULT_STORAGE


def test_parse_tokens():
    assert parse_tokens("16M") == 16 * 2**20 and parse_tokens("4m") == 4 * 2**20
    assert parse_tokens("524288") == 524288 and parse_tokens("512K") == 2**19


def test_help_is_fast_and_does_not_import_torch():
    code = "import sys, autotune.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


import re  # noqa: E402

from fake_evaluator import FakeEvaluator  # noqa: E402


class _Oom(FakeEvaluator):
    def __init__(self, **kw):
        super().__init__(capacity_scale=0.001, **kw)


def test_launch_hints_uneven_layout():
    # Llama 3 style split (one layer fewer on the first and last of 16 stages): Megatron-LM's first/last
    # flags cannot express it with virtual stages, so the explicit layout is emitted: 16 entries,
    # 'E' + 7 t, 14 x 8 t, 7 t + 'L' (7 + 14*8 + 7 = 126 layers).
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, Workload
    from autotune.report.summary import launch_hints
    plan = Plan(tp_degree=8, pp_degree=16, dp_degree=8, micro_batch_size=1, num_micro_batches=16,
                stage_layers=(7,) + (8,) * 14 + (7,))
    text = launch_hints(plan, get_model("405b"), Workload(seq_len=8192, global_batch_size=128))
    layout = "|".join(["E" + "t" * 7] + ["t" * 8] * 14 + ["t" * 7 + "L"])
    assert f"--pipeline-model-parallel-layout '{layout}'" in text
    assert "--decoder-first-pipeline-num-layers" not in text


def test_help_lists_gpu_commands_without_importing_them():
    # `autotune --help` must stay fast on a CPU machine: the GPU-host commands (which pull in SQLAlchemy
    # and, when run, torch) are listed from their summaries and imported only when used.
    import subprocess
    import sys
    code = ("import sys; from click.testing import CliRunner; from autotune.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
            "assert 'profile' in r.output and 'validate' in r.output; "
            "print('sqlalchemy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_run_rejects_bad_trials_before_tuning(tmp_path):
    # --trials 0 is refused before anything is printed or stored (one error line, exit 2)
    from click.testing import CliRunner

    from autotune.cli.app import main
    db = tmp_path / "s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--trials", "0", "--storage", f"sqlite:///{db}"])
    assert r.exit_code == 2 and r.output.startswith("error: --trials must be >= 1, got 0"), r.output
    assert not db.exists()


def test_export_hint_names_the_study(tmp_path):
    # the hint printed after a run must select that very study, whatever options chose it
    from click.testing import CliRunner

    from autotune.cli.app import main
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "3", "--storage", url])
    assert r.exit_code == 0, r.output
    hint = r.output.strip().splitlines()[-1]
    assert hint.startswith("export it: autotune export --study "), hint
    import shlex
    args = shlex.split(hint[len("export it: autotune "):])
    args[args.index("-o") + 1] = str(tmp_path / "p.yaml")
    r2 = CliRunner().invoke(main, args)
    assert r2.exit_code == 0 and (tmp_path / "p.yaml").exists(), r2.output


def _run_into_closed_pipe(args, tmp_path):
    """Run ``python -m autotune ARGS`` with stdout a pipe whose read end is already closed: the first
    write fails with EPIPE (Python ignores SIGPIPE, so it is a BrokenPipeError), as after
    ``autotune export | head -1`` once head has exited."""
    import os
    r, w = os.pipe()
    os.close(r)
    try:
        import pathlib
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2]))
        p = subprocess.run([sys.executable, "-m", "autotune", *args], stdout=w, stderr=subprocess.PIPE,
                           cwd=tmp_path, timeout=120, env=env)
    finally:
        os.close(w)
    return p


def test_closed_pipe_ends_quietly(tmp_path):
    # the default storage (studies/autotune.db under tmp_path) does not exist: show says so on stdout
    p = _run_into_closed_pipe(["show"], tmp_path)
    # 141 = 128 + SIGPIPE, what a shell reports for a writer killed by SIGPIPE; nothing on stderr
    assert p.returncode in (0, 141), p.stderr
    assert b"bug" not in p.stderr and b"Error" not in p.stderr, p.stderr


def _signal_a_run(tmp_path, sig: int, delay_s: float, *, poll_s: float, wait_s: float) -> tuple[int, str, str]:
    """Start ``autotune run --size 405b --trials 100000 --no-early-stop`` on a fresh SQLite file, send ``sig`` ``delay_s``
    after the file appears, and return (exit code, stdout, stderr); fails if it has not ended ``wait_s``
    later (the run went on)."""
    import os
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path}/s.db"
    import signal as _signal

    # start it with the signals at their defaults: a shell that started pytest in the background leaves
    # SIGINT ignored for its children, and an ignored SIGINT before the CLI installs its handler is lost
    # --no-early-stop: the convergence stop ends a default 405B run in ~7 s of CPU, before the signal
    p = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--size", "405b", "--trials", "100000",
                          "--no-early-stop", "--storage", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()},
                         preexec_fn=lambda: _signal.signal(_signal.SIGINT, _signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "s.db").exists():
        time.sleep(poll_s)
    time.sleep(delay_s)
    p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"the run went on {wait_s:g} s after signal {sig}")
    return p.returncode, out, err


@pytest.mark.parametrize("sig,code", [(2, 130), (15, 143)])
def test_interrupted_run_says_what_was_saved(tmp_path, sig, code):
    # SIGINT / SIGTERM while `autotune run` tunes: one line saying how many trials are saved and the best
    # so far, exit 128 + signal number (130 / 143), and the finished trials stay in the study.
    # 8 s: some trials finish; wait_s bounds a run that goes on (100,000 trials: hours), not its speed
    rc, out, err = _signal_a_run(tmp_path, sig, 8.0, poll_s=0.5, wait_s=600)
    assert rc == code, (out, err)
    line = [x for x in err.splitlines() if x.startswith("interrupted:")]
    assert line and "trials saved in" in line[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("delay_s", [0.3, 2.0])
def test_early_interrupt_stops_the_run(tmp_path, delay_s):
    # SIGINT soon after the storage appears lands inside SQLite calls (study creation, a trial's writes),
    # where it surfaces as "sqlite3.OperationalError: interrupted" and was once recorded as a failed trial
    # or a storage error while tuning went on: the run must still stop with exit 130 and the one line.
    import signal

    # wait_s bounds a run that goes on (100,000 trials of 405b: hours); a loaded 2-core machine may still be
    # enumerating the study's layouts when the signal lands, which ends at the next check, not at once
    rc, out, err = _signal_a_run(tmp_path, signal.SIGINT, delay_s, poll_s=0.05, wait_s=600)
    assert rc == 130, (out, err)
    assert any(x.startswith("interrupted:") for x in err.splitlines()), err
    assert "Traceback" not in err


def test_interrupt_inside_a_finalizer_prints_no_traceback(capsys, tmp_path, monkeypatch):
    # A signal can land while the garbage collector runs a finalizer (SQLAlchemy's weakref callbacks):
    # the KeyboardInterrupt cannot propagate there and Python would print "Exception ignored in ..."
    # with a traceback. Inside _interruptible, once the interrupt is noted, that report is dropped; the
    # run still ends with the one line and 130. Any other unraisable exception is still reported.
    import gc
    import signal

    import click

    from autotune.cli import options as cli
    from autotune.signals import note_interrupt

    class Finalized:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    seen = []                               # the hook in place before: it must not see the interrupt
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value).__name__))

    def body():
        note_interrupt(signal.SIGINT)
        Finalized(KeyboardInterrupt())      # collected at once: its __del__ raises into the hook
        gc.collect()
        raise KeyboardInterrupt

    with pytest.raises(click.exceptions.Exit) as e:
        cli.interruptible(body, storage=f"sqlite:///{tmp_path}/none.db", study="s")
    assert e.value.exit_code == 130
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err and err.startswith("interrupted:")
    assert seen == []

    def other():
        note_interrupt(signal.SIGINT)
        Finalized(RuntimeError("a real finalizer bug"))
        gc.collect()
        raise KeyboardInterrupt

    with pytest.raises(click.exceptions.Exit):
        cli.interruptible(other, storage=f"sqlite:///{tmp_path}/none.db", study="s")
    assert seen == ["RuntimeError"]         # reported through the previous hook


def test_real_only_options_warn_with_the_simulated_backend(storage):
    # --real-steps / --trial-timeout / --heartbeat-interval pace real trials only: given with the simulated
    # backend each gets one warning line on stderr (none when left at the default); --layers is refused
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "1", "--storage", storage,
               "--real-steps", "5", "--trial-timeout", "60", "--heartbeat-interval", "10")
    assert r.exit_code == 0, r.output
    warns = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert warns == [f"warning: --{o} has no effect with --backend simulated (it applies to --backend real only)"
                     for o in ("real-steps", "trial-timeout", "heartbeat-interval")], r.stderr
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "1", "--storage", storage)
    assert r.exit_code == 0 and "has no effect" not in r.stderr, r.stderr
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "1", "--storage", storage, "--layers", "2")
    assert r.exit_code == 2 and "--layers applies to --backend real only" in r.output


def test_simulate_prints_each_no_effect_note_once_as_a_warning(tmp_path):
    # examples/8b-2xh200-fsdp.yaml has tp 1, async collectives on, DP overlap on; with tp_comm_overlap
    # on and async_collectives off, validate_plan's rules give exactly three notes (plan.py):
    # tp_comm_overlap with tp 1, tp_comm_overlap with blocking collectives, dp_grad_reduce_overlap with
    # blocking collectives; each must appear once, prefixed 'warning: ', on stderr
    from pathlib import Path
    d = yaml.safe_load((Path(__file__).parents[2] / "examples" / "8b-2xh200-fsdp.yaml").read_text())
    d["plan"].update(tp_comm_overlap=True, async_collectives=False)
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    r = invoke("simulate", str(f))
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "has no effect" in ln]
    assert notes == ["warning: tp_comm_overlap has no effect with tp_degree=1",
                     "warning: tp_comm_overlap has no effect with async_collectives=false (collectives block)",
                     "warning: dp_grad_reduce_overlap has no effect with async_collectives=false "
                     "(collectives block)"], r.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("hb, storage, match", [
    ("0", "sqlite:///{d}/hb.db", "--heartbeat-interval must be an integer >= 1 s, got 0"),
    ("10", "journal:{d}/hb.log", "--heartbeat-interval 10: Optuna's journal storage"),
])
def test_bad_heartbeat_leaves_no_study(tmp_path, workers, hb, storage, match):
    # before: exit 2 but the storage held a 0-trial study that `show` listed; the journal message said
    # "for --backend real" although the backend was the simulated default
    url = storage.format(d=tmp_path)
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "2", "--workers", workers,
               "--heartbeat-interval", hb, "--storage", url)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and match in lines[0] and "--backend real" not in lines[0], r.output
    assert list(tmp_path.iterdir()) == []


def test_simulate_warns_about_a_sequence_beyond_the_models_positions(tmp_path):
    # Llama 3.1 8B's max_position_embeddings is 131072 (models.py); a plan with seq_len 262144 gets the
    # same warning `run --seq-len 262144` prints, on stderr, and is still simulated (exit 0)
    from pathlib import Path
    d = yaml.safe_load((Path(__file__).parents[2] / "examples" / "8b-2xh200-fsdp.yaml").read_text())
    d["workload"]["seq_len"] = 262144
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    r = invoke("simulate", str(f))
    assert r.exit_code == 0, r.output
    assert "warning: seq_len 262144 is longer than llama3.1-8b's max_position_embeddings 131072" in r.stderr


def test_show_with_an_engine_the_storage_lacks_says_what_it_holds(storage):
    # one megatron study (the default engine); `show --engine native` must not say the storage is empty
    r = invoke("run", "--size", "8b", "--space", "small", "--trials", "1", "--storage", storage)
    assert r.exit_code == 0, r.output
    r = invoke("show", "--engine", "native", "--storage", storage)
    assert r.exit_code == 0 and "no native studies" in r.output and "engine megatron" in r.output, r.output


def test_run_on_memory_storage_does_not_suggest_an_export_that_cannot_read_it():
    # sqlite:///:memory: is gone when the run ends: the closing line says so instead of an `export` command
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2", "--storage",
                                  "sqlite:///:memory:"])
    assert r.exit_code == 0, r.output
    assert "export it:" not in r.output and "keeps nothing after this run" in r.output, r.output


def test_timeout_that_ends_before_the_first_trial_says_so(tmp_path, monkeypatch):
    # --timeout counts from the start of tuning, ranking the layouts included: a ranking slower than the timeout
    # (405B on a busy machine, --timeout 1) left no trial, and the error said "no trials yet; run `autotune run`
    # with the same options first" to a user who had just done that. Here the ranking is made to take 1.2 s.
    import time

    from autotune.search.sampler import LayoutSampler

    rank = LayoutSampler.rank

    def slow_rank(self, *a, **k):
        time.sleep(1.2)
        return rank(self, *a, **k)

    monkeypatch.setattr(LayoutSampler, "rank", slow_rank)
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--timeout", "1", "--storage",
                                  f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 2, r.output
    assert "--timeout 1 s ran out before the first trial" in r.output and "Traceback" not in r.output, r.output


def test_workers_stop_line_is_the_latest_workers_view():
    # with --workers each worker stops on its own view of the study; the line printed is the one that saw the
    # most trials (before: the highest-numbered worker's, "converged after 47 trials" where others had gone on
    # to 55), whatever order the workers are listed in
    from autotune.cli.tune import _trials_seen

    lines = ["converged after 47 trials: a", "converged after 55 trials: b", "converged after 1 trial: c"]
    assert [_trials_seen(x) for x in lines] == [47, 55, 1]
    assert sorted(lines, key=_trials_seen)[-1] == "converged after 55 trials: b"
    assert _trials_seen("stopped for another reason") == -1
