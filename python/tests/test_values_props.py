"""Property tests of the value boundary: every JSON-compatible Python value a
step returns comes back equal (from the step, from a resume, from show), and
every value that is not is refused with the path where it sits and nothing
written. Random values from a seeded generator (no extra dependency); set
STEADFAST_VALUE_CASES for more."""

from __future__ import annotations

import math
import os
import random
import string

import pytest

import steadfast

CASES = int(os.environ.get("STEADFAST_VALUE_CASES", "300"))
KEY_CHARS = string.ascii_letters + string.digits + " _-.$[]\"'<>&/\\é中🙂"


def key(rng: random.Random) -> str:
    # Now and then the key that marks bytes and escaped dicts when stored.
    if rng.random() < 0.05:
        return "$py"
    return "".join(rng.choice(KEY_CHARS) for _ in range(rng.randint(1, 8)))


def scalar(rng: random.Random):
    kind = rng.randrange(8)
    if kind == 7:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randint(-(10**12), 10**12)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 0.1, 1e300, -1e-300, 5e-324, rng.uniform(-1e6, 1e6)])
    if kind == 4:
        return "".join(rng.choice(KEY_CHARS + "\n\t\u0000\u2028") for _ in range(rng.randint(0, 12)))
    if kind == 5:
        return []
    return {}


def value(rng: random.Random, depth: int = 0):
    if depth > 4 or rng.random() < 0.4:
        return scalar(rng)
    if rng.random() < 0.5:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {key(rng): value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def same(a, b) -> bool:
    """Equality that tells 1 from 1.0 and True from 1, as JSON does; -0.0 may come back as 0.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_json_values_come_back_equal(tmp_path) -> None:
    rng = random.Random(20261130)
    store = steadfast.open_store(f"sqlite:{tmp_path}/runs.db")
    for i in range(CASES):
        v = value(rng)

        @steadfast.durable("echo")
        async def echo(ctx):
            first = await ctx.step("make", lambda: v)
            await ctx.gate("hold")
            return first

        out = echo.run(f"r{i}", store)
        assert out.waiting
        steadfast.approve(store, f"r{i}", "hold")
        calls = []

        @steadfast.durable("echo")
        async def echo_again(ctx):
            # On the resume the step is not run: its saved value comes back.
            first = await ctx.step("make", lambda: calls.append(1) or "ran again")
            await ctx.gate("hold")
            return first

        back = echo_again.run(f"r{i}", store).value
        assert calls == []
        assert same(back, v), (v, back)
        assert same(steadfast.show(store, f"r{i}")["state"]["make"], v)


class Opaque:
    pass


def poison(rng: random.Random):
    return rng.choice([math.nan, math.inf, -math.inf, 2**64, -(2**63) - 1, {1: "x"}, {("a",): 1}, {1, 2}, bytearray(b"raw"), Opaque(), 1j])


def plant(rng: random.Random, v, bad, path="$"):
    """Puts `bad` somewhere inside a container built around `v`; returns the value and the path."""
    if rng.random() < 0.3:
        return bad, path
    if rng.random() < 0.5:
        items = [v, v]
        i = rng.randrange(2)
        items[i], p = plant(rng, v, bad, f"{path}[{i}]")
        return items, p
    k = rng.choice(["a", "b_c", "d1"])
    inner, p = plant(rng, v, bad, f"{path}.{k}")
    return {k: inner, "ok": 1}, p


def test_values_that_cannot_be_stored_are_refused_with_their_path() -> None:
    rng = random.Random(7)
    store = steadfast.open_store("memory:")
    for i in range(CASES):
        bad = poison(rng)
        v, path = plant(rng, value(rng), bad)
        wf = steadfast.Workflow("w")
        wf.step("make", lambda ctx, state, v=v: {"out": v}, retries=0)
        with pytest.raises(steadfast.InvalidValue) as e:
            steadfast.run(f"r{i}", wf, store)
        where = "$.out" + path[1:]
        assert f"`{where}`" in str(e.value), (where, str(e.value))
        assert steadfast.show(store, f"r{i}")["state"] == {}


def test_bytes_and_dicts_that_look_like_marks_round_trip_exactly(tmp_path) -> None:
    """A step's bytes (a file it read, 1 MiB of them: stored once, as a blob)
    come back as the same bytes, from the step on a resume and from show; a
    dict of the caller's that uses the key that marks bytes comes back as it
    was, and a bytearray is refused with its path."""
    rng = random.Random(11)
    blob = bytes(rng.randrange(256) for _ in range(1 << 20))
    looks = {"$py": "bytes", "base64": "AAAA"}
    store = steadfast.open_store(f"sqlite:{tmp_path}/runs.db")
    calls = []

    @steadfast.durable("reader")
    async def reader(ctx):
        data = await ctx.step("read", lambda: calls.append(1) or blob)
        again = await ctx.step("reread", lambda: {"copy": blob, "looks": looks, "list": [b"", b"\x00"]})
        await ctx.gate("hold")
        return [data, again]

    assert reader.run("r", store).waiting
    steadfast.approve(store, "r", "hold")
    out = reader.run("r", store).value
    assert calls == [1]
    assert out[0] == blob and type(out[0]) is bytes
    assert out[1] == {"copy": blob, "looks": looks, "list": [b"", b"\x00"]}
    state = steadfast.show(store, "r")["state"]
    assert state["read"] == blob
    assert state["reread"]["looks"] == looks
    wf = steadfast.Workflow("w")
    wf.step("make", lambda ctx, state: {"out": [1, bytearray(b"x")]}, retries=0)
    with pytest.raises(steadfast.InvalidValue) as e:
        steadfast.run("bad", wf, store)
    assert "`$.out[1]`" in str(e.value)


def test_the_key_that_marks_bytes_is_not_a_state_key() -> None:
    """A state key `$py` would be read back as a marked value: a listed step
    that returns it and a durable step named so are refused, nothing written."""
    store = steadfast.open_store("memory:")
    wf = steadfast.Workflow("w")
    wf.step("make", lambda ctx, state: {"$py": "bytes"}, retries=0)
    with pytest.raises(steadfast.InvalidValue) as e:
        steadfast.run("listed", wf, store)
    assert "`$.$py`" in str(e.value)
    assert steadfast.show(store, "listed")["state"] == {}

    @steadfast.durable("named")
    async def named(ctx):
        return await ctx.step("$py", lambda: 1)

    with pytest.raises(steadfast.InvalidInput) as e:
        named.run("durable", store)
    assert "$py" in str(e.value)
