#!/usr/bin/env python3
"""What a write of new content costs when the pages it needs were freed
long ago, and how that changes after a pause.

Each batch makes N new files (create, write 1 MiB, fsync, rename, as a blob
is stored) and times the write() call alone; the files are removed at the
end of the batch, which frees their pages. On a virtual machine whose host
takes back the memory its guest frees (free page reporting: the kernel
says "Free page reporting enabled" at boot), a page not used lately costs
the host a fault on its first touch, which the guest sees only as a slower
write(). Prints the median, mean, 10th and 90th percentiles of each batch
in microseconds, one line per batch. Only Python's standard library;
nothing of Steadfast runs.

    python3 scripts/new-pages.py --dir DIR --files 500 --batches 3 --pause 30

DIR must exist, on the disk to measure. With --pause S, sleeps S seconds
before each batch after the first, so that the pages the previous batch
freed have time to go back to the host.
"""

import argparse
import os
import statistics
import time


def batch(directory, files, body):
    """Times the write() of `files` new files of `body`; removes them."""
    took = []
    made = []
    try:
        for i in range(files):
            tmp = os.path.join(directory, f".new-pages-{i}.tmp")
            name = os.path.join(directory, f"new-pages-{i}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            made.append(tmp)
            try:
                t = time.perf_counter()
                wrote = os.write(fd, body)
                took.append((time.perf_counter() - t) * 1e6)
                if wrote != len(body):
                    raise OSError(f"{tmp}: wrote {wrote} of {len(body)} bytes")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name)
            made[-1] = name
    finally:
        for path in made:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    took.sort()
    n = len(took)
    return {
        "median_us": round(statistics.median(took)),
        "mean_us": round(statistics.fmean(took)),
        "p10_us": round(took[n // 10]),
        "p90_us": round(took[9 * n // 10]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="an existing directory on the disk to measure")
    ap.add_argument("--files", type=int, default=500, help="files per batch (1 MiB each)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds before each batch after the first")
    args = ap.parse_args()
    if not 10 <= args.files <= 100_000 or not 1 <= args.batches <= 1000:
        ap.error("--files must be 10 to 100000 and --batches 1 to 1000")
    if not 0 <= args.pause <= 3600:
        ap.error("--pause must be 0 to 3600 seconds")
    if not os.path.isdir(args.dir):
        ap.error(f"--dir {args.dir!r} is not an existing directory")
    body = os.urandom(1 << 20)
    for b in range(args.batches):
        if b and args.pause:
            time.sleep(args.pause)
        try:
            took = batch(args.dir, args.files, body)
        except OSError as e:
            # A name of ours already there (never overwritten), a full disk.
            raise SystemExit(f"new-pages.py: batch {b}: {e}") from None
        print({"batch": b, "files": args.files, **took}, flush=True)


if __name__ == "__main__":
    main()
