#!/usr/bin/env python3
"""PyTorch reference workloads for the Redline benchmark (bench/run.sh).

Trains the same models as `redline train` on Fashion-MNIST on the CPU and prints ONE JSON
line with the results on stdout (everything else goes to stderr).

Workloads (--workload):
  tutorial  the PyTorch "Quickstart" pipeline: torchvision datasets.FashionMNIST with
            ToTensor() + Normalize((0.5,), (0.5,)) and DataLoader(batch_size, shuffle=True)
            (num_workers=0, as in the tutorial).
  tensor    the whole split as one pre-normalised float32 tensor (N,1,28,28); each epoch
            draws torch.randperm(N) and slices batches of --batch-size from it.
  graph     PyTorch's strongest GPU loop (CUDA only): the tensor workload with the whole
            training step (batch gather from the resident split by a static index tensor,
            forward, loss, backward, Adam(capturable=True), the on-device loss sum)
            captured once with torch.cuda.graph after 3 warm-up steps on a side stream
            (their updates are undone before timing) and replayed per full batch; the
            shorter last batch runs eagerly. Each replay is preceded by one copy of the
            batch's indices into the static index tensor.

Models (--model): mlp (Flatten-Linear(784,128)-ReLU-Linear(128,10)) or cnn
(Conv(1,32,3,p1)-ReLU-MaxPool2-Conv(32,64,3,p1)-ReLU-MaxPool2-Flatten-Linear(3136,128)-ReLU-
Linear(128,10)). Optimiser Adam, cross-entropy loss.

Timing: time.perf_counter() around each epoch's training loop only (the data pipeline is
inside it, as it is part of training; evaluation is not). Test accuracy is measured on the
10k test split after the last epoch.

The data comes from the repository's data/fashion-mnist/ (IDX, gzipped). Nothing is ever
downloaded: sockets are disabled for the whole run.
"""

from __future__ import annotations

import argparse
import gzip
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO / "data" / "fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def forbid_network() -> None:
    """Make any attempt to open a network connection fail loudly."""

    def _refuse(*_a: object, **_k: object) -> None:
        raise RuntimeError("torch_mnist.py: network access attempted (it must never download)")

    socket.socket.connect = _refuse  # type: ignore[assignment]
    socket.socket.connect_ex = _refuse  # type: ignore[assignment]
    socket.create_connection = _refuse  # type: ignore[assignment]
    socket.getaddrinfo = _refuse  # type: ignore[assignment]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["tutorial", "tensor", "graph"], default="tensor")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(n)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda[:N]. tutorial: each batch is copied with .to(device) as the tutorial "
        "does; tensor: the whole split lives on the device and randperm runs there",
    )
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with the four IDX .gz files")
    p.add_argument(
        "--tv-root",
        type=Path,
        default=None,
        help="torchvision root to use/prepare for the tutorial workload (ROOT/FashionMNIST/raw/); "
        "default: a fresh temp folder, removed afterwards",
    )
    p.add_argument(
        "--matmul-precision",
        choices=["default", "highest", "high"],
        default="default",
        help="default: PyTorch's own settings (fp32 matmuls, but TF32 cuDNN convolutions, "
        "torch.backends.cudnn.allow_tf32=True); highest: fp32 everywhere (matmuls and cuDNN); "
        "high: TF32 matmuls and convolutions. Redline's --matmul-precision highest|high match "
        "the last two. The settings used are in the output's matmul_tf32/cudnn_tf32",
    )
    p.add_argument(
        "--precision",
        choices=["32-true", "bf16-mixed", "16-mixed", "bf16-true"],
        default="32-true",
        help="bf16-mixed: forward and loss under torch.autocast(device, dtype=torch.bfloat16), "
        "as Lightning's precision='bf16-mixed'; 16-mixed: the same in float16 with "
        "torch.amp.GradScaler; bf16-true: model.to(torch.bfloat16) and bf16 inputs, Adam over "
        "the bf16 parameters, as Lightning's precision='bf16-true' (tensor and tutorial "
        "workloads). The output's state_bytes is the weights, gradients and optimizer state "
        "after training; its activation_bytes is "
        "what the first step's forward saved for the backward (saved_tensors_hooks, each "
        "storage once)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        help="SMOKE TESTS ONLY: train on the first N training samples (0 = all 60000)",
    )
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- data


def read_idx_gz(path: Path):
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    off = 4 + 4 * ndim
    return np.frombuffer(raw, dtype=np.uint8, offset=off).reshape(dims)


