"""--run-script and the static reader against hostile scripts: nothing runs in autotune's process, no blow-up,
one-line errors (issue 37's launch-script cases)."""

from __future__ import annotations

import os
import shutil
import time
import signal
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.export.script_run import ScriptRun, run_script
from autotune.engines.shell_vars import MAX_WORD_CHARS, MAX_WORDS, launcher_world

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="--run-script needs bash")
ARGS = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--micro-batch-size 1 --position-embedding-type rope --normalization RMSNorm --disable-bias-linear "
        "--swiglu --bf16 --vocab-size 1000")


def _script(tmp_path: Path, body: str, name: str = "launch.sh") -> Path:
    f = tmp_path / name
    f.write_text("#!/bin/bash\n" + body)
    return f


@needs_bash
def test_recorder_sees_argv_env_and_an_empty_cwd(tmp_path):
    f = _script(tmp_path, 'NNODES=${NNODES:-16}\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n'
                'echo "cwd: $(ls -A | tr "\\n" " ")"\n'
                'read -t 1 x && echo "stdin: $x"\n'
                f'torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py {ARGS} --save "$1"\n')
    rec = run_script(f, ScriptRun(args=("/ckpt dir",)))
    assert rec.argv[:5] == ("torchrun", "--nnodes", "16", "--nproc-per-node", "8")
    assert rec.argv[-2:] == ("--save", "/ckpt dir")            # a positional argument with a space, one word
    assert rec.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # the working directory holds only the placeholders; stdin is /dev/null (read fails: no "stdin:" line)
    assert "cwd: pretrain_bert.py pretrain_gpt.py" in rec.output and "stdin:" not in rec.output
    # an override of the script's default (NNODES from the environment)
    assert run_script(f, ScriptRun(env=(("NNODES", "2"),))).argv[2] == "2"
    # the script's world size: 16 x 8, from its own NNODES default
    assert launcher_world(list(rec.argv[:rec.argv.index("pretrain_gpt.py")]))[0] == 128


@needs_bash
def test_script_does_not_run_in_autotunes_process(tmp_path):
    canary = tmp_path / "CANARY"
    f = _script(tmp_path, f"touch {canary}\nexit 0\n")
    # static reading runs nothing
    with pytest.raises(ConfigError):
        from autotune.cli.launch_import import import_launch
        import_launch(f, "megatron", num_gpus=8)
    assert not canary.exists()
    # --run-script: in a child; autotune's own environment is not the child's
    os.environ["AUTOTUNE_TEST_SECRET"] = "s3cret"
    try:
        g = _script(tmp_path, f'torchrun pretrain_gpt.py {ARGS}\n', "g.sh")
        rec = run_script(g, ScriptRun())
    finally:
        del os.environ["AUTOTUNE_TEST_SECRET"]
    assert "AUTOTUNE_TEST_SECRET" not in rec.env


@needs_bash
def test_timeout_kills_the_script(tmp_path):
    f = _script(tmp_path, "while true; do :; done\n")
    t = time.monotonic()
    with pytest.raises(ConfigError, match=r"ran past 1 s under --run-script"):
        run_script(f, ScriptRun(timeout_s=1.0))
    assert time.monotonic() - t < 10


@needs_bash
def test_array_bomb_under_run_script_is_stopped(tmp_path):
    # 10 words doubled 30 times = 10^10 words: bash hits the address-space limit (or the timeout) long
    # before that; either way one error, and autotune's memory does not grow
    f = _script(tmp_path, "A=(a b c d e f g h i j)\nfor i in $(seq 30); do A=(\"${A[@]}\" \"${A[@]}\"); done\n"
                "torchrun pretrain_gpt.py \"${A[@]}\"\n")
    # issue 37 F7: bash's xmalloc fails at the 512 MiB address-space cap: one line naming the cap, and the
    # child's peak (ru_maxrss of the waited children, KiB) stays under 1 GiB (it was 1.87 GB with a 2 GiB cap)
    import resource
    with pytest.raises(ConfigError, match=r"used more than 512 MiB of memory under --run-script"):
        run_script(f, ScriptRun(timeout_s=15.0))
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2**20


def test_static_array_expansion_capped(tmp_path):
    # one array of 10^4 words referenced 10^3 times: 10^7 words (the 0.9 MB script reached 10^9)
    arr = "A=(" + " ".join(["--x"] * 10_000) + ")\n"
    f = tmp_path / "bomb.sh"
    f.write_text(arr + "torchrun pretrain_gpt.py " + " ".join(["${A[@]}"] * 1_000) + "\n")
    t = time.monotonic()
    with pytest.raises(ConfigError, match=f"more than {MAX_WORDS:,} words"):
        from autotune.cli.launch_import import import_launch
        import_launch(f, "megatron", num_gpus=8)
    assert time.monotonic() - t < 30


def test_static_long_word_refused_fast(tmp_path):
    f = tmp_path / "word.sh"
    # one 1,000,000-character word: under the 4 MiB argument-file cap and the 1,048,576-character script cap,
    # so the word cap (MAX_WORD_CHARS) is the one that refuses it
    f.write_text("--num-layers " + "9" * 1_000_000 + "\n")
    t = time.monotonic()
    with pytest.raises(ConfigError, match=f"a word of 1,000,000 characters.*limit is {MAX_WORD_CHARS:,}") as e:
        from autotune.cli.launch_import import import_launch
        import_launch(f, "megatron", num_gpus=8)
    assert time.monotonic() - t < 10 and len(str(e.value)) < 300


