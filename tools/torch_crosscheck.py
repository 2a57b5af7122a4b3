"""Measure nanoddp's training arithmetic against PyTorch in float64, beside PyTorch's float32.

Every run starts from the same He-scaled weights (N(0, 2/fan_in), zero biases; written here to
a safetensors file for nanoddp's --init), reads the same batches in file order and takes plain
SGD steps (summed cross-entropy / batch). Two measurements, each printed for PyTorch float32
and for nanoddp (every --devices and --precision asked for), against PyTorch float64:

1. Gradients, step by step. At each step of the float64 run, its weights (rounded to float32)
   are the start of one gradient computation in each implementation, compared tensor by
   tensor with float64's gradient at the same weights: ||got - want|| / ||want||. This is the
   arithmetic's own error, free of what earlier steps did. nanoddp's gradient is read exactly
   from its checkpoint: one step with momentum 0.5 from zero velocity leaves velocity = gradient.
   A step where a ReLU input lies within float32's rounding of zero can take the other branch
   in float32 than in float64 and move a whole term: such steps (any tensor off by > 2e-5) are
   counted separately and kept out of the medians.
2. Trajectories, seed by seed: the largest relative deviation of the loss from float64's over
   the steps. lr 0.1 on He-scaled weights is close to the edge of stability, so a deviation of
   1e-7 can grow tenfold per step after one such branch; which seeds it happens on is luck, in
   PyTorch float32 as in nanoddp (about half of the seeds, in each): count them over many.

    bash tools/baselines/setup.sh           # once: the venv with torch, numpy, safetensors
    cargo build --release                   # the binary
    python3 tools/torch_crosscheck.py [--steps 12] [--lr 0.1] [--batch 256] [--seeds 0 1 2 3 4 5 6 7]
        [--gradient-seeds 1] [--devices 1 4] [--precision fp32 fp16] [--nanoddp target/release/nanoddp]
        [--data DIR]
    python3 tools/torch_crosscheck.py --steps 3 --seeds 0 --devices 1 --precision fp32   # a quick look

Exit status 0 when nanoddp fp32 (every device count) meets the project's bar, 1 otherwise:
per tensor, its median gradient error at most 3x PyTorch float32's; on the first seed, its
trajectory deviation below 1e-5 and at most 3x PyTorch float32's. fp16 is reported, not judged.
Needs torch, numpy and safetensors: run with plain python3, it re-runs itself with the Python
of the venv tools/baselines/setup.sh makes (tools/baselines/baseline_python.py says where).
Fashion-MNIST is found where nanoddp looks (--data, $NANODDP_DATA, /usr/share/datasets/fashion-mnist,
./data/fashion-mnist).
"""
import argparse, gzip, json, os, struct, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "baselines"))
import baseline_python  # noqa: E402

baseline_python.reexec_unless_importable("torch", "numpy", "safetensors")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import fashion_mnist  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
p.add_argument("--gradient-seeds", type=int, default=1, help="how many of --seeds the gradients are measured on")
p.add_argument("--devices", type=int, nargs="+", default=[1, 4])
p.add_argument("--precision", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
p.add_argument("--threads", type=int, default=2)
p.add_argument("--nanoddp", default=os.path.join(ROOT, "target", "release", "nanoddp"))
p.add_argument("--data", help="Fashion-MNIST folder (default: where nanoddp looks)")
a = p.parse_args()
try:
    a.data = fashion_mnist.locate(a.data)
except fashion_mnist.DataNotFound as e:
    sys.exit(f"error: {e}")
if not os.path.exists(a.nanoddp):
    sys.exit(f"{a.nanoddp} not found: run `cargo build --release` first, or give --nanoddp")
torch.set_num_threads(a.threads)
FLIP = 2e-5  # a gradient this far off float64's took a different ReLU branch somewhere

NAMES = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}


def lenet(dtype):
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 20, 3), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Conv2d(20, 50, 5), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(800, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10)).to(dtype)


def ours(key):  # PyTorch's parameter name -> nanoddp's
    layer, kind = key.split(".")
    return f"{NAMES[layer]}.{kind}"


