"""The child process that loads a user's torchtitan 0.3 config module (``--from-torchtitan FILE.py``,
``run --compare-to FILE.py``) and answers with the settings autotune reads, as JSON; see
:func:`autotune.engines.torchtitan.importer.import_python_config`, which starts it.

Run as ``python -I config_child.py REQUEST`` (``REQUEST``: JSON ``{"file", "function", "path", "cpu_s",
"fsize_bytes", "as_bytes"}``) in an empty temporary working directory with stdin closed. ``-I`` (isolated mode: no
``PYTHON*`` environment variables, no user site, and neither this script's folder nor the working directory
on ``sys.path``) and this file's own imports (the standard library only, then torchtitan; never autotune) keep
it independent of the caller. What it does:

1. keeps a private copy of file descriptor 1 for the answer and points descriptor 1 at stderr, so whatever the
   module prints cannot be taken for the answer;
2. limits its own CPU time (``RLIMIT_CPU``: a module stuck in a loop is ended even when the caller is gone),
   the size of any file it writes (``RLIMIT_FSIZE``) and its address space (``RLIMIT_AS``, ``"as_bytes"``: an
   allocation past it raises MemoryError, answered as ``{"ok": false, "kind": "memory"}``), setrlimit(2);
3. appends the caller's ``sys.path`` folders and the module's own folder (or its package's root) to the END of
   ``sys.path``: the standard library and the installed packages come first, so a ``json.py`` beside the module
   does not replace :mod:`json`;
4. imports torchtitan and replaces the llama3 ``model_registry`` by one that records the converters each
   call passes (the converters' GPU checks are not run: the BF16 model spec is built), as
   tests/export/test_export.py does;
5. imports the module: a file inside a package (folders with ``__init__.py``) as that package's module
   (``pkg.sub.config_registry``), so relative imports (``from . import model_registry``, torchtitan 0.3's own
   ``config_registry.py``) work; a package whose top name imports from elsewhere here (the standard library's
   ``json``, another torchtitan) is refused; a loose file under a private name (``autotune_user_config``),
   never its own stem (a module named ``json`` or ``llama3`` would shadow a real one);
6. runs torchtitan's ``ConfigManager().parse_args(["--module", NAME, "--config", FUNCTION])``
   (torchtitan/config/manager.py) and writes the settings autotune reads (:func:`describe`) as one JSON
   object ``{"ok": true, "config": {...}}``, or ``{"ok": false, "kind": ..., "message": ...}``.
"""

import json
import math
import os
import sys

#: private module name of a config module that is not inside a package
LOOSE_NAME = "autotune_user_config"
#: longest string value sent back (the settings autotune reads are names and FQNs of < 100 characters)
MAX_TEXT_CHARS = 1024
#: characters of an error message sent back (the caller shortens it further)
MESSAGE_CHARS = 500


def _plain(v, depth=0):
    """``v`` as JSON data: None, bool, int, str (longer than :data:`MAX_TEXT_CHARS`: ``<text of N characters>``),
    finite float, lists of them; anything else as ``<TypeName>``."""
    if isinstance(v, str):
        return v if len(v) <= MAX_TEXT_CHARS else f"<text of {len(v)} characters>"
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)) and depth < 8:
        return [_plain(x, depth + 1) for x in v]
    return f"<{type(v).__qualname__}>"


def _message(e):
    """``Type: message`` of an exception raised by torchtitan's own import (no user code has run yet)."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text[:MESSAGE_CHARS]


def _kind_name(e):
    """The exception's class name when it is a built-in one (``RuntimeError``), else ``a subclass of X`` with X
    its first built-in base: a module-defined class name is the module's text too, never sent back."""
    for cls in type(e).__mro__:
        if cls.__module__ == "builtins":
            return cls.__name__ if cls is type(e) else f"a subclass of {cls.__name__}"
    return "an exception"


