#!/usr/bin/env python3
"""Baseline: Open MPI's float32 Allreduce(SUM) through mpi4py, K processes on this machine.

What it measures: the time and bus bandwidth of the MPI library's own allreduce for each
world size K in --ranks and each size in --sizes, by the method allreduce_sweep.py describes
(the one allreduce_gloo.py shares, in nccl-tests' units, as `nanoddp bench allreduce` reports).
The README's and docs/allreduce.md's Open MPI column came from this script.

How: for each K it launches itself under mpirun ($MPIRUN, default `mpirun`) as

    mpirun --allow-run-as-root --oversubscribe --bind-to none \
           --mca btl self,vader --mca oob_tcp_if_include lo -np K  python allreduce_mpi.py --worker ...

that is, Open MPI's shared-memory transport only and a loopback-only runtime channel, plus
`--mca mpi_yield_when_idle 1` when K exceeds the CPU count (waiting ranks then yield their
core instead of spinning). Out of place by default (Allreduce(src, dst) on numpy buffers);
--inplace uses MPI.IN_PLACE with an untimed refill. The workers' RESULT line is collected.

    bash tools/baselines/setup.sh           # once: the venv (mpi4py is added when mpirun is there)
    python3 tools/baselines/allreduce_mpi.py --ranks 2 4 8
    python3 tools/baselines/allreduce_mpi.py --ranks 2 --sizes 4KB 16MB --target-s 0.5

Prints a markdown table per K, then one "RESULT {json}" line per K; exit status 1 if any
result was wrong. Run with plain python3 it re-runs itself with the venv's Python. Needs
numpy, mpi4py and Open MPI (`apt-get install openmpi-bin libopenmpi-dev`).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import baseline_python

baseline_python.reexec_unless_importable("numpy", "mpi4py")

import numpy as np  # noqa: E402

import allreduce_sweep as sweep  # noqa: E402
from load_meter import LoadMeter, load_line  # noqa: E402

MPIRUN = os.environ.get("MPIRUN", "mpirun")
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]


def worker(args):
    """One rank, inside mpirun: sweep the sizes; rank 0 prints a RESULT line."""
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, k = comm.Get_rank(), comm.Get_size()
    records = []
    for nbytes in args.sizes:
        n = nbytes // 4
        src = sweep.pattern(n, rank)
        want = sweep.expected(n, k)
        dst = np.zeros_like(src)
        ok = True

        if args.inplace:
            def one():
                dst[...] = src
                comm.Barrier()
                t0 = time.perf_counter()
                comm.Allreduce(MPI.IN_PLACE, [dst, MPI.FLOAT], op=MPI.SUM)
                return time.perf_counter() - t0
        else:
            def one():
                comm.Barrier()
                t0 = time.perf_counter()
                comm.Allreduce([src, MPI.FLOAT], [dst, MPI.FLOAT], op=MPI.SUM)
                return time.perf_counter() - t0

        warm = []
        for _ in range(args.warmup):
            dst.fill(-1)
            warm.append(one())
            ok = ok and bool(np.array_equal(dst, want))
        iters = comm.bcast(sweep.iterations(warm, args), root=0)  # rank 0's choice for all

        times = np.empty(iters, dtype=np.float64)
        dst.fill(-1)
        for it in range(iters):
            times[it] = one()
        ok = ok and bool(np.array_equal(dst, want))

        slowest = np.empty_like(times)
        comm.Allreduce(times, slowest, op=MPI.MAX)  # the slowest rank, per iteration
        all_ok = comm.allreduce(1 if ok else 0, op=MPI.MIN)
        if rank == 0:
            records.append(sweep.size_record(nbytes, k, slowest.tolist(), args.warmup, all_ok))
    if rank == 0:
        library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        print("RESULT " + json.dumps({"baseline": "allreduce_mpi", "mpi4py": mpi4py.__version__,
                                      "mpi": library, "ranks": k, "inplace": args.inplace,
                                      "sizes": records}), flush=True)


def launch(args):
    """For each K: run mpirun on this script's worker mode, print its table."""
    here = os.path.abspath(__file__)
    ncpu = os.cpu_count() or 1
    print(f"# {MPIRUN} {' '.join(MPIRUN_FLAGS + args.mpirun_args)} -np K; "
          f"{'in place' if args.inplace else 'out of place'}; "
          f"+ --mca mpi_yield_when_idle 1 when K > {ncpu} CPUs", flush=True)
    all_ok = True
    for k in args.ranks:
        yield_flags = ["--mca", "mpi_yield_when_idle", "1"] if k > ncpu else []
        cmd = [MPIRUN, *MPIRUN_FLAGS, *yield_flags, *args.mpirun_args, "-np", str(k), sys.executable, here,
               "--worker", "--sizes", *map(str, args.sizes), "--warmup", str(args.warmup),
               "--min-iters", str(args.min_iters), "--max-iters", str(args.max_iters),
               "--target-s", str(args.target_s)] + (["--inplace"] if args.inplace else [])
        meter = LoadMeter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
        except FileNotFoundError:
            sys.exit(f"error: {MPIRUN} not found: apt-get install openmpi-bin libopenmpi-dev (or set MPIRUN)")
        load = meter.stop()
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stdout + proc.stderr)
            sys.exit(f"K={k}: mpirun failed (exit {proc.returncode}): {shlex.join(cmd)}")
        rec = json.loads(lines[-1][len("RESULT "):])
        rec["load"] = load
        print(f"\n## MPI Allreduce ({rec['mpi']}), K = {k}\n")
        print(sweep.table(rec["sizes"]))
        print("\n" + load_line(load), flush=True)
        print("RESULT " + json.dumps(rec), flush=True)
        all_ok = all_ok and all(r["correct"] for r in rec["sizes"])
    return 0 if all_ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_sweep_args(ap, "world sizes K, one mpirun each (default 2 4 8)")
    ap.add_argument("--inplace", action="store_true", help="MPI.IN_PLACE (as gloo's all_reduce is)")
    ap.add_argument("--timeout-s", type=int, default=900, help="limit for one mpirun, seconds")
    ap.add_argument("--mpirun-args", default="", help="extra mpirun arguments, one string")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.mpirun_args = shlex.split(args.mpirun_args)
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
