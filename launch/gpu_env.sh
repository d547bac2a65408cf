# The environment of a GPU run, sourced by launch/gpu_single_node.sh and launch/gpu_slurm.sbatch. Source it before
# `python -m electra_jax.aot --topology=h100:8` too, to compile with the flags the run will use. A variable already
# set is kept (XLA_FLAGS given by the user go after these, and the last of two equal flags wins).

# The share of each GPU's memory JAX preallocates (its default: .75). The rest is for NCCL's buffers, the cuDNN and
# cuBLAS workspaces and the CUDA context. The GPU presets (configs/gpu.py) fit in 80% of the default .75.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"

# XLA:GPU flags; tests/test_launch.py checks that jax 0.10.2's XLA knows every one (it aborts on an unknown flag).
#   latency-hiding scheduler: start the gradient all-reduce (FSDP: all-gathers, reduce-scatters) early and
#     overlap it with the backward pass instead of running it after;
#   highest-priority async stream: those collectives are not held up behind queued compute kernels;
#   combine thresholds: gradients all-reduced in a few 128 MiB buffers (one NCCL call each) rather than many small.
GPU_XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_highest_priority_async_stream=true'
GPU_XLA_FLAGS+=' --xla_gpu_all_reduce_combine_threshold_bytes=134217728'
GPU_XLA_FLAGS+=' --xla_gpu_all_gather_combine_threshold_bytes=134217728'
GPU_XLA_FLAGS+=' --xla_gpu_reduce_scatter_combine_threshold_bytes=67108864'
export XLA_FLAGS="${GPU_XLA_FLAGS}${XLA_FLAGS:+ ${XLA_FLAGS}}"

# NCCL picks NVLink within a node and InfiniBand (or RoCE) across nodes by itself. WARN: a failing collective says
# why (INFO also prints the rings and channels it chose). If it picks the wrong network, set NCCL_SOCKET_IFNAME
# (bootstrap interface, e.g. =ib0 or =^lo,docker) and NCCL_IB_HCA (e.g. =mlx5) as your cluster's guide says.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# `launch COMMAND...`: runs COMMAND, or with DRY_RUN=1 prints the environment above and COMMAND (shell-quoted).
launch() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    local name
    for name in XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA; do
      if [[ -n "${!name:-}" ]]; then printf '%s=%q\n' "$name" "${!name}"; fi
    done
    printf '%q' "$1"; shift; printf ' %q' "$@"; printf '\n'
  else
    exec "$@"
  fi
}
