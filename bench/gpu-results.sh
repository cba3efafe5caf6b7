#!/usr/bin/env bash
# Files a device call's archives (bench/gpu-session.sh's $OUT/<part>.tgz) under
# bench/results/<gpu>-<date>/<part>/ for committing: the logs, the tables (*.md),
# parts.txt and commit.txt as files; the run folders, summaries and JSON in one
# runs.tar.xz per results folder (added to one already there): the device tool
# counts the carried tree in disk blocks, and each small file costs 4 KiB. Weight
# files, NVML samples (metrics.jsonl) and TensorBoard files are left out.
#   bash bench/gpu-results.sh FILES_AT DEST      e.g. /work/.device/1 bench/results/h200-2026-11-27
set -euo pipefail
src="$(cd "${1:?the folder holding the PART.tgz files}" && pwd)"
dest="$(mkdir -p "${2:?the results folder, bench/results/GPU-DATE}" && cd "$2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for tgz in "$src"/*.tgz; do
    part="$(basename "$tgz" .tgz)"
    mkdir -p "$work/new/$part"
    tar -C "$work/new/$part" -xzf "$tgz"
done
cp "$src/commit.txt" "$src/parts.txt" "$dest/" 2>/dev/null || true
cd "$work/new"
find . -type f \( -name '*.safetensors' -o -name 'metrics.jsonl' -o -name '*tfevents*' \) -delete
kept=(-name '*.log' -o -name '*.md' -o -name 'parts.txt' -o -name 'commit.txt')
find . -type f \( "${kept[@]}" \) -print0 | tar --null -T - -cf - | tar -C "$dest" -xf -
find . -type f \( "${kept[@]}" \) -delete
count="$(find . -type f | wc -l)"
if [ "$count" -gt 0 ]; then
    [ -f "$dest/runs.tar.xz" ] && tar -C "$work/new" -xJf "$dest/runs.tar.xz"
    tar -C "$work/new" -cJf "$dest/runs.tar.xz" .
fi
echo "filed $count files in $dest/runs.tar.xz, the logs and tables beside it"
