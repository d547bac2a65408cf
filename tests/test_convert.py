"""Hugging Face / TF conversion: names, configs, logits and loss equal to transformers', exact round trips."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from electra_jax import checkpoint, config_files, convert, masking, objective, pretrained, sharding  # noqa: E402
from electra_jax.config import ModelConfig, ObjectiveConfig  # noqa: E402
from electra_jax.model import Electra  # noqa: E402
from electra_jax.train_step import Pretraining  # noqa: E402
from helpers import CONVERT_MODEL, SPECIAL, random_params  # noqa: E402  # pylint: disable=g-bad-import-order
from helpers import HF_SIZES as SIZES, WORDPIECE_VOCAB as VOCAB  # noqa: E402
from helpers import hf_models, loss_of, save_hf, write_tokenizer_files  # noqa: E402

# Every test here compiles or trains a model (or shares a module fixture that does): the slow tier.
pytestmark = pytest.mark.slow

MASK = 4


def example_batch():
  """Two sequences, the second padded after 7 tokens, with both segment ids."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, len(VOCAB), size=(2, 12)).astype(np.int32)
  ids[:, 0] = 2
  ids[0, -1] = ids[1, 6] = 3
  ids[1, 7:] = 0
  mask = (ids != 0).astype(np.int32)
  segments = np.zeros_like(ids)
  segments[0, 6:] = 1
  segments[1, 4:7] = 1
  return ids, segments, mask


def hf_logits(disc, gen, ids, segments, mask):
  with torch.no_grad():
    kwargs = dict(attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(segments))
    return (disc(torch.tensor(ids), **kwargs).logits.numpy(), gen(torch.tensor(ids), **kwargs).logits.numpy())


@functools.partial(jax.jit, static_argnames='config')
def _forward(params, ids, segments, mask, *, config):
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  gen_logits, disc_logits = Electra(config).apply({'params': params}, ids, segments, mask, positions)
  return disc_logits, gen_logits, Electra(config).apply({'params': params}, ids, segments, mask, method='encode')


def our_logits(model_config, params, ids, segments, mask):
  """(discriminator logits [batch, length], generator logits [batch, length, vocab], encoder output), deterministic."""
  return tuple(np.asarray(x) for x in _forward(params, ids, segments, mask, config=model_config))


def assert_logits_close(ours, theirs, mask):
  real = mask > 0
  for a, b in zip(ours[:2], theirs):
    assert a.shape == b.shape
    np.testing.assert_allclose(a[real], b[real], atol=1e-4, rtol=0)


def test_hf_names_are_exactly_transformers_state_dict_keys():
  model = ModelConfig(vocab_size=len(VOCAB), embedding_size=32, hidden_size=64, num_layers=2, num_heads=2,
                      intermediate_size=96, generator_hidden_fraction=0.5, max_position_embeddings=32)
  names = {convert.DISC: set(), convert.GEN: set()}
  for path in traverse_util.flatten_dict(pretrained.abstract_params(Electra(model))):
    for what in convert.hf_name(path)[0]:
      names[what].add(convert.hf_name(path)[1])
  disc, gen = hf_models(32, 64, 32, 2)
  assert names[convert.DISC] == set(disc.state_dict())
  assert names[convert.GEN] == set(gen.state_dict()) - {'generator_lm_head.weight'}  # tied to the embeddings
  assert convert.hf_name(('discriminator', 'encoder', 'layer_1', 'attention', 'self', 'query', 'kernel')) == (
      (convert.DISC,), 'electra.encoder.layer.1.attention.self.query.weight')


