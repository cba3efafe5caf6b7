#!/usr/bin/env bash
# Redline vs PyTorch CPU benchmark: entry point. See bench/README.md.
#
#   bash bench/run.sh [--torch-epochs N] [--quick] [--no-build] [--no-save] [--out FILE]
#                     [--no-precision] [--precision-rounds N]
#                     [any other bench/compare.py flag, e.g. --no-b512, --threads 1,2, --limit N]
#
# 1. makes sure a PyTorch venv exists OUTSIDE the repo ($REDLINE_BENCH_VENV, default
#    $HOME/.venvs/redline-bench; created with `python3 -m venv` + `pip install torch torchvision numpy`
#    if `import torch, torchvision, numpy` fails there; extra pip flags via $REDLINE_BENCH_PIP_ARGS),
# 2. builds Redline (`cargo build --release`) unless --no-build,
# 3. runs bench/compare.py (refuses to start while cargo/rustc/redline run), prints the markdown report
#    and saves it as bench/results/<date>-<host>-cpu.md (--quick runs are not saved unless --out),
# 4. then bench/precision.py (32-true, bf16-mixed, 16-mixed beside PyTorch autocast: s/epoch,
#    accuracy, activations, peak RSS), its table appended to the same report (--no-precision skips
#    it; --quick runs it with one round).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${REDLINE_BENCH_VENV:-$HOME/.venvs/redline-bench}"

build=1
save=1
quick=0
precision=1
precision_rounds=3
out=""
pass=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) build=0 ;;
    --no-save) save=0 ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#--out=}" ;;
    --quick) quick=1; precision_rounds=1; pass+=("$1") ;;
    --no-precision) precision=0 ;;
    --precision-rounds) precision_rounds="$2"; shift ;;
    -h|--help)
      sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
      echo
      echo "compare.py flags:"
      exec python3 "$here/compare.py" --help ;;
    *) pass+=("$1") ;;
  esac
  shift
done

case "$venv" in
  "$repo"|"$repo"/*) echo "REDLINE_BENCH_VENV must be outside the repository ($venv)" >&2; exit 2 ;;
esac

# --- 1. PyTorch venv ---------------------------------------------------------------------------
if ! "$venv/bin/python" -c 'import torch, torchvision, numpy' >/dev/null 2>&1; then
  echo ">>> creating PyTorch venv at $venv (pip install torch torchvision numpy; large download)" >&2
  mkdir -p "$(dirname "$venv")"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  # shellcheck disable=SC2086  # REDLINE_BENCH_PIP_ARGS is a list of flags
  "$venv/bin/python" -m pip install ${REDLINE_BENCH_PIP_ARGS:-} torch torchvision numpy >&2
  "$venv/bin/python" -c 'import torch, torchvision, numpy' >&2
fi

# --- 2. Redline ------------------------------------------------------------------------------------
if [[ $build -eq 1 ]]; then
  echo ">>> cargo build --release" >&2
  (cd "$repo" && cargo build --release) >&2
  # let the machine settle after the build: wait (up to 120 s) for the 1-min load average < 0.5
  for _ in $(seq 1 24); do
    sleep 5
    awk '{ exit !($1 < 0.5) }' /proc/loadavg 2>/dev/null && break
  done
fi

# --- 3. run and report --------------------------------------------------------------------------
if [[ -z "$out" && $save -eq 1 && $quick -eq 0 ]]; then
  host="$(hostname -s 2>/dev/null || hostname || echo host)"
  host="$(printf '%s' "$host" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9-' '-' | cut -c1-24)"
  base="$here/results/$(date +%Y-%m-%d)-${host:-host}-cpu"
  out="$base.md"
  n=2
  while [[ -e "$out" ]]; do out="$base-$n.md"; n=$((n + 1)); done
fi

if [[ -n "$out" && $save -eq 1 ]]; then
  mkdir -p "$(dirname "$out")"
  tmp="$out.partial"
  # compare.py's stdout is the report; progress goes to stderr (the terminal)
  if "$venv/bin/python" "$here/compare.py" --python "$venv/bin/python" ${pass[@]+"${pass[@]}"} | tee "$tmp"; then
    if [[ $precision -eq 1 ]]; then
      echo >> "$tmp"
      "$venv/bin/python" "$here/precision.py" --python "$venv/bin/python" \
        --rounds "$precision_rounds" | tee -a "$tmp"
    fi
    mv "$tmp" "$out"
    echo ">>> report saved to ${out#"$repo"/}" >&2
  else
    rc=$?
    if [[ -s "$tmp" ]]; then
      mv "$tmp" "$out"
      echo ">>> some runs FAILED (exit $rc); partial report saved to ${out#"$repo"/}" >&2
    else
      rm -f "$tmp"
    fi
    exit "$rc"
  fi
else
  "$venv/bin/python" "$here/compare.py" --python "$venv/bin/python" ${pass[@]+"${pass[@]}"}
  if [[ $precision -eq 1 ]]; then
    "$venv/bin/python" "$here/precision.py" --python "$venv/bin/python" --rounds "$precision_rounds"
  fi
fi
