"""run_plan end to end through torchrun on CPU (gloo): ok, raise, hang, out of memory, refused."""

import dataclasses
import os

import pytest

from autotune.spec.plan import Plan, PlanDocument, Workload
from autotune.runtime.launch import FIXED_ENV, run_plan, worker_env
from runtime_harness import SEQ, TINY
from workers_harness import alive, repo_env, wait_for


def _doc(model=TINY, seq=SEQ, **kw):
    p = Plan(**kw)
    return PlanDocument(plan=p, model=model, gpu="h200", num_gpus=p.num_gpus, fabric={},
                        workload=Workload(seq_len=seq, global_batch_size=p.global_batch_size))


def _no_worker_left(workdir):
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            assert workdir not in cmd, f"process {d} of the killed job is still alive: {cmd!r}"


def test_ok_run_reports_metrics_with_the_simulator_mfu_formula(tmp_path):
    r = run_plan(_doc(tp_degree=2, micro_batch_size=2, zero_stage=0), steps=2, warmup=1, device="cpu",
                 timeout_s=120, workdir=tmp_path)
    assert r["status"] == "ok", r["reason"]
    assert len(r["step_times_ms"]) == 2 and len(r["losses"]) == 2 and len(r["peak_rss_bytes"]) == 2
    # tiny model: N without the input embedding = head 16384 + 4 layers x 36992 + norm 64 = 164416;
    # per token 6N + 6 L H Q T = 986496 + 6*4*4*16*32 = 1035648 FLOP; x 2 sequences x 32 tokens
    assert r["model_flops_per_step"] == 1035648 * 64
    s = r["step_time_ms"] / 1e3
    assert r["mfu"] == pytest.approx(1035648 * 64 / (s * 2 * 989e12), rel=1e-9)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(64 / s / 2, rel=1e-9)
    # random tokens over a 256-word vocabulary: the initial loss is near ln(256) = 5.55
    assert 5.0 < r["losses"][0] < 7.0
    assert r["env"]["NCCL_NVLS_ENABLE"] == "0" and r["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def test_worker_that_raises_is_failed_with_its_message(tmp_path):
    r = run_plan(_doc(dp_degree=2, zero_stage=0), steps=1, warmup=1, device="cpu", timeout_s=120,
                 env={"AUTOTUNE_RUNTIME_FAULT": "raise:warmup"}, workdir=tmp_path)
    assert r["status"] == "failed"
    assert "injected failure" in r["reason"] and "warmup 1/1" in r["reason"]


def test_a_rank_failing_in_teardown_keeps_the_written_result(tmp_path):
    # the workers leave together after rank 0 wrote the report (worker.py _leave_together); a rank that
    # then dies (here: an injected failure on rank 1 in "teardown"; seen for real as a gloo SIGABRT of
    # rank 1) does not lose the measurement: status ok, and the exit code is recorded
    r = run_plan(_doc(dp_degree=2, zero_stage=0), steps=1, warmup=0, device="cpu", timeout_s=120,
                 env={"AUTOTUNE_RUNTIME_FAULT": "raise:teardown@1"}, workdir=tmp_path)
    assert r["status"] == "ok", r["reason"]
    assert r["teardown_exit_code"] != 0 and len(r["step_times_ms"]) == 1
    # a failure before the report was written is still a failure
    r = run_plan(_doc(dp_degree=2, zero_stage=0), steps=1, warmup=0, device="cpu", timeout_s=120,
                 env={"AUTOTUNE_RUNTIME_FAULT": "raise:report@1"}, workdir=tmp_path / "b")
    assert r["status"] == "failed" and "report" in r["reason"]


@pytest.mark.slow
def test_hang_is_killed_and_reported_with_its_phase(tmp_path):
    # rank 1 sleeps in the second timed step; rank 0 waits for it in a collective. The job is killed at
    # its time limit and the reason names the phase the ranks were in then. On a loaded machine the two
    # ranks may still be starting (imports, gloo) when a short limit ends: that is reported as its own
    # phase, and the test retries with a 4x longer limit until the ranks were hanging in step 2 (12 s
    # suffice on an idle 2-core machine; 192 s is the last try).
    for limit in (12, 48, 192):
        wd = tmp_path / f"limit{limit}"
        r = run_plan(_doc(dp_degree=2, zero_stage=0), steps=2, warmup=0, device="cpu", timeout_s=limit,
                     env={"AUTOTUNE_RUNTIME_FAULT": "hang:step 2@1"}, workdir=wd)
        assert r["status"] == "timeout", r
        _no_worker_left(str(wd))
        if "step 2/2" in r["reason"]:
            break
        assert r["reason"].startswith(f"timed out after {limit} s in "), r["reason"]
    assert r["reason"] == f"timed out after {limit} s in step 2/2"


def test_memory_cap_exceeded_is_oom_with_memory_reached(tmp_path):
    # vocab 32000, 4 x 512 tokens per rank: the FP32 logits alone are 4*512*32000*4 B = 250 MiB, more
    # than the 128 MiB cap set above what each rank holds after building the model (RLIMIT_AS on CPU;
    # on CUDA the same option uses set_per_process_memory_fraction). A real allocator failure.
    big = dataclasses.replace(TINY, vocab_size=32000)
    r = run_plan(_doc(big, 512, dp_degree=2, micro_batch_size=4, zero_stage=3), steps=1, warmup=0,
                 device="cpu", timeout_s=120, memory_limit_mib=128, workdir=tmp_path)
    assert r["status"] == "oom", r["reason"]
    assert r["memory_reached_bytes"] > 100 * 2**20
    assert "out of memory" in r["reason"]


def test_refused_plan_is_failed_and_marked_refused(tmp_path):
    r = run_plan(_doc(tp_degree=2, tp_comm_overlap=True, zero_stage=0), steps=1, warmup=0, device="cpu",
                 timeout_s=120, workdir=tmp_path)
    assert r["status"] == "failed" and r["refused"] and "tp_comm_overlap" in r["reason"]


def test_worker_env_sets_fixed_nccl_and_allocator_settings():
    e = worker_env(_doc(memory_reclaim="expandable_segments"), {"NCCL_NVLS_ENABLE": "1"})
    assert e["NCCL_NVLS_ENABLE"] == "0" and e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "expandable_segments:True" in e["PYTORCH_CUDA_ALLOC_CONF"]
    e = worker_env(_doc(), {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:64"})
    assert e["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    assert FIXED_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@pytest.mark.gpu
def test_gpu_tp2_run_and_context_parallel(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    model = dataclasses.replace(TINY, hidden_size=256, num_heads=2, num_kv_heads=2, head_dim=128,
                                ffn_hidden_size=512)
    for i, kw in enumerate((dict(tp_degree=2, sequence_parallel=True, zero_stage=0),
               dict(dp_degree=2, zero_stage=3, param_gather_overlap=True, memory_reclaim="expandable_segments"),
               dict(cp_degree=2, zero_stage=3))):
        r = run_plan(_doc(model, 256, **kw), steps=2, warmup=1, device="cuda", timeout_s=300,
                     workdir=tmp_path / str(i))
        assert r["status"] == "ok", r["reason"]
        assert all(b > 0 for b in r["peak_allocated_bytes"])


# A stand-in torchrun that ignores SIGTERM (CI once saw torchrun alive 60 s after its tuner was kill -9-ed)
# and starts a rank in a session of its own that ignores SIGTERM too (torch starts ranks with
# start_new_session=True; an engine's ranks have no parent-death signal): each writes its pid to a file.
_JOB = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
d = sys.argv[1]
if len(sys.argv) > 2:                  # the rank
    open(os.path.join(d, "rank.pid"), "w").write(str(os.getpid()))
else:                                  # the launcher
    open(os.path.join(d, "launcher.pid"), "w").write(str(os.getpid()))
    job = open(os.path.join(d, "job.py")).read()
    subprocess.Popen([sys.executable, "-c", job, d, "rank"], start_new_session=True)
time.sleep(120)
"""
_TUNER = """
import os, subprocess, sys
from autotune.runtime.launch import run_in_session
d = sys.argv[1]
open(os.path.join(d, "tuner.pid"), "w").write(str(os.getpid()))
print(run_in_session([sys.executable, "-c", open(os.path.join(d, "job.py")).read(), d], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, env=dict(os.environ), cwd=d, timeout_s=float(sys.argv[2])))
"""


def _start_tuner(d, timeout_s: float = 120.0):
    import subprocess
    import sys
    (d / "job.py").write_text(_JOB)
    return subprocess.Popen([sys.executable, "-c", _TUNER, str(d), str(timeout_s)], env=repo_env(),
                            stdout=subprocess.PIPE, text=True)


def _pid(path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def test_kill9_of_the_tuner_ends_a_launcher_and_a_rank_that_ignore_sigterm(tmp_path):
    # the guard SIGTERMs both, then SIGKILLs them after its 5 s grace: 15 s allowed on a loaded machine
    tuner = _start_tuner(tmp_path)
    try:
        wait_for(lambda: _pid(tmp_path / "rank.pid"), 60, "the stand-in rank to start")
        launcher, rank = _pid(tmp_path / "launcher.pid"), _pid(tmp_path / "rank.pid")
        tuner.kill()
        tuner.wait(timeout=30)
        wait_for(lambda: not alive([launcher, rank]), 15,
                 lambda: f"{alive([launcher, rank])} (launcher {launcher}, rank {rank}) to end after the tuner was killed")
    finally:
        for p in (_pid(tmp_path / "launcher.pid"), _pid(tmp_path / "rank.pid")):
            if p and alive([p]):
                os.kill(p, 9)


def test_a_rank_orphaned_by_its_launcher_is_ended_when_the_tuner_dies(tmp_path):
    # the launcher is SIGKILLed first (its rank is re-parented to the guard, a child subreaper), then the
    # tuner: the rank is still found and ended
    tuner = _start_tuner(tmp_path)
    try:
        wait_for(lambda: _pid(tmp_path / "rank.pid"), 60, "the stand-in rank to start")
        launcher, rank = _pid(tmp_path / "launcher.pid"), _pid(tmp_path / "rank.pid")
        os.kill(launcher, 9)
        wait_for(lambda: not alive([launcher]), 10, "the killed launcher to end")
        tuner.kill()
        tuner.wait(timeout=30)
        wait_for(lambda: not alive([rank]), 15, "the orphaned rank to end after the tuner was killed")
    finally:
        for p in (_pid(tmp_path / "launcher.pid"), _pid(tmp_path / "rank.pid")):
            if p and alive([p]):
                os.kill(p, 9)


def test_kill9_of_the_tuner_while_its_guard_starts_leaves_nothing(tmp_path):
    # the tuner is killed as soon as its guard exists, before (or while) the job starts: the guard either
    # sees its parent gone after its prctl and starts nothing, or gets SIGTERM and ends what it started
    from autotune.launchers.reaper import descendants
    for i in range(5):
        d = tmp_path / str(i)
        d.mkdir()
        tuner = _start_tuner(d)
        wait_for(lambda: _pid(d / "tuner.pid") and descendants(tuner.pid), 60, "the tuner's guard to start")
        tuner.kill()
        tuner.wait(timeout=30)
        import time
        time.sleep(1.0)
        started = [p for p in (_pid(d / "launcher.pid"), _pid(d / "rank.pid")) if p]
        try:
            wait_for(lambda: not alive(started), 15, lambda: f"round {i}: {alive(started)} to end")
        finally:
            for p in started:
                if alive([p]):
                    os.kill(p, 9)


def test_the_guard_passes_the_exit_status_and_ends_what_the_job_left(tmp_path):
    import subprocess
    import sys
    from autotune.runtime.launch import run_in_session
    kw = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ), cwd=tmp_path,
              timeout_s=60)
    assert run_in_session([sys.executable, "-c", "import sys; sys.exit(3)"], **kw) == (3, False)
    # killed by a signal: the subprocess convention, -9
    assert run_in_session([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], **kw) == (-9, False)
    # a process the job left behind in a session of its own is ended when the job ends
    left = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "start_new_session=True); open(sys.argv[1], 'w').write(str(p.pid))")
    assert run_in_session([sys.executable, "-c", left, str(tmp_path / "left.pid")], **kw) == (0, False)
    pid = _pid(tmp_path / "left.pid")
    assert pid
    wait_for(lambda: not alive([pid]), 10, f"the left-behind process {pid} to end")
