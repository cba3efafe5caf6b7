#!/usr/bin/env bash
# The GPU check of issue 5, run ON a GPU machine from the repository root with
# the archives of scripts/gpu-bundle.sh carried under .gpu/. The tracked tree and both
# archives pass the device tool's 64 MiB, so each call carries the one its part needs:
# part `tests` and part `attention` the test binaries, every other part the CLI:
#   device tool: run(command="bash bench/gpu.sh tests", carry=[".gpu/tests.tar.xz", ".gpu/commit"])
#   device tool: run(command="bash bench/gpu.sh redline", carry=[".gpu/cli.tar.xz", ".gpu/commit"])
# (An older single .gpu/bundle.tar.xz is unpacked too.)
# Writes raw logs to $OUT (or bench/results/gpu-raw/) for bench/results/<gpu-name>/:
#   1. nvidia-smi, `redline devices`;
#   2. the golden MLP/CNN checks against PyTorch on cuda:0 (fp32, CPU tolerances),
#      device-resident and streaming;
#   3. the seed workload (MLP, batch 64, 5 epochs) and the CNN: Redline device-resident
#      and streaming, with NVML sampled every 100 ms and CUDA-event timing, vs PyTorch
#      on the same GPU (tutorial DataLoader pipeline, and the whole split on the GPU);
#   4. batch 512 device-resident (the GPU-busy target);
#   5. issues 12-13: CUDA graph and fused-kernel runs, GPU busy from the kernel trace,
#      the --device auto choice, and PyTorch's whole-step CUDA graph;
#   6. issue 25 (part `precision`): the precision goldens' jobs on cuda:0 checked against
#      PyTorch's references (bench/precision_check.py), then each precision's epochs
#      beside PyTorch autocast / GradScaler / model.to(bfloat16) on the same GPU.
# One part at a time keeps each device call under its 10 minutes:
#   bash bench/gpu.sh [all|tests|redline|torch|precision|steps|busy|stream|mfu|gpt]   (default all; the table ends each part)
# Part `attention` (issue 50; the test binaries): the attention kernels' times beside
# PyTorch's flash SDPA (bench/attention.py --kernels).
# Part `gpt` (issue 50): `redline sample` on cuda:0 against the transformers-written golden
# folder's greedy ids, a GPT trained on token windows on cuda:0 (fp32 and bf16-mixed), and
# bench/gpt_cpu.py --device cuda: Redline against nanoGPT's model eager and compiled.
# Part `stream` (issue 48): ImageNet-like JPEGs made on the host (tools/datasets/make_imagelike.py),
# the streamed pipeline alone at 1..all host cores (`redline tune workers`), torchvision's
# DataLoader on the same cores (bench/pipeline.py --no-redline), and ResNet-18 bf16-mixed on
# cuda:0 streamed with the ImageNet recipe (data wait in its breakdown).
# Part `mfu` (issue 49): the zoo's jobs at batch 512 (ResNet-18 at 256) in each precision, with
# the FLOPs counted from the model and MFU against the data sheet's peak for the math
# (summary.json `flops`); bench/gpu_table.py adds PyTorch's MFU on the same GPU from its
# samples/s and FlopCounterMode's counts (testdata/golden/flops.json).
# Part `busy` trains long enough (about 5-8 s each) for NVML's utilisation to be
# compared with GPU busy from the kernel trace (issue 22's "within 10 points" rows).
# Part `steps` saves the CNN's 16-mixed golden jobs' weights after 6 and 10 steps, with the
# defaults and with candle's ops, as steps-<set>-<job>-<n>.safetensors, for a per-tensor
# comparison with PyTorch's weights after as many steps (tools/reference/precision_steps.py).
# GPU_EPOCHS (default 5) sets the epochs of every timed run, Redline's and PyTorch's alike.
# bench/gpu-session.sh runs several parts in one device call, each under its own time limit.
set -uo pipefail
part="${1:-all}"
case "$part" in all|tests|attention|redline|torch|precision|steps|busy|stream|mfu|gpt) ;; *) echo "usage: bash bench/gpu.sh [all|tests|attention|redline|torch|precision|steps|busy|stream|mfu|gpt]" >&2; exit 2 ;; esac
out="${OUT:-bench/results/gpu-raw}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu-$part.log") 2>&1
py="$(command -v python3)"
# The CUDA 13 libraries candle loads (cuBLAS, NVRTC, cuRAND) come with the image's PyTorch.
libs="$("$py" -c 'import nvidia, pathlib; print(":".join(str(p) for p in pathlib.Path(list(nvidia.__path__)[0]).glob("*/lib")))')"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export REDLINE_REPO_ROOT="$PWD"
bin="$(mktemp -d)"
for a in .gpu/cli.tar.xz .gpu/tests.tar.xz .gpu/bundle.tar.xz; do
    [ -f "$a" ] && tar -C "$bin" -xJf "$a"
