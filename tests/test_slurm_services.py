"""Issue 25: a Slurm job script built from hostile values holds no unquoted user text, tested against the
real single-node Slurm that .ci/run starts (.ci/services.sh: $AUTOTUNE_TEST_SLURM=1 and SLURM_CONF); without
it the tests skip and say why. Nothing here is mocked: the jobs are submitted with the real sbatch and run.

User text that reaches a trial's job script (autotune/launchers/slurm.py): the trial's work directory (under
$TMPDIR, any path the user's file system allows) in every path the worker is given, the worker's arguments,
and the --partition / --account / --time values (checked plain before any study is written)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import AutotuneError

ROOT = Path(__file__).resolve().parents[1]
SLURM = os.environ.get("AUTOTUNE_TEST_SLURM") == "1" and bool(os.environ.get("SLURM_CONF"))
pytestmark = pytest.mark.skipif(not SLURM, reason="no Slurm: set AUTOTUNE_TEST_SLURM=1 and SLURM_CONF (.ci/run "
                                                   "starts a single-node Slurm with .ci/services.sh)")

#: the job echoes its argv and working directory here (a torchrun training script, as the worker is)
ECHO = ("import json, os, sys\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()},\n"
        "          open(os.path.join(here, 'echo.json'), 'w', encoding='utf-8'), ensure_ascii=False)\n")


def _hostile(canary: Path) -> list[str]:
    """Values a shell, sbatch's #SBATCH parser or Slurm's filename patterns would read as more than text;
    each injection would create ``canary`` (an absolute path) if it ran."""
    c = str(canary)
    return [f"$(touch {c})", f"`touch {c}`", f"x; touch {c}", f"x && touch {c} #", f"| tee {c}", f"> {c}",
            "sp ace", "it's", 'd"q', "*", "?[a]", "~", "{a,b}", "%j %% %x", "back\\slash", "tab\there",
            "new\nline", "ünïcödé 日本 🚀", "$HOME ${IFS}", "-leading-dash", "", "#SBATCH --wrap=id"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else ""))


def _job_ids() -> set[str]:
    """Every job the controller knows (finished ones stay MinJobAge = 600 s, .ci/services.sh)."""
    p = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True)
    return set(re.findall(r"^JobId=(\d+)", p.stdout, re.M))


def test_trial_job_from_hostile_paths_and_arguments_runs_them_verbatim(tmp_path):
    from autotune.launchers.slurm import run_slurm_job

    canary = tmp_path / "CANARY"
    # a work directory whose path holds an injection of each kind (a legal path: the '/' make sub-directories)
    wd = Path(f"{tmp_path}/w d 'q' \"dq\" $(touch {canary}) `touch {canary}`; touch {canary} & #h %j \\b ü*?"
              f"\nnl")
    wd.mkdir(parents=True)
    (wd / "echo.py").write_text(ECHO)
    values = _hostile(canary)
    job = run_slurm_job([str(wd / "echo.py"), *values], nproc_per_node=1, wd=wd, env=_env(), timeout_s=240,
                        options={"kind": "slurm", "nodes": 1, "partition": "debug", "time": "10"}, gpus=False)
    assert (job.state, job.returncode, job.timed_out) == ("COMPLETED", 0, False), \
        (job, [p.read_text()[-2000:] for p in wd.glob("std*.log")])
    got = json.loads((wd / "echo.json").read_text(encoding="utf-8"))
    assert got["argv"] == values                   # every value arrived as one word, byte for byte
    assert Path(got["cwd"]).resolve() == wd.resolve()   # the job ran in the work directory
    assert (wd / "stdout.log").is_file() and (wd / "stderr.log").is_file()     # its logs landed there too
    assert [p for p in tmp_path.rglob("*") if p.name == "CANARY"] == []        # no injected command ran
    text = (wd / "job.sbatch").read_text()
    assert not [ln for ln in text.splitlines() if ln.startswith("#SBATCH") and str(tmp_path) in ln]


def test_sbatch_refusing_a_plain_but_unknown_partition_is_its_message(tmp_path):
    from autotune.launchers.slurm import run_slurm_job
    before = _job_ids()
    with pytest.raises(AutotuneError, match=r"sbatch refused the trial job: .*(?i:partition)"):
        run_slurm_job(["x.py"], nproc_per_node=1, wd=tmp_path, env=_env(), timeout_s=60,
                      options={"kind": "slurm", "partition": "nosuchpartition"}, gpus=False)
    assert _job_ids() == before


@pytest.mark.parametrize("args,env,names", [
    (["--partition", "debug\n#SBATCH --wrap=touch CANARY"], {}, "--partition"),
    (["--partition", "debug;touch CANARY"], {}, "--partition"),
    (["--account", "$(touch CANARY)"], {}, "--account"),
    (["--time", "10 min"], {}, "--time"),
    (["--time", "1\n#SBATCH --wrap=x"], {}, "--time"),
    (["--nodes", "3", "--gpus-per-node", "2"], {}, "--nodes 3 x --gpus-per-node 2 = 6 ranks"),
    (["--nodes", "0"], {}, "--nodes"),
    (["--gpus-per-node", "-8"], {}, "--gpus-per-node"),
    ([], {"PATH": "/nonexistent"}, "sbatch is not on PATH"),
])
def test_refused_slurm_options_submit_nothing_and_create_nothing(tmp_path, args, env, names):
    # the real sbatch is on PATH (but for the last case): each value is refused before any study or job exists
    before = _job_ids()
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = subprocess.run([sys.executable, "-m", "autotune", "run", "--size", "8b", "--backend", "real",
                        "--launcher", "slurm", "--trials", "1", "--storage", url, *args], cwd=tmp_path,
                       env={**_env(), **env}, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines and lines[-1].startswith("error: ") and names in lines[-1], r.stderr
    assert "Traceback" not in r.stderr and "(a bug" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and _job_ids() == before


def test_exported_slurm_script_from_a_hostile_directory_runs_it_verbatim(tmp_path):
    # `autotune export --launcher slurm -o DIR`: DIR (any path) is in the script as HERE, shell-quoted; the job
    # (launch_slurm.sbatch -> srun -> launch_torchrun.sh -> `autotune validate "$HERE/plan.yaml" "$@"`) runs a
    # stub `autotune` first on PATH (sbatch exports the environment) that echoes its argv
    from click.testing import CliRunner

    from autotune.cli.app import main
    canary = tmp_path / "CANARY"
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--gpus", "8", "--engine", "native", "--space", "small",
                                  "--trials", "3", "--storage", url])
    assert r.exit_code == 0, r.output
    out = Path(f"{tmp_path}/o 'q' \"dq\" $(touch {canary}) `touch {canary}`; touch {canary} & #h %j \\b ü*?\nnl")
    r = CliRunner().invoke(main, ["export", "--size", "8b", "--gpus", "8", "--engine", "native", "--space", "small",
                                  "--storage", url, "--launcher", "slurm", "-o", str(out)])
    assert r.exit_code == 0, r.output
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "autotune").write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                                   "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'rank': os.environ.get("
                                   "'NODE_RANK')}, open(os.environ['ECHO_OUT'], 'w'), ensure_ascii=False)\n")
    (stub / "autotune").chmod(0o755)
    values = _hostile(canary)
    env = dict(_env(), PATH=f"{stub}{os.pathsep}{os.environ['PATH']}", ECHO_OUT=str(tmp_path / "echo.json"))
    # --gpus-per-node=0 on the command line overrides the script's 8 (this CPU-only Slurm has no GPU gres);
    # the job's own output goes to a plain path of the test
    p = subprocess.run(["sbatch", "--parsable", "--wait", "--gpus-per-node=0", f"--output={tmp_path / 'job.out'}",
                        str(out / "launch_slurm.sbatch"), *values], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr + (tmp_path / "job.out").read_text()
    got = json.loads((tmp_path / "echo.json").read_text(encoding="utf-8"))
    assert got["argv"] == ["validate", str(out / "plan.yaml"), *values] and got["rank"] == "0", got
    assert [p for p in tmp_path.rglob("*") if p.name == "CANARY"] == []        # no injected command ran
