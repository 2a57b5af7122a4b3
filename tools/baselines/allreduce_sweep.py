"""The method shared by allreduce_gloo.py and allreduce_mpi.py, so their figures compare.

Both time a float32 SUM allreduce over K processes for each message size:

    per iteration:  barrier; t0; allreduce; t1
    an iteration's time is the slowest rank's t1 - t0; a size's time is the median over the
    timed iterations (min and mean are kept in the JSON); --warmup iterations run first, and
    the number of timed ones is chosen from rank 0's warm-up so that a size takes about
    --target-s seconds, within [--min-iters, --max-iters].

Bandwidths as nccl-tests defines them (its doc/PERFORMANCE.md), and as `nanoddp bench
allreduce` prints them:  algbw = bytes / time,  busbw = algbw * 2 (K - 1) / K,  GB/s = 1e9 B/s.
Sizes are binary (4KB = 4096 bytes).

Correctness: rank r sends x[i] = ((i mod 13) + 1) * (r + 1), so the sum is
((i mod 13) + 1) * K (K + 1) / 2, exact in float32; every warm-up result and the last timed
one are compared element by element with it on every rank.
"""

import argparse
import re
import statistics

import numpy as np

DEFAULT_SIZES = ["4KB", "64KB", "1MB", "16MB", "64MB"]
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text):
    """'4KB' -> 4096, '64MB' -> 67108864, '1000' -> 1000."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"bad size {text!r}: use e.g. 4096, 4KB, 64MB, 1GB")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def size_arg(text):
    """argparse type: a size in bytes that is a positive multiple of 4 (float32)."""
    try:
        n = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive multiple of 4 bytes (float32)")
    return n


def add_sweep_args(ap, ranks_help):
    """The options both sweeps take."""
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help=ranks_help)
    ap.add_argument("--sizes", nargs="+", type=size_arg, default=[size_arg(x) for x in DEFAULT_SIZES],
                    help=f"message sizes, binary units (default {' '.join(DEFAULT_SIZES)})")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    ap.add_argument("--min-iters", type=int, default=10)
    ap.add_argument("--max-iters", type=int, default=500)
    ap.add_argument("--target-s", type=float, default=2.0, help="about this many timed seconds per size")


def pattern(n, rank):
    """Rank `rank`'s input: ((i mod 13) + 1) * (rank + 1), float32."""
    return ((np.arange(n, dtype=np.int64) % 13) + 1).astype(np.float32) * np.float32(rank + 1)


def expected(n, k):
    """The exact sum over K ranks of pattern(n, r)."""
    return ((np.arange(n, dtype=np.int64) % 13) + 1).astype(np.float32) * np.float32(k * (k + 1) // 2)


def iterations(warmup_times, args):
    """How many timed iterations a size gets, from rank 0's warm-up times."""
    estimate = statistics.median(warmup_times) if warmup_times else 1e-3
    return int(min(args.max_iters, max(args.min_iters, args.target_s / max(estimate, 1e-7))))


def size_record(nbytes, k, slowest_times, warmup, correct):
    """One size's figures from the per-iteration times of the slowest rank."""
    median = statistics.median(slowest_times)
    algbw = nbytes / median / 1e9
    return {"bytes": nbytes, "iters": len(slowest_times), "warmup": warmup, "median_s": median,
            "min_s": min(slowest_times), "mean_s": statistics.mean(slowest_times),
            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (k - 1) / k, "correct": bool(correct)}


def fmt_size(nbytes):
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def fmt_time(seconds):
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def table(records):
    """A markdown table of one K's sizes."""
    headers = ["size", "iters", "median time", "algbw GB/s", "busbw GB/s", "correct"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    for r in records:
        cells = [fmt_size(r["bytes"]), r["iters"], fmt_time(r["median_s"]), f"{r['algbw_GBps']:.3f}",
                 f"{r['busbw_GBps']:.3f}", "yes" if r["correct"] else "NO"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
