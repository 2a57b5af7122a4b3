#!/usr/bin/env python3
"""The README's speed table: nanoddp and PyTorch alternated in one sitting on this machine.

What it measures: training throughput (images/s) of `nanoddp train --recipe chapter` at fp32,
fp16 and bf16 on 1 and 4 devices, and of the same model and recipe in PyTorch on the CPU
(tools/baselines/torch_lenet.py: eager, `--compile` and `--amp bf16`), on the full
Fashion-MNIST. Each cycle trains every configuration once for a few epochs, in an order that
alternates the two programs, so the machine's drift touches both alike. The figure of a run
is its median images/s over the steady epochs (the first is warm-up, and compilation for
`--compile`); the table gives the median over cycles and the ratios nanoddp / PyTorch. It
prints the CPU model, its half-precision features, the PyTorch version and the instruction
paths nanoddp computed with (`nanoddp info`), so a table says which machine and which paths
it measured.

    bash tools/baselines/setup.sh                    # once: the venv with torch
    cargo build --release                            # the binary
    python3 tools/speed_table.py                     # 2 cycles of 3 epochs (13 minutes or more on 2 cores)
    python3 tools/speed_table.py --cycles 3 --epochs 4 --threads 2
    python3 tools/speed_table.py --only "fp32, 1 device" "eager"     # a subset of the rows
    python3 tools/speed_table.py --cycles 1 --epochs 2 --data tests/data/fashion-mnist-subset
                                                     # a one-minute smoke test (figures meaningless)

The AVX2 table of the README holds both programs to AVX2:
`NANODDP_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python3 tools/speed_table.py`.

Needs the release binary and the baselines' venv (tools/baselines/setup.sh; its Python is
found where that script puts it, $NANODDP_BASELINES_VENV or
${XDG_CACHE_HOME:-~/.cache}/nanoddp-baselines/venv, or give --python). This script itself
needs only Python 3's standard library. Both programs find Fashion-MNIST the same way
(--data, else $NANODDP_DATA, else /usr/share/datasets/fashion-mnist, else ./data/fashion-mnist).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "tools" / "baselines"
sys.path.insert(0, str(BASELINES))
import baseline_python  # noqa: E402  (standard library only: where the venv is)

# (label, extra arguments of `nanoddp train`)
NANODDP_RUNS = [
    ("nanoddp fp32, 1 device", ["--devices", "1"]),
    ("nanoddp fp32, 4 devices", ["--devices", "4"]),
    ("nanoddp fp16, 1 device", ["--devices", "1", "--precision", "fp16"]),
    ("nanoddp fp16, 4 devices", ["--devices", "4", "--precision", "fp16"]),
    ("nanoddp bf16, 1 device", ["--devices", "1", "--precision", "bf16"]),
    ("nanoddp bf16, 4 devices", ["--devices", "4", "--precision", "bf16"]),
]
# (label, extra arguments of torch_lenet.py)
TORCH_RUNS = [
    ("PyTorch eager", []),
    ("PyTorch --compile", ["--compile"]),
    ("PyTorch --amp bf16", ["--amp", "bf16"]),
]
# Which PyTorch figure each nanoddp precision is compared with, as the issue names them.
COMPARE = {
    "fp32": ["PyTorch eager", "PyTorch --compile"],
    "fp16": ["PyTorch --amp bf16"],
    "bf16": ["PyTorch --amp bf16"],
}


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def cpu_half_features():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    wanted = ["avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]
    return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted)


def nanoddp_paths(binary):
    info = subprocess.run([binary, "info"], capture_output=True, text=True, check=True).stdout
    lines = [l.strip() for l in info.splitlines() if "computes with" in l]
    return lines[0] if lines else "(nanoddp info names no CPU paths)"


def steady_median(per_epoch):
    steady = per_epoch[1:] or per_epoch
    return statistics.median(steady)


def torch_version(python):
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run_nanoddp(binary, args, extra, threads):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.jsonl"
        cmd = [binary, "train", "--recipe", "chapter", "--epochs", str(args.epochs),
               "--metrics", str(metrics)] + extra
        if args.data:
            cmd += ["--data", args.data]
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        ips = [json.loads(l)["images_per_s"] for l in metrics.read_text().splitlines()
               if '"images_per_s"' in l]
    return steady_median(ips)


def run_torch(python, args, extra, threads):
    cmd = [python, str(BASELINES / "torch_lenet.py"), "--epochs", str(args.epochs),
           "--threads", str(threads)] + extra
    if args.data:
        cmd += ["--data", args.data]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result = next(l for l in out.splitlines() if l.startswith("RESULT "))
    per_epoch = [e["images_per_s"] for e in json.loads(result[len("RESULT "):])["per_epoch"]]
    return steady_median(per_epoch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=2, help="rounds of every configuration (default 2)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is not counted (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both programs (default: all cores)")
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "nanoddp"))
    ap.add_argument("--python", default=baseline_python.venv_python(),
                    help="a Python with torch (default: the venv tools/baselines/setup.sh makes)")
    ap.add_argument("--data", help="Fashion-MNIST folder for both programs (default: where nanoddp looks)")
    ap.add_argument("--only", nargs="+", metavar="TEXT",
                    help="run only the configurations whose label contains one of these texts")
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be at least 2: the first epoch is warm-up and not counted")
    if not Path(args.binary).exists():
        sys.exit(f"{args.binary} not found: run `cargo build --release` first")
    if not Path(args.python).exists():
        sys.exit(f"{args.python} not found: run `{baseline_python.SETUP_LINE}`, or give --python")

    print(f"CPU: {cpu_model()} ({os.cpu_count()} threads; {args.threads} used)")
    print(f"CPU half-precision features: {cpu_half_features()}")
    print(f"nanoddp: {nanoddp_paths(args.binary)}")
    print(f"PyTorch {torch_version(args.python)} ({args.python})")
    print(f"{args.cycles} cycles of {args.epochs} epochs, chapter recipe, batch 256; "
          "figures are medians of the steady epochs, then over cycles", flush=True)

    # Alternate: nanoddp, PyTorch, nanoddp, ... within each cycle.
    order = []
    n_runs = [("nanoddp", r) for r in NANODDP_RUNS]
    t_runs = [("torch", r) for r in TORCH_RUNS]
    while n_runs or t_runs:
        if n_runs:
            order.append(n_runs.pop(0))
        if t_runs:
            order.append(t_runs.pop(0))
    if args.only:
        order = [o for o in order if any(text in o[1][0] for text in args.only)]
    figures = {label: [] for _, (label, _) in order}
    for cycle in range(args.cycles):
        for kind, (label, extra) in order:
            if kind == "nanoddp":
                ips = run_nanoddp(args.binary, args, extra, args.threads)
            else:
                ips = run_torch(args.python, args, extra, args.threads)
            figures[label].append(ips)
            print(f"  cycle {cycle + 1}: {label:26s} {ips:9.0f} images/s", flush=True)

    med = {label: statistics.median(v) for label, v in figures.items() if v}
    print()
    print("| | images/s | vs PyTorch |")
    print("|---|---:|---|")
    for label, value in med.items():
        ratios = ""
        m = re.match(r"nanoddp (\w+),", label)
        if m:
            ratios = ", ".join(f"{value / med[t]:.2f}x {t.removeprefix('PyTorch ')}"
                               for t in COMPARE[m.group(1)] if t in med)
        print(f"| {label} | {value:,.0f} | {ratios} |")


if __name__ == "__main__":
    main()
