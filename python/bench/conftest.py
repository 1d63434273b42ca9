"""Options and the closing summary of the Python benchmarks (pytest-benchmark)."""

from __future__ import annotations

import os

import pytest


def _positive(name: str, most: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise pytest.UsageError(f"{name} {text!r}: not a whole number")
        if not 1 <= n <= most:
            raise pytest.UsageError(f"{name} {n}: it must lie in 1..={most}")
        return n

    return parse


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise pytest.UsageError(f"--step-dir {text!r}: no such directory")
    return text


def pytest_addoption(parser):
    group = parser.getgroup("steadfast step cost")
    group.addoption("--step-runs", type=_positive("--step-runs", 100_000), default=300,
                    help="runs of ten steps in each round (default 300)")
    group.addoption("--step-rounds", type=_positive("--step-rounds", 1_000), default=5,
                    help="rounds of each case; the median is reported (default 5)")
    group.addoption("--step-dir", type=_directory, default=None,
                    help="where SQLite's files go (default: pytest's temporary directory)")


#: What each case measured: (store, way) -> (median µs per step, median
#: context switches per step).
RESULTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def step_results(request) -> dict:
    """Where the cases leave their figures for the closing summary."""
    return request.config.stash.setdefault(RESULTS, {})


def pytest_terminal_summary(terminalreporter, config):
    found = config.stash.get(RESULTS, None)
    if not found:
        return
    write = terminalreporter.write_line
    terminalreporter.section("µs per step, above Rust (target: at most 20), context switches per step")
    for kind in ("memory", "sqlite"):
        rust = found.get((kind, "rust"))
        for way in ("rust", "def", "async-def", "async-steps"):
            got = found.get((kind, way))
            if got is None:
                continue
            us, switches = got
            above = "" if rust is None or way == "rust" else f"{us - rust[0]:+9.1f}"
            write(f"{kind:7} {way:12} {us:9.1f} {above:>9} {switches:6.2f}")
    hand_off = found.get(("to_thread", "call"))
    if hand_off is not None:
        write(f"asyncio.to_thread of a trivial function: {hand_off[0]:.1f} µs a call")
