"""electra_jax: pre-train and fine-tune ELECTRA text encoders with JAX and Flax."""

__version__ = '0.1.0'