def load_tensors(data: Path, train: bool):
    """The split as (x float32 (N,1,28,28) normalised like ToTensor+Normalize(0.5,0.5), y int64)."""
    import torch

    img = read_idx_gz(data / FILES["train_images" if train else "test_images"])
    lab = read_idx_gz(data / FILES["train_labels" if train else "test_labels"])
    x = torch.from_numpy(img.copy()).to(torch.float32).div_(255.0).sub_(0.5).div_(0.5).unsqueeze(1)
    y = torch.from_numpy(lab.astype("int64"))
    return x.contiguous(), y


def prepare_tv_root(data: Path, root: Path) -> None:
    """Lay out ROOT/FashionMNIST/raw/ from the repo's gz files (symlinks) and extract them with
    torchvision's own extract_archive, so that datasets.FashionMNIST(download=False) finds them.
    (torchvision's _check_exists looks for the *uncompressed* files.)"""
    from torchvision.datasets.utils import extract_archive

    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        link = raw / name
        if not link.exists():
            link.symlink_to((data / name).resolve())
        if not (raw / name[: -len(".gz")]).exists():
            extract_archive(str(link), str(raw), remove_finished=False)


# ----------------------------------------------------------------------------- models


def build_model(kind: str):
    from torch import nn

    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3136, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


# ----------------------------------------------------------------------------- graph


