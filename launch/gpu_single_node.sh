#!/usr/bin/env bash
# Pre-training on all GPUs of one machine: one process drives every local GPU (jax's default).
#   WORKDIR=runs/base bash launch/gpu_single_node.sh [--config.KEY=VALUE ...]
set -euo pipefail
: "${WORKDIR:?set WORKDIR}"
CONFIG="${CONFIG:-configs/base.py}"
# Let XLA use most of the GPU memory up front and overlap collectives with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
exec python3 -m electra_jax.main --config="$CONFIG" --workdir="$WORKDIR" "$@"