done
rl="$bin/redline"
epochs="${GPU_EPOCHS:-5}"
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
# A part's binaries, or a line saying which archive to carry.
need() {
    local b
    for b in "$@"; do
        [ -x "$bin/$b" ] || { echo "bench/gpu.sh $part: no $b here: carry .gpu/$( [ "$b" = redline ] && echo cli || echo tests).tar.xz" >&2; exit 3; }
    done
}
case "$part" in tests|attention) need golden kernels ;; all) need redline golden kernels ;; *) need redline ;; esac
set -x
nvidia-smi
uptime
[ -x "$rl" ] && $rl devices
if want tests; then
"$bin/kernels" cuda_ --test-threads 1 --nocapture
"$bin/golden" cuda_ --test-threads 1 --nocapture
# Issue 24: the NCCL backend with a world of one (a real communicator and
# all-reduce), then --strategy ddp through the CLI (one rank: nothing to reduce).
[ -x "$bin/nccl" ] && "$bin/nccl" --test-threads 1 --nocapture
# (The CLI comes with .gpu/cli.tar.xz: part `redline` when only the test binaries came.)
[ -x "$rl" ] && $rl train --device cuda:0 --strategy ddp --max-steps 50 --run-dir "$out/run-ddp-one" --monitor-interval 0
fi
if want attention; then
"$py" bench/attention.py --kernels "$bin/kernels" | tee "$out/attention-gpu.md"
fi
run() { # name, then redline train flags
    local name="$1"; shift
    $rl train --device cuda:0 --run-dir "$out/run-$name" --monitor-interval 0.1 --profiler simple --epochs "$epochs" "$@"
    cp "$out/run-$name/summary.json" "$out/$name.summary.json" 2>/dev/null
}
if want redline; then
# Issue 22: the defaults alone (graph mode and fused kernels on where the step
# allows; the split on the GPU when it fits): what `redline train` does on a GPU.
# The first run on this machine as a user's first run: PTX compiled anew
# (the driver's JIT cache emptied), so `gpu_kernels_load_s` is a first start.
rm -rf "${HOME:-/root}/.nv/ComputeCache"
run mlp-defaults
# The same first start taking candle's PTX instead of its machine code
# (vendor/candle-kernels/REDLINE.md): what every first run paid before.
rm -rf "${HOME:-/root}/.nv/ComputeCache"
REDLINE_CANDLE_PTX=1 run mlp-ptx-jit --max-steps 50
run mlp-b512-defaults --batch-size 512
run cnn-defaults --model cnn
run cnn-b512-defaults --model cnn --batch-size 512
# The convolutions through cuDNN (--gpu-conv cudnn) beside Redline's kernels
# above: graph::AUTO_CONV_CUDNN waits for these rows and the cudnn golden.
run cnn-cudnn --model cnn --gpu-conv cudnn
run cnn-b512-cudnn --model cnn --batch-size 512 --gpu-conv cudnn
run cnn-bf16-cudnn --model cnn --precision bf16-mixed --gpu-conv cudnn
# Streamed batches (pinned slots, the raw copy stream) into the captured step.
run mlp-streaming --data-on-device off
# The kernel trace's own cost (GPU busy is then timed from the graph replays).
run mlp-notrace --kernel-trace off
# TF32 products, opt-in (--matmul-precision high), as PyTorch's default
# cuDNN convolutions are; the fp32 runs above are the goldens' arithmetic.
run cnn-tf32 --model cnn --matmul-precision high
run cnn-b512-tf32 --model cnn --batch-size 512 --matmul-precision high
# Which device `--device auto` picks for the default job, with its timings.
$rl train --run-dir "$out/run-auto" --monitor-interval 0 --epochs 1
cp "$out/run-auto/summary.json" "$out/auto.summary.json" 2>/dev/null
# Last (the slowest, measured before): the same jobs eagerly, without the
# fused kernels: what the defaults replace.
run mlp-eager --cuda-graph off --fused-kernels off
run cnn-eager --model cnn --cuda-graph off --fused-kernels off
fi
if want busy; then
# NVML's utilisation is the share of its own sample period (1/6 s to 1 s) in
# which a kernel ran, read every 100 ms here; a 0.3-0.6 s run (the parts
# above) puts most of its samples in start-up and epoch ends, so the table
# judges "GPU busy within 10 points of NVML" on these runs only: the defaults,
# many epochs, no checkpoints (the steady loop is what both measure).
long() { # name, epochs, then redline train flags
    local name="$1" n="$2"; shift 2
    $rl train --device cuda:0 --run-dir "$out/run-$name" --monitor-interval 0.1 --profiler simple \
        --epochs "$n" --no-checkpoint "$@"
    cp "$out/run-$name/summary.json" "$out/$name.summary.json" 2>/dev/null
}
long busy-mlp-b512 200 --batch-size 512
long busy-cnn-b64 20 --model cnn
long busy-cnn-b512 40 --model cnn --batch-size 512
fi
if want torch; then
# Issue 12: PyTorch's strongest loop, the whole step as one CUDA graph (capturable Adam).
for m in mlp cnn; do
    for b in 64 512; do
        "$py" bench/torch_mnist.py --device cuda --workload graph --model "$m" --batch-size "$b" \
            --epochs "$epochs" --threads 4 > "$out/torch-graph-$m-b$b.json"
    done
