#!/usr/bin/env python3
"""What SQLite itself charges for a new large value, beside the disk.

Inserts one new value of --mib MiB per transaction (BEGIN IMMEDIATE, INSERT,
COMMIT; synchronous=FULL) into a fresh database in each of three layouts:
WAL with SQLite's default 4 KiB pages (the store's layout), WAL with 64 KiB
pages, and a rollback journal (TRUNCATE), where pages appended past the end
of the file need no copy in the journal. Beside them, the raw write of the
same bytes plus fsync. Prints the median and the mean milliseconds of each
(SQLite copies its log back into the database in about one transaction in
four, at its default of 1,000 pages, which the mean counts and the median
mostly does not), one line per round. Only Python's standard library;
nothing of Steadfast runs.

    python3 scripts/sqlite-large-values.py --dir DIR --rounds 3

DIR must exist, on the disk to measure (a temporary directory of the
system's may be in memory).
"""

import argparse
import os
import sqlite3
import statistics
import tempfile
import time

LAYOUTS = {
    "wal_4k": ("wal", None),
    "wal_64k": ("wal", 65536),
    "truncate_4k": ("truncate", None),
}


def insert_ms(directory, name, body, n):
    journal, page = LAYOUTS[name]
    path = os.path.join(directory, f"{name}.db")
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    db = sqlite3.connect(path, isolation_level=None)
    try:
        if page:
            db.execute(f"PRAGMA page_size={page}")
        db.execute(f"PRAGMA journal_mode={journal}")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE blobs (hash BLOB PRIMARY KEY, body BLOB)")
        samples = []
        for _ in range(n):
            # New content each time, as a new value is.
            value = os.urandom(32) + body[32:]
            start = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO blobs VALUES (?, ?)", (value[:32], value))
            db.execute("COMMIT")
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples), statistics.fmean(samples)
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(path + suffix)
            except FileNotFoundError:
                pass


def raw_ms(directory, body, n):
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        samples = []
        for i in range(n):
            start = time.perf_counter()
            os.pwrite(fd, body, (i % 64) * len(body))
            os.fsync(fd)
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples), statistics.fmean(samples)
    finally:
        os.close(fd)
        os.remove(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="a directory on the disk to measure (default: a new temporary one)")
    p.add_argument("--mib", type=int, default=1, help="the value's size in MiB (1 to 64)")
    p.add_argument("--n", type=int, default=100, help="transactions per layout and round (10 to 10000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (1 to 20)")
    a = p.parse_args()
    if not 1 <= a.mib <= 64 or not 10 <= a.n <= 10000 or not 1 <= a.rounds <= 20:
        p.error("--mib must be 1 to 64, --n 10 to 10000, --rounds 1 to 20")
    body = os.urandom(a.mib << 20)
    with tempfile.TemporaryDirectory(dir=a.dir) as directory:
        for _ in range(a.rounds):
            row = {name: insert_ms(directory, name, body, a.n) for name in LAYOUTS}
            row["raw_write_fsync"] = raw_ms(directory, body, a.n)
            print(
                "  ".join(f"{k} {m:.3f}/{avg:.3f}" for k, (m, avg) in row.items()),
                "(ms, median/mean)",
                flush=True,
            )


if __name__ == "__main__":
    main()
