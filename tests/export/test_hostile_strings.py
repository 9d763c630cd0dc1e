"""Hostile strings never run (issue 37 item 1): every string a plan carries into a generated file (study, model
name, the launch directory, the paths of a torchtitan job file, a Slurm trial job's work directory and
arguments) holds shell metacharacters, quotes and newlines; the generated scripts pass ``bash -n``, run with
``--dry-run`` and for real with ``torchrun`` / ``srun`` / ``python`` / ``autotune`` / ``scontrol`` replaced by
recorders on PATH, create no canary file, and the recorded argv is exactly the command autotune meant; the
TOML job file reads back the same strings; the torchtitan config module parses to the same statements as for a
benign plan. A plan YAML holding such a string is refused on load with a one-line error (exit 2)."""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autotune.errors import ConfigError
from autotune.export import write_launch_files
from autotune.engines.quoting import comment_text, slurm_job_name, toml_string
from autotune.engines.megatron.export import megatron_args
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

M8 = get_model("8b")
W8 = Workload(seq_len=8192, global_batch_size=128)
#: a plan each engine exports for 8 H200 (torchtitan: ZeRO-3, as it has no ZeRO-1); 1 x 16 x 8 = 128 sequences
PLANS = {"megatron": Plan(tp_degree=2, dp_degree=4, num_micro_batches=32),
         "torchtitan": Plan(dp_degree=8, zero_stage=3, num_micro_batches=16),
         "native": Plan(tp_degree=2, dp_degree=4, num_micro_batches=32)}
#: recorder programs put first on PATH
FAKES = ("torchrun", "srun", "python", "python3", "autotune", "scontrol", "sbatch")
MARK = "\x01CALL\x01"


def hostile(tmp: Path) -> list[str]:
    """Strings that run ``touch <tmp>/CANARY<i>`` if anything evaluates them as shell code (command
    substitution, backticks, ``;``, a newline that ends a comment, a closing quote), plus other metacharacters."""
    c = [f"{tmp}/CANARY{i}" for i in range(8)]
    return [f"$(touch {c[0]})", f"`touch {c[1]}`", f"x; touch {c[2]}", f"evil\ntouch {c[3]}\n#",
            f"q' ; touch {c[4]} ; '", f'd" ; touch {c[5]} ; "', f"\r\ntouch {c[6]} # \\", f"${{IFS}}&&touch {c[7]}|*?~<>"]


def canaries(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.rglob("CANARY*"))


def fake_bin(tmp: Path) -> tuple[Path, Path]:
    """A folder of recorders: each appends MARK, its name and its argv (NUL-separated) to the record file;
    the fake ``srun`` then runs its command (after its options) as Slurm's node 0 would."""
    b, rec = tmp / "fakebin", tmp / "record.bin"
    b.mkdir()
    for name in FAKES:
        body = f'printf "%s\\0" "{MARK}" "{name}" "$@" >> "$RECORD"\n'
        if name == "srun":
            body += 'while [[ "${1:-}" == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n'
        if name == "scontrol":
            body += "echo node0\n"
        (b / name).write_text("#!/usr/bin/env bash\n" + body)
        (b / name).chmod(0o755)
    return b, rec


def calls(rec: Path) -> list[list[str]]:
    if not rec.exists():
        return []
    parts = rec.read_bytes().decode().split("\0")[:-1]
    out: list[list[str]] = []
    for p in parts:
        if p == MARK:
            out.append([])
        else:
            out[-1].append(p)
    return out


