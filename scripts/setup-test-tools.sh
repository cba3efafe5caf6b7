#!/usr/bin/env bash
# Installs the external tools some Redline tests check against, and prints the
# environment variables that point the tests at them:
#   - Chromium (Debian package), for tests that render HTML reports headless;
#   - a Python venv with TensorBoard, for the event-file test that reads our
#     files with TensorBoard's own EventAccumulator;
#   - OpenMPI (Debian's openmpi-bin and libopenmpi-dev) and libclang-dev, for
#     the `mpi` feature (the `mpi` crate generates its bindings with bindgen)
#     and the tests that run real `mpirun -n 2` jobs.
# Idempotent: anything already in place is left alone. Progress goes to stderr,
# the export lines to stdout, so this works:
#   eval "$(scripts/setup-test-tools.sh)"
# Tools dir: $REDLINE_TOOLS_DIR (default ~/.cache/redline-tools).
set -euo pipefail

TENSORBOARD_VERSION=2.21.0
CHROMIUM=/usr/bin/chromium
TOOLS_DIR="${REDLINE_TOOLS_DIR:-$HOME/.cache/redline-tools}"
VENV="$TOOLS_DIR/tb-venv"

log() { echo "setup-test-tools: $*" >&2; }

# apt needs root; use sudo when not root and it exists.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root to run: $* (HINT: run this script as root or install sudo)"
        return 1
    fi
}

apt_install_chromium() {
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends chromium >&2
}

if [ -x "$CHROMIUM" ]; then
    log "chromium: present ($CHROMIUM)"
else
    log "chromium: installing with apt-get"
    # The package lists may be stale or absent (fresh containers): update only
    # when the plain install fails, so a warm machine does no network round trip.
    if ! apt_install_chromium; then
        log "chromium: install failed; running apt-get update and retrying"
        as_root apt-get update >&2
        apt_install_chromium
    fi
    [ -x "$CHROMIUM" ] || { log "chromium: apt-get succeeded but $CHROMIUM is missing"; exit 1; }
fi

MPI_PACKAGES=(openmpi-bin libopenmpi-dev libclang-dev)
mpi_ok() {
    command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 &&
        ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1
}
if mpi_ok; then
    log "openmpi: present ($(mpirun --version 2>/dev/null | head -1))"
else
    log "openmpi: installing ${MPI_PACKAGES[*]} with apt-get"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${MPI_PACKAGES[@]}" >&2; then
        log "openmpi: install failed; running apt-get update and retrying"
        as_root apt-get update >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            "${MPI_PACKAGES[@]}" >&2
    fi
    mpi_ok || { log "openmpi: apt-get succeeded but mpirun, mpicc or libclang is missing"; exit 1; }
fi

tensorboard_ok() {
    [ -x "$VENV/bin/python" ] &&
        "$VENV/bin/python" -c "import sys, tensorboard; sys.exit(tensorboard.__version__ != '$TENSORBOARD_VERSION')" \
            >/dev/null 2>&1
}

if tensorboard_ok; then
    log "tensorboard: $TENSORBOARD_VERSION present ($VENV)"
else
    if [ ! -x "$VENV/bin/python" ]; then
        log "tensorboard: creating venv $VENV"
        mkdir -p "$TOOLS_DIR"
        python3 -m venv "$VENV" >&2 ||
            { log "python3 -m venv failed (HINT: apt-get install python3-venv)"; exit 1; }
    fi
    log "tensorboard: installing tensorboard==$TENSORBOARD_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "tensorboard==$TENSORBOARD_VERSION" >&2
    tensorboard_ok || { log "tensorboard: installed but 'import tensorboard' fails in $VENV"; exit 1; }
fi

# %q quotes a tools dir with spaces so the line is safe to eval.
printf 'export REDLINE_TB_PYTHON=%q REDLINE_CHROMIUM=%q\n' "$VENV/bin/python" "$CHROMIUM"
