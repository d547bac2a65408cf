#!/usr/bin/env bash
# Pre-training on all GPUs of one machine: one process drives every local GPU (jax's default), no jax.distributed.
#   WORKDIR=runs/base bash launch/gpu_single_node.sh [--config.KEY=VALUE ...]
# CONFIG defaults to ELECTRA-Base with the GPU preset for this machine's GPUs (configs/gpu.py: configs/base.py:gpu:N,
# N from CUDA_VISIBLE_DEVICES, else nvidia-smi, or GPUS=N); give CONFIG=configs/large.py:gpu to change it.
# DRY_RUN=1 prints the environment and the command instead of running it. Check that the config fits first, on any
# machine:
#   source launch/gpu_env.sh; python -m electra_jax.aot --config="$CONFIG" --topology=h100:8
set -euo pipefail
: "${WORKDIR:?set WORKDIR}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
if [[ -z "${GPUS:-}" && -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then  # what CUDA may use; nvidia-smi lists them all
  IFS=, read -ra VISIBLE <<< "$CUDA_VISIBLE_DEVICES"
  GPUS="${#VISIBLE[@]}"
  (( GPUS > 0 )) || { echo "no GPU found: CUDA_VISIBLE_DEVICES is empty; set GPUS=N or CUDA_VISIBLE_DEVICES" >&2
                      exit 1; }
elif [[ -z "${GPUS:-}" ]]; then  # a failing nvidia-smi prints its error on stdout: count only its 'GPU i: ...' lines
  GPUS="$( (nvidia-smi --list-gpus 2>/dev/null || true) | grep -c '^GPU [0-9]' || true)"
  (( GPUS > 0 )) || { echo "no GPU found by nvidia-smi: set GPUS=N (how many this machine has)" >&2; exit 1; }
fi
CONFIG="${CONFIG:-configs/base.py:gpu:${GPUS}}"
launch python3 -m electra_jax.main --config="$CONFIG" --workdir="$WORKDIR" "$@"
