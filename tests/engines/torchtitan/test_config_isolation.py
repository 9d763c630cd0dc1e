"""A user's torchtitan 0.3 config module never runs inside autotune's process (issue 37 item 2): it loads in a
child process (autotune/engines/torchtitan/config_child.py) that answers with the settings as data. A module
that ends its process (``os._exit(0)``) or loops forever is a one-line error, exit 2; a ``json.py`` beside it
does not replace the standard library's; a module's own code runs in the child (another pid), not here;
modules of a package load as such (relative imports, torchtitan 0.3's own ``config_registry.py``, issue 42
item 4) and a relative import outside a package shows Python's own ImportError. TOML job files nested 20,000
to 100,000 levels deep are a one-line error, exit 2 (issue 37 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from torchtitan_loader import torchtitan_available

from autotune.cli.app import main
from autotune.errors import ConfigError
from autotune.cli.launch_import import import_launch

REPO = Path(__file__).resolve().parents[3]
needs_torchtitan = pytest.mark.skipif(not torchtitan_available(), reason="torchtitan >= 0.3.0 not importable "
                                      "(pip install -e '.[torchtitan]' in the autotune checkout)")
#: a config function on torchtitan's own llama3_8b with TP 2 (8 GPUs: DP shard -1 -> 8 / 2 = 4)
CONFIG = ("from torchtitan.models.llama3.config_registry import llama3_8b\n\n\n"
          "def my_8b():\n    c = llama3_8b()\n    c.parallelism.tensor_parallel_degree = 2\n    return c\n")


def _cli(*args: str, env_extra=None, cwd=None) -> subprocess.CompletedProcess:
    """``python -m autotune ARGS`` in a process of its own (a module that ended this process would end pytest)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or REPO, timeout=300)


def _one_error_line(r) -> str:
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and lines[0].isprintable() and len(lines[0]) < 500
    return lines[0]


@needs_torchtitan
def test_a_module_calling_os_exit_is_a_one_line_error(tmp_path):
    f = tmp_path / "ends.py"
    f.write_text("import os\nos._exit(0)\n\n\ndef autotune_plan():\n    pass\n")
    line = _one_error_line(_cli("simulate", "--from-torchtitan", str(f), "--gpus", "8"))
    assert "ended with exit status 0 without returning a config" in line