done
# PyTorch's default CNN runs TF32 convolutions (cudnn.allow_tf32): also fp32 throughout.
"$py" bench/torch_mnist.py --device cuda --workload graph --model cnn --batch-size 64 \
    --epochs "$epochs" --threads 4 --matmul-precision highest > "$out/torch-graph-cnn-b64-highest.json"
for w in tensor; do
    for m in mlp cnn; do
        "$py" bench/torch_mnist.py --device cuda --workload "$w" --model "$m" --epochs "$epochs" --threads 4 \
            > "$out/torch-$w-$m.json"
    done
done
"$py" bench/torch_mnist.py --device cuda --workload tensor --model mlp --batch-size 512 --epochs "$epochs" \
    --threads 4 > "$out/torch-tensor-mlp-b512.json"
fi
if want precision; then
# The goldens' jobs (init, data order, 20 steps), each precision, on cuda:0: with
# the defaults (the tensor-core kernels, 16-bit layers, bf16 and flag-skipping
# optimizer: graph::AUTO_FUSES_REDUCED), then in $out/candle with --fused-kernels off
# (candle's 16-bit ops). Each checked against the CPU goldens and against PyTorch's
# own CUDA autocast runs of the same jobs, made first: the reference on a GPU (the
# CNN's pooling ties move with a GPU's rounding, PyTorch's alike).
"$py" tools/reference/make_golden_precision.py --device cuda --init testdata/golden \
    --out "$out/torch-ref" --precisions bf16-mixed,16-mixed,bf16-true
# PyTorch's own spread on the 16-mixed jobs: the same runs with cudnn.benchmark and in
# channels_last (other summation orders, the same maths), beside its CPU run.
"$py" tools/reference/fp16_spread.py --out "$out/torch-spread" --models mlp,cnn --variants bench,nhwc
# A third set, in $out/eager, runs every job step by step (--cuda-graph off): the
# defaults capture them all (16-mixed too: graph::AUTO_CAPTURES_SCALED), and the
# two should agree bit for bit.
for set in default candle eager; do
    dir="$out"; extra=""
    case "$set" in
        candle) dir="$out/candle"; extra="--fused-kernels off" ;;
        eager) dir="$out/eager"; extra="--cuda-graph off" ;;
    esac
    mkdir -p "$dir"
    "$py" bench/precision_check.py --flags "$dir" | while read -r model prefix flags; do
        # shellcheck disable=SC2086 # $flags and $extra are lists of flags
        $rl train --device cuda:0 --model "$model" --init "testdata/golden/${model}_init.safetensors" \
            --no-shuffle --val-split 0 --max-steps 20 --batch-size 64 --log-every 1 $flags $extra \
            --save "$dir/prec-$model-$prefix.safetensors" --run-dir "$dir/run-prec-$model-$prefix" \
            --monitor-interval 0
    done
    "$py" bench/precision_check.py "$dir" | tee "$dir/precision-goldens.md"
    "$py" bench/precision_check.py "$dir" --golden "$out/torch-ref" --also testdata/golden \
        --spread "$out/torch-spread/bench" --spread "$out/torch-spread/nhwc" | tee "$dir/precision-goldens-cuda.md"
