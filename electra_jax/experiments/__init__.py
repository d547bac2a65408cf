"""Experiments built from pre-training and fine-tuning runs, each a `python -m electra_jax.experiments.NAME`.

  compare   pre-training objectives at equal FLOPs budgets, fine-tuned on tasks against from-scratch training
"""