@needs_torchtitan
def test_an_endless_loop_hits_the_time_limit_and_the_child_is_gone(tmp_path):
    marker = tmp_path / "started"
    f = tmp_path / "loops.py"
    f.write_text(f"import os\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n\n\n"
                 "def autotune_plan():\n    pass\n")
    # 45 s: importing torch and torchtitan in the child takes 5-15 s on this project's 2-core machine
    t0 = time.monotonic()
    line = _one_error_line(_cli("simulate", "--from-torchtitan", str(f), "--gpus", "8",
                                env_extra={"AUTOTUNE_CONFIG_MODULE_TIMEOUT_S": "45"}))
    assert "took longer than 45 s and was stopped" in line and "AUTOTUNE_CONFIG_MODULE_TIMEOUT_S" in line
    assert time.monotonic() - t0 < 45 + 60
    pid = int(marker.read_text())          # the loop was reached, in another process
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_bad_time_limit_is_named(tmp_path, monkeypatch):
    f = tmp_path / "cfg.py"
    f.write_text("def autotune_plan():\n    pass\n")
    monkeypatch.setenv("AUTOTUNE_CONFIG_MODULE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="AUTOTUNE_CONFIG_MODULE_TIMEOUT_S='?soon'?: must be a number of seconds"):
        import_launch(f, None, num_gpus=8)


@needs_torchtitan
def test_json_py_beside_the_module_does_not_shadow_the_stdlib_and_the_module_runs_in_a_child(tmp_path):
    canary = tmp_path / "CANARY-json"
    (tmp_path / "json.py").write_text(f"open({str(canary)!r}, 'w').write('shadowed')\nraise SystemExit(3)\n")
    ran = tmp_path / "ran-at-import"
    f = tmp_path / "cfg.py"
    f.write_text(f"import os\nopen({str(ran)!r}, 'w').write(str(os.getpid()))\n" + CONFIG)
    imp = import_launch(f, None, num_gpus=8)
    # by hand: TP 2 x DP shard (-1 = 8 / 2 = 4) on 8 GPUs, llama3_8b's own settings otherwise
    assert (imp.model.name, imp.plan.tp_degree, imp.plan.dp_degree) == ("llama3.1-8b", 2, 4)
    assert not canary.exists()
    # the module's code did run (docs/outputs.md says so), in a process that is not this one
    assert ran.exists() and int(ran.read_text()) != os.getpid()
    assert "autotune_user_config" not in sys.modules


@needs_torchtitan
def test_modules_of_a_package_load_with_their_relative_imports(tmp_path):
    pkg = tmp_path / "myconfigs"
    (pkg / "llama").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "llama" / "__init__.py").write_text("")
    (pkg / "llama" / "base.py").write_text("from torchtitan.models.llama3.config_registry import llama3_8b\n\n\n"
                                           "def base():\n    return llama3_8b()\n")
    (pkg / "llama" / "config_registry.py").write_text(
        "from . import base\nfrom .. import llama\n\n\n"
        "def my_8b():\n    c = base.base()\n    c.parallelism.tensor_parallel_degree = 4\n    return c\n")
    imp = import_launch(f"{pkg / 'llama' / 'config_registry.py'}:my_8b", None, num_gpus=8)
    assert (imp.plan.tp_degree, imp.plan.dp_degree) == (4, 2)      # 8 / 4 = 2 FSDP shards


@needs_torchtitan
def test_torchtitans_own_config_registry_loads_as_shipped():
    """torchtitan 0.3's models/llama3/config_registry.py (``from . import model_registry``) read as shipped
    (issue 42 item 4): llama3_8b() of the installed release, on 8 GPUs."""
    import importlib.util

    f = Path(importlib.util.find_spec("torchtitan").submodule_search_locations[0]) / "models" / "llama3" / \
        "config_registry.py"
    imp = import_launch(f"{f}:llama3_8b", None, num_gpus=8)
    # llama3_8b(): no TP/PP/CP, data_parallel_shard_degree -1 -> FSDP over all 8 GPUs (ZeRO-3 without PP)
    assert (imp.model.name, imp.plan.tp_degree, imp.plan.dp_degree, imp.plan.zero_stage) == ("llama3.1-8b", 1, 8, 3)


