#!/usr/bin/env python3
"""Baseline: torch.distributed's gloo backend, float32 allreduce(SUM), K processes on this machine.

What it measures: the time and bus bandwidth of gloo's allreduce for each world size K in
--ranks and each size in --sizes, by the method allreduce_sweep.py describes (the one
allreduce_mpi.py shares, in nccl-tests' units, as `nanoddp bench allreduce` reports). The
README's and docs/allreduce.md's gloo column came from this script.

How: K processes (torch.multiprocessing, spawn), one torch thread each, join a gloo process
group over the loopback interface only (GLOO_SOCKET_IFNAME=lo, rendezvous on 127.0.0.1).
gloo's all_reduce is in place, so the buffer is refilled (untimed) before every iteration.
With more ranks than cores the ranks share them, as nanoddp's CPU ranks do.

    bash tools/baselines/setup.sh           # once: the venv with torch
    python3 tools/baselines/allreduce_gloo.py --ranks 2 4 8
    python3 tools/baselines/allreduce_gloo.py --ranks 2 --sizes 4KB 16MB --target-s 0.5

Prints a markdown table per K, then one "RESULT {json}" line per K; exit status 1 if any
result was wrong. Run with plain python3 it re-runs itself with the venv's Python. Needs torch.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

import baseline_python

baseline_python.reexec_unless_importable("torch", "numpy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import allreduce_sweep as sweep  # noqa: E402
from load_meter import LoadMeter, load_line  # noqa: E402


def worker(rank, k, port, args, queue):
    """One rank: join the group, sweep the sizes; rank 0 puts the records on `queue`."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    records = []
    try:
        for nbytes in args.sizes:
            n = nbytes // 4
            src = torch.from_numpy(sweep.pattern(n, rank))
            want = torch.from_numpy(sweep.expected(n, k))
            buf = torch.empty_like(src)
            ok = True

            def one():
                buf.copy_(src)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                return time.perf_counter() - t0

            warm = []
            for _ in range(args.warmup):
                warm.append(one())
                ok = ok and torch.equal(buf, want)
            iters = torch.tensor([sweep.iterations(warm, args)], dtype=torch.int64)
            dist.broadcast(iters, src=0)  # rank 0's choice for all

            times = torch.empty(int(iters.item()), dtype=torch.float64)
            for it in range(times.numel()):
                times[it] = one()
            ok = ok and torch.equal(buf, want)

            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank, per iteration
            all_ok = torch.tensor([1 if ok else 0], dtype=torch.int64)
            dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
            if rank == 0:
                records.append(sweep.size_record(nbytes, k, times.tolist(), args.warmup, all_ok.item()))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put(records)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(k, args):
    """Start K workers, collect rank 0's records, join them all."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    meter = LoadMeter()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, k, port, args, queue)) for r in range(k)]
    for p in procs:
        p.start()
    records = None
    while records is None:  # read before joining: rank 0 exits after putting them
        if not queue.empty():
            records = queue.get()
        elif any(p.exitcode not in (None, 0) for p in procs):
            break
        else:
            time.sleep(0.05)
    for p in procs:
        p.join()
    load = meter.stop()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed or records is None:
        sys.exit(f"K={k}: worker(s) failed with exit codes {failed}")
    return records, load


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_sweep_args(ap, "world sizes K (default 2 4 8)")
    ap.add_argument("--timeout-s", type=int, default=300, help="gloo's collective timeout")
    args = ap.parse_args(argv)

    print(f"# torch {torch.__version__}, gloo, {os.cpu_count()} CPUs, 1 thread per rank, loopback", flush=True)
    all_ok = True
    for k in args.ranks:
        records, load = run_world(k, args)
        print(f"\n## gloo allreduce, K = {k}\n")
        print(sweep.table(records))
        print("\n" + load_line(load), flush=True)
        print("RESULT " + json.dumps({"baseline": "allreduce_gloo", "torch": torch.__version__, "ranks": k,
                                      "load": load, "sizes": records}), flush=True)
        all_ok = all_ok and all(r["correct"] for r in records)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
