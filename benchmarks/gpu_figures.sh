#!/usr/bin/env bash
# Every GPU figure of the benchmarks page, in one run on a machine with one NVIDIA GPU (about
# 9 minutes): the CUDA paths, small steps, ResNet-50 in bf16 against the hand-written loop,
# Accelerate and Fabric, the checkpoint I/O table and the demo. Each part has a time limit, and
# one that fails does not stop the others; the exit status says whether all passed.
#
#   bash benchmarks/gpu_figures.sh [OUT_DIR]      # logs and bench.json files go to OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu-figures}"
mkdir -p "$out"
py="${PYTHON:-python}"
failed=0
part() {  # part NAME SECONDS COMMAND...
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || failed=1
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
part cuda_paths 150 "$py" benchmarks/cuda_paths.py
part small_steps 80 "$py" benchmarks/small_steps.py --budget 45 --run-dir "$out/small_steps"
part resnet50_bf16 140 "$py" -m paratrain bench --model resnet --depth 50 --image-size 224 \
    --strategies single --nproc 1 --precision bf16 --batch-size 128 --steps 20 --budget 90 \
    --compare accelerate,fabric --run-dir "$out/resnet50" --no-plot
part checkpoint_io 100 "$py" benchmarks/checkpoint_io.py --mib 512 --repeats 3 --fsdp-mib 0
part demo 80 "$py" -m paratrain demo --run-dir "$out/demo"
exit "$failed"
