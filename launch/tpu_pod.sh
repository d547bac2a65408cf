#!/usr/bin/env bash
# Runs the same pre-training command on every worker of a Cloud TPU VM slice (one process per worker).
#   TPU_NAME=electra-v4-32 ZONE=us-central2-b BUCKET=my-bucket bash launch/tpu_pod.sh [--config.KEY=VALUE ...]
# The workdir is gs://$BUCKET/electra/<config name> unless WORKDIR is set: checkpoints, metrics and TensorBoard
# events go to Cloud Storage, which every worker reads and writes and which outlives a preempted slice; run the same
# command again to resume. Each worker needs this repository at $REPO with its requirements installed (docs/scale.md
# shows the whole recipe: slice, install, data, launch, TensorBoard, preemption).
# ELECTRA_JAX_DISTRIBUTED=1 makes electra_jax call jax.distributed.initialize(), which finds the slice's coordinator
# and this worker's rank from the TPU metadata.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
CONFIG="${CONFIG:-configs/large.py}"
if [[ -z "${WORKDIR:-}" ]]; then
  : "${BUCKET:?set BUCKET (the workdir is gs://BUCKET/electra/CONFIG_NAME) or WORKDIR}"
  WORKDIR="gs://${BUCKET}/electra/$(basename "$CONFIG" .py)"
fi
REPO="${REPO:-\$HOME/electra_jax}"
ARGS="$(printf ' %q' --config="$CONFIG" --workdir="$WORKDIR" "$@")"
echo "workdir: $WORKDIR" >&2
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command \
  "cd $REPO && ELECTRA_JAX_DISTRIBUTED=1 python3 -m electra_jax.main$ARGS"
