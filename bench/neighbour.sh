#!/usr/bin/env bash
# Does training collapse when another process is busy on the machine?
# Runs the MLP (batch 64, 2 epochs) alone and next to a neighbour that spins one core,
# for Redline (default thread policy, and forced --threads 2) and PyTorch (1 and 2 threads,
# whole split as one tensor), and prints median epoch seconds and the slowdown ratio.
#
#   bash bench/neighbour.sh            # REDLINE_BENCH_VENV as in bench/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${REDLINE_BENCH_VENV:-$HOME/.venvs/redline-bench}"
bin="$repo/target/release/redline"
data="$repo/data/fashion-mnist"
tmp="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

[[ -x "$bin" ]] || (cd "$repo" && cargo build --release >&2)

median_redline() { # args: label, extra flags...
  local label="$1"; shift
  "$bin" train --epochs 2 --no-validate --device cpu --data "$data" --metrics "$tmp/m.jsonl" "$@" > "$tmp/out.txt"
  python3 - "$tmp/m.jsonl" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"]
print(f"{statistics.median(r['epoch_s'] for r in rows):.3f}")
PY
}

median_torch() { # args: threads
  local env=()
  [[ "$1" -gt 1 ]] && env=(OMP_WAIT_POLICY=PASSIVE)
  env "${env[@]}" OMP_NUM_THREADS="$1" "$venv/bin/python" "$here/torch_mnist.py" --workload tensor --model mlp \
    --threads "$1" --epochs 2 --batch-size 64 --data "$data" > "$tmp/torch.json"
  python3 - "$tmp/torch.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"{r['median_epoch_s']:.3f}")
PY
}

echo "uptime: $(uptime)"
echo "nproc: $(nproc)"
printf '| run | alone s/epoch | with busy neighbour s/epoch | slowdown |\n| --- | ---: | ---: | ---: |\n'
run() { # args: label
  case "$1" in
    "redline default") median_redline x ;;
    "redline --threads 2") median_redline x --threads 2 ;;
    "torch 1") median_torch 1 ;;
    "torch 2") median_torch 2 ;;
  esac
}
for cfg in "redline default" "redline --threads 2" "torch 1" "torch 2"; do
  alone=$(run "$cfg")
  python3 -c 'while True: pass' &   # the busy neighbour: one core spinning
  pid=$!; sleep 1
  busy=$(run "$cfg")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  ratio=$(python3 -c "print(f'{$busy/$alone:.2f}x')")
  printf '| %s | %s | %s | %s |\n' "$cfg" "$alone" "$busy" "$ratio"
done
echo "uptime: $(uptime)"
