#!/usr/bin/env bash
# The GPU path, checked in one command: GRPO steps of a pretrained model on the math domain, on one GPU without and
# with TRL's vLLM generation (colocate mode), on every GPU as data-parallel ranks where there are several, and the
# throughput of each.
#
#     benchmarks/gpu_check.sh [MODEL] [STEPS] [OUT]
#
# MODEL: anything `evotrainer train --model` takes (default smollm2; a 0.5B-class model is a local Hugging Face
# directory, for example a Qwen2.5-0.5B-Instruct download). STEPS: GRPO steps per configuration (default 5).
# OUT: where the runs go (default runs/gpu-check). The GPU side needs an NVIDIA GPU, a CUDA build of torch, and the
# `vllm` extra for the second configuration (pip install -e '.[vllm]'); without vLLM that line says so and the first
# still runs. Without a usable GPU the script runs its CPU branch: the same command on the CPU, at most 2 steps, so the
# path is exercised everywhere (tests/test_train_cli.py runs that branch).
#
# Prints one line per configuration: device, generation backend, steps, training seconds, steps/s and completions/s
# (steps x the preset's batch x ranks / training seconds), and dev accuracy before and after. With two GPUs or more a
# third line trains with one rank per GPU (`--processes N`, torchrun as `accelerate launch` runs it; the preset's batch
# is per rank, so a step sees N times as many completions).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2}
STEPS=${2:-5}
OUT=${3:-runs/gpu-check}
PY=${PYTHON:-.venv/bin/python}

run() {  # run NAME DEVICE [--vllm]: one training, its summary line
  local name=$1 device=$2
  shift 2
  rm -rf "$OUT/$name"
  "$PY" -m evotrainer.cli train --domain math --model "$MODEL" --steps "$STEPS" --device "$device" "$@" \
    --eval-limit 50 --eval-k 0 --out "$OUT/$name" --json | tail -n 1 > "$OUT/$name.json"
  "$PY" - "$OUT/$name.json" "$name" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
batch = int((r.get("preset") or {}).get("per_device_train_batch_size") or 0) * r.get("processes", 1)
secs = r["train_seconds"]
rate = f"{r['steps'] / secs:.3f} steps/s" + (f", {r['steps'] * batch / secs:.1f} completions/s" if batch else "")
print(f"{sys.argv[2]:<16} {r['steps']} steps in {secs:.1f} s: {rate}; dev {r['dev_before']:.3f} -> {r['dev_after']:.3f}")
EOF
}

mkdir -p "$OUT"
if command -v nvidia-smi >/dev/null && "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  run cuda-hf cuda
  if "$PY" -c "import vllm" 2>/dev/null; then
    run cuda-vllm cuda --vllm
  else
    echo "cuda-vllm        skipped: vLLM is not installed (pip install -e '.[vllm]')"
  fi
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if [ "$GPUS" -ge 2 ]; then
    run "cuda-hf-x$GPUS" cuda --processes "$GPUS"
  fi
else
  STEPS=$(( STEPS < 2 ? STEPS : 2 ))
  echo "no usable CUDA device (nvidia-smi or a CUDA build of torch missing): the CPU branch, $STEPS step(s)"
  run cpu cpu
fi
