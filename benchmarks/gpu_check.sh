#!/usr/bin/env bash
# The GPU check (issue 5): run on a machine with one NVIDIA GPU, from the repository root, with a
# venv that has torch's CUDA build and triton (`pip install torch==2.13.0 triton -e .`).
# Checks every family's Triton kernel (forward and backward) against its reference and torch's op and
# tunes its key; runs a trial that faults the GPU in an isolated process; tunes triton_fused_attention
# (3 shapes x fp16/bf16) and triton_matmul (2 shapes) and prints JSON: tuned vs the hand-written
# rule's config vs PyTorch's own op, measured interleaved. Sized for 8 minutes on one H100 or H200
# (trial counts; `timeout 480` stops it): its wall time on a GPU is not yet measured.
# First the honest-timing checks (issue 27: NVML clocks and temperature, the 256 MiB flush default,
# the clock check); `benchmarks/gpu_check.sh --conditions-only` runs only those (under a minute).
# NVML comes from the nvidia-ml-py package (`pip install nvidia-ml-py`); without it the clocks
# read null and the check says so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA GPU visible'" >&2
"$PYTHON" -c "import pynvml" 2>/dev/null || echo "gpu_check: pynvml (nvidia-ml-py) is not installed: no clocks" >&2
exec timeout 480 "$PYTHON" -m benchmarks.gpu_check "$@"
