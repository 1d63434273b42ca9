"""Shared fixtures: one store per test, of every kind the package opens.

``store_url`` is parametrized over ``memory:``, ``file:``, ``sqlite:`` and,
when ``$STEADFAST_TEST_PG`` names a PostgreSQL server, ``postgres://`` in a
schema of its own (dropped afterwards). Without that variable the postgres
cases are skipped, except under CI (``$CI`` set), where they fail: a CI run
that silently skips a store proves nothing about it.

A ``memory:`` store lives in its Store object only: a test that resumes a run
must reuse the same ``store``, never open the URL again.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import urllib.parse

import pytest

import steadfast

PG_ENV = "STEADFAST_TEST_PG"
STORE_KINDS = ["memory", "file", "sqlite", "postgres"]


def _without_schema(url: str) -> str:
    """``url`` without a ``schema`` query parameter (libpq does not know it)."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _with_schema(url: str, schema: str) -> str:
    base = _without_schema(url)
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def _drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(_without_schema(base), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    kind = request.param
    if kind == "memory":
        yield "memory:"
    elif kind == "file":
        yield f"file:{tmp_path}/runs.json"
    elif kind == "sqlite":
        yield f"sqlite:{tmp_path}/runs.db"
    else:
        base = os.environ.get(PG_ENV)
        if not base:
            if os.environ.get("CI"):
                pytest.fail(f"CI is set but ${PG_ENV} is not: the PostgreSQL store would go untested")
            pytest.skip(f"set ${PG_ENV} to a PostgreSQL URL to test the postgres store")
        schema = f"py_{secrets.token_hex(6)}"
        try:
            yield _with_schema(base, schema)
        finally:
            _drop_schema(base, schema)


@pytest.fixture
def store(store_url: str) -> steadfast.Store:
    return steadfast.open_store(store_url)


@pytest.fixture
def memory_store() -> steadfast.Store:
    """A store for tests whose subject is not the store (argument checks)."""
    return steadfast.open_store("memory:")


@pytest.fixture
def steadfast_cli() -> str:
    """The ``steadfast`` command: ``$STEADFAST_BIN``, else the workspace's
    debug build. Missing, the test is skipped, except under CI, where it fails."""
    env = os.environ.get("STEADFAST_BIN")
    if env:
        return env
    built = pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "steadfast"
    if built.is_file():
        return str(built)
    if os.environ.get("CI"):
        pytest.fail("the steadfast command is needed: set STEADFAST_BIN or run cargo test first")
    pytest.skip("no steadfast command (set STEADFAST_BIN or run cargo test first)")
