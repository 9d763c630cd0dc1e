"""The config-module child's memory limit as error lines state it (issue 37 F10): the importer's limit
(:data:`autotune.engines.torchtitan.importer.CONFIG_MODULE_MAX_GIB` or its variable), or the lower hard
``RLIMIT_AS`` this process inherited."""
from __future__ import annotations

from autotune.errors import ConfigError

#: the variable that sets the limit (named in the message)
MAX_GIB_ENV = "AUTOTUNE_CONFIG_MODULE_MAX_GIB"


def _memory_limit_text(max_gib: float) -> str:
    """The child's address-space limit as an error line states it: ``"8 GiB"``, or the hard ``RLIMIT_AS`` this
    process inherited when lower (the child cannot raise past it, setrlimit(2); ``config_child.py`` takes it)."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY and hard < max_gib * 2**30:
        return f"{hard / 2**30:.3g} GiB (the hard limit this process inherited, ulimit -Hv)"
    return f"{max_gib:g} GiB"


def _memory_error(source: str, max_gib: float) -> ConfigError:
    return ConfigError(f"{source}: loading the config module used more than {_memory_limit_text(max_gib)} of memory "
                       f"and was stopped (it runs in a child process; {MAX_GIB_ENV}=GIB sets the limit)")


__all__ = ["MAX_GIB_ENV"]
