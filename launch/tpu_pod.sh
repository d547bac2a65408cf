#!/usr/bin/env bash
# Runs the same pre-training command on every worker of a Cloud TPU VM pod slice (one process per worker).
#   TPU_NAME=my-v4-64 ZONE=us-central2-b WORKDIR=/mnt/shared/electra-large bash launch/tpu_pod.sh [--config.KEY=VALUE ...]
# Each worker must have this repository checked out at the same path with requirements installed
# (pip install -r requirements.txt "jax[tpu]" -e .). WORKDIR must be one directory every worker reads and writes
# (an NFS/Filestore or gcsfuse mount at the same path): all workers write their shards of each checkpoint there.
# ELECTRA_JAX_DISTRIBUTED=1 makes electra_jax call jax.distributed.initialize(), which finds the pod's
# coordinator and this worker's rank from the TPU metadata.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR}"
CONFIG="${CONFIG:-configs/large.py}"
REPO="${REPO:-\$HOME/electra_jax}"
ARGS="$(printf ' %q' "$@")"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command \
  "cd $REPO && ELECTRA_JAX_DISTRIBUTED=1 python3 -m electra_jax.main --config=$CONFIG --workdir=$WORKDIR$ARGS"