def graph_step(torch, model, opt, loss_fn, x_train, y_train, bs: int):
    """The whole training step as one CUDA graph (PyTorch's documented whole-network
    capture). Returns a generator function in place of train_batches: it yields None
    after each step (a replay for each full batch, an eager step for the shorter last
    one), then the epoch's loss sum (a 0-d device tensor, summed inside the graph)."""
    n = x_train.shape[0]
    dev = x_train.device
    static_idx = torch.arange(bs, device=dev)
    saved_params = [p.detach().clone() for p in model.parameters()]
    # Warm-up on a side stream, as torch.cuda.graph requires; its updates are undone below.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_train[static_idx]), y_train[static_idx])
            loss.backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    # The epoch's loss sum lives on the device and is added to inside the graph.
    loss_acc = torch.zeros((), device=dev)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(x_train[static_idx]), y_train[static_idx])
        static_loss.backward()
        opt.step()
        loss_acc.add_(static_loss.detach())
    # Capturing records without running: undo the warm-up in place (the graph keeps
    # these very tensors), so the timed run starts from the initial weights.
    with torch.no_grad():
        for p, s0 in zip(model.parameters(), saved_params):
            p.copy_(s0)
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    v.zero_()
    torch.cuda.synchronize(dev)

    def batches():
        perm = torch.randperm(n, device=dev)
        loss_acc.zero_()
        full = n // bs
        for i in range(full):
            static_idx.copy_(perm[i * bs : (i + 1) * bs])
            graph.replay()
            yield None
        if n % bs:
            idx = perm[full * bs :]
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            loss_acc.add_(loss.detach())
            yield None
        # The epoch's summed loss, read by the caller after the loop.
        yield loss_acc

    return batches


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    forbid_network()

    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.matmul_precision != "default":
        torch.set_float32_matmul_precision(args.matmul_precision)
        torch.backends.cudnn.allow_tf32 = args.matmul_precision == "high"
    dev = torch.device(args.device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    tmp_root = None
    if args.workload == "tutorial":
        from torch.utils.data import DataLoader, Subset
        from torchvision import datasets
        from torchvision.transforms import Compose, Normalize, ToTensor

        root = args.tv_root
        if root is None:
            tmp_root = tempfile.TemporaryDirectory(prefix="redline-bench-tv-")
            root = Path(tmp_root.name)
        prepare_tv_root(args.data, root)
        tf = Compose([ToTensor(), Normalize((0.5,), (0.5,))])
        train_ds = datasets.FashionMNIST(root=str(root), train=True, download=False, transform=tf)
        test_ds = datasets.FashionMNIST(root=str(root), train=False, download=False, transform=tf)
        if args.limit:
            train_ds = Subset(train_ds, range(min(args.limit, len(train_ds))))
        n_train = len(train_ds)
        train_dl = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True)

        def train_batches():
            for xb, yb in train_dl:
                yield xb.to(dev), yb.to(dev)

        def test_batches():
            for xb, yb in DataLoader(test_ds, batch_size=1000):
                yield xb.to(dev), yb.to(dev)

    else:
        if args.workload == "graph" and dev.type != "cuda":
            log("torch_mnist.py: --workload graph captures CUDA graphs: it needs --device cuda")
            return 2
        x_train, y_train = load_tensors(args.data, train=True)
        x_test, y_test = load_tensors(args.data, train=False)
        if args.limit:
            x_train, y_train = x_train[: args.limit].contiguous(), y_train[: args.limit].contiguous()
        x_train, y_train = x_train.to(dev), y_train.to(dev)
        x_test, y_test = x_test.to(dev), y_test.to(dev)
        n_train = x_train.shape[0]
        bs = args.batch_size

        def train_batches():
            perm = torch.randperm(n_train, device=dev)
            for i in range(0, n_train, bs):
                idx = perm[i : i + bs]
                yield x_train[idx], y_train[idx]

        def test_batches():
            for i in range(0, x_test.shape[0], 1000):
                yield x_test[i : i + 1000], y_test[i : i + 1000]

    model = build_model(args.model).to(dev)
    # bf16-true: everything bf16 (Lightning's HalfPrecision converts the module and the inputs).
    true16 = torch.bfloat16 if args.precision == "bf16-true" else None
    if true16 is not None:
        model = model.to(true16)
    graphed = args.workload == "graph"
    # capturable: Adam's step count on the device, as a captured step needs.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, capturable=graphed)
    loss_fn = nn.CrossEntropyLoss()
    if graphed:
        train_batches = graph_step(torch, model, opt, loss_fn, x_train, y_train, args.batch_size)

    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(dev.type) if args.precision == "16-mixed" else None
    # Bytes the forward saves for the backward (the activations), measured once.
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = max(saved.get(st.data_ptr(), 0), st.nbytes())
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activation_bytes = None

    epoch_s: list[float] = []
    train_loss: list[float] = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        loss_sum = torch.zeros((), device=dev)
        steps = 0
        sync()
        t0 = time.perf_counter()
        for item in train_batches():
            if graphed:
                # None: a step ran (a replay, or the eager last batch); then the sum.
                if item is None:
                    steps += 1
                else:
                    loss_sum += item
                continue
            xb, yb = item
            if true16 is not None:
                xb = xb.to(true16)
            hooks = (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                     if activation_bytes is None else contextlib.nullcontext())
            with hooks, torch.autocast(dev.type, dtype=half or torch.bfloat16,
                                       enabled=half is not None):
                loss = loss_fn(model(xb), yb)
            if activation_bytes is None:
                # Saved weights (fp32 masters) are parameters and the batch is the
                # data, not activations (Redline's count leaves both out too); a
                # 16-bit copy of either is new memory, and counts.
                own = params | {xb.untyped_storage().data_ptr()}
                activation_bytes = sum(b for k, b in saved.items() if k not in own)
            opt.zero_grad()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            loss_sum += loss.detach()
            steps += 1
        sync()
        dt = time.perf_counter() - t0
        epoch_s.append(dt)
        train_loss.append(float(loss_sum) / max(steps, 1))
        log(f"[torch {args.workload}/{args.model} t={args.threads} b={args.batch_size}] "
            f"epoch {epoch}: {dt:.3f} s, train loss {train_loss[-1]:.4f}")

    model.eval()
    correct = total = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for xb, yb in test_batches():
            if true16 is not None:
                xb = xb.to(true16)
            with torch.autocast(dev.type, dtype=half or torch.bfloat16, enabled=half is not None):
                correct += int((model(xb).argmax(1) == yb).sum())
            total += int(yb.shape[0])
    eval_s = time.perf_counter() - t0
    if tmp_root is not None:
        tmp_root.cleanup()
    # Weights, gradients and the optimizer's state tensors, as held at the end.
    tensors = list(model.parameters())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for st in opt.state.values() for t in st.values()
                if torch.is_tensor(t) and t.dim() > 0]
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)

    med = statistics.median(epoch_s)
    out = {
        "impl": "pytorch",
        "workload": args.workload,
        "precision": args.precision,
        "model": args.model,
        "threads": args.threads,
        "device": str(dev),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "train_samples": n_train,
        "limit": args.limit,
        "epoch_s": [round(s, 4) for s in epoch_s],
        "median_epoch_s": med,
        "samples_per_s": n_train / med,
        "train_loss": [round(v, 5) for v in train_loss],
        "test_accuracy": correct / total,
        "activation_bytes": activation_bytes,
        "state_bytes": state_bytes,
        "eval_s": eval_s,
        "torch_version": torch.__version__,
        "matmul_precision": args.matmul_precision,
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
