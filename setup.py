"""electra_jax: pre-train and fine-tune ELECTRA text encoders with JAX and Flax."""

import setuptools

TPU_COMPILER = 'libtpu==0.0.42.1'
BEAM = 'apache-beam==2.77.0'
TEST_RUNNER = ['pytest==9.2.0', 'pytest-xdist==3.8.0', 'gcp-storage-emulator==2026.7.19']
LINTER = 'ruff==0.17.5'  # its settings: pyproject.toml; its command: CONTRIBUTING.md

setuptools.setup(
    name='electra_jax',
    version='0.1.0',
    description='ELECTRA pre-training and fine-tuning in JAX/Flax, from one CPU to TPU pods',
    python_requires='>=3.11',  # jax 0.10.2's
    # The repository's configs/ is installed inside the package, as electra_jax.configs (not a top-level `configs`
    # that would collide with other projects'): `--config=configs/NAME.py` finds it there (electra_jax.config_files).
    packages=(setuptools.find_packages(include=['electra_jax', 'electra_jax.*'])
              + ['electra_jax.configs', 'electra_jax.configs.experiments']),
    package_dir={'electra_jax.configs': 'configs'},
    package_data={'electra_jax.data': ['quickstart/*.txt.gz']},
    install_requires=[
        'jax>=0.10', 'flax>=0.12', 'optax>=0.2.8', 'orbax-checkpoint>=0.12', 'tensorflow-datasets>=4.9',
        'importlib_resources',  # imported by tensorflow-datasets when it prepares a dataset, not declared by it
        'grain>=0.2', 'sentencepiece>=0.2', 'ml_collections>=1.1', 'absl-py', 'numpy', 'tqdm', 'tensorboardX',
        'safetensors', 'tokenizers', 'matplotlib>=3.8', 'etils[epath]', 'fsspec', 'gcsfs', 'google-crc32c',
    ],
    # Tests and benchmarks only (parity with Hugging Face's PyTorch ELECTRA, property tests, the TPU compile test,
    # a local Cloud Storage emulator for the gs:// tests). Pinned exactly: an open torch range pulls a multi-GB CUDA
    # build.
    extras_require={
        'test': ['torch==2.13.0', 'transformers==5.23.0', 'hypothesis==6.155.2', TPU_COMPILER] + TEST_RUNNER,
        # The TPU runtime and compiler, the version jax[tpu]==0.10.2 pins. On a TPU VM it runs the TPU; on any other
        # machine `python -m electra_jax.aot` uses it to compile for a TPU slice.
        'tpu': [TPU_COMPILER],
        # The CUDA plugin and NVIDIA's CUDA/cuDNN/NCCL wheels (~5 GB): on a GPU machine they run the GPUs; on any
        # other machine `python -m electra_jax.aot --topology=h100:8` uses them to compile for GPUs. CI tests jax
        # 0.10.2 (on CPUs); the GPU path was measured on jax 0.11.2 with its CUDA 13 plugin on one H200 (2026-11-26
        # to 28), where the code ran unchanged (docs/gpu.md).
        'cuda': ['jax[cuda12]==0.10.2'],
        # `data build --runner=...` on Apache Beam (Dataflow, Flink, Spark, or DirectRunner locally): ~0.5 GB. Beam
        # holds protobuf below 7, so in the same environment a SentencePiece tokenizer cannot be converted to
        # Hugging Face's format (convert.py): install it where the data is built, not in the test extra. `beamtest`
        # is that environment plus the test runner: CI runs tests/test_beam_build.py in it (.ci/run).
        'beam': [BEAM],
        'beamtest': [BEAM] + TEST_RUNNER,
        # The linter CI runs (.ci/run), pinned: a newer ruff may add checks the tree does not pass yet.
        'lint': [LINTER],
    },
)
