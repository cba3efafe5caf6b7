#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU needed) and packs them into two
# archives under .gpu/, which the device tool carries to a GPU machine, where
# bench/gpu.sh unpacks and runs them:
#   .gpu/cli.tar.xz    redline   the CLI built with --features cuda
#   .gpu/tests.tar.xz  golden    the golden tests against PyTorch (their cuda_* tests run on cuda:0)
#                      kernels   Redline's GPU kernels against the generic ops they replace
#                      nccl      only with GPU_BUNDLE_NCCL=1: the NCCL backend of --strategy ddp, a
#                                communicator of one on cuda:0 (built with the nccl feature;
#                                libnccl comes from the image's PyTorch). Passed on the H100
#                                (2026-11-25).
# Two archives, because the device tool carries 64 MiB at most: the tracked tree is about 57 MB
# (mostly the dataset and the goldens) and the three binaries together about 8.8 MB of xz, over
# the limit; each call carries the one its part needs (bench/gpu.sh's header says which):
#   run(command="bash bench/gpu.sh tests", carry=[".gpu/tests.tar.xz", ".gpu/commit"])
#   run(command="bash bench/gpu.sh redline", carry=[".gpu/cli.tar.xz", ".gpu/commit"])
# The CUDA libraries are not bundled: the GPU image's PyTorch ships the CUDA 13
# ones (bench/gpu.sh finds them). Target folder: target/cuda (kept between runs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
eval "$(scripts/cuda-toolchain.sh)"
export CARGO_TARGET_DIR="$repo/target/cuda"
cargo build --release -p redline --features cuda
# The path of test binary $2 of package $1, built with features $3 (default cuda).
test_binary() {
    cargo test --release -p "$1" --features "${3:-cuda}" --test "$2" --no-run --message-format=json \
        2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2"
}
golden="$(test_binary redline-train golden)"
kernels="$(test_binary redline-kernels cuda_kernels)"
bins=(redline golden kernels)
if [ "${GPU_BUNDLE_NCCL:-0}" = 1 ]; then
    nccl="$(test_binary redline-dist nccl nccl)"
    bins+=(nccl)
fi
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$CARGO_TARGET_DIR/release/redline" "$stage/redline"
cp "$golden" "$stage/golden"
cp "$kernels" "$stage/kernels"
[ -n "${nccl:-}" ] && cp "$nccl" "$stage/nccl"
(cd "$stage" && strip "${bins[@]}")
mkdir -p .gpu
rm -f .gpu/bundle.tar.xz
# xz with a 256 MiB window, one thread (one block): it finds the kernels the
# binaries of an archive share (candle's kernels as machine code and PTX are in
# all of them).
pack() { # archive, binaries
    local name="$1"; shift
    tar -C "$stage" -cf - "$@" | xz --lzma2=preset=9,dict=256MiB -T1 >".gpu/$name"
}
pack cli.tar.xz redline
pack tests.tar.xz "${bins[@]:1}"
# The commit the binaries were built from (bench/gpu-session.sh logs it).
{ git rev-parse --short HEAD | tr -d '\n'; git diff --quiet HEAD -- crates vendor Cargo.toml Cargo.lock || printf -- '-dirty'; echo; } >.gpu/commit
ls -l "$stage" .gpu >&2
# What the device tool carries: the tracked files and one archive, 64 MiB at most,
# counted in disk blocks (a tree of 66.9 MB in bytes, 68.6 MB in blocks, was refused).
tree=$(git ls-files -z | xargs -0 du -c --block-size=1 | tail -1 | cut -f1)
for a in cli.tar.xz tests.tar.xz; do
    total=$((tree + $(du --block-size=1 ".gpu/$a" | cut -f1)))
    echo "tracked files $tree B + $a = $total B on disk, of the device tool's 67108864" >&2
    if [ "$total" -gt 65000000 ]; then
        echo "warning: within 2 MB of the device tool's 64 MiB (or over) with $a: the call may be refused" >&2
    fi
done