done
# Candle's 16-bit ops (--fused-kernels off) beside the defaults' tensor-core
# kernels below (the redline part's cnn-tf32 runs the TF32 tensor-core convolution).
run mlp-b512-bf16-mixed-candle --precision bf16-mixed --batch-size 512 --fused-kernels off
run cnn-bf16-mixed-candle --model cnn --precision bf16-mixed --fused-kernels off
# 16-mixed step by step (--cuda-graph off), beside the defaults' captured rows below.
run mlp-16-mixed-eager --precision 16-mixed --cuda-graph off
run cnn-16-mixed-eager --model cnn --precision 16-mixed --cuda-graph off
# Speed and memory per precision, Redline then PyTorch, MLP (b64, b512) and CNN.
for p in bf16-mixed 16-mixed bf16-true; do
    run "mlp-$p" --precision "$p"
    run "mlp-b512-$p" --precision "$p" --batch-size 512
    run "cnn-$p" --model cnn --precision "$p"
    for m in mlp cnn; do
        "$py" bench/torch_mnist.py --device cuda --workload tensor --model "$m" --epochs "$epochs" \
            --threads 4 --precision "$p" > "$out/torch-prec-$m-$p.json"
    done
    "$py" bench/torch_mnist.py --device cuda --workload tensor --model mlp --batch-size 512 \
        --epochs "$epochs" --threads 4 --precision "$p" > "$out/torch-prec-mlp-b512-$p.json"
done
fi
if want steps; then
for extra in "" "--fused-kernels off"; do
    set_name=default; [ -n "$extra" ] && set_name=candle
    for job in fp16_overflow fp16_mixed; do
        flags="$("$py" bench/precision_check.py --flags x | awk -v j="$job" '$1 == "cnn" && $2 == j { $1 = $2 = ""; print }')"
        for n in 6 10; do
            # shellcheck disable=SC2086 # $flags and $extra are lists of flags
            $rl train --device cuda:0 --model cnn --init testdata/golden/cnn_init.safetensors \
                --no-shuffle --val-split 0 --max-steps "$n" --batch-size 64 --log-every 1 $flags $extra \
                --save "$out/steps-$set_name-$job-$n.safetensors" --run-dir "$out/run-steps-$set_name-$job-$n" \
                --monitor-interval 0
        done
    done
done
# Against PyTorch's CUDA run of the same steps, kept in $out/torch-steps: another machine
# compares PyTorch's CUDA run against its CPU run (precision_steps.py --cache DIR --spread).
"$py" tools/reference/precision_steps.py "$out" --device cuda --cache "$out/torch-steps"
fi
if want mfu; then
for p in 32-true bf16-mixed 16-mixed; do
    run "mfu-mlp-b512-$p" --batch-size 512 --precision "$p" --epochs 2
    run "mfu-cnn-b512-$p" --model cnn --batch-size 512 --precision "$p" --epochs 2
done
run mfu-cnn-b512-tf32 --model cnn --batch-size 512 --matmul-precision high --epochs 2
run mfu-resnet18-b256-bf16-mixed --model resnet18 --batch-size 256 --precision bf16-mixed --epochs 1
for m in mlp cnn; do
    "$py" bench/torch_mnist.py --device cuda --workload tensor --model "$m" --batch-size 512 \
        --epochs 2 --threads 4 > "$out/torch-mfu-$m-b512.json"
done
fi
if want gpt; then
$rl sample testdata/golden/hf-gpt2-tiny --device cuda:0 --temperature 0 --ids --tokens 16 \
    --prompt "def forward(self, x):" | tee "$out/gpt-sample-ids.txt"
"$py" -c 'import json,sys; e=json.load(open("testdata/golden/hf_gpt2_tiny.json"))["greedy_ids"]; g=[int(v) for v in open(sys.argv[1]).read().split()]; print("sample greedy ids", "MATCH" if g == e else f"DIFFER {g} vs {e}")' "$out/gpt-sample-ids.txt"
for p in 32-true bf16-mixed; do
    "$py" bench/gpt_cpu.py --bin "$rl" --device cuda --threads 4 --steps 10 \
        --rows small:64,gpt-char:64 $([ "$p" = bf16-mixed ] && echo --bf16) > "$out/gpt-train-$p.md"
done
fi
if want stream; then
imgs="$(mktemp -d)/imnet"
"$py" tools/datasets/make_imagelike.py "$imgs" --classes 10 --train 200 --val 10
$rl tune workers --device cpu --data "$imgs" --augment random-resized-crop=224,hflip \
    --batch-size 256 --out "$out/tune-workers"
"$py" bench/pipeline.py "$imgs" --no-redline --workers "1,4,8,$(nproc)" --batch 256 --batches 6 \
    > "$out/pipeline-torchvision.md"
run resnet18-stream-bf16 --data "$imgs" --model resnet18 --augment random-resized-crop=224,hflip \
    --precision bf16-mixed --batch-size 256 --epochs 2
fi
set +x
"$py" bench/gpu_table.py "$out"