@pytest.fixture(scope='module', params=SIZES.values(), ids=SIZES.keys())
def imported(request, tmp_path_factory):
  """HF models saved to disk and imported with the command line: {disc, gen, dirs, workdir, config, params}."""
  tmp_path = tmp_path_factory.mktemp('imported')
  disc, gen = hf_models(*request.param)
  disc_dir, gen_dir = save_hf(tmp_path, disc, gen)
  convert.main(['--from-hf', disc_dir, '--from-hf-generator', gen_dir, '--out', str(tmp_path / 'run')])
  config, params = pretrained.load_params(str(tmp_path / 'run'))
  return dict(sizes=request.param, disc=disc, gen=gen, disc_dir=disc_dir, gen_dir=gen_dir,
              workdir=str(tmp_path / 'run'), config=config, params=params)


def test_import_hf_pair_gives_transformers_logits(imported):
  config = imported['config']
  embedding_size, hidden, gen_hidden, gen_layers = imported['sizes']
  assert config.model.tower(generator=True).hidden_size == gen_hidden
  assert config.model.tower(generator=True).num_layers == gen_layers
  assert (config.model.embedding_size, config.model.hidden_size) == (embedding_size, hidden)
  assert config.data.lowercase
  assert sorted(f for f in os.listdir(imported['workdir']) if not f.startswith(('checkpoints', 'config'))) == [
      'electra_tokenizer.json', 'tokenizer_config.json', 'vocab.txt']
  ids, segments, mask = example_batch()
  assert_logits_close(our_logits(config.model, imported['params'], ids, segments, mask),
                      hf_logits(imported['disc'], imported['gen'], ids, segments, mask), mask)


@pytest.mark.parametrize('imported', [SIZES['E!=H']], ids=['E!=H'], indirect=True)
def test_import_is_a_train_state_the_trainer_resumes_from(imported):
  config = config_files.load_config(imported['workdir'])
  run = Pretraining(config, SPECIAL, sharding.make_mesh(config.mesh))
  checkpointer = checkpoint.Checkpointer(imported['workdir'])
  state, data_state = checkpointer.restore(0, run.abstract_state())
  checkpointer.close()
  assert int(state.step) == 0 and data_state == {}  # no data position: a run from it starts at its data's start
  jax.tree.map(np.testing.assert_array_equal, state.params, imported['params'])
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(state.opt_state))  # a fresh Adam: zero moments


@pytest.mark.parametrize('imported', [SIZES['E!=H']], ids=['E!=H'], indirect=True)
def test_import_discriminator_alone_initialises_the_generator(imported, tmp_path):
  with pytest.warns(convert.ConversionWarning, match='initialised randomly'):
    convert.import_hf(imported['disc_dir'], str(tmp_path / 'run'))
  config, params = pretrained.load_params(str(tmp_path / 'run'))
  assert config.model.generator_hidden_fraction == 0.25  # configs/default.py's, as nothing says otherwise
  for name in ('embeddings', 'discriminator'):  # the same as the pair's, which give transformers' logits
    jax.tree.map(np.testing.assert_array_equal, params[name], imported['params'][name])
  generator = params['generator']['encoder']['layer_0']
  assert generator['attention']['self']['query']['kernel'].shape == (16, 16)
  np.testing.assert_array_equal(generator['output']['LayerNorm']['scale'], np.ones(16))
  # Truncated at 2 std, so a little narrower than the config's initializer_range (0.1 in these HF configs).
  assert 0.8 < np.std(generator['intermediate']['dense']['kernel']) / config.model.initializer_range < 1


