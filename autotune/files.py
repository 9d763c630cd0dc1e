"""Reading the user's files with errors that name the file and the problem (never a traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError


def read_text_file(path: str | Path, *, what: str) -> str:
    """The text of ``path``; ``what`` names the file's role in messages (``"plan file"``).

    Raises:
        ConfigError: the file does not exist or cannot be read.
    """
    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{what} {p} cannot be read: {e}") from None


def read_yaml_file(path: str | Path, *, what: str) -> Any:
    """``path`` parsed as YAML (any YAML value; callers check the shape).

    Raises:
        ConfigError: missing or unreadable file, or not valid YAML.
    """
    text = read_text_file(path, what=what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {' '.join(str(e).split())}") from None
