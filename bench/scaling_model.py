#!/usr/bin/env python3
"""Epoch time of data-parallel training on 1 to 64 GPUs, predicted from measured single-GPU
step times and a ring all-reduce model; prints the markdown tables of docs/scaling.md.

    python3 bench/scaling_model.py

Model, per optimizer step of one rank (batch B per rank, N ranks, an epoch of S samples:
S / (B N) steps):

    step = compute + exposed all-reduce
    all-reduce (ring) = 2 (N - 1) / N * bytes / bus_bandwidth + 2 (N - 1) * latency
    exposed = all-reduce - overlap * min(all-reduce, backward)

`bytes` are the fp32 gradients (4 bytes a parameter). On one node (N <= 8) the ring runs
over NVLink; across nodes (8 GPUs a node) every ring crosses the inter-node network, whose
per-GPU bandwidth bounds it (NCCL's rings on a DGX-class node give each GPU its own NIC).
`overlap` is the share of the backward the all-reduce can hide behind: 0 for Redline today
(its buckets are reduced after the backward: candle's backward returns every gradient at
once), up to 1 for PyTorch DDP (buckets launched as their gradients complete).

Inputs (edit below; `measured` says where a number came from):
"""

# Single-GPU step times (ms) at batch 64 on an H100, from the committed GPU logs
# (README "Performance": MLP eager 1.70 s/epoch, CNN 2.45 s/epoch over 938 steps) and the
# issue-22 targets for the captured step, which are not yet measured.
STEP_MS = {
    ("mlp", "eager (measured)"): 1700.0 / 938,
    ("mlp", "graph (target)"): 80.0 / 938,
    ("cnn", "eager (measured)"): 2450.0 / 938,
    ("cnn", "graph (target)"): 400.0 / 938,
}
# Backward's share of a step (Redline's CPU breakdown: backward / (forward + backward +
# update); used only for the overlap bound).
BACKWARD_SHARE = 0.5
PARAMS = {"mlp": 101_770, "cnn": 421_642}
SAMPLES = 60_000
BATCH = 64
# Links (assumed, not measured here): NCCL bus bandwidth and per-hop latency.
NVLINK = (370e9, 5e-6)  # H100 SXM NVLink 4, NCCL all-reduce bus bandwidth
NETWORK = (45e9, 10e-6)  # 400 Gb/s InfiniBand NDR per GPU
GPUS_PER_NODE = 8


def allreduce_s(n: int, nbytes: int) -> float:
    if n == 1:
        return 0.0
    bw, lat = NVLINK if n <= GPUS_PER_NODE else NETWORK
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def epoch_s(model: str, step_ms: float, n: int, overlap: float) -> tuple[float, float]:
    ar = allreduce_s(n, 4 * PARAMS[model])
    compute = step_ms / 1e3
    exposed = ar - overlap * min(ar, BACKWARD_SHARE * compute)
    steps = SAMPLES / (BATCH * n)
    return steps * (compute + exposed), ar


def main() -> None:
    for model in ("mlp", "cnn"):
        print(f"\n### {model.upper()} ({PARAMS[model]:,} parameters, "
              f"{4 * PARAMS[model] / 1e6:.2f} MB of fp32 gradients), batch {BATCH} per GPU\n")
        print("| GPUs | nodes | all-reduce ms | "
              + " | ".join(f"{kind}: epoch s, no overlap | overlapped"
                           for (m, kind) in STEP_MS if m == model) + " |")
        print("| --- | --- | --- | " + " | ".join("--- | ---" for (m, _) in STEP_MS if m == model)
              + " |")
        for n in (1, 2, 4, 8, 16, 32, 64):
            cells = []
            ar = 0.0
            for (m, kind), ms in STEP_MS.items():
                if m != model:
                    continue
                plain, ar = epoch_s(model, ms, n, 0.0)
                hidden, _ = epoch_s(model, ms, n, 1.0)
                cells.append(f"{plain:.3f} | {hidden:.3f}")
            nodes = max(1, n // GPUS_PER_NODE)
            print(f"| {n} | {nodes} | {1e3 * ar:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
