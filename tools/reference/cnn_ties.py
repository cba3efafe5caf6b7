"""The CNN's first-batch gradients of tools/reference/make_golden.py, on every
device torch has here, against the CPU golden and against float64: how far a
different (but correct) fp32 convolution moves the conv gradients.

Max pooling routes a window's gradient to one maximum. Fashion-MNIST's flat
backgrounds give the first batch tens of thousands of windows whose maximum
is tied or nearly tied, so a convolution whose fp32 sums round differently
(a GPU's tiling, cuDNN's algorithms) sends some of those gradients to another
element. Run: python3 tools/reference/cnn_ties.py (torch; CUDA if present).

With --write DIR on a CUDA machine it also writes the CUDA goldens the GPU
tests compare with: the first batch (cnn_cuda_first_batch.safetensors), 8
Adam steps as in make_golden.py (cnn_cuda_trace.json,
cnn_cuda_final.safetensors), on cuda:0 in fp32 without TF32, deterministic.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

DTYPES = {"F32": np.float32, "F64": np.float64}


def read_safetensors(path):
    """name -> float tensor, without the safetensors package."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=DTYPES[meta["dtype"]]).reshape(meta["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def grads(init, x, y, device, dtype):
    m = mg.Cnn().to(device=device, dtype=dtype)
    m.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in init.items()})
    loss = F.cross_entropy(m(x.to(device=device, dtype=dtype)), y.to(device))
    loss.backward()
    return {n: p.grad.detach().double().cpu() for n, p in m.named_parameters()}


def max_rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def write_cuda_goldens(init, x, y, out, device="cuda"):
    """PyTorch's CUDA run of make_golden.py's CNN job (x, y: its 8 batches), written
    beside the CPU one; `device="cpu"` reproduces the CPU golden (a self-check)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    steps = mg.STEPS["cnn"]
    n = steps * mg.BATCH_SIZE
    if len(x) < n:
        raise ValueError(f"{steps} steps need {n} samples, got {len(x)}")
    model = mg.Cnn().to(device)
    model.load_state_dict({k: v.to(device) for k, v in init.items()})
    opt, hp = mg.make_optimizer("adam", model.parameters())
    losses, first = mg.train(model, opt, x[:n].to(device), y[:n].to(device), steps,
                             capture_first=True)
    first = {k: v.cpu() for k, v in first.items()}
    mg.write_safetensors(first, os.path.join(out, "cnn_cuda_first_batch.safetensors"))
    mg.write_safetensors({k: v.cpu() for k, v in model.state_dict().items()},
                         os.path.join(out, "cnn_cuda_final.safetensors"))
    obj = mg.trace("cnn", steps, "adam", mg.SEEDS["cnn"], hp, losses, y[:mg.BATCH_SIZE].tolist(),
                   x[:mg.BATCH_SIZE])
    obj["device"] = torch.cuda.get_device_name(0) if device == "cuda" else device
    obj["note"] = "PyTorch on CUDA (cuDNN, fp32, TF32 off, deterministic): tools/reference/cnn_ties.py"
    mg.write_json(obj, os.path.join(out, "cnn_cuda_trace.json"))
    print(f"wrote the CUDA goldens to {out}: losses {losses[0]:.6f} ... {losses[-1]:.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", metavar="DIR", help="also write the CUDA goldens into DIR")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    # The 8 batches of make_golden.py's CNN job; the comparisons use the first.
    xs, ys = mg.load_split(os.path.join(root, "data/fashion-mnist"), "train",
                           mg.STEPS["cnn"] * mg.BATCH_SIZE)
    x, y = xs[:mg.BATCH_SIZE], ys[:mg.BATCH_SIZE]
    gold = os.path.join(root, "testdata/golden")
    init = read_safetensors(os.path.join(gold, "cnn_init.safetensors"))
    first = read_safetensors(os.path.join(gold, "cnn_first_batch.safetensors"))
    exact = grads(init, x, y, "cpu", torch.float64)
    runs = [("cpu fp32", "cpu")] + ([("cuda fp32 (cuDNN, no TF32)", "cuda")] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}")
    for what, dev in runs:
        g = grads(init, x, y, dev, torch.float32)
        for n in exact:
            print(f"{what:28} {n:13} vs golden {max_rel(g[n], first['grad.' + n].double()):.2e}"
                  f"   vs float64 {max_rel(g[n], exact[n]):.2e}")
    if args.write:
        if not torch.cuda.is_available():
            sys.exit("--write needs a CUDA device")
        write_cuda_goldens(init, xs, ys, args.write)


if __name__ == "__main__":
    main()
