#!/usr/bin/env python3
"""PyTorch baseline: the reference chapter's LeNet and training loop on the CPU.

What it measures: training speed (images/s of the training loop) and the accuracy reached
by the chapter's from-scratch LeNet on Fashion-MNIST in PyTorch, eager or through
torch.compile or under bf16 autocast. `nanoddp train --recipe chapter` runs the same model
and recipe, so the two are compared on the same machine (tools/speed_table.py alternates
them). The chapter is d2l.ai's "Multiple-GPU Training"
(chapter_computational-performance/multiple-gpus):

    conv 1->20, 3x3, + ReLU + avgpool 2x2
    conv 20->50, 5x5, + ReLU + avgpool 2x2
    flatten (50*4*4 = 800)
    linear 800->128 + ReLU
    linear 128->10

* weights ~ N(0, 1) * 0.01 from a generator seeded with --seed, biases zero;
* loss: cross-entropy summed over the whole minibatch;
* plain SGD, param -= lr * grad / batch_size (the chapter's d2l.sgd, full batch size);
* batch 256, the training set reshuffled every epoch (a generator seeded with --seed + 1),
  the last partial batch kept (the DataLoader default the chapter uses); inputs uint8 / 255.

--ranks K runs the chapter's K-device data parallelism the way the chapter does it on GPUs,
on the one CPU: each batch is split into K shards (torch.chunk, as nn.parallel.scatter),
K parameter copies each run forward and backward on their shard, the gradients are summed
with the chapter's naive allreduce (accumulate into copy 0, copy back), and every copy is
updated. All K "devices" share the CPU, so this measures the scheme's overhead, not a speed-up.

The data is read from the IDX files directly (no torchvision, no download), found where
nanoddp looks (fashion_mnist.py). The timed part of an epoch is the training loop alone (as
d2l.Timer in the chapter); evaluation on the 10k test images is timed separately. Batches
are sliced from an in-memory tensor, no DataLoader: slightly faster than the book's loop.

Output: one line per epoch (train loss, test accuracy, seconds, images/s, and the CPU other
processes used meanwhile), then one JSON line starting with "RESULT " (per-epoch figures in
"per_epoch"; tools/speed_table.py reads it).

    bash tools/baselines/setup.sh           # once: the venv with torch (see its header)
    python3 tools/baselines/torch_lenet.py --epochs 10
    python3 tools/baselines/torch_lenet.py --epochs 3 --compile      # first epoch compiles
    python3 tools/baselines/torch_lenet.py --epochs 3 --amp bf16

--compile compiles into a fresh cache per run (see private_compile_cache), so its first
epoch includes compiling: give it --epochs 3 or more and read the later epochs.

Run with plain python3 it re-runs itself with the venv's Python (baseline_python.py says
where that is). Needs torch and numpy, and Fashion-MNIST (`apt-get install
dataset-fashion-mnist`, or --data).
"""

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import baseline_python

baseline_python.reexec_unless_importable("torch", "numpy")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fashion_mnist  # noqa: E402
from load_meter import LoadMeter, cores, load_line  # noqa: E402


# ---------------------------------------------------------------------------------- data
def as_tensors(data):
    """uint8 arrays -> (train images, train labels, test images, test labels) as torch tensors:
    images float32 [N, 1, 28, 28] in [0, 1] (ToTensor()), labels int64."""
    def images(a):
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1).contiguous()

    def labels(a):
        return torch.from_numpy(a.astype(np.int64))

    return (images(data["train_images"]), labels(data["train_labels"]),
            images(data["test_images"]), labels(data["test_labels"]))


# --------------------------------------------------------------------------------- model
def init_params(seed):
    """The chapter's parameters: N(0, 1) * 0.01 weights (drawn in this order), zero biases."""
    g = torch.Generator().manual_seed(seed)
    scale = 0.01
    W1 = torch.randn(size=(20, 1, 3, 3), generator=g) * scale
    b1 = torch.zeros(20)
    W2 = torch.randn(size=(50, 20, 5, 5), generator=g) * scale
    b2 = torch.zeros(50)
    W3 = torch.randn(size=(800, 128), generator=g) * scale
    b3 = torch.zeros(128)
    W4 = torch.randn(size=(128, 10), generator=g) * scale
    b4 = torch.zeros(10)
    return [W1, b1, W2, b2, W3, b3, W4, b4]


def lenet(X, params):
    """The chapter's functional LeNet (logits)."""
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, params[2], params[3])), kernel_size=2, stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(torch.mm(h2, params[4]) + params[5])
    return torch.mm(h3, params[6]) + params[7]


def replica(params):
    """One device's copy of the parameters (the chapter's get_params)."""
    copy = [p.clone() for p in params]
    for p in copy:
        p.requires_grad_()
    return copy


def allreduce(tensors):
    """The chapter's naive allreduce: sum into tensors[0], then copy it back to the others."""
    for i in range(1, len(tensors)):
        tensors[0][:] += tensors[i]
    for i in range(1, len(tensors)):
        tensors[i][:] = tensors[0]