def run(script: Path, *args: str, fakes: Path, rec: Path, cwd: Path, extra_env=None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{fakes}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(cwd), "RECORD": str(rec),
           "MEGATRON_LM": str(cwd / "Megatron-LM"), **(extra_env or {})}
    return subprocess.run([BASH, str(script), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def _doc(engine: str, study: str, model_name: str) -> PlanDocument:
    model = M8 if engine == "torchtitan" else dataclasses.replace(M8, name=model_name)
    cl = make_cluster("h200", 8, None)
    # built in code (as `export --study` builds it from a study's storage): the plan-file checks are not on this
    # path, so the writers' own quoting is what is tested
    return PlanDocument(plan=PLANS[engine], model=model, gpu="h200", num_gpus=8, fabric=cl.fabric.to_dict(),
                        workload=W8, study=study, trial_id=3, engine=engine)


def expected_exec(engine: str, here: Path, cwd: Path, master: str = "localhost") -> tuple[str, list[str]]:
    """The argv the launch script execs (by hand from autotune/export/__init__.py ``torchrun_script``: the
    torchrun options with their defaults for 8 GPUs on one node, then the engine's program and arguments;
    ``master``: the first host, what the sbatch script's ``scontrol show hostnames`` printed)."""
    head = ["--nnodes", "1", "--nproc-per-node", "8", "--node-rank", "0", "--master-addr", master,
            "--master-port", "29500"]
    if engine == "megatron":
        return "torchrun", head + [f"{cwd}/Megatron-LM/pretrain_gpt.py", *megatron_args(PLANS[engine], M8, W8)]
    if engine == "torchtitan":
        return "torchrun", head + ["-m", "torchtitan.train", "--module", "autotune_torchtitan", "--config",
                                   "autotune_plan"]
    return "autotune", ["validate", f"{here}/plan.yaml"]


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "native"])
def test_launch_scripts_with_hostile_strings_run_nothing_but_the_command(engine, tmp_path):
    fakes, rec = fake_bin(tmp_path)
    strings = hostile(tmp_path)
    for i, s in enumerate(strings):
        # the model name is printable by ModelSpec's own check (no newline): the printable ones are used there
        name = s if s.isprintable() else strings[i - 1] if strings[i - 1].isprintable() else "m"
        here = tmp_path / f"launch {i} {s.replace('/', '_')}"       # the directory name is hostile too
        doc = _doc(engine, study=s, model_name=name)
        write_launch_files(doc, here, "slurm")
        sh, sb = here / "launch_torchrun.sh", here / "launch_slurm.sbatch"
        for f in (sh, sb):
            r = subprocess.run([BASH, "-n", str(f)], capture_output=True, text=True)
            assert r.returncode == 0, (f.name, s, r.stderr)
        text = sh.read_text()
        # the study and model name land in comment lines only, each one printable line
        assert f"# study {comment_text(s)}, trial 3\n" in text
        if engine != "torchtitan":
            assert f"# {comment_text(name)} on 8 x h200, engine {engine}; written by autotune export\n" in text
            assert f"#SBATCH --job-name=autotune-{slurm_job_name(name)}\n" in sb.read_text()
        # --dry-run: prints, runs nothing (the sbatch script asks scontrol for the first host, nothing else)
        r = run(sh, "--dry-run", fakes=fakes, rec=rec, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert calls(rec) == [] and canaries(tmp_path) == []
        # the printed command, read back by bash, is the argv the script would exec, word for word
        # (bash's printf %q: $'...' for control characters; the output read as bytes, with no newline translation)
        last = subprocess.run([BASH, str(sh), "--dry-run"], capture_output=True, cwd=tmp_path,
                              env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                                   "MEGATRON_LM": str(tmp_path / "Megatron-LM")}).stdout.rstrip(b"\n").split(b"\n")[-1]
        r2 = subprocess.run([BASH, "-c", 'eval "a=($1)"; printf "%s\\0" "${a[@]}"', "_", last], capture_output=True)
        prog, argv = expected_exec(engine, here, tmp_path)
        assert r2.stdout.decode().split("\0")[:-1] == [prog, *argv]
        r = run(sb, "--dry-run", fakes=fakes, rec=rec, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert [c[0] for c in calls(rec)] == ["scontrol"] and canaries(tmp_path) == []
        rec.unlink()
        # for real: torchrun (or autotune) gets exactly the planned argv; with Slurm, srun starts the torchrun script
        r = run(sh, fakes=fakes, rec=rec, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert calls(rec) == [[prog, *argv]]
        rec.unlink()
        r = run(sb, fakes=fakes, rec=rec, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        # the fake scontrol names node0 the first host: the sbatch script exports it as MASTER_ADDR
        assert calls(rec) == [["scontrol", "show", "hostnames", "localhost"],
                              ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c",
                               'NODE_RANK=$SLURM_NODEID exec bash "$0" "$@"', f"{here.resolve()}/launch_torchrun.sh"],
                              [expected_exec(engine, here, tmp_path, "node0")[0],
                               *expected_exec(engine, here, tmp_path, "node0")[1]]]
        rec.unlink()
        assert canaries(tmp_path) == []
        # plan.yaml: a newline in the study is refused on load; printable text reads back exactly
        if s.isprintable():
            assert PlanDocument.load(here / "plan.yaml").study == s
        else:
            with pytest.raises(ConfigError, match="field study .* contains a control character"):
                PlanDocument.load(here / "plan.yaml")


def test_torchtitan_config_module_is_the_same_code_whatever_the_study(tmp_path):
    """The module written for a hostile study has the same statements as for study "s"; only the docstring
    differs, and it holds the study as one printable line."""
    write_launch_files(_doc("torchtitan", "s", "m"), tmp_path / "ref", "torchrun")
    ref = ast.parse((tmp_path / "ref" / "autotune_torchtitan.py").read_text())
    for i, s in enumerate(hostile(tmp_path) + ['"""; import os; os.system("touch X") #', "\\N{bad} \\x \\"]):
        d = tmp_path / f"t{i}"
        write_launch_files(_doc("torchtitan", s, "m"), d, "torchrun")
        tree = ast.parse((d / "autotune_torchtitan.py").read_text())
        assert ast.dump(ast.Module(body=tree.body[1:], type_ignores=[])) == \
            ast.dump(ast.Module(body=ref.body[1:], type_ignores=[]))
        doc = ast.get_docstring(tree, clean=False)
        assert f"study {comment_text(s)}, trial 3." in doc
    assert canaries(tmp_path) == []


def test_job_toml_reads_back_every_hostile_path_exactly(tmp_path):
    from autotune.engines.torchtitan.job import job_toml

    strs = hostile(tmp_path) + ['a"b\\c\td\x7fe\x00f', "\u2028\x0c\x1b[31m"]
    for s in strs:
        text = job_toml(PLANS["torchtitan"], M8, W8, steps=3, hf_assets_path=s, dataset_path=s + "/d",
                        dump_folder=s + "/o")
        doc = tomllib.loads(text)
        assert (doc["model"]["hf_assets_path"], doc["training"]["dataset_path"], doc["job"]["dump_folder"]) == \
            (s, s + "/d", s + "/o")
    assert tomllib.loads("x = " + toml_string("".join(map(chr, range(0x80)))))["x"] == "".join(map(chr, range(0x80)))


def test_slurm_trial_job_with_a_hostile_work_directory_and_arguments(tmp_path):
    from autotune.launchers.slurm import batch_script

    fakes, rec = fake_bin(tmp_path)
    for i, s in enumerate(hostile(tmp_path)):
        wd = tmp_path / f"wd {i} {s.replace('/', '_')}"
        wd.mkdir()
        worker = ["-m", "autotune.runtime.worker", "--out", s, "--plan", str(wd / "plan.yaml")]
        script = wd / "job.sbatch"
        script.write_text(batch_script(worker, nodes=2, nproc_per_node=4, wd=wd, timeout_s=60, options={},
                                       gpus=True, python="python"))
        assert subprocess.run([BASH, "-n", str(script)]).returncode == 0
        r = run(script, fakes=fakes, rec=rec, cwd=tmp_path, extra_env={"SLURM_JOB_NODELIST": "n[0-1]",
                                                                       "SLURM_JOB_ID": "41"})
        assert r.returncode == 0, r.stderr
        # port = 20000 + 41 mod 20000 (RDZV_PORT_BASE / SPAN, autotune/launchers/slurm.py); the fake srun runs
        # its command (the fake python) after its two options
        torchrun = ["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=node0:20041", "--rdzv-id=41", *worker]
        assert calls(rec) == [["scontrol", "show", "hostnames", "n[0-1]"],
                              ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "python", *torchrun],
                              ["python", *torchrun]]
        rec.unlink()
    assert canaries(tmp_path) == []


def test_plan_yaml_with_a_newline_in_the_study_is_refused_by_export(tmp_path):
    """The issue's case: `study: "evil\\ntouch CANARY\\n#"` in a plan YAML; export refuses it, one line, exit 2,
    and writes nothing."""
    from autotune.cli.app import main

    doc = _doc("megatron", "s", "llama3.1-8b").to_dict()
    for field, value in (("study", f"evil\ntouch {tmp_path}/CANARY\n#"), ("study", "x" * 10_000),
                         ("model.name", "llama\x1b]0;title\x07"), ("cluster.fabric.name", "nv\u202elink")):
        d = yaml.safe_load(yaml.safe_dump(doc))
        *parents, last = field.split(".")
        node = d
        for p in parents:
            node = node[p]
        node[last] = value
        f = tmp_path / "hostile.yaml"
        f.write_text(yaml.safe_dump(d))
        out = tmp_path / "launch"
        r = CliRunner().invoke(main, ["export", "--plan", str(f), "--launcher", "slurm", "-o", str(out)])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and f"field {field}" in lines[0] and lines[0].isprintable(), r.output
        assert len(lines[0]) < 400
        assert not out.exists() and canaries(tmp_path) == []


def test_export_dry_run_of_a_plan_with_a_printable_hostile_study_runs_nothing(tmp_path):
    """Printable metacharacters are accepted in a plan file (a study may be named so) and stay text: `export
    --plan --launcher slurm --dry-run` runs the written script, which prints the command and runs nothing."""
    import shutil
    import tempfile

    from autotune.cli.app import main

    # the canaries under a short folder: the study must stay within the 512 characters a plan file allows, and
    # pytest's own tmp_path (with xdist's popen-gwN part) made it 561
    short = Path(tempfile.mkdtemp(prefix="ah", dir="/tmp"))
    try:
        _printable_hostile_study(tmp_path, short, main)
    finally:
        assert canaries(short) == []
        shutil.rmtree(short, ignore_errors=True)


def _printable_hostile_study(tmp_path: Path, short: Path, main) -> None:
    s = " ".join(x for x in hostile(short) if x.isprintable())
    assert len(s) <= 512
    d = _doc("megatron", s, "llama3.1-8b").to_dict()
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d))
    out = tmp_path / "launch $(touch x)"
    r = CliRunner().invoke(main, ["export", "--plan", str(f), "--launcher", "slurm", "-o", str(out), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "torchrun --nnodes 1 --nproc-per-node 8" in r.output and canaries(tmp_path) == []
    assert PlanDocument.load(out / "plan.yaml").study == s
    fakes, rec = fake_bin(tmp_path)
    r = run(out / "launch_slurm.sbatch", "--dry-run", fakes=fakes, rec=rec, cwd=tmp_path)
    assert r.returncode == 0 and [c[0] for c in calls(rec)] == ["scontrol"] and canaries(tmp_path) == []