def he_init(seed):
    torch.manual_seed(seed)
    net = lenet(torch.float32)
    with torch.no_grad():
        for mod in net:
            if hasattr(mod, "weight"):
                mod.weight.normal_(0, (2.0 / mod.weight[0].numel()) ** 0.5)
                mod.bias.zero_()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def idx_write(path, arr):
    header = struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + np.ascontiguousarray(arr).tobytes())


dataset = fashion_mnist.load(a.data)
train_pixels, train_labels = dataset["train_images"], dataset["train_labels"]
if a.steps * a.batch > len(train_labels):
    sys.exit(f"{a.steps} steps of {a.batch} need {a.steps * a.batch} images; the set has {len(train_labels)}")
pixels = torch.tensor(train_pixels)[:, None]
labels = torch.tensor(train_labels, dtype=torch.long)


def batch(step, dtype):
    s = slice(step * a.batch, (step + 1) * a.batch)
    return pixels[s].to(dtype) / 255, labels[s]


def loss_and_grads(state, dtype, step):
    net = lenet(dtype)
    net.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    x, y = batch(step, dtype)
    loss = torch.nn.functional.cross_entropy(net(x), y, reduction="sum") / a.batch
    loss.backward()
    return loss.item(), {k: p.grad.detach().clone() for k, p in net.named_parameters()}


def torch_trajectory(init, dtype):
    state = {k: v.to(dtype) for k, v in init.items()}
    losses, states = [], []
    for step in range(a.steps):
        states.append(state)
        loss, grads = loss_and_grads(state, dtype, step)
        losses.append(loss)
        state = {k: v - a.lr * grads[k] for k, v in state.items()}
    return losses, states


def nanoddp(tmp, args):
    subprocess.run([a.nanoddp, "train", "--recipe", "chapter", "--shuffle", "none", "--batch", str(a.batch),
                    "--lr", str(a.lr)] + args, check=True, stdout=subprocess.DEVNULL)


def nanoddp_losses(tmp, init_file, devices, precision):
    metrics = os.path.join(tmp, f"m{devices}{precision}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    nanoddp(tmp, ["--init", init_file, "--max-steps", str(a.steps), "--devices", str(devices),
                  "--precision", precision, "--data", a.data, "--metrics", metrics])
    return [r["loss"] for r in map(json.loads, open(metrics)) if "loss" in r]


def nanoddp_gradient(tmp, state32, step, devices, precision):
    """nanoddp's gradient at `state32` on batch `step`: one step from zero velocity with
    momentum 0.5 leaves velocity = gradient exactly (v = 0.5·0 + g)."""
    data = os.path.join(tmp, f"batch{step}")
    if not os.path.isdir(data):
        os.makedirs(data)
        s = slice(step * a.batch, (step + 1) * a.batch)
        idx_write(os.path.join(data, "train-images-idx3-ubyte.gz"), train_pixels[s])
        idx_write(os.path.join(data, "train-labels-idx1-ubyte.gz"), train_labels[s])
        idx_write(os.path.join(data, "t10k-images-idx3-ubyte.gz"), train_pixels[:16])
        idx_write(os.path.join(data, "t10k-labels-idx1-ubyte.gz"), train_labels[:16])
    start, out = os.path.join(tmp, "start.safetensors"), os.path.join(tmp, "after.safetensors")
    save_file({ours(k): v.contiguous() for k, v in state32.items()}, start)
    nanoddp(tmp, ["--init", start, "--max-steps", "1", "--momentum", "0.5", "--devices", str(devices),
                  "--precision", precision, "--data", data, "--save", out, "--overwrite"])
    saved = load_file(out)
    return {k: saved[f"optimizer.velocity.{ours(k)}"] for k in state32}


