"""Write tests/data/megatron_args.txt: every option string of Megatron-LM's argument parser.

Usage: python tests/data/extract_megatron_args.py PATH/TO/Megatron-LM COMMIT > tests/data/megatron_args.txt
       python tests/data/extract_megatron_args.py PATH/TO/Megatron-LM COMMIT --facts > autotune/engines/megatron/arg_facts.jsonl

``--facts``: one JSON object per option string with what the parser does with its value (facts, no
code): ``action`` (store, store_true, store_false, store_const, append, ...), ``type`` (the name of the
converter: int, float, str, or another callable's name), ``nargs``, ``choices`` (as strings: the
strings the command line accepts) and ``dest``; tests/export rebuild an argparse parser from them and parse every export with it.

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
    if "--facts" in sys.argv[3:]:
        _print_facts(parser, names, commit)
        return
    print(f"# Option strings of Megatron-LM's parser (megatron/training/arguments.py add_megatron_arguments)")
    print(f"# NVIDIA/Megatron-LM commit {commit}; written by tests/data/extract_megatron_args.py")
    for n in names:
        print(n)


def _print_facts(parser: argparse.ArgumentParser, names: list[str], commit: str) -> None:
    import json
    kinds = {argparse._StoreAction: "store", argparse._StoreTrueAction: "store_true",
             argparse._StoreFalseAction: "store_false", argparse._StoreConstAction: "store_const",
             argparse._AppendAction: "append", argparse._CountAction: "count"}
    print(json.dumps({"comment": "facts of Megatron-LM's parser (megatron/training/arguments.py "
                                 "add_megatron_arguments), written by tests/data/extract_megatron_args.py --facts",
                      "commit": commit}))
    for n in names:
        a = parser._option_string_actions[n]
        kind = next((v for k, v in kinds.items() if type(a) is k), type(a).__name__)
        t = a.type
        tname = None if t is None else getattr(t, "__name__", type(t).__name__)
        print(json.dumps({"option": n, "action": kind, "type": tname,
                          "nargs": a.nargs if a.nargs is None or isinstance(a.nargs, (int, str)) else str(a.nargs),
                          "choices": _choice_strings(a),
                          "dest": a.dest}))


def _choice_strings(a: argparse.Action) -> list[str] | None:
    """The strings the command line accepts for ``a``. An enum-typed option (Megatron's
    ArgumentGroupFactory ``_get_enum_kwargs``: ``type=enum_type_handler`` converting by
    ``config_type[cli_arg]``, ``choices=list(config_type)``) takes the member NAMES (``fused``, ``SIGTERM``;
    aliases such as ``SIGIOT`` too, since ``Enum[name]`` resolves them), not ``str(member)``."""
    import enum
    if a.choices is None:
        return None
    if a.choices and all(isinstance(c, enum.Enum) for c in a.choices):
        return list(type(a.choices[0]).__members__)
    return [str(c) for c in a.choices]


if __name__ == "__main__":
    main()
