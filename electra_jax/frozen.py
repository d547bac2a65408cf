r"""A frozen, pre-trained generator (Fast-ELECTRA, arXiv 2310.07347): objective 'electra_frozen'.

  python -m electra_jax.main --config=configs/tiny.py --config.objective.name=electra_frozen \
      --config.objective.generator_checkpoint=MLM_WORKDIR [--config.objective.generator_step=N] \
      --config.objective.initial_temperature=2 --config.objective.temperature_decay_fraction=0.5 --workdir=WORKDIR

The replacements are sampled from the MLM of another pre-training run of this project, at checkpoint
objective.generator_step (0: its latest): of an `mlm` run its discriminator-sized model and MLM head
(`Electra.discriminator_mlm_logits`), of any run with a generator (electra, electra_floor, ...) its generator
(`Electra.generator_logits`). The run must use that run's tokenizer (it is checked; data.tokenizer=MLM_WORKDIR).

The generator is not trained: it runs without dropout, under stop_gradient, and the optimiser gives its parameters
no update (optax.set_to_zero, no Adam moments). Its parameters are copied into this run's state at step 0 (the
`frozen_generator` subtree) and checkpointed with the rest, so a resumed run samples from exactly the same weights
(its workdir's config.json is read again to rebuild its architecture). The samples follow the objective's
temperature schedule (objective.initial_temperature falling to objective.temperature). The loss is the
discriminator's alone; gen_loss and gen_accuracy report the frozen MLM on the batch.

FLOPs ('matmul' convention, `objective.train_flops_per_step`): a step costs 3 x the discriminator's forward pass
(embeddings, encoder, RTD head) plus 1 x the frozen generator's forward pass (its encoder at every token, its MLM
head at the selected positions): no backward pass runs through it. That is the run's `train_flops`. What the
generator cost to train (`generator_train_flops`: its step x its own run's FLOPs per step) is a one-off cost,
reported apart and not included: `frozen.describe` prints both, the compare runner records both.

The objective 'electra_frozen' (`electra_jax.objective.OBJECTIVES`) points here for each of these; this module is
below it and never looks an objective up by name: the generator run's objective comes with it (`Source`).
"""

import dataclasses
import sys
from typing import Any, NamedTuple

import jax
import optax

from electra_jax import checkpoint, continued, flops
from electra_jax.config import ModelConfig, TrainConfig
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import CheckpointError, ConfigError
from electra_jax.model import Electra

PARAMS = 'frozen_generator'  # the subtree of the run's params that holds the generator


class FrozenGeneratorElectra(Electra):
  """A discriminator (Electra without its own generator) whose `generator_logits` are a frozen MLM's.

  `generator_config` is the generator run's model; `generator_kind` 'mlm' (an mlm run: its discriminator-sized
  MLM) or 'generator' (a run's generator tower). Its parameters are `frozen_generator/...`, laid out as that run's.
  """
  generator_config: ModelConfig | None = None
  generator_kind: str = 'generator'

  def setup(self):
    super().setup()
    mlm = self.generator_kind == 'mlm'
    self.frozen_generator = Electra(self.generator_config, with_generator=not mlm,
                                    discriminator_head='mlm' if mlm else 'rtd')

  def generator_logits(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True,
                       rows=None):
    """[batch, P, vocab] float32 logits of the frozen MLM at `positions` (no dropout, no gradient)."""
    del deterministic, rows  # a frozen generator samples from its trained weights, without dropout
    if self.generator_kind == 'mlm':
      logits, _ = self.frozen_generator.discriminator_mlm_logits(input_ids, segment_ids, input_mask, positions)
    else:
      logits = self.frozen_generator.generator_logits(input_ids, segment_ids, input_mask, positions)
    return jax.lax.stop_gradient(logits)

  def __call__(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True):
    return (self.generator_logits(input_ids, segment_ids, input_mask, positions),
            self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic=deterministic))


class Source(NamedTuple):
  """The run an electra_frozen run samples from (`objective.generator_source` reads it)."""
  config: TrainConfig  # its config.json
  objective: Any  # its `electra_jax.objective.Objective`: what its model holds, what its steps cost

  @property
  def kind(self) -> str:
    """'generator': the run's generator tower samples; 'mlm': an mlm run's discriminator-sized MLM does."""
    return 'generator' if self.objective.with_generator else 'mlm'


