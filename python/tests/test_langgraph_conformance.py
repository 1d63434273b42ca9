"""LangGraph's checkpointer conformance suite, run against SteadfastSaver.

On a temporary SQLite file always; on PostgreSQL at `$STEADFAST_TEST_PG`, in a
schema of its own that is dropped afterwards. Without `$STEADFAST_TEST_PG`
the PostgreSQL run is skipped with the reason printed, except under CI (`$CI`
set), where that is a failure.

Each run prints the suite's report, whose last line states the level reached
(`FULL`, `BASE+PARTIAL`, `BASE` or `NONE`); see it with `pytest -s` or `-rP`.
When `$STEADFAST_CONFORMANCE_REPORT` names a file, the reports are also
written there (replaced at the start of each session).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport, ProgressCallbacks

from steadfast.langgraph import SteadfastSaver

REPORT_ENV = "STEADFAST_CONFORMANCE_REPORT"


@pytest.fixture(scope="session")
def report_file() -> Path | None:
    """The file named by `$STEADFAST_CONFORMANCE_REPORT`, emptied once per session."""
    name = os.environ.get(REPORT_ENV)
    if not name:
        return None
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")
    return path


def run_suite(name: str, url: str, report_file: Path | None, encrypt: bool = False) -> CapabilityReport:
    """Run every capability of the suite on `url`, print and keep the report."""

    async def factory() -> AsyncGenerator[SteadfastSaver, None]:
        # A fresh saver per capability, as the suite asks; releasing its leases
        # at the end lets the next one write to any thread it touched.
        saver = SteadfastSaver(url, encrypt=encrypt)
        try:
            yield saver
        finally:
            await saver.aclose()

    registered = checkpointer_test(name=name)(factory)
    report = asyncio.run(validate(registered, progress=ProgressCallbacks.verbose()))

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        report.print_report()
        for cap, result in sorted(report.results.items()):
            for failure in result.failures:
                print(f"  FAILED {cap}: {failure}")
    print(text.getvalue())
    if report_file is not None:
        with report_file.open("a", encoding="utf-8") as out:
            out.write(text.getvalue())
    return report


def assert_conforms(report: CapabilityReport) -> None:
    """Fail on any failed test, naming the level reached and what failed."""
    level = report.conformance_level()
    failures = [
        f"{cap}: {failure}"
        for cap, result in sorted(report.results.items())
        for failure in result.failures
    ]
    assert report.passed_all_base(), (
        f"{report.checkpointer_name}: base capabilities fail (level {level}): {failures}"
    )
    # SteadfastSaver implements every optional capability, so all must be
    # detected and pass.
    undetected = sorted(
        cap.value
        for cap in ALL_CAPABILITIES
        if not report.results.get(cap.value) or not report.results[cap.value].detected
    )
    assert not undetected, f"{report.checkpointer_name}: not detected: {undetected}"
    assert report.passed_all(), (
        f"{report.checkpointer_name}: extended capabilities fail (level {level}): {failures}"
    )
    assert level == "FULL"


# The smallest blob threshold a store takes: with it, most channel values
# and writes of the suite go through the blob tables.
SMALL_BLOBS = "blob_threshold=256"


@pytest.mark.parametrize("blobs", ["", SMALL_BLOBS])
def test_sqlite_store_passes_langgraph_conformance(
    tmp_path: Path, report_file: Path | None, blobs: str
) -> None:
    url = f"sqlite:{tmp_path / 'graph.db'}" + (f"?{blobs}" if blobs else "")
    report = run_suite(f"SteadfastSaver (sqlite{', ' + blobs if blobs else ''})", url, report_file)
    assert_conforms(report)


# A test key (not a secret): 32 bytes, base64.
TEST_KEY = "k1:q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80="


def test_encrypted_sqlite_store_passes_langgraph_conformance(
    tmp_path: Path, report_file: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", TEST_KEY)
    report = run_suite(
        "SteadfastSaver (sqlite, encrypted, blob_threshold=256)",
        f"sqlite:{tmp_path / 'graph.db'}?{SMALL_BLOBS}",
        report_file,
        encrypt=True,
    )
    assert_conforms(report)


def _with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    query.append(("schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _without_schema(url: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """`$STEADFAST_TEST_PG` with a schema made for this session, dropped at its end."""
    base = os.environ.get("STEADFAST_TEST_PG")
    if not base:
        reason = "STEADFAST_TEST_PG is not set, so the PostgreSQL conformance run did not happen"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(reason)
        pytest.skip(reason)
    schema = f"lg_{uuid.uuid4().hex[:16]}"
    yield _with_schema(base, schema)
    import psycopg

    with psycopg.connect(_without_schema(base), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("blobs", ["", SMALL_BLOBS])
def test_postgres_store_passes_langgraph_conformance(
    pg_url: str, report_file: Path | None, blobs: str
) -> None:
    url = f"{pg_url}&{blobs}" if blobs else pg_url
    report = run_suite(f"SteadfastSaver (postgres{', ' + blobs if blobs else ''})", url, report_file)
    assert_conforms(report)
