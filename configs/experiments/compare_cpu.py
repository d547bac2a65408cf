"""Pre-training objectives compared at equal compute, sized for a 2-core CPU (`configs/tiny.py` model).

  python -m electra_jax.experiments.compare --config=configs/experiments/compare_cpu.py --workdir=WORKDIR

Paths are relative to the directory the command runs in (the repository root: ../shared/data/...). Every key can
be overridden on the command line: `--config.flops_budgets=1e13,3e13 --config.seeds=5 --config.tasks="'DIR1','DIR2'"`.
At the defaults (per-step FLOPs of configs/tiny.py with 4000 pieces: electra 1.24e10, mlm 1.14e10) the
largest budget is ~3600 electra steps and ~4000 mlm steps; fine-tuning is 10 initialisations x 3 tasks x 3 seeds.
See docs/experiments.md.
"""

import ml_collections

from configs import finetune, tiny


def get_config():
  config = ml_collections.ConfigDict()
  # Runs: names of electra_jax.objective.OBJECTIVES, or variants (see `overrides`).
  config.objectives = ('electra', 'electra_t2', 'mlm')
  config.flops_budgets = (5e12, 1.5e13, 4.5e13)  # Pre-training FLOPs (as the trainer counts train_flops) compared.
  config.tasks = ('../shared/data/tasks/polarity', '../shared/data/tasks/hedge',
                  '../shared/data/tasks/pos')  # Fine-tuning tasks: anything --config.task takes (GLUE name, dir).
  config.seeds = 3  # Fine-tuning seeds per (checkpoint, task); the table reports their median [min-max].
  # Budgets to fine-tune (a subset of flops_budgets; (): all). Pre-training stops at the largest of them, on the
  # schedule of the largest flops_budget: a later command with more budgets resumes it.
  config.finetune_budgets = ()
  # Compile every pre-training and fine-tuning step at once before the first run trains (compare._precompile): the
  # compiles overlap on a host with cores to spare (a GPU's), not on a 2-core CPU.
  config.precompile = False

  # The pre-training run every objective starts from. train_steps and save_steps are set per objective from
  # flops_budgets, objective.name from `objectives`: deleted here so that overriding them is an error.
  config.pretrain = tiny.get_config()
  config.pretrain.data.source = '../shared/data/corpus/*.txt.gz'
  config.pretrain.objective.temperature = 1.0  # the paper's sampling; configs/tiny.py's T=2 is the variant below
  del config.pretrain.train_steps, config.pretrain.save_steps
  del config.pretrain.objective['name']

  # Per-run changes to `pretrain` (keys as in configs/default.py). A run name that is not an objective names a
  # variant and must set objective.name, e.g. overrides.untied = {'objective': {'name': 'electra'},
  # 'model': {'tying': 'none'}}. Add new entries here: the command line can only change existing ones.
  config.overrides = ml_collections.ConfigDict()
  # BERT's masking for the MLM baseline (paper section 3.2): 80% [MASK], 10% random token, 10% unchanged.
  config.overrides.mlm = {'objective': {'mask_token_prob': 0.8, 'random_token_prob': 0.1}}
  # ELECTRA with the quickstart's flatter generator samples (configs/tiny.py: detection starts within minutes).
  config.overrides.electra_t2 = {'objective': {'name': 'electra', 'temperature': 2.0}}
  # ELECTRA for small budgets (issue #16): a quarter of the tokens replaced, samples at T=2 falling to the paper's
  # T=1 over the first half of training (Fast-ELECTRA's curriculum). See docs/experiments.md.
  config.overrides.electra_curriculum = {'objective': {
      'name': 'electra', 'mask_prob': 0.25, 'initial_temperature': 2.0, 'temperature_decay_fraction': 0.5}}
  # Each issue-#16 lever on its own (docs/history.md, "ELECTRA at small compute"): the curriculum stopping at T=1.5
  # instead of the paper's 1 (detection faded below ~1.5); 25% replaced alone; lambda rising from 0 over the
  # first 20% of training alone; a one-layer generator (a quarter of the depth) alone.
  config.overrides.electra_floor = {'objective': {
      'name': 'electra', 'mask_prob': 0.25, 'initial_temperature': 2.0, 'temperature': 1.5,
      'temperature_decay_fraction': 0.5}}
  config.overrides.electra_mask25 = {'objective': {'name': 'electra', 'mask_prob': 0.25}}
  config.overrides.electra_lambda = {'objective': {'name': 'electra', 'disc_weight_warmup_fraction': 0.2}}
  config.overrides.electra_gen1 = {'objective': {'name': 'electra'}, 'model': {'generator_layers_fraction': 0.25}}
  # Issue #28, on top of electra_floor: GDES (DeBERTa-v3's gradient-disentangled embedding sharing: the detector
  # reads stop_gradient(shared embeddings) + its own zero-initialised delta), and a frozen generator (Fast-ELECTRA:
  # the samples come from this experiment's `mlm` run, listed before it, at its smallest budget's checkpoint; its
  # forward passes count in the budget, what it cost to train is stated apart). See docs/experiments.md.
  floor = config.overrides.electra_floor.objective.to_dict()
  config.overrides.electra_floor_gdes = {'objective': floor, 'model': {'tying': 'gdes'}}
  config.overrides.electra_floor_frozen = {'objective': {
      **floor, 'name': 'electra_frozen', 'generator_checkpoint': 'WORKDIR/pretrain/mlm'}}

  # Fine-tuning settings shared by every checkpoint and the from-scratch baseline (keys as in configs/finetune.py).
  # The runner sets task, seeds, init_checkpoint and init_step, and takes the from-scratch model and tokenizer
  # from `pretrain`: those keys are deleted here.
  config.finetune = finetune.get_config()
  for key in ('task', 'seeds', 'init_checkpoint', 'init_step', 'model', 'data', 'predict_input', 'predict_output'):
    del config.finetune[key]
  config.finetune.update(epochs=3.0, max_seq_length=64, max_train_examples=1000, save_model=False,
                         write_predictions=False, log_every=1000)
  # 1e-3 as bench/finetune_tasks.py used for small CPU models (0 would give the paper's 3e-4 for this width).
  config.finetune.optimizer.learning_rate = 1e-3
  # Per-task changes to `finetune`, by task name (as `overrides`: add entries here). Polarity: 10 epochs (320
  # steps) at lr 3e-4, where 96 steps at 1e-3 left most pre-trained models answering one class (docs/history.md,
  # "Fine-tuning polarity for 320 steps").
  config.task_overrides = ml_collections.ConfigDict()
  config.task_overrides.polarity = {'epochs': 10.0, 'optimizer': {'learning_rate': 3e-4}}
  return config
