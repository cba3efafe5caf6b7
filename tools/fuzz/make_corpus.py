#!/usr/bin/env python3
"""Seeds of the fuzz corpus (testdata/fuzz/<target>/), small valid files of
each format the fuzz tests mutate. The run-folder seeds (config, metrics,
summary, breakdown, tfevents) are copied from a real run folder:

    redline train --data data/tables/wine.csv --epochs 40 --batch-size 16 \
        --log-every 20 --monitor-interval 0.05 --profiler simple --run-dir /tmp/seedrun/long
    redline train --data data/tables/wine.csv --epochs 2 --batch-size 16 --run-dir /tmp/seedrun/short
    ~/.venvs/redline-ref/bin/python tools/fuzz/make_corpus.py --long /tmp/seedrun/long \
        --short /tmp/seedrun/short
"""

import argparse
import glob
import gzip
import io
import os
import shutil
import struct

import numpy as np
from safetensors.numpy import save as st_save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../testdata/fuzz")


def idx(dims, data):
    head = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return head + bytes(data)


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def npz(members):
    """An uncompressed .npz (what np.savez writes) of name -> array."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, arr in members.items():
            z.writestr(name + ".npy", npy(arr))
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--long", required=True)
    ap.add_argument("--short", required=True)
    args = ap.parse_args()
    labels = idx([8], range(8))
    images = idx([2, 4, 4], range(32))
    write("idx", "labels.idx", labels)
    write("idx", "images.idx", images)
    write("idx", "images.idx.gz", gzip.compress(images, mtime=0))
    write("idx", "two-members.gz", gzip.compress(images[:9], mtime=0) + gzip.compress(images[9:], mtime=0))
    write("npy", "f32.npy", npy(np.arange(6, dtype=np.float32).reshape(3, 2)))
    write("npy", "u8.npy", npy(np.arange(4, dtype=np.uint8)))
    write("npy", "i64.npy", npy(np.array([3, 1, 2], dtype=np.int64)))
    f32 = np.arange(6, dtype=np.float32).reshape(3, 2)
    u8, i64 = np.arange(4, dtype=np.uint8), np.array([3, 1, 2], dtype=np.int64)
    write("npz", "xy.npz", npz({"x": f32, "y": i64}))
    write("npz", "train-test.npz", npz({"x_train": u8, "y_train": i64, "x_test": u8, "y_test": i64}))
    repo = os.path.join(OUT, "../..")
    for model in ["examples/models/residual-mlp.toml", "examples/models/small-cnn.toml",
                  "crates/redline-models/src/resnet.toml"]:
        os.makedirs(os.path.join(OUT, "model"), exist_ok=True)
        shutil.copy(os.path.join(repo, model), os.path.join(OUT, "model"))
    write("csv", "header.csv", b"a,b,target\n1,2.5,0\n-3,4e2,1\n5,6,2\n")
    write("csv", "plain.csv", b"0.1,0.2,1\n0.3,0.4,0\n")
    write("csv", "quoted.csv", b'"x","y"\n"1","2"\n3,4\n')
    weights = {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "fc.bias": np.zeros(2, dtype=np.float32)}
    write("safetensors", "fc.safetensors", st_save(weights))
    write("safetensors", "fc-f16.safetensors",
          st_save({k: v.astype(np.float16) for k, v in weights.items()}))
    for target, run, pattern in [("config", args.long, "config.toml"),
                                 ("metrics", args.long, "metrics.jsonl"),
                                 ("summary", args.long, "summary.json"),
                                 ("breakdown", args.short, "breakdown.json"),
                                 ("profile", args.long, "profile.json"),
                                 ("tfevents", args.long, "events.out.tfevents.*")]:
        for path in glob.glob(os.path.join(run, pattern)):
            name = "events.tfevents" if target == "tfevents" else os.path.basename(path)
            os.makedirs(os.path.join(OUT, target), exist_ok=True)
            shutil.copy(path, os.path.join(OUT, target, name))


if __name__ == "__main__":
    main()
