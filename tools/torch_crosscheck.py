"""Cross-check nanoddp's first training steps against PyTorch.

Both start from the same weights (written here to a safetensors file, N(0, 0.01^2) weights
and zero biases as in the reference chapter), read the same batches in file order, and take
plain SGD steps (lr 0.2, mean cross-entropy over the batch). The per-step losses must agree
to float32 rounding.

    python tools/torch_crosscheck.py [--steps 20] [--nanoddp target/release/nanoddp]

Needs torch, numpy and safetensors (../shared/anchors/setup.sh installs them in a venv).
"""
import argparse, gzip, json, os, struct, subprocess, sys, tempfile

import numpy as np
import torch
from safetensors.torch import save_file

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--nanoddp", default="target/release/nanoddp")
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
a = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(2)
net = torch.nn.Sequential(
    torch.nn.Conv2d(1, 20, 3), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
    torch.nn.Conv2d(20, 50, 5), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(800, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
names = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2"}
with torch.no_grad():
    for mod in net:
        if hasattr(mod, "weight"):
            mod.weight.normal_(0, 0.01)
            mod.bias.zero_()
state = {f"{names[k.split('.')[0]]}.{k.split('.')[1]}": v.contiguous() for k, v in net.state_dict().items()}

def idx(path):
    raw = gzip.open(path).read()
    dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims)

images = torch.tensor(idx(os.path.join(a.data, "train-images-idx3-ubyte.gz")), dtype=torch.float32)[:, None] / 255
labels = torch.tensor(idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz")), dtype=torch.long)

with tempfile.TemporaryDirectory() as tmp:
    init = os.path.join(tmp, "init.safetensors")
    save_file(state, init)
    metrics = os.path.join(tmp, "m.jsonl")
    subprocess.run([a.nanoddp, "train", "--recipe", "chapter", "--init", init, "--shuffle", "none",
                    "--max-steps", str(a.steps), "--batch", str(a.batch), "--data", a.data,
                    "--metrics", metrics], check=True, stdout=subprocess.DEVNULL)
    ours = [json.loads(l)["loss"] for l in open(metrics) if '"step"' in l]

opt = torch.optim.SGD(net.parameters(), lr=0.2)
worst = 0.0
for step in range(a.steps):
    x, y = images[step * a.batch:(step + 1) * a.batch], labels[step * a.batch:(step + 1) * a.batch]
    loss = torch.nn.functional.cross_entropy(net(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    diff = abs(loss.item() - ours[step])
    worst = max(worst, diff / abs(loss.item()))
    print(f"step {step + 1:3}  torch {loss.item():.7f}  nanoddp {ours[step]:.7f}  diff {diff:.2e}")
print(f"largest relative difference: {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