def _where(e, folder):
    """``FILE line N``: the innermost traceback frame in a file under ``folder`` (the module's own folder or
    its package's root), the file named relative to it; ``""`` when no frame is there."""
    tb, found = e.__traceback__, ""
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        try:
            real = os.path.realpath(fn)
        except (OSError, ValueError):
            real = fn
        if real == folder or real.startswith(folder.rstrip(os.sep) + os.sep):
            found = f"{os.path.relpath(real, folder)[:200]} line {tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _safe_message(e, folder):
    """What is sent back of an exception the user's module (or its config function) raised: its built-in
    type and where in the module it was raised (:func:`_where`), never ``str(e)``: the module's code chooses
    that text, and it may hold anything the module can read (issue 37: ``raise RuntimeError(os.environ[...])``
    printed a secret)."""
    where = _where(e, folder)
    return (f"{_kind_name(e)}" + (f" raised at {where}" if where else "")
            + " (its message is not shown: run the module yourself to see it)")[:MESSAGE_CHARS]


def describe(cfg, seen, alloc):
    """The settings of ``cfg`` (a torchtitan ``Trainer.Config``) that autotune's importer reads
    (autotune/engines/torchtitan/importer.py ``_from_config``), as JSON data."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    ms = cfg.model_spec
    ac = cfg.activation_checkpoint
    if ac is None:
        mode = "none"
    elif type(ac) is SelectiveAC.Config:
        mode = "selective"
    elif type(ac) is FullAC.Config:
        mode = "full"
    else:
        mode = {"other": type(ac).__qualname__}
    par, tr, comp = cfg.parallelism, cfg.training, cfg.compile
    par_fields = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                  "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                  "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                  "pipeline_parallel_layers_per_stage", "module_fqns_per_model_part",
                  "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                  "expert_parallel_degree", "enable_sequence_parallel")
    owner = getattr(type(cfg), "_owner", None)
    return {
        "model": {"name": _plain(getattr(ms, "name", None)), "flavor": _plain(getattr(ms, "flavor", None))},
        "activation_checkpoint": mode,
        "converters": [{"kind": type(c).__qualname__, "recipe_name": _plain(getattr(c, "recipe_name", None))}
                       for c in seen.get(id(ms), [])],
        "parallelism": {**{k: _plain(getattr(par, k)) for k in par_fields},
                        "enable_fsdp_symm_mem": _plain(getattr(par, "enable_fsdp_symm_mem", False))},
        "training": {k: _plain(getattr(tr, k)) for k in ("mixed_precision_param", "enable_cpu_offload", "seq_len",
                                                          "local_batch_size", "global_batch_size")},
        "compile": {"enable": _plain(comp.enable), "components": _plain(list(comp.components)),
                    "enable_async_tensor_parallel": _plain(comp.enable_async_tensor_parallel)},
        "trainer": None if owner is None else {"name": owner.__name__, "qualname": owner.__qualname__,
                                               "train_step": "train_step" in vars(owner)},
        "alloc": alloc,
    }


def load_module(path):
    """Import the module at ``path`` (step 5 of the module docstring); returns the name it is imported as.

    Raises:
        ImportError: a package whose top name imports from another folder here; what the module raises.
    """
    import importlib
    import importlib.machinery
    import importlib.util

    folder = os.path.dirname(path)
    parts, root = [os.path.splitext(os.path.basename(path))[0]], folder
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    if len(parts) == 1 or not all(p.isidentifier() for p in parts):
        sys.path.append(folder)         # after the standard library and site-packages: siblings import, shadow nothing
        # (an explicit source loader: a file named CFG.PY gets one too)
        spec = importlib.util.spec_from_loader(LOOSE_NAME, importlib.machinery.SourceFileLoader(LOOSE_NAME, path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[LOOSE_NAME] = mod
        spec.loader.exec_module(mod)
        return LOOSE_NAME
    top, name = parts[0], ".".join(parts)
    pkg_dir = os.path.join(root, top)
    found = importlib.util.find_spec(top)
    if found is None:
        spec = importlib.util.spec_from_file_location(top, os.path.join(pkg_dir, "__init__.py"),
                                                      submodule_search_locations=[pkg_dir])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[top] = pkg
        spec.loader.exec_module(pkg)
    else:
        where = [os.path.realpath(p) for p in (found.submodule_search_locations or [])]
        if os.path.realpath(pkg_dir) not in where:
            origin = where[0] if where else (found.origin or "?")
            raise ImportError(f"{path} is module {name} of package {top} ({pkg_dir}), but {top} imports from "
                              f"{origin} here; rename the package or copy the config function into a file outside it")
    sys.path.append(root)
    importlib.import_module(name)
    return name


def _module_root(path):
    """The real path of the folder whose files are the user's: the module's folder, or the root folder of
    its package (the folders with ``__init__.py`` above it), as :func:`load_module` finds it."""
    root = os.path.dirname(os.path.realpath(path))
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        root = os.path.dirname(root)
    return root


def main():
    req = json.loads(sys.argv[1])
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                       # the module's prints go to stderr, not into the answer

    def reply(obj):
        answer.write(json.dumps(obj))
        answer.flush()

    try:
        import resource
        cpu = int(req["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        size = int(req["fsize_bytes"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    except (ImportError, ValueError, OSError):
        pass
    try:        # address space (RLIMIT_AS): allocations past it fail (MemoryError) instead of swapping the host
        import resource
        limit = int(req["as_bytes"])
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError, KeyError):
        pass
    sys.path.extend(p for p in req["path"] if p not in sys.path)
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import logging
    logging.disable(logging.WARNING)    # torchtitan's notes on paths the config names (assets, checkpoints)
    try:
        import importlib
        from torchtitan.config.manager import ConfigManager
        ll3 = importlib.import_module("torchtitan.models.llama3")
        reg = importlib.import_module("torchtitan.models.llama3.config_registry")
    except MemoryError:
        return reply({"ok": False, "kind": "memory", "message": "MemoryError importing torchtitan"})
    except Exception as e:              # noqa: BLE001 - any failure: torchtitan is not usable here
        return reply({"ok": False, "kind": "torchtitan", "message": _message(e)})
    seen = {}
    real = ll3.model_registry

    def registry(flavor, *a, converters=None, **kw):
        spec = real(flavor, *a, **kw)
        seen[id(spec)] = list(converters or [])
        return spec

    ll3.model_registry = reg.model_registry = registry
    folder = _module_root(req["file"])
    try:
        name = load_module(req["file"])
    except MemoryError:
        return reply({"ok": False, "kind": "memory", "message": "MemoryError at import"})
    except BaseException as e:          # noqa: BLE001 - whatever the module raises (SystemExit too), one line
        return reply({"ok": False, "kind": "import", "message": _safe_message(e, folder)})
    try:
        cfg = ConfigManager().parse_args(["--module", name, "--config", req["function"]])
    except SystemExit as e:
        where = _where(e, folder)
        # argparse's own exit (an int status, raised outside the module) is torchtitan's refusal; a SystemExit
        # the config function raised is reported like any other exception of the module's
        msg = (_safe_message(e, folder) if where or not isinstance(e.code, (int, type(None)))
               else f"exit status {e.code}")
        return reply({"ok": False, "kind": "exit", "message": msg})
    except MemoryError:
        return reply({"ok": False, "kind": "memory", "message": "MemoryError in the config function"})
    except BaseException as e:          # noqa: BLE001
        return reply({"ok": False, "kind": "load", "message": _safe_message(e, folder)})
    try:
        return reply({"ok": True, "config": describe(cfg, seen, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))})
    except Exception as e:              # noqa: BLE001 - a config object without the fields of Trainer.Config
        return reply({"ok": False, "kind": "describe", "message": _safe_message(e, folder)})


if __name__ == "__main__":
    main()
