#!/usr/bin/env python3
"""The same LeNet in PyTorch on the same GPU: the yardstick for `nanoddp train --backend cuda`.

    python3 torch_lenet_gpu.py [--data DIR] [--mode eager|compile|graphed|both|all] [--epochs 2] [--batch 256]

The model, data and optimizer match what run.sh gives nanoddp
(`train --backend cuda --epochs 2 --batch 256 --lr 0.1 --momentum 0.9 --weight-decay 0`):

    conv(1->20, 3x3) + ReLU + avgpool 2, conv(20->50, 5x5) + ReLU + avgpool 2, flatten 800,
    linear 800->128 + ReLU, linear 128->10; mean cross-entropy;
    He init (N(0, 2/fan_in) weights, zero biases) and a cosine decay of the learning rate to
    zero over the run, step by step: nanoddp's default recipe (--schedule constant turns it off);
    SGD lr 0.1, momentum 0.9; batch 256, reshuffled every epoch, last partial batch kept;
    inputs uint8 / 255, read straight from the IDX .gz files.

Differences kept on purpose: the data set lives on the GPU (PyTorch's fastest idiom; nanoddp
uploads each batch from host memory), and TF32 is off for convolutions and matmuls (PyTorch
turns it on for cuDNN convolutions by default; nanoddp computes in true fp32): --tf32 allows it.

Modes: eager; torch.compile; graphed, the whole step (the batch's gather from the
device-resident data, forward, backward, the SGD step and the running loss and accuracy)
captured once as a CUDA graph with torch.cuda.graph and replayed, the learning rate a device
tensor the host refills before each replay (PyTorch's whole-network capture recipe; three
warm-up steps on a side stream first, which train too). The epoch's last, partial batch runs
eagerly in graphed mode (a graph has one shape). `both` is eager and compile, `all` adds
graphed.

Timing: the training loop of each epoch, between two torch.cuda.synchronize() calls (test
accuracy is computed after, untimed), as nanoddp times its epochs. With torch.compile the
first epoch includes compilation, in graphed mode the capture; the last epoch is the
steady-state figure.

Prints one line per epoch and one `RESULT {json}` line per mode. Exits 77 (skip) when torch or
a CUDA GPU is missing, 0 on success, 1 on an error.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))


def skip(message):
    print(f"SKIP: {message}", flush=True)
    sys.exit(SKIP)


def default_data():
    for d in (os.path.join(HERE, "data", "fashion-mnist"),  # inside the bundle
              os.path.join(HERE, "..", "..", "tests", "data", "fashion-mnist-subset")):  # in the repo
        if os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")):
            return os.path.normpath(d)
    return "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An unsigned-byte IDX(.gz) file: big-endian magic (0, 0, 0x08, ndim), ndim u32 dims, bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    offset = 4 + 4 * ndim
    if len(raw) - offset != math.prod(dims):
        raise ValueError(f"{path}: {len(raw) - offset} payload bytes for dims {dims}")
    return raw[offset:], dims


def load(torch, data_dir, device):
    def part(name):
        for candidate in (name + ".gz", name):
            p = os.path.join(data_dir, candidate)
            if os.path.exists(p):
                payload, dims = read_idx(p)
                return torch.frombuffer(bytearray(payload), dtype=torch.uint8).reshape(dims)
        raise FileNotFoundError(f"{data_dir}: no {name}(.gz)")

    def images(name):
        return (part(name).to(device).float() / 255.0).unsqueeze(1).contiguous()

    def labels(name):
        return part(name).to(device).long()

    return (images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
            images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"))


def lenet(torch):
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        for m in net:
            if hasattr(m, "weight"):
                fan_in = m.weight[0].numel()
                m.weight.normal_(0.0, math.sqrt(2.0 / fan_in))
                m.bias.zero_()
    return net


def train(torch, args, data, mode):
    if mode == "graphed":
        return train_graphed(torch, args, data)
    F = torch.nn.functional
    xtr, ytr, xte, yte = data
    torch.manual_seed(args.seed)
    net = lenet(torch).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    # dynamic=False: one static graph per batch shape (256 and the last partial batch); the
    # default would recompile for dynamic shapes at the partial batch and run epoch 2 on those.
    forward = torch.compile(net, dynamic=False) if mode == "compile" else net
    n = xtr.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    total = steps_per_epoch * args.epochs
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    step, per_epoch = 0, []
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(n, device="cuda", generator=gen)
        loss_sum = torch.zeros((), device="cuda")
        correct = torch.zeros((), device="cuda", dtype=torch.long)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for b in range(steps_per_epoch):
            idx = perm[b * args.batch:(b + 1) * args.batch]
            x, y = xtr[idx], ytr[idx]
            out = forward(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            lr = args.lr
            if args.schedule == "cosine":
                lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            loss_sum += loss.detach() * y.shape[0]
            correct += (out.detach().argmax(1) == y).sum()
            step += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        per_epoch.append(epoch_record(torch, args, net, data, mode, epoch, n,
                                      loss_sum.item(), correct.item(), seconds))
    return report(mode, args, n, per_epoch)


def epoch_record(torch, args, net, data, mode, epoch, n, loss_sum, correct, seconds):
    _, _, xte, yte = data
    with torch.no_grad():
        test_correct = sum(int((net(xte[i:i + args.batch]).argmax(1) == yte[i:i + args.batch]).sum())
                           for i in range(0, xte.shape[0], args.batch))
    rec = {"epoch": epoch, "train_loss": loss_sum / n, "train_acc": correct / n,
           "test_acc": test_correct / xte.shape[0], "seconds": seconds, "images_per_s": n / seconds}
    print(f"torch {mode:7}  epoch {epoch:>3}  loss {rec['train_loss']:.4f}  train acc {rec['train_acc']:.4f}  "
          f"test acc {rec['test_acc']:.4f}  {seconds:.2f} s  {rec['images_per_s']:.0f} img/s", flush=True)
    return rec


def train_graphed(torch, args, data):
    """The whole step as one CUDA graph, replayed for every full batch."""
    F = torch.nn.functional
    xtr, ytr, _, _ = data
    torch.manual_seed(args.seed)
    net = lenet(torch).cuda()
    # torch.optim.SGD's update written out with the rate as a device tensor: its own code
    # turns a tensor rate into a Python number, a host read that a capture refuses. The same
    # arithmetic (dampening 0, not Nesterov; the first step's buffer is the gradient).
    lr = torch.tensor(args.lr, device="cuda")
    params = list(net.parameters())
    velocity = [torch.zeros_like(p) for p in params]

    def sgd():
        with torch.no_grad():
            for p, v in zip(params, velocity):
                g = p.grad if args.weight_decay == 0 else p.grad.add(p, alpha=args.weight_decay)
                v.mul_(args.momentum).add_(g)
                p.sub_(v * lr)
                p.grad.zero_()

    n = xtr.shape[0]
    full = n // args.batch
    steps_per_epoch = (n + args.batch - 1) // args.batch
    total = steps_per_epoch * args.epochs
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    idx = torch.zeros(args.batch, device="cuda", dtype=torch.long)
    loss_sum = torch.zeros((), device="cuda")
    correct = torch.zeros((), device="cuda", dtype=torch.long)

    def step(index):
        x, y = xtr[index], ytr[index]
        out = net(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        sgd()
        loss_sum.add_(loss.detach() * y.shape[0])
        correct.add_((out.detach().argmax(1) == y).sum())

    # Warm-up on a side stream (allocations, cuDNN's choices, the optimizer's state), then
    # the capture: PyTorch's recipe. The warm-up steps train on the first batch.
    idx.copy_(torch.arange(args.batch, device="cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(idx)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(idx)
    step_no, per_epoch = 0, []
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(n, device="cuda", generator=gen)
        loss_sum.zero_()
        correct.zero_()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for b in range(steps_per_epoch):
            rate = args.lr
            if args.schedule == "cosine":
                rate = args.lr * 0.5 * (1.0 + math.cos(math.pi * step_no / total))
            lr.fill_(rate)
            if b < full:
                idx.copy_(perm[b * args.batch:(b + 1) * args.batch])
                graph.replay()
            else:
                step(perm[b * args.batch:])
            step_no += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        per_epoch.append(epoch_record(torch, args, net, data, "graphed", epoch, n,
                                      loss_sum.item(), correct.item(), seconds))
    return report("graphed", args, n, per_epoch)


def report(mode, args, n, per_epoch):
    last = per_epoch[-1]
    result = {"mode": mode, "epochs": args.epochs, "batch": args.batch, "train_images": n,
              "images_per_s_last_epoch": round(last["images_per_s"]),
              "images_per_s_per_epoch": [round(r["images_per_s"]) for r in per_epoch],
              "test_acc": last["test_acc"], "train_loss": last["train_loss"]}
    print("RESULT " + json.dumps(result), flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=default_data(), help="folder with the four IDX(.gz) files")
    ap.add_argument("--mode", choices=["eager", "compile", "graphed", "both", "all"], default="both")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in convolutions and matmuls")
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        skip(f"PyTorch is not importable by {sys.executable}: {e}")
    if not torch.cuda.is_available():
        skip(f"torch {torch.__version__} sees no usable CUDA GPU (torch.cuda.is_available() is False; "
             f"built for CUDA {torch.version.cuda})")
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}) on "
          f"{torch.cuda.get_device_name(0)}; data {args.data}; batch {args.batch}, {args.epochs} epochs, "
          f"SGD lr {args.lr} momentum {args.momentum} weight decay {args.weight_decay}, {args.schedule} schedule, "
          f"TF32 {'on' if args.tf32 else 'off'}", flush=True)
    data = load(torch, args.data, "cuda")

    modes = {"both": ["eager", "compile"], "all": ["eager", "compile", "graphed"]}.get(args.mode, [args.mode])
    skipped = []
    for mode in modes:
        if mode == "compile" and not hasattr(torch, "compile"):
            skipped.append(f"torch.compile is not in torch {torch.__version__}")
            print(f"SKIP: {skipped[-1]}", flush=True)
            continue
        try:
            train(torch, args, data, mode)
        except Exception as e:
            if mode != "compile":
                raise
            # torch.compile needs Triton and a C compiler; its absence is a skip, not a failure.
            skipped.append(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            print(f"SKIP: {skipped[-1]}", flush=True)
    if skipped and len(skipped) == len(modes):
        sys.exit(SKIP)


if __name__ == "__main__":
    main()
