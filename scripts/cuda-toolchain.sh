#!/usr/bin/env bash
# Provides a CUDA 13.0 toolchain for `cargo build --features cuda` on a machine
# without one, from NVIDIA's wheels on PyPI, into a folder outside the repo:
#   - nvcc, crt headers, nvvm (candle compiles its kernels to PTX at build time),
#   - cudart, cccl headers, cuBLAS, NVRTC, cuRAND (what candle/cudarc load),
#   - plain lib*.so links for the versioned libraries (the wheels ship only
#     lib*.so.13 and the like; the linker and dlopen look for lib*.so),
#   - a link-time libcuda.so stub when no driver is installed (what a
#     toolkit's lib64/stubs normally holds; the real driver replaces it at run time).
# Then prints the environment to export, so this works:
#   eval "$(scripts/cuda-toolchain.sh)"
#   cargo build --release --features cuda
# Idempotent: a toolchain already in place is reused. Progress goes to stderr.
# Folder: $REDLINE_CUDA_DIR (default ~/.cache/redline-cuda).
# GPU architecture: $CUDA_COMPUTE_CAP if set, else 90 (H100/H200).
#
# Why 13.0.2: cudarc 0.19 (under candle 0.11) checks the CUDA version it was
# built against and refuses nvcc 13.5; the CUDA 12 wheels on PyPI carry no nvcc.
set -euo pipefail

CUDA_TOOLKIT_VERSION=13.0.2
DIR="${REDLINE_CUDA_DIR:-$HOME/.cache/redline-cuda}"
VENV="$DIR/venv"
COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
PYTHON="${PYTHON:-python3}"

log() { echo "cuda-toolchain: $*" >&2; }

mkdir -p "$DIR"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV" >&2
fi
stamp="$DIR/.installed-$CUDA_TOOLKIT_VERSION"
if [ ! -f "$stamp" ]; then
    log "installing cuda-toolkit $CUDA_TOOLKIT_VERSION wheels (about 1 GB download)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "cuda-toolkit[nvcc,crt,nvvm,cudart,cccl,cublas,nvrtc,curand]==$CUDA_TOOLKIT_VERSION" >&2
    touch "$stamp"
else
    log "cuda-toolkit $CUDA_TOOLKIT_VERSION: present ($VENV)"
fi

# NCCL, for the `nccl` feature (cudarc links libnccl): its own wheel, linked
# into the toolkit's lib folder below. The GPU machines' image has it too.
NCCL_VERSION=2.28.9
nccl_stamp="$DIR/.installed-nccl-$NCCL_VERSION"
if [ ! -f "$nccl_stamp" ]; then
    log "installing nvidia-nccl-cu13 $NCCL_VERSION"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-nccl-cu13==$NCCL_VERSION" >&2
    touch "$nccl_stamp"
fi

# The CUDA 13 wheels put everything under site-packages/nvidia/cu13.
ROOT="$("$VENV/bin/python" - <<'EOF'
import pathlib, sysconfig
print(pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13")
EOF
)"
[ -x "$ROOT/bin/nvcc" ] || { log "no nvcc under $ROOT/bin after install"; exit 1; }

# candle's kernel build and cudarc look for lib64 and include under CUDA_ROOT.
LIB="$ROOT/lib"
[ -e "$ROOT/lib64" ] || ln -s lib "$ROOT/lib64"

NCCL_LIB="$(dirname "$ROOT")/nccl/lib"
for f in "$NCCL_LIB"/libnccl.so.*; do
    [ -e "$f" ] && { [ -e "$LIB/${f##*/}" ] || ln -s "$f" "$LIB/${f##*/}"; }
done

# Plain names for versioned libraries: libcublas.so.13 -> libcublas.so.
for f in "$LIB"/lib*.so.*; do
    [ -e "$f" ] || continue
    base="${f##*/}"
    plain="$LIB/${base%%.so.*}.so"
    [ -e "$plain" ] || ln -s "$base" "$plain"
done

# A link-time stub of the driver API when no driver is installed. Only the
# linker reads it (every cu* entry point of cuda.h, as empty functions); at run
# time the loader finds the real libcuda.so.1 of the driver.
STUBS="$ROOT/lib/stubs"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    if [ ! -e "$STUBS/libcuda.so" ] || [ "$STUBS/libcuda.so" -ot "$ROOT/include/cuda.h" ]; then
        log "no NVIDIA driver here: building a libcuda.so link stub from cuda.h"
        mkdir -p "$STUBS"
        grep -oE '\bcu[A-Z][A-Za-z0-9_]*\b' "$ROOT/include/cuda.h" | sort -u |
            sed 's/.*/int &(void) { return 100; }/' >"$STUBS/stub.c"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUBS/libcuda.so" "$STUBS/stub.c"
        rm -f "$STUBS/stub.c"
    fi
    LIBPATH="$LIB:$STUBS"
else
    LIBPATH="$LIB"
fi

log "nvcc: $("$ROOT/bin/nvcc" --version | tail -n 2 | head -n 1)"
cat <<EOF
export CUDA_ROOT="$ROOT"
export CUDA_PATH="$ROOT"
export PATH="$ROOT/bin:\$PATH"
export LIBRARY_PATH="$LIBPATH\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP=$COMPUTE_CAP
EOF