def test_import_refuses_a_generator_it_cannot_represent(tmp_path):
  disc, gen = hf_models(*SIZES['E!=H'])
  disc_dir, gen_dir = save_hf(tmp_path, disc, gen)
  config = json.loads((tmp_path / 'hf_gen' / 'config.json').read_text())
  (tmp_path / 'hf_gen' / 'config.json').write_text(json.dumps(dict(config, num_attention_heads=2)))
  with pytest.raises(convert.ConversionError, match=r'heads = max\(1, 32 // 64\) = 1'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'), generator_dir=gen_dir)
  assert not os.path.exists(tmp_path / 'run')


def test_import_refuses_a_generator_with_another_layer_norm_eps(tmp_path):
  """electra_jax has one model.layer_norm_eps: the generator's would otherwise be replaced by the discriminator's."""
  disc_dir, gen_dir = save_hf(tmp_path, *hf_models(*SIZES['E!=H']))
  config = json.loads((tmp_path / 'hf_gen' / 'config.json').read_text())
  (tmp_path / 'hf_gen' / 'config.json').write_text(json.dumps(dict(config, layer_norm_eps=1e-2)))
  with pytest.raises(convert.ConversionError, match='generator layer_norm_eps=0.01 but discriminator layer_norm_eps'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'), generator_dir=gen_dir)
  assert not os.path.exists(tmp_path / 'run')


def test_a_damaged_hf_directory_is_one_line(tmp_path):
  """A model.safetensors cut short or a config.json that is not JSON (a copy that stopped): SafetensorError and
  JSONDecodeError tracebacks before."""
  disc_dir, _ = save_hf(tmp_path, *hf_models(*SIZES['E!=H']))
  weights = tmp_path / 'hf_disc' / 'model.safetensors'
  whole = weights.read_bytes()
  weights.write_bytes(whole[:7])
  with pytest.raises(convert.ConversionError, match=r'model.safetensors cannot be read \(.*\): it is damaged or '
                     r'incomplete; copy or download it again$'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'))
  weights.write_bytes(whole)
  (tmp_path / 'hf_disc' / 'config.json').write_text('{"architectures": [')
  with pytest.raises(convert.ConversionError, match=r'config.json is damaged \(not a JSON object: .*\): copy or '
                     r'download the model again$'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


def test_wrong_directories_say_in_one_line_which_flag_they_belong_to(tmp_path, capsys):
  """A generator or a bare encoder given as --from-hf, a discriminator as --from-hf-generator, and an HF directory
  given to --checkpoint: one error line saying what the directory is and what to do (no warning before it)."""
  disc, gen = hf_models(*SIZES['E!=H'])
  disc_dir, gen_dir = save_hf(tmp_path, disc, gen)
  disc.electra.save_pretrained(tmp_path / 'encoder')
  capsys.readouterr()  # transformers' progress bars
  out = str(tmp_path / 'run')
  for argv, expected in (
      (['--from-hf', gen_dir, '--out', out], 'is an ElectraForMaskedLM (a generator): pass it as --from-hf-generator'),
      (['--from-hf', disc_dir, '--from-hf-generator', disc_dir, '--out', out],
       'is an ElectraForPreTraining (a discriminator): pass it as --from-hf,'),
      (['--from-hf', str(tmp_path / 'encoder'), '--out', out],
       'is a Hugging Face ElectraModel, but --from-hf takes the pre-trained discriminator with its head'),
      (['--checkpoint', disc_dir, '--to-hf', str(tmp_path / 'hf')],
       f'{disc_dir} is a Hugging Face model directory, not an electra_jax workdir: import it first with '
       f'python -m electra_jax.convert --from-hf {disc_dir} --out WORKDIR')):
    with pytest.raises(SystemExit) as exit_info:
      convert.main(argv)
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1 and expected in error, error
  assert not os.path.exists(out) and not os.path.exists(tmp_path / 'hf')


def test_import_keeps_the_discriminator_embeddings_and_warns_when_they_differ(tmp_path):
  disc, gen = hf_models(*SIZES['E!=H'])
  with torch.no_grad():
    gen.electra.embeddings.LayerNorm.bias.add_(1.0)
  disc_dir, gen_dir = save_hf(tmp_path, disc, gen)
  with pytest.warns(convert.ConversionWarning, match='electra.embeddings.LayerNorm.bias'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'), generator_dir=gen_dir)
  _, params = pretrained.load_params(str(tmp_path / 'run'))
  np.testing.assert_array_equal(params['embeddings']['LayerNorm']['bias'],
                                disc.electra.embeddings.LayerNorm.bias.detach().numpy())


def test_import_without_a_tokenizer_says_so(tmp_path):
  """It succeeded in silence, and detect or fine-tuning then found no tokenizer in the workdir."""
  disc_dir, gen_dir = save_hf(tmp_path, *hf_models(*SIZES['E!=H']))
  for name in convert.TOKENIZER_FILES:
    (tmp_path / 'hf_disc' / name).unlink(missing_ok=True)
  with pytest.warns(convert.ConversionWarning, match=f'^{disc_dir} and {gen_dir} hold no tokenizer .*: copy the one '
                    f'the model was trained with into {tmp_path / "run"} before'):
    convert.import_hf(disc_dir, str(tmp_path / 'run'), generator_dir=gen_dir)
  assert pretrained.load_params(str(tmp_path / 'run'))[0].model.vocab_size == 100


def test_import_refuses_a_tokenizer_of_another_size_before_writing(tmp_path, capsys):
  disc_dir, gen_dir = save_hf(tmp_path, *hf_models(*SIZES['E!=H']))
  (tmp_path / 'hf_disc' / 'vocab.txt').write_text('\n'.join(VOCAB + [f'extra{i}' for i in range(20)]) + '\n')
  with pytest.raises(SystemExit) as exit_info:
    convert.main(['--from-hf', disc_dir, '--from-hf-generator', gen_dir, '--out', str(tmp_path / 'run')])
  assert exit_info.value.code == 1
  assert f'{disc_dir}/vocab.txt holds 120 tokens but the word embeddings have 100 rows' in capsys.readouterr().err
  assert not os.path.exists(tmp_path / 'run')


def test_an_interrupted_import_can_be_rerun_and_keeps_what_was_there(tmp_path, monkeypatch, capsys):
  """Ctrl-C while the checkpoint is written: the CLI says to run the same command again, which must then work (no
  checkpoints/ left that reads as a run), whether --out was new or already held the user's own files."""
  disc_dir, gen_dir = save_hf(tmp_path, *hf_models(*SIZES['E!=H']))
  (tmp_path / 'existing').mkdir()
  (tmp_path / 'existing' / 'notes.txt').write_text('mine')
  save = checkpoint.Checkpointer.save
  def interrupted(self, *args, **kwargs):
    save(self, *args, **kwargs)
    raise KeyboardInterrupt
  for out, left in ((tmp_path / 'new', None), (tmp_path / 'existing', ['notes.txt'])):
    argv = ['--from-hf', disc_dir, '--from-hf-generator', gen_dir, '--out', str(out)]
    with monkeypatch.context() as patch:
      patch.setattr(checkpoint.Checkpointer, 'save', interrupted)
      with pytest.raises(SystemExit) as exit_info:
        convert.main(argv)
    assert exit_info.value.code == 130 and 'run the same command again' in capsys.readouterr().err
    assert (sorted(os.listdir(out)) if out.exists() else None) == left
    convert.main(argv)
    assert (out / 'notes.txt').exists() == (left is not None)
    config, _ = pretrained.load_params(str(out))
    assert config.model.hidden_size == 64


def random_workdir(path, model_section, seed=0):
  """A workdir holding our own model with random parameters, and a WordPiece vocabulary."""
  model = ModelConfig(**model_section)
  params = random_params(model, seed)
  tokenizer_dir = f'{path}_tokenizer'
  os.makedirs(tokenizer_dir)
  write_tokenizer_files(tokenizer_dir)
  convert.write_workdir(str(path), model_section, params, tokenizer_dir=tokenizer_dir)
  return model, params


MODEL_SECTION = dict(CONVERT_MODEL, vocab_size=len(VOCAB))


def test_export_loads_in_transformers_and_round_trips_bit_exactly(tmp_path):
  model, params = random_workdir(tmp_path / 'ours', MODEL_SECTION)
  assert model.embedding_size != model.hidden_size and model.tower(generator=True).hidden_size == 32
  convert.main(['--checkpoint', str(tmp_path / 'ours'), '--to-hf', str(tmp_path / 'hf')])

  disc_dir, gen_dir = str(tmp_path / 'hf' / 'discriminator'), str(tmp_path / 'hf' / 'generator')
  assert {'vocab.txt', 'tokenizer_config.json', 'config.json', 'model.safetensors'} <= set(os.listdir(disc_dir))
  disc, info = transformers.ElectraForPreTraining.from_pretrained(disc_dir, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  gen, info = transformers.ElectraForMaskedLM.from_pretrained(gen_dir, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  assert gen.generator_lm_head.weight.data_ptr() == gen.electra.embeddings.word_embeddings.weight.data_ptr()
  encoder, info = transformers.ElectraModel.from_pretrained(disc_dir, output_loading_info=True)
  assert not info['missing_keys'] and not info['mismatched_keys']
  assert all(k.startswith('discriminator_predictions.') for k in info['unexpected_keys'])  # the head it lacks
  assert gen.config.num_hidden_layers == 1 and gen.config.hidden_size == 32

  ids, segments, mask = example_batch()
  assert_logits_close(our_logits(model, params, ids, segments, mask),
                      hf_logits(disc.eval(), gen.eval(), ids, segments, mask), mask)
  with torch.no_grad():
    hidden = encoder.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask),
                            token_type_ids=torch.tensor(segments)).last_hidden_state.numpy()
  ours = our_logits(model, params, ids, segments, mask)[2]
  np.testing.assert_allclose(ours[mask > 0], hidden[mask > 0], atol=1e-4, rtol=0)

  convert.import_hf(disc_dir, str(tmp_path / 'back'), generator_dir=gen_dir)
  config, back = pretrained.load_params(str(tmp_path / 'back'))
  assert config.model == model
  flat, flat_back = traverse_util.flatten_dict(params), traverse_util.flatten_dict(back)
  assert flat.keys() == flat_back.keys()
  for path, value in flat.items():
    np.testing.assert_array_equal(np.asarray(flat_back[path]), value, err_msg='/'.join(path))


def test_export_refuses_untied_or_fully_tied_generators(tmp_path, capsys):
  """HF's generator shares exactly the embeddings: a workdir trained with another model.tying is refused."""
  for tying in ('none', 'all'):
    section = {**MODEL_SECTION, 'tying': tying}
    if tying == 'all':
      section.update(generator_hidden_fraction=1.0, generator_layers_fraction=1.0)
    random_workdir(tmp_path / tying, section)
    with pytest.raises(SystemExit) as exit_info:
      convert.main(['--checkpoint', str(tmp_path / tying), '--to-hf', str(tmp_path / f'hf_{tying}')])
    assert exit_info.value.code == 1
    assert f"model.tying='{tying}'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / f'hf_{tying}')


@pytest.mark.parametrize('imported', [SIZES['E!=H']], ids=['E!=H'], indirect=True)
def test_loss_equals_transformers_loss_for_fixed_corruption(imported):
  disc, gen, config, params = imported['disc'], imported['gen'], imported['config'], imported['params']
  ids, segments, mask = example_batch()

  # Three prediction slots per row; row 1's last slot is padding. Row 0 shows position 7 unmasked (the 15% case).
  positions = np.array([[3, 7, 9], [1, 5, 2]], np.int32)
  weights = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
  targets = np.take_along_axis(ids, positions, axis=1)
  shown = np.where([[1, 0, 1], [1, 1, 0]], MASK, targets)
  masked_ids = ids.copy()
  np.put_along_axis(masked_ids, positions, shown, axis=1)
  # Samples: one equals the original (labelled real), the padding slot's sample must be ignored.
  samples = np.array([[targets[0, 0], 11, 12], [13, 14, 15]], np.int32)
  masked = masking.Masked(jnp.asarray(masked_ids), jnp.asarray(positions), jnp.asarray(targets),
                          jnp.asarray(weights))
  batch = {'input_ids': jnp.asarray(ids), 'segment_ids': jnp.asarray(segments), 'input_mask': jnp.asarray(mask)}
  model = Electra(config.model)
  apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)
  loss_fn = jax.jit(lambda params, batch, masked: loss_of('electra')(
      apply_fn, params, batch, masked, lambda _: jnp.asarray(samples), config=ObjectiveConfig(), deterministic=True))
  loss, metrics = loss_fn(params, batch, masked)

  labels = np.full_like(ids, -100)
  corrupted = ids.copy()
  for row in range(2):
    for slot in range(3):
      if weights[row, slot]:
        labels[row, positions[row, slot]] = targets[row, slot]
        corrupted[row, positions[row, slot]] = samples[row, slot]
  replaced = ((corrupted != ids) & (mask > 0)).astype(np.int64)
  assert replaced.sum() == 4
  kwargs = dict(attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(segments))
  with torch.no_grad():
    gen_loss = gen(torch.tensor(masked_ids), labels=torch.tensor(labels).long(), **kwargs).loss.item()
    disc_loss = disc(torch.tensor(corrupted), labels=torch.tensor(replaced), **kwargs).loss.item()
  np.testing.assert_allclose(float(metrics['gen_loss'][0]), gen_loss, rtol=1e-5)
  np.testing.assert_allclose(float(metrics['disc_loss'][0]), disc_loss, rtol=1e-5)
  np.testing.assert_allclose(float(loss), gen_loss + 50 * disc_loss, rtol=1e-5, atol=1e-4)


def test_export_refuses_an_existing_export_and_an_interrupted_one_can_be_rerun(tmp_path, monkeypatch, capsys):
  """A second export into the same --to-hf would mix the first one's files (its tokenizer) into the second's: it is
  refused, nothing written. An export stopped by Ctrl-C leaves no discriminator/ behind, so that it can be rerun."""
  random_workdir(tmp_path / 'ours', MODEL_SECTION)
  (tmp_path / 'hf').mkdir()
  (tmp_path / 'hf' / 'README.md').write_text('mine')
  argv = ['--checkpoint', str(tmp_path / 'ours'), '--to-hf', str(tmp_path / 'hf')]
  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  with monkeypatch.context() as patch:
    patch.setattr(convert.hf_tokenizer, 'save', interrupted)  # the discriminator's weights are written by then
    with pytest.raises(SystemExit) as exit_info:
      convert.main(argv)
  assert exit_info.value.code == 130 and os.listdir(tmp_path / 'hf') == ['README.md']
  convert.main(argv)
  weights = (tmp_path / 'hf' / 'generator' / 'model.safetensors').read_bytes()
  capsys.readouterr()

  random_workdir(tmp_path / 'other', MODEL_SECTION, seed=1)
  with pytest.raises(SystemExit) as exit_info:
    convert.main(['--checkpoint', str(tmp_path / 'other'), '--to-hf', str(tmp_path / 'hf')])
  assert exit_info.value.code == 1
  assert f'{tmp_path}/hf/discriminator already exists: give a new --to-hf' in capsys.readouterr().err
  assert (tmp_path / 'hf' / 'generator' / 'model.safetensors').read_bytes() == weights


def objective_workdir(path, name):
  """A workdir holding random parameters of the model objective `name` trains, as its run would have saved it."""
  params = jax.tree.map(lambda s: np.random.default_rng(0).normal(0, 0.1, s.shape).astype(np.float32),
                        pretrained.abstract_params(objective.get(name).model(ModelConfig(**MODEL_SECTION))))
  os.makedirs(f'{path}_tokenizer')
  write_tokenizer_files(f'{path}_tokenizer')
  convert.write_workdir(str(path), MODEL_SECTION, params, tokenizer_dir=f'{path}_tokenizer')
  config = json.loads((path / 'config.json').read_text())
  config['objective'].update(name=name, generator_checkpoint=str(path) if name == 'electra_frozen' else '')
  (path / 'config.json').write_text(json.dumps(config))
  return params


def test_export_refuses_mlm_heads_and_writes_no_generator_for_electra_frozen(tmp_path, capsys):
  """ElectraForPreTraining's head detects replaced tokens: a run whose discriminator-sized model has an MLM head
  instead is refused (transformers would draw the head at random); electra_frozen, which has no generator of its
  own, exports its discriminator alone (not a generator/ holding only the embeddings)."""
  for name in ('mlm', 'replace_mlm'):
    objective_workdir(tmp_path / name, name)
    with pytest.raises(SystemExit) as exit_info:
      convert.main(['--checkpoint', str(tmp_path / name), '--to-hf', str(tmp_path / f'hf_{name}')])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert f"objective.name='{name}'" in error and 'electra, electra_15, electra_adversarial, electra_frozen' in error
    assert not os.path.exists(tmp_path / f'hf_{name}')

  params = objective_workdir(tmp_path / 'frozen', 'electra_frozen')
  convert.main(['--checkpoint', str(tmp_path / 'frozen'), '--to-hf', str(tmp_path / 'hf')])
  assert 'discriminator only: the run has no generator of its own' in capsys.readouterr().out
  assert os.listdir(tmp_path / 'hf') == ['discriminator']
  disc, info = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / 'hf' / 'discriminator'),
                                                                  output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  np.testing.assert_array_equal(disc.discriminator_predictions.dense_prediction.bias.detach().numpy(),
                                params['discriminator']['discriminator_predictions']['dense_prediction']['bias'])


def test_tf_names_follow_google_checkpoints_and_invert():
  assert convert.tf_name(('embeddings', 'word_embeddings', 'embedding')) == 'electra/embeddings/word_embeddings'
  assert convert.tf_name(('embeddings', 'LayerNorm', 'scale')) == 'electra/embeddings/LayerNorm/gamma'
  assert convert.tf_name(('generator', 'encoder', 'layer_0', 'output', 'LayerNorm', 'bias')) == (
      'generator/encoder/layer_0/output/LayerNorm/beta')
  assert convert.tf_name(('discriminator', 'embeddings_project', 'kernel')) == 'electra/embeddings_project/kernel'
  assert convert.tf_name(('discriminator', 'discriminator_predictions', 'dense_prediction', 'kernel')) == (
      'discriminator_predictions/dense_1/kernel')
  assert convert.tf_name(('generator', 'generator_lm_head', 'bias')) == 'generator_predictions/output_bias'

  model = ModelConfig(**dict(MODEL_SECTION, num_heads=1))  # TF checkpoints do not store heads: hidden // 64
  params = random_params(model, seed=3)
  weights = {convert.tf_name(p): v for p, v in traverse_util.flatten_dict(params).items()}
  assert len(weights) == len(traverse_util.flatten_dict(params))
  section = convert.model_section_from_tf({k: v.shape for k, v in weights.items()})
  assert ModelConfig(**section) == model
  back = convert.params_from_tf(model, weights, seed=4)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  with pytest.raises(convert.ConversionError, match='unexpected TF variables: electra/pooler/dense/kernel'):
    convert.params_from_tf(model, dict(weights, **{'electra/pooler/dense/kernel': np.zeros((64, 64))}))


def test_from_tf_without_tensorflow_says_how_to_install_it(tmp_path, capsys):
  try:
    import tensorflow  # noqa: F401, PLC0415
    pytest.skip('tensorflow is installed')
  except ImportError:
    pass
  write_tokenizer_files(tmp_path)
  with pytest.raises(SystemExit) as exit_info:
    convert.main(['--from-tf', str(tmp_path / 'model.ckpt'), '--out', str(tmp_path / 'run')])
  assert exit_info.value.code == 1
  assert 'pip install tensorflow' in capsys.readouterr().err