def relative(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


runs = [(d, pr) for pr in a.precision for d in a.devices]
label = lambda d, pr: f"nanoddp {pr} x{d}"

with tempfile.TemporaryDirectory() as tmp:
    # 1. Gradients along the float64 trajectories of the first --gradient-seeds seeds.
    errors = {"torch fp32": []}
    errors.update({label(d, pr): [] for d, pr in runs})
    gradient_seeds = a.seeds[:max(1, a.gradient_seeds)]
    points = [(step, state64) for seed in gradient_seeds
              for step, state64 in enumerate(torch_trajectory(he_init(seed), torch.float64)[1])]
    for step, state64 in points:
        state32 = {k: v.float() for k, v in state64.items()}
        _, want = loss_and_grads({k: v.double() for k, v in state32.items()}, torch.float64, step)
        _, got = loss_and_grads(state32, torch.float32, step)
        errors["torch fp32"].append({k: relative(got[k], want[k]) for k in want})
        for d, pr in runs:
            got = nanoddp_gradient(tmp, state32, step, d, pr)
            errors[label(d, pr)].append({k: relative(got[k], want[k]) for k in want})
    tensors = list(points[0][1])
    print(f"Gradients against float64 at the same weights, {a.steps} steps of seed(s) "
          f"{' '.join(map(str, gradient_seeds))}: median over the steps of ||got - want|| / ||want|| "
          f"(steps where a ReLU took the other branch, > {FLIP:.0e}, counted and left out)")
    print(f"{'':20}" + "".join(f"{ours(t):>14}" for t in tensors) + f"{'branch steps':>14}")
    medians = {}
    for name, per_step in errors.items():
        # fp16's own rounding is far above FLIP: every step would count, so none is left out.
        fp32 = "fp16" not in name
        clean = [e for e in per_step if not fp32 or max(e.values()) <= FLIP]
        medians[name] = {t: float(np.median([e[t] for e in clean or per_step])) for t in tensors}
        flips = str(len(per_step) - len(clean)) if fp32 else "-"
        print(f"{name:20}" + "".join(f"{medians[name][t]:14.2e}" for t in tensors) + f"{flips:>14}")

    # 2. Trajectories, seed by seed.
    deviation = {name: [] for name in errors}
    for seed in a.seeds:
        init = he_init(seed)
        init_file = os.path.join(tmp, f"init{seed}.safetensors")
        save_file({ours(k): v.contiguous() for k, v in init.items()}, init_file)
        reference, _ = torch_trajectory(init, torch.float64)
        losses = {"torch fp32": torch_trajectory(init, torch.float32)[0]}
        for d, pr in runs:
            losses[label(d, pr)] = nanoddp_losses(tmp, init_file, d, pr)
        for name, ls in losses.items():
            deviation[name].append(max(abs(l - r) / abs(r) for l, r in zip(ls, reference)))
    print(f"\nTrajectories: the largest relative deviation of the loss from float64's over {a.steps} steps "
          f"(lr {a.lr}, batch {a.batch}), per seed, and the median over seeds")
    print(f"{'':20}" + "".join(f"{'seed ' + str(s):>10}" for s in a.seeds) + f"{'median':>10}")
    for name, devs in deviation.items():
        within = sum(v < 1e-5 for v in devs)
        print(f"{name:20}" + "".join(f"{v:10.1e}" for v in devs) + f"{np.median(devs):10.1e}"
              + f"   {within}/{len(devs)} seeds within 1e-5")

# Judged: the arithmetic (gradients at the same weights, where luck plays no part), and the
# trajectory of the first seed (the check as first specified). Which other seeds depart is
# reported above, not judged: a single ReLU branch decides it, in PyTorch float32 as here.
ok = True
first = a.seeds[0]
torch_first = deviation["torch fp32"][0]
print(f"\nThe bar (fp32): median gradient error per tensor <= 3x PyTorch float32's; seed {first}'s "
      "trajectory deviation < 1e-5 and <= 3x PyTorch float32's")
for d, pr in runs:
    if pr != "fp32":
        continue
    name = label(d, pr)
    worst = max(medians[name][t] / medians["torch fp32"][t] for t in tensors)
    traj = deviation[name][0]
    passed = worst <= 3 and traj < 1e-5 and traj <= 3 * torch_first
    ok &= passed
    print(f"  {name}: gradients at most {worst:.2f}x PyTorch float32's (tensor by tensor); seed {first}'s "
          f"trajectory {traj:.1e} = {traj / torch_first:.2f}x PyTorch float32's: "
          f"{'meets' if passed else 'MISSES'} the bar")
sys.exit(0 if ok else 1)
