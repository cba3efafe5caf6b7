#!/usr/bin/env bash
# One device call for the GPU check: the parts of bench/gpu.sh (and a short
# CPU comparison at 4 and 16 threads, part `cpu`, CPU_EPOCHS epochs, default 1), each under its own time limit, so a
# part that hangs or runs long cannot take the others' time. The device tool
# returns at most 8 files of at most 16 MB, so each part's logs, summaries and
# run folders (less checkpoints and HTML reports) are packed into $OUT/PART.tgz
# as the part ends (kept even if the call is cut off later):
#   device tool: run(command="COMMIT=<sha> GPU_EPOCHS=3 bash bench/gpu-session.sh redline:150 mfu:120",
#                    carry=[".gpu/cli.tar.xz", ".gpu/commit"])
# Each argument is PART:SECONDS; PART is tests, attention, ties, precision, redline, torch, steps,
# busy, stream, mfu, gpt (issue 50: sample on cuda:0, GPT training beside nanoGPT) or cpu.
# Parts tests and attention need the test binaries (carry .gpu/tests.tar.xz instead; the tree
# and both archives pass the device tool's 64 MiB: scripts/gpu-bundle.sh).
# bench/gpu-results.sh then files the archives under bench/results/ for committing.
set -uo pipefail
final="${OUT:?the device tool sets OUT}"
work="$(mktemp -d)"
epochs="${GPU_EPOCHS:-5}"
bundle="$(cat .gpu/commit 2>/dev/null || echo unknown)"
echo "commit ${COMMIT:-unknown}; bundle built at $bundle; GPU_EPOCHS=$epochs; $*" >"$work/commit.txt"
pack() { # this part's new files (those newer than its stamp) into $OUT/$1.tgz
    (cd "$work" && find . -type f -newer "$work/.stamp" ! -path '*/checkpoints/*' ! -name 'report.html' \
        ! -name 'prec-*.safetensors' -print0 | tar --null -T - -czf "$final/$1.tgz")
    ls -l "$final/$1.tgz"
}
py="$(command -v python3)"
cpu_part() { # the CNN on the host's cores, Redline beside PyTorch, 4 and 16 threads
    local bin t
    bin="$(mktemp -d)"
    tar -C "$bin" -xJf .gpu/cli.tar.xz redline
    for t in 4 16; do
        "$bin/redline" train --device cpu --model cnn --threads "$t" --epochs "${CPU_EPOCHS:-1}" \
            --run-dir "$work/cpu-cnn-t$t" --monitor-interval 0
        # candle's elementwise pool at the thread count (the default before
        # threads::configure set CANDLE_NUM_THREADS=1 on its own).
        CANDLE_NUM_THREADS="$t" "$bin/redline" train --device cpu --model cnn --threads "$t" \
            --epochs "${CPU_EPOCHS:-1}" --run-dir "$work/cpu-cnn-t$t-candle-pool" --monitor-interval 0
        "$py" bench/torch_mnist.py --device cpu --workload tensor --model cnn --threads "$t" \
            --epochs "${CPU_EPOCHS:-1}" >"$work/torch-cpu-cnn-t$t.json"
    done
}
for spec in "$@"; do
    part="${spec%%:*}"
    limit="${spec#*:}"
    start=$(date +%s)
    touch "$work/.stamp"
    case "$part" in
        ties) mkdir -p "$work/golden"
            OUT="$work" timeout -k 5 "$limit" "$py" tools/reference/cnn_ties.py --write "$work/golden" \
            2>&1 | tee "$work/cnn-ties.log" ;;
        cpu) export -f cpu_part; export work epochs py
            timeout -k 5 "$limit" bash -c cpu_part 2>&1 | tee "$work/cpu.log" ;;
        *) OUT="$work" timeout -k 5 "$limit" bash bench/gpu.sh "$part" ;;
    esac
    echo "part $part: exit ${PIPESTATUS[0]} after $(($(date +%s) - start)) s (limit $limit s)" | tee -a "$work/parts.txt"
    cp "$work/parts.txt" "$work/commit.txt" "$final/"
    pack "$part"
done
