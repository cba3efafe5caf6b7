#!/usr/bin/env bash
# Extra CLI runs of the GPU check (issue 22) beside `bench/gpu.sh tests`: graph
# mode on streamed data and the CNN's graph and fused paths, one epoch each,
# with the driver's own error log on (CUDA_LOG_FILE). Logs to $OUT/gpu-extra.log.
set -uo pipefail
out="${OUT:-bench/results/gpu-raw}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu-extra.log") 2>&1
libs="$(python3 -c 'import nvidia, pathlib; print(":".join(str(p) for p in pathlib.Path(list(nvidia.__path__)[0]).glob("*/lib")))')"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" REDLINE_REPO_ROOT="$PWD" CUDA_LOG_FILE=stderr
b="$(mktemp -d)"; tar -C "$b" -xJf .gpu/bundle.tar.xz
one() { local name="$1"; shift; echo "== $name: $*"; "$b/redline" train --device cuda:0 --epochs 1 --monitor-interval 0 --run-dir "/tmp/run-$name" "$@" 2>&1 | tail -9; }
one mlp-streaming-eager --data-on-device off
one mlp-streaming-graph --data-on-device off --cuda-graph on
one mlp-streaming-graph-fused --data-on-device off --cuda-graph on --fused-kernels on
one cnn-graph --model cnn --data-on-device on --cuda-graph on
one cnn-graph-fused --model cnn --data-on-device on --cuda-graph on --fused-kernels on
