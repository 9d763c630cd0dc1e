"""Issue 37 F1 F2 F4: the torchtitan config-module child gets a minimal environment, none of the module's own
text is echoed, the default time limit is under 60 s, and SIGINT / SIGTERM while it loads kill it and print
``run``'s "interrupted:" line with exit 130 / 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torchtitan_loader import torchtitan_available

from autotune.engines.torchtitan import importer

REPO = Path(__file__).resolve().parents[3]
needs_torchtitan = pytest.mark.skipif(not torchtitan_available(), reason="torchtitan >= 0.3.0 not importable")
SECRET = "HUNTER2_SUPERSECRET_37"


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "QA_SECRET": SECRET, **extra}


def test_child_env_keeps_only_the_documented_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("QA_SECRET", SECRET)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = importer.child_env(str(tmp_path))
    # exactly PATH, LANG, (LC_ALL, LD_LIBRARY_PATH where set), HOME = TMPDIR = the child's own folder
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "HOME", "TMPDIR"}
    assert env["PATH"] == "/usr/bin:/bin" and env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert SECRET not in " ".join(env.values())


def test_default_time_limit_is_under_the_60_s_bar(monkeypatch):
    monkeypatch.delenv(importer.TIMEOUT_ENV, raising=False)
    assert importer._timeout_s() <= 45
    monkeypatch.setenv(importer.TIMEOUT_ENV, "30")
    assert importer._timeout_s() == 30.0


@needs_torchtitan
@pytest.mark.parametrize("where", ["import", "function"])
def test_a_module_raising_the_environment_prints_no_secret(tmp_path, where):
    # the module's text "MODULE_TEXT" and the parent's secret must both stay out of the output; the child sees
    # no QA_SECRET at all ("absent"), which only the hidden message would show, so both are asserted by absence
    f = tmp_path / "envleak.py"
    body = 'raise RuntimeError("MODULE_TEXT " + os.environ.get("QA_SECRET", "absent"))'
    f.write_text("import os\n" + (body + "\n\ndef autotune_plan():\n    pass\n" if where == "import" else
                                  "\n\ndef autotune_plan():\n    " + body + "\n"))
    r = subprocess.run([sys.executable, "-m", "autotune", "simulate", "--from-torchtitan", str(f), "--gpus", "8",
                        "--gpu", "h100"], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=200)
    out = r.stdout + r.stderr
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in out, out
    assert SECRET not in out and "MODULE_TEXT" not in out and "absent" not in out
    line = 2 if where == "import" else 5        # the raise's line in the file written above
    assert f"RuntimeError raised at envleak.py line {line}" in lines[0]


def _children_of_session(pid: int, word: str) -> list[int]:
    """pids of processes whose command line holds ``word`` (the test's own tmp path makes it unique)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if word in cmd and state != "Z":
                found.append(int(d))
    return found


@needs_torchtitan
@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_signal_while_a_module_loads_kills_the_child_and_says_so(tmp_path, sig, code, name):
    marker = tmp_path / "started"
    f = tmp_path / "loops.py"
    f.write_text(f"open({str(marker)!r}, 'w').write('1')\nwhile True:\n    pass\n\n\ndef autotune_plan():\n    pass\n")
    p = subprocess.Popen([sys.executable, "-m", "autotune", "simulate", "--from-torchtitan", str(f), "--gpus", "8",
                          "--gpu", "h100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         cwd=tmp_path)
    t0 = time.monotonic()
    while not marker.exists() and time.monotonic() - t0 < 120:     # torch + torchtitan import: ~20 s here
        time.sleep(0.2)
    assert marker.exists() and p.poll() is None
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1, (p.returncode, out, err)
    assert lines[0].startswith(f"interrupted: {name} arrived while the config module") and "longer than" not in err
    time.sleep(0.5)
    assert _children_of_session(0, str(f)) == []            # the child running the loop is gone