@pytest.mark.parametrize("launcher", ["torchrun --nnodes 0 --nproc-per-node 8", "torchrun --nnodes 2 --nproc_per_node=0"])
def test_zero_nodes_is_one_line_exit_2(tmp_path, launcher):
    from click.testing import CliRunner

    from autotune.cli import main
    f = tmp_path / "z.sh"
    f.write_text(f"{launcher} pretrain_gpt.py {ARGS}\n")
    r = CliRunner().invoke(main, ["simulate", "--from-megatron", str(f)])
    assert r.exit_code == 2, r.output
    assert "must be an integer >= 1" in r.output and "Traceback" not in r.output


def test_script_options_need_run_script(tmp_path):
    from click.testing import CliRunner

    from autotune.cli import main
    f = tmp_path / "a.sh"
    f.write_text(f"pretrain_gpt.py {ARGS}\n")
    r = CliRunner().invoke(main, ["simulate", "--from-megatron", str(f), "--gpus", "8", "--script-args", "a b"])
    assert r.exit_code == 2 and "only with --run-script" in r.output
    r = CliRunner().invoke(main, ["simulate", "--from-megatron", str(f), "--run-script", "--script-env", "1X=2"])
    assert r.exit_code == 2 and "give NAME=VALUE" in r.output


def test_run_script_needs_a_launch_file(tmp_path):
    from click.testing import CliRunner

    from autotune.cli import main
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--run-script", "--storage", f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 2 and "--compare-to" in r.output, r.output
    r = CliRunner().invoke(main, ["simulate", "--size", "8b", "--run-script"])
    assert r.exit_code == 2 and "--from-megatron" in r.output, r.output


def test_fifo_is_not_opened_by_the_script_sniffer(tmp_path):
    from autotune.export.script_run import looks_like_script
    f = tmp_path / "fifo"
    os.mkfifo(f)
    # returns at once (a FIFO would block an open() for reading)
    assert looks_like_script(f) is False


@pytest.mark.parametrize("line,match", [
    ("    --x 1\n", r"runs over more than 10,000 lines"),               # 20,000 lines: re-split each line before
    ('    --x 1 ")x"\n', r"more than 20,000,000 characters of shell-word splitting"),   # a ')' on every line
])
def test_long_array_definitions_refused_fast(tmp_path, line, match):
    # a multi-line array used to be shell-split again at every line (quadratic): 20,000 lines took > 120 s
    from autotune.cli.launch_import import import_launch
    f = tmp_path / "arr.sh"
    f.write_text("A=(\n" + line * (20_000 if "1\n" == line[-2:] else 9_000) + ")\ntorchrun pretrain_gpt.py ${A[@]}\n")
    t = time.monotonic()
    with pytest.raises(ConfigError, match=match):
        import_launch(f, "megatron", num_gpus=8)
    assert time.monotonic() - t < 60


def test_scalar_expansion_bounded_before_it_is_built(tmp_path):
    # A is 200,000 characters; a word of 500 "$A" would be 100 MB: refused from the lengths, nothing built
    from autotune.cli.launch_import import import_launch
    f = tmp_path / "s.sh"
    f.write_text("A=" + "a" * 200_000 + "\ntorchrun pretrain_gpt.py --save " + "$A" * 500 + "\n")
    t = time.monotonic()
    with pytest.raises(ConfigError, match=r"expands to about 100,00\d,\d{3} characters"):
        import_launch(f, "megatron", num_gpus=8)
    assert time.monotonic() - t < 30


@needs_bash
@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_signal_during_run_script_kills_the_script_at_once_and_says_so(tmp_path, sig, code, name):
    # issue 37 F5: SIGTERM exited 143 silently and the script's bash lived on (ppid 1) until the 20 s limit;
    # SIGINT waited the 20 s and then said "ran past 20 s"
    import os
    import subprocess
    import sys
    marker = tmp_path / "started"
    f = _script(tmp_path, f"echo 1 > {marker}\n( while true; do :; done ) &\nwhile true; do :; done\n")
    repo = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-m", "autotune", "simulate", "--from-megatron", str(f), "--run-script",
                          "--gpus", "8", "--gpu", "h100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo)}, cwd=tmp_path)
    t0 = time.monotonic()
    while not marker.exists() and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    assert marker.exists() and p.poll() is None
    p.send_signal(sig)
    out, err = p.communicate(timeout=10)
    assert time.monotonic() - t0 < 20          # well before the 20 s limit would have ended it
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1, (p.returncode, out, err)
    assert lines[0].startswith(f"interrupted: {name} arrived while --run-script ran") and "ran past" not in err
    time.sleep(0.3)
    left = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(f).encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                left.append(d)
        except OSError:
            pass
    assert left == []           # bash and its background loop are both gone


def test_run_script_memory_limit_is_the_lower_inherited_hard_limit(monkeypatch):
    # issue 37 F10: a hard RLIMIT_AS of 256 MiB inherited (ulimit -Hv) cannot be raised to 512 MiB
    # (setrlimit(2)); the child gets 256 MiB and the messages say 256
    import resource

    from autotune.export.script_run import MAX_CHILD_BYTES, _child_as_bytes
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, 256 * 2**20))
    assert _child_as_bytes() == 256 * 2**20
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert _child_as_bytes() == MAX_CHILD_BYTES == 512 * 2**20
