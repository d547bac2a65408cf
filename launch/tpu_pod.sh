#!/usr/bin/env bash
# Runs the same pre-training command on every worker of a Cloud TPU VM slice (one process per worker).
#   TPU_NAME=electra-v4-32 ZONE=us-central2-b BUCKET=my-bucket bash launch/tpu_pod.sh [--config.KEY=VALUE ...]
# The workdir is gs://$BUCKET/electra/<config name> unless WORKDIR is set: checkpoints, metrics and TensorBoard
# events go to Cloud Storage, which every worker reads and writes and which outlives a preempted slice; run the same
# command again to resume. Each worker needs this repository at $REPO with its requirements installed in
# $REPO/.venv (PYTHON names another interpreter; docs/scale.md shows the whole recipe: slice, install, data, launch,
# TensorBoard, preemption). DRY_RUN=1 prints the gcloud command instead of running it.
# ELECTRA_JAX_DISTRIBUTED=1 makes electra_jax call jax.distributed.initialize(), which finds the slice's coordinator
# and this worker's rank from the TPU metadata.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
CONFIG="${CONFIG:-configs/large.py}"
if [[ -z "${WORKDIR:-}" ]]; then
  : "${BUCKET:?set BUCKET (the workdir is gs://BUCKET/electra/CONFIG_NAME) or WORKDIR}"
  NAME="$(basename "${CONFIG%%:*}" .py)"  # configs/small.py:quickstart -> small_quickstart
  [[ "$CONFIG" == *:* ]] && NAME+="_${CONFIG#*:}" && NAME="${NAME//:/_}"
  WORKDIR="gs://${BUCKET}/electra/${NAME}"
fi
REPO="${REPO:-\$HOME/electra_jax}"  # expanded on the workers
REPO="${REPO/#\~\//\$HOME/}"  # ~/x: quoted below, ~ would not expand there
PYTHON="${PYTHON:-.venv/bin/python}"  # relative to REPO
ARGS="$(printf ' %q' --config="$CONFIG" --workdir="$WORKDIR" "$@")"
echo "workdir: $WORKDIR" >&2
COMMAND=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command
         "cd \"$REPO\" && ELECTRA_JAX_DISTRIBUTED=1 $PYTHON -m electra_jax.main$ARGS")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q' "${COMMAND[0]}"; printf ' %q' "${COMMAND[@]:1}"; printf '\n'
else
  "${COMMAND[@]}"
fi
