#!/usr/bin/env bash
# Runs the same pre-training command on every worker of a Cloud TPU VM pod slice.
#   TPU_NAME=my-v4-64 ZONE=us-central2-b WORKDIR=gs://bucket/electra-large bash launch/tpu_pod.sh [--config.KEY=VALUE ...]
# Each worker must have this repository checked out at the same path with requirements installed
# (pip install -r requirements.txt "jax[tpu]" -e .). jax.distributed finds the pod's coordinator by itself.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR}"
CONFIG="${CONFIG:-configs/large.py}"
REPO="${REPO:-\$HOME/electra_jax}"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command \
  "cd $REPO && python3 -m electra_jax.main --config=$CONFIG --workdir=$WORKDIR $*"