@needs_torchtitan
def test_a_relative_import_outside_a_package_names_the_error_and_its_line(tmp_path):
    # issue 37 F1: the exception's type and line, never its text (the module chooses that text)
    f = tmp_path / "loose.py"
    f.write_text("from . import model_registry\n\n\ndef autotune_plan():\n    pass\n")
    with pytest.raises(ConfigError, match=r"importing the config module failed: ImportError raised at loose.py "
                                          r"line 1 \(its message is not shown") as e:
        import_launch(f, None, num_gpus=8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", [
    "x = " + "[" * 20_000 + "]" * 20_000,
    "x = " + "[" * 100_000 + "]" * 100_000,
    "x = " + "{a = " * 20_000 + "1" + "}" * 20_000,
    ".".join(["a"] * 20_000) + " = 1\n",
    "[" + ".".join(["a"] * 100_000) + "]\nb = 1\n",
    "[" + ".".join(["a"] * 40) + "]\n" + ".".join(["b"] * 40) + " = 1\n",     # 80 levels, each part < 64
], ids=["arrays-20k", "arrays-100k", "inline-tables-20k", "dotted-key-20k", "table-header-100k", "header+key-80"])
def test_deeply_nested_toml_is_a_one_line_error(text, tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text(text)
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["simulate", "--from-torchtitan", str(f), "--gpus", "8"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nests deeper than 64 levels" in lines[0] and len(lines[0]) < 300, r.output
    assert time.monotonic() - t0 < 10      # refused before tomllib parses it (a 100,000-part header takes it 10 s)


def test_toml_nesting_within_the_cap_still_reads(tmp_path):
    from autotune.engines.torchtitan.importer import parse_toml_text

    # brackets, braces and dots inside strings and comments do not count
    text = ('a = "[[[[{{{{....' + "[" * 100 + '"\nb = \'' + "{" * 100 + "'\n# " + "[" * 100 + "\n"
            'c = """\n' + "[" * 100 + '\n"""\n' + "x = " + "[" * 60 + "]" * 60 + "\n")
    doc = parse_toml_text(text, source="t.toml")
    assert doc["a"].endswith("[" * 100) and doc["b"] == "{" * 100 and doc["c"] == "[" * 100 + "\n"


@pytest.mark.parametrize("text", ["x = " + "1+" * 120_000 + "1\n", "x = " + "-" * 120_000 + "1\n"],
                         ids=["sum-120k", "unary-120k"])
def test_a_module_nested_past_pythons_parser_is_a_one_line_error(text, tmp_path):
    # the config function is found with ast.parse, in this process: RecursionError / MemoryError there is named
    # (120,000 terms: under the 256 KiB module cap, importer.MAX_CONFIG_MODULE_CHARS; 200,000 no longer reach ast)
    f = tmp_path / "deep.py"
    f.write_text(text + "\n\ndef autotune_plan():\n    pass\n")
    r = CliRunner().invoke(main, ["simulate", "--from-torchtitan", str(f), "--gpus", "8"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "nests too deeply for Python's parser" in lines[0], r.output


@needs_torchtitan
@pytest.mark.parametrize("where", ["import", "function"])
def test_a_module_past_the_memory_limit_is_one_line(tmp_path, where):
    # 64 GiB asked for (bytearray zero-fills: it would touch every page) under a 3 GiB address-space limit
    # (RLIMIT_AS in the child; importing torch + torchtitan needs ~1 GiB): MemoryError, reported as one line
    grab = "x = bytearray(64 * 2**30)\n"
    f = tmp_path / "big.py"
    f.write_text((grab if where == "import" else "") + "from torchtitan.models.llama3.config_registry import "
                 "llama3_8b\n\n\ndef autotune_plan():\n" + ("    " + grab if where == "function" else "")
                 + "    return llama3_8b()\n")
    t0 = time.monotonic()
    r = _cli("simulate", "--from-torchtitan", str(f), "--gpus", "8",
             env_extra={"AUTOTUNE_CONFIG_MODULE_MAX_GIB": "3"})
    line = _one_error_line(r)
    assert "used more than 3 GiB of memory" in line and "AUTOTUNE_CONFIG_MODULE_MAX_GIB" in line, line
    assert time.monotonic() - t0 < 120


def test_the_memory_message_states_a_lower_inherited_hard_limit(monkeypatch):
    # issue 37 F10: under `ulimit -Hv` of 2 GiB the child cannot raise its soft limit past 2 GiB
    # (setrlimit(2)), so "used more than 8 GiB" would be false; the line states the 2 GiB it had
    import resource

    from autotune.engines.torchtitan.importer import _memory_limit_text
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, 2 * 2**30))
    assert _memory_limit_text(8.0) == "2 GiB (the hard limit this process inherited, ulimit -Hv)"
    assert _memory_limit_text(1.5) == "1.5 GiB"          # the own limit is the lower one: stated as is
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert _memory_limit_text(8.0) == "8 GiB"


@pytest.mark.parametrize("raw", ["0", "x", "٨", "1e9", "-2", "5000"])
def test_the_memory_limit_variable_is_checked(raw, monkeypatch):
    from autotune.engines.torchtitan.importer import _max_gib
    monkeypatch.setenv("AUTOTUNE_CONFIG_MODULE_MAX_GIB", raw)
    with pytest.raises(ConfigError, match="between 1 and 4096"):
        _max_gib()
