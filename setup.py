"""electra_jax: pre-train and fine-tune ELECTRA text encoders with JAX and Flax."""

import setuptools

setuptools.setup(
    name='electra_jax',
    version='0.1.0',
    description='ELECTRA pre-training and fine-tuning in JAX/Flax, from one CPU to TPU pods',
    python_requires='>=3.10',
    packages=setuptools.find_packages(include=['electra_jax', 'electra_jax.*', 'configs', 'configs.*']),
    package_data={'electra_jax.data': ['quickstart/*.txt.gz']},
    install_requires=[
        'jax>=0.10', 'flax>=0.12', 'optax>=0.2.8', 'orbax-checkpoint>=0.12', 'tensorflow-datasets>=4.9',
        'importlib_resources',  # imported by tensorflow-datasets when it prepares a dataset, not declared by it
        'grain>=0.2', 'sentencepiece>=0.2', 'ml_collections>=1.1', 'absl-py', 'numpy', 'tqdm', 'tensorboardX',
        'safetensors', 'tokenizers', 'matplotlib>=3.8', 'etils[epath]', 'fsspec', 'gcsfs', 'google-crc32c',
    ],
    # The tests run against a local Cloud Storage emulator (gcp-storage-emulator), started by a pytest fixture.
    extras_require={'test': ['torch==2.13.0', 'transformers==5.23.0', 'pytest', 'pytest-xdist', 'hypothesis',
                             'gcp-storage-emulator==2026.7.19']},
)
