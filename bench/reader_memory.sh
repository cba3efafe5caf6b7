#!/usr/bin/env bash
# Peak memory of each data reader on its worst input, against the input's
# size (docs/reliability.md, "Memory"). Makes the inputs in a temporary
# folder (about 600 MB), then reads each with
# crates/redline-data/examples/read_memory.rs, and the CLI on the table of
# 50 million columns from issue 26 (refused from its first row).
#   bash bench/reader_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo build --release -q -p redline-data --example read_memory
cargo build --release -q
reader=target/release/examples/read_memory
python3 - "$tmp" <<'PY'
import os, struct, sys, zipfile
d = sys.argv[1]
# CSV, the fewest bytes per value: single digits, 10 columns (100 MB).
with open(f"{d}/digits.csv", "w") as f:
    row = "1,2,3,4,5,6,7,8,9,0\n"
    f.write(row * 5_000_000)
# CSV, two columns of single digits: a target per two cells (40 MB).
with open(f"{d}/two.csv", "w") as f:
    f.write("3,1\n" * 10_000_000)
# CSV, 2 rows by 50 million columns (200 MB; the issue's input).
with open(f"{d}/wide.csv", "w") as f:
    for _ in range(2):
        f.write("0," * (50_000_000 - 1) + "1\n")
def npy(shape, descr, data):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data
# uint8 images (N, 28, 28) and int64 labels: 1 byte a pixel becomes 4.
n = 60_000
os.makedirs(f"{d}/npy", exist_ok=True)
open(f"{d}/npy/x.npy", "wb").write(npy(f"({n}, 28, 28)", "|u1", bytes(n * 784)))
open(f"{d}/npy/y.npy", "wb").write(npy(f"({n},)", "<i8", bytes(8 * n)))
# The same as float32 in an .npz.
with zipfile.ZipFile(f"{d}/f32.npz", "w", zipfile.ZIP_STORED) as z:
    z.writestr("x.npy", npy(f"({n}, 784)", "<f4", bytes(4 * n * 784)))
    z.writestr("y.npy", npy(f"({n},)", "<i8", bytes(8 * n)))
PY
uptime
printf 'input\tsize\tpeak above start\tpeak/size\tresult\n'
for f in digits.csv two.csv npy f32.npz; do
    "$reader" "$tmp/$f"
done
"$reader" data/fashion-mnist
# The CLI on the wide table: refused before the table is read.
/usr/bin/time -f "wide.csv via redline train: peak RSS %M KB, %e s" \
    target/release/redline train --data "$tmp/wide.csv" --device cpu \
    --run-dir "$tmp/run" 2>&1 | grep -E "peak RSS|error|imply" || true
