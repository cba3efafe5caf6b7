#!/usr/bin/env bash
# The project's test command (README.md): installs the external tools some
# tests check against (Chromium for the HTML report, TensorBoard's own reader
# for the event files, OpenMPI for the `mpi` feature; scripts/setup-test-tools.sh,
# idempotent), then runs the whole workspace's tests with those tools
# required, so none is skipped, and with MPI built in, so the data-parallel
# tests run real `mpirun -n 2` jobs.
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup-test-tools.sh)"
export REDLINE_TB_PYTHON REDLINE_CHROMIUM
export REDLINE_REQUIRE_TOOLS=1
exec cargo test --workspace --features redline/mpi,redline-dist/mpi "$@"
