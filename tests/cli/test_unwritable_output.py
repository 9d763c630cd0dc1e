"""Issue 25: an output directory autotune cannot write is refused before any work, in one ``error:`` line
(``plot -o`` into a read-only directory crashed with a PermissionError). Proven for root too, whom file modes
do not stop: as root the directory is a read-only tmpfs mount (access(2) W_OK gives EROFS whoever asks), as
any other user a directory of mode 0555 (autotune/files.py check_output_path)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.app import main


@pytest.fixture
def unwritable_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"as root, a read-only directory needs a read-only mount, refused here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_unwritable_output_directory_is_refused_before_any_work(tmp_path, unwritable_dir):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2",
                                     "--storage", url]).exit_code == 0
    # the check is what refuses: a write attempted there would fail (EACCES as a user, EROFS as root)
    with pytest.raises(OSError):
        (unwritable_dir / "probe").write_text("x")
    target = ["--size", "8b", "--space", "small", "--storage", url]
    for args in (["plot", "--storage", url, "-o", str(unwritable_dir / "plots")],
                 ["plot", "--storage", url, "-o", str(unwritable_dir)],
                 ["export", *target, "-o", str(unwritable_dir / "plan.yaml")],
                 ["export", *target, "--launcher", "slurm", "-o", str(unwritable_dir / "launch")],
                 ["export", *target, "--launcher", "torchrun", "-o", str(unwritable_dir)]):
        r = CliRunner().invoke(main, args)
        lines = [x for x in r.output.splitlines() if x.strip()]
        assert r.exit_code == 2 and lines[-1].startswith("error: -o ") and "Traceback" not in r.output, r.output
        assert f"{unwritable_dir} is not a writable directory" in lines[-1], lines[-1]
    assert list(Path(unwritable_dir).iterdir()) == []


def test_the_check_refuses_a_mode_0555_directory_as_an_unprivileged_user(tmp_path):
    # as root (CI), the same check as user nobody through setpriv(1), on a directory of mode 0555: the case file
    # modes decide (as any other user the fixture above already uses such a directory)
    import shutil
    import sys
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv(1) to act as user nobody (as another user the test above covers it)")
    root = Path(__file__).resolve().parents[2]
    base = Path("/tmp") / f"autotune-nobody-{os.getpid()}"      # tmp_path is root's (mode 0700)
    d = base / "ro"
    d.mkdir(parents=True)
    try:
        os.chown(base, 65534, 65534)
        d.chmod(0o555)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from autotune.files import check_output_path\n"
                "try:\n    check_output_path(sys.argv[2], what='-o', directory=True)\n"
                "except Exception as e:\n    print(type(e).__name__, e)\nelse:\n    print('accepted')\n"
                "try:\n    open(sys.argv[2], 'w')\nexcept OSError as e:\n    print('write:', e.errno)\n")
        for py in (sys.executable, "/usr/bin/python3"):
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", py, "-c", code,
                                str(root), str(d / "plots")], capture_output=True, text=True, cwd="/")
            if r.returncode == 0:
                break
        else:
            pytest.skip(f"user nobody cannot run Python on autotune's files here: {r.stderr.strip()[-200:]}")
        import errno
        assert r.stdout.splitlines() == [f"ConfigError -o {d / 'plots'}: {d} is not a writable directory; give a "
                                         "path you can write", f"write: {errno.EACCES}"], r.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)
