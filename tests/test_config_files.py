"""`--config=configs/NAME.py` from a clone and from an installed package, which has no top-level `configs`."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from electra_jax import config_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_path_that_exists_is_read_as_given(tmp_path, monkeypatch):
  monkeypatch.chdir(REPO)
  assert config_files.resolve('configs/large.py') == 'configs/large.py'  # a clone: its own file
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'mine.py').write_text('')
  assert config_files.resolve('mine.py') == 'mine.py'
  assert config_files.resolve('other/large.py') == 'other/large.py'  # not configs/: left for the loader to report
  assert config_files.resolve_argv(['x', '--config.train_steps=3', '--config', 'mine.py']) == [
      'x', '--config.train_steps=3', '--config', 'mine.py']


def test_a_preset_resolves_outside_a_clone(tmp_path, monkeypatch):
  """`configs/small.py:quickstart` is the file configs/small.py and get_config's argument `quickstart`: from a
  directory without configs/, the packaged file is found and the argument kept, in both forms of the flag."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.delitem(sys.modules, 'configs', raising=False)  # resolve points `configs` at the package: undone after
  packaged = os.path.join(config_files.packaged_dir(), 'small.py')
  assert config_files.resolve('configs/small.py:quickstart') == packaged + ':quickstart'
  assert config_files.resolve_argv(['x', '--config', 'configs/small.py:quickstart']) == [
      'x', '--config', packaged + ':quickstart']
  assert config_files.resolve('configs/nope.py:quickstart') == 'configs/nope.py:quickstart'  # left for the loader


def test_a_config_file_outside_a_clone_imports_the_packaged_configs(tmp_path):
  """A config file of one's own (or the clone's, by its absolute path) run from a directory without configs/:
  its `from configs import default` finds the packaged default.py (it was 'No module named configs')."""
  (tmp_path / 'mine.py').write_text('from configs import default\n\n\ndef get_config():\n'
                                    '  config = default.get_config()\n  config.train_steps = 7\n  return config\n')
  for config in (str(tmp_path / 'mine.py'), os.path.join(REPO, 'configs', 'tiny.py')):
    result = subprocess.run([sys.executable, '-m', 'electra_jax.main', f'--config={config}', '--show_config'],
                            cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'\ntrain_steps = {7 if config.endswith("mine.py") else 1000}' in result.stdout


@pytest.mark.slow
def test_the_installed_package_carries_the_configs(tmp_path):
  """A wheel built from setup.py installs configs/ as electra_jax/configs and nothing named `configs` at the top
  level; from a directory without configs/, `--config=configs/large.py` reads the packaged file, whose
  `from configs import default` finds the packaged default.py."""
  source = tmp_path / 'source'
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
  for name in ('electra_jax', 'configs'):
    shutil.copytree(os.path.join(REPO, name), source / name, ignore=ignore)
  shutil.copy(os.path.join(REPO, 'setup.py'), source)
  pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
  subprocess.run(pip + ['wheel', '--no-deps', '--no-build-isolation', '-w', str(tmp_path / 'wheel'), str(source)],
                 check=True, capture_output=True)
  site = tmp_path / 'site'
  subprocess.run(pip + ['install', '--no-deps', '--no-index', '--target', str(site),
                        *glob.glob(str(tmp_path / 'wheel' / '*.whl'))], check=True, capture_output=True)
  assert sorted(p for p in os.listdir(site) if not p.endswith('.dist-info')) == ['electra_jax']
  assert (site / 'electra_jax' / 'configs' / 'experiments' / 'compare_cpu.py').is_file()

  code = ('import sys; from ml_collections import config_flags; from electra_jax import cli; '
          "config = config_flags.DEFINE_config_file('config'); cli.flags_parser(['x', '--config=configs/large.py']); "
          "print(config.value.train_steps, sys.modules['configs'].__path__[0])")
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  result = subprocess.run([sys.executable, '-c', code], cwd=elsewhere, capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(site)))
  assert result.returncode == 0, result.stderr[-2000:]
  steps, configs_dir = result.stdout.split()
  assert steps == '400000'
  assert configs_dir == str(site / 'electra_jax' / 'configs')
