"""Fixtures: a temporary SQLite store, populated with hand-chosen timings (profiling_fixtures.py)."""

from __future__ import annotations

import pytest

from autotune.profiling import store as S
from profiling_fixtures import ENV, populate


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'profile.db'}"


@pytest.fixture
def populated(url):
    session = S.open_store(url)()
    env = S.get_or_create_environment(session, ENV)
    populate(session, env)
    yield session, env
    session.close()