def sgd(params, lr, batch_size):
    """The chapter's d2l.sgd: param -= lr * grad / batch_size; gradients zeroed."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


class Trainer:
    """The chapter's train_batch and evaluate_accuracy over K replicas.

    forward is lenet or torch.compile(lenet); amp_bf16 runs the forward pass under
    torch.autocast("cpu", bfloat16) (the loss is taken in float32)."""

    def __init__(self, params, ranks, lr, forward, amp_bf16):
        self.replicas = [replica(params) for _ in range(ranks)]
        self.lr, self.forward, self.amp_bf16 = lr, forward, amp_bf16

    def train_batch(self, X, y):
        """One step; returns the batch's summed loss (a 0-d tensor)."""
        k = len(self.replicas)
        X_shards, y_shards = X.chunk(k), y.chunk(k)  # as nn.parallel.scatter splits
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp_bf16):
            losses = [F.cross_entropy(self.forward(Xs, W).float(), ys, reduction="none").sum()
                      for Xs, ys, W in zip(X_shards, y_shards, self.replicas)]
        for loss in losses:
            loss.backward()
        if k > 1:
            with torch.no_grad():
                for i in range(len(self.replicas[0])):
                    allreduce([self.replicas[c][i].grad for c in range(k)])
        for params in self.replicas:
            sgd(params, self.lr, X.shape[0])  # the full batch size
        return sum(loss.detach() for loss in losses)

    def accuracy(self, X, y, batch):
        """Test accuracy of replica 0 (all replicas are equal)."""
        correct = 0
        with torch.no_grad():
            for i in range(0, X.shape[0], batch):
                y_hat = self.forward(X[i:i + batch], self.replicas[0])
                correct += int((y_hat.argmax(dim=1) == y[i:i + batch]).sum())
        return correct / X.shape[0]


def private_compile_cache():
    """Give torch.compile a fresh on-disk cache for this run, unless TORCHINDUCTOR_CACHE_DIR is set.

    Its default cache (/tmp/torchinductor_$USER) is shared by every run on the machine, and an
    entry compiled under other CPU settings (as the AVX2 table's ATEN_CPU_CAPABILITY=avx2 run
    leaves) crashed a later default run here ("malloc(): memory corruption"). Compiling afresh
    costs only the first epoch, which speed_table.py does not count."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return
    folder = tempfile.mkdtemp(prefix="nanoddp-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


# ---------------------------------------------------------------------------------- main
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=1, help="emulated data-parallel ranks (parameter copies)")
    ap.add_argument("--data", help="folder with the four IDX files (default: where nanoddp looks)")
    ap.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none",
                    help="bf16 autocast for the forward pass (PyTorch's CPU mixed precision)")
    ap.add_argument("--train-limit", type=int, default=0,
                    help="use only the first N training images (0 = all): for smoke tests")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.batch < args.ranks:
        ap.error("--ranks must be >= 1 and <= --batch")
    if args.epochs < 1:
        ap.error("--epochs must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    try:
        folder = fashion_mnist.locate(args.data)
        Xtr, ytr, Xte, yte = as_tensors(fashion_mnist.load(folder))
    except (fashion_mnist.DataNotFound, OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    if args.train_limit:
        Xtr, ytr = Xtr[:args.train_limit], ytr[:args.train_limit]
    load_s = time.perf_counter() - t0
    n_train = Xtr.shape[0]
    print(f"# torch {torch.__version__} threads={torch.get_num_threads()} ranks={args.ranks} "
          f"batch={args.batch} lr={args.lr} seed={args.seed} compile={args.compile} amp={args.amp} "
          f"data={folder} train={n_train} test={Xte.shape[0]} data_load={load_s:.2f}s", flush=True)

    if args.compile:
        private_compile_cache()
    forward = torch.compile(lenet) if args.compile else lenet
    trainer = Trainer(init_params(args.seed), args.ranks, args.lr, forward, args.amp == "bf16")
    shuffle = torch.Generator().manual_seed(args.seed + 1)

    epochs = []
    run_meter = LoadMeter()
    for epoch in range(args.epochs):
        meter = LoadMeter()
        perm = torch.randperm(n_train, generator=shuffle)
        loss_sum = torch.zeros(())
        t_start = time.perf_counter()
        for i in range(0, n_train, args.batch):
            idx = perm[i:i + args.batch]
            loss_sum += trainer.train_batch(Xtr.index_select(0, idx), ytr.index_select(0, idx))
        train_s = time.perf_counter() - t_start
        t_eval = time.perf_counter()
        acc = trainer.accuracy(Xte, yte, args.batch)
        eval_s = time.perf_counter() - t_eval
        load = meter.stop()
        rec = {"epoch": epoch + 1, "train_loss": float(loss_sum) / n_train, "test_acc": acc,
               "train_s": train_s, "eval_s": eval_s, "images_per_s": n_train / train_s,
               "others_cores": load["others_cores"]}
        epochs.append(rec)
        print(f"epoch {rec['epoch']:3d}  train loss {rec['train_loss']:.4f}  test acc {acc:.4f}  "
              f"train {train_s:7.2f} s  eval {eval_s:5.2f} s  {rec['images_per_s']:9.1f} img/s  "
              f"(others' cpu {cores(load['others_cores'])} cores)", flush=True)

    run_load = run_meter.stop()
    print("# " + load_line(run_load), flush=True)
    train_times = [e["train_s"] for e in epochs]
    result = {
        "baseline": "torch_lenet", "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "ranks": args.ranks, "compile": args.compile,
        "amp": args.amp, "batch": args.batch, "lr": args.lr, "seed": args.seed,
        "epochs": args.epochs, "n_train": n_train,
        "final_train_loss": epochs[-1]["train_loss"], "final_test_acc": epochs[-1]["test_acc"],
        "mean_train_s_per_epoch": statistics.mean(train_times),
        "median_train_s_per_epoch": statistics.median(train_times),
        "median_images_per_s": n_train / statistics.median(train_times),
        "load": run_load, "per_epoch": epochs,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
