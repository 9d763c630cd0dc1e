"""Write tests/data/megatron_args.txt: every option string of Megatron-LM's argument parser.

Usage: python tests/data/extract_megatron_args.py PATH/TO/Megatron-LM COMMIT > tests/data/megatron_args.txt

Builds the real parser (``megatron.training.arguments.add_megatron_arguments``, which also adds the
options generated from config dataclasses by ``ArgumentGroupFactory``) with the CPU torch of this
project; GPU-only imports (triton, transformer_engine, apex, ...) that are missing are replaced by
empty stand-in modules, which only matters for defaults, not option names. No Megatron source is
committed: only the option names and the commit they come from.
"""

from __future__ import annotations

import argparse
import re
import importlib.abc
import importlib.machinery
import sys
import types
from unittest import mock

STUBBED: tuple[str, ...] = ()

TRITON_IMPORT = re.compile(r"^(import triton|from triton)", re.M)


def _imports_triton(name: str, path) -> bool:
    """A Megatron module that imports triton unconditionally (GPU kernels, no arguments): stood in for,
    since a stand-in triton would mislead torch's own triton detection."""
    if not name.startswith("megatron."):
        return False
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8") as f:
        return bool(TRITON_IMPORT.search(f.read()))


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED or _imports_triton(name, path):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__ = []
        m.__spec__ = spec
        m.__name__ = spec.name
        m.__version__ = "99.0.0"  # newer than any minimum Megatron asserts
        return m

    def exec_module(self, module):
        pass


def main() -> None:
    src, commit = sys.argv[1], sys.argv[2]
    sys.path.insert(0, src)
    import torch  # noqa: F401  (before the stand-ins: torch must see that triton is absent)
    import torch.utils.flop_counter  # noqa: F401
    sys.meta_path.insert(0, _Stubs())
    import typing
    if not hasattr(typing, "override"):         # Python < 3.12 (Megatron uses typing.override)
        typing.override = lambda f: f
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    names = sorted({s for s in parser._option_string_actions if s.startswith("--")})
    print(f"# Option strings of Megatron-LM's parser (megatron/training/arguments.py add_megatron_arguments)")
    print(f"# NVIDIA/Megatron-LM commit {commit}; written by tests/data/extract_megatron_args.py")
    for n in names:
        print(n)


if __name__ == "__main__":
    main()
