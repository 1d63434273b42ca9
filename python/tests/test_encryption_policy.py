"""One policy for opening a store, shared with the Rust library and the CLI.

With ``STEADFAST_ENCRYPTION_KEY`` set, a run made from Python is sealed in
the store (no value in clear text in the database file), and the
``steadfast`` command opens it with the same key; without the key, Python
refuses the sealed run instead of reading it as plain values.

The command is ``$STEADFAST_BIN``, else the workspace's
``target/debug/steadfast`` (built by ``cargo test``). Without it the test is
skipped, except under CI (``$CI`` set), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import steadfast

KEYS = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
SECRET = "the-launch-code-is-0000"


def test_a_key_in_the_environment_seals_python_runs_and_the_cli_reads_them(tmp_path, steadfast_cli, monkeypatch):
    cli = steadfast_cli
    db = tmp_path / "runs.db"
    url = f"sqlite:{db}"
    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", KEYS)
    wf = steadfast.Workflow("secretive")
    wf.step("keep", lambda ctx, state: {"secret": SECRET})
    out = steadfast.run("s1", wf, steadfast.open_store(url))
    assert out.completed and out.state["secret"] == SECRET

    # Sealed in the file: the value is nowhere in clear text.
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("runs.db"))
    assert SECRET.encode() not in raw

    env = dict(os.environ, STEADFAST_ENCRYPTION_KEY=KEYS)
    shown = subprocess.run(
        [cli, "--store", url, "show", "s1", "--json"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"]["secret"] == SECRET

    # Without the key: refused, by Python as by the command, never read as plain values.
    monkeypatch.delenv("STEADFAST_ENCRYPTION_KEY")
    with pytest.raises(steadfast.SteadfastError, match="encrypted"):
        steadfast.show(steadfast.open_store(url), "s1")
    env.pop("STEADFAST_ENCRYPTION_KEY")
    refused = subprocess.run([cli, "--store", url, "show", "s1"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "encrypted" in refused.stderr


@pytest.mark.parametrize("value", ["garbage", "k1:", "k1:" + "A" * 10, " "])
def test_a_key_that_cannot_be_used_is_refused_before_the_store_is_made(tmp_path, monkeypatch, value):
    monkeypatch.setenv("STEADFAST_ENCRYPTION_KEY", value)
    db = tmp_path / "new" / "runs.db"
    with pytest.raises(steadfast.SteadfastError):
        steadfast.open_store(f"sqlite:{db}")
    assert not (tmp_path / "new").exists()