def check_source(c: TrainConfig, source: Source) -> Source:
  """`source` if run `c` can sample from it: a ConfigError if it has no MLM or another vocabulary."""
  path = c.objective.generator_checkpoint
  if not source.objective.with_generator and source.objective.discriminator_head != 'mlm':
    raise ConfigError(f'a {source.config.objective.name} run has no MLM to sample from: give '
                      'objective.generator_checkpoint an mlm run or a run with a generator (electra, ...)')
  if source.config.model.vocab_size != c.model.vocab_size:
    raise ConfigError(f'objective.generator_checkpoint {path} has {source.config.model.vocab_size} tokens, this run '
                      f'{c.model.vocab_size}: set data.tokenizer={path} (its tokenizer)')
  if c.data.max_seq_length > source.config.model.max_position_embeddings:
    raise ConfigError(f'data.max_seq_length={c.data.max_seq_length} exceeds objective.generator_checkpoint {path}\'s '
                      f'model.max_position_embeddings={source.config.model.max_position_embeddings}; lower '
                      'data.max_seq_length')
  return source


def model(c: TrainConfig, source: Source) -> FrozenGeneratorElectra:
  """Run `c`'s model: its discriminator and the frozen generator of `source`, which runs with this run's settings
  that change no parameter (`continued.FREE_MODEL_KEYS`: its attention, dtype, ...; a generator trained on a GPU
  saved attention=cudnn, and one with attention dropout could not run under this run's cuDNN attention)."""
  generator = dataclasses.replace(source.config.model, **{k: getattr(c.model, k) for k in continued.FREE_MODEL_KEYS})
  return FrozenGeneratorElectra(c.model, with_generator=False, generator_config=generator,
                                generator_kind=source.kind)


def optimizer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` for every parameter but the frozen generator's, which get no update (and no optimiser state)."""
  return optax.multi_transform({'train': tx, 'frozen': optax.set_to_zero()},
                               lambda params: {k: 'frozen' if k == PARAMS else 'train' for k in params})


def initial_state(c: TrainConfig, run, state, source: Source, tokenizer=None):
  """The step-0 state of electra_frozen run `c`: `state` with the generator's checkpoint in `frozen_generator`
  (laid out as `run` says). `tokenizer` (the run's) must be the generator's."""
  path = c.objective.generator_checkpoint
  if tokenizer is not None and tokenizer_lib.load(path).fingerprint != tokenizer.fingerprint:
    raise ConfigError(f'this run\'s tokenizer is not that of objective.generator_checkpoint {path}: the '
                      f'generator\'s embeddings are indexed by its own; set data.tokenizer={path}')
  step = c.objective.generator_step or latest_step(path)
  checkpointer = checkpoint.Checkpointer(path, read_only=True)
  try:
    params = checkpointer.restore_params(step, run.abstract_state().params[PARAMS])
  finally:
    checkpointer.close()
  if jax.process_index() == 0:
    print(describe(c, source, step), file=sys.stderr)
  return state.replace(params={**state.params, PARAMS: params})


def latest_step(path: str) -> int:
  """The newest checkpoint step of the pre-training WORKDIR `path`."""
  checkpointer = checkpoint.Checkpointer(path, read_only=True)
  try:
    step = checkpointer.latest_step()
  finally:
    checkpointer.close()
  if step is None:
    raise CheckpointError(f'objective.generator_checkpoint {path} holds no checkpoint')
  return step


def forward_flops_per_step(c: TrainConfig, source: Source) -> float:
  """FLOPs of one forward pass of the frozen generator of `source` over a batch of run `c`."""
  length = c.data.max_seq_length
  return c.batch_size * flops.mlm_forward_flops_per_sequence(source.config.model, source.kind == 'mlm', length,
                                                              c.objective.num_predictions(length))


def generator_train_flops(source: Source, step: int) -> float:
  """What training the generator cost: `step` steps of its own run."""
  return step * source.objective.train_flops_per_step(source.config)


def describe(c: TrainConfig, source: Source, step: int) -> str:
  return (f'frozen generator: the {source.kind} of {c.objective.generator_checkpoint} at step {step}; its forward '
          f'pass costs {forward_flops_per_step(c, source):.3e} FLOPs per step (counted in train_flops), training it '
          f'cost {generator_train_flops(source, step):.3e} FLOPs (not counted)')
