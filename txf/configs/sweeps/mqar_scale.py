"""Multi-query associative recall at a harder scale: attention against the LSTM by width.

  txf-sweep --config=sweeps/mqar_scale --workdir=runs/mqar_scale          # 2-core CPU
  txf-sweep --config=sweeps/mqar_scale:gpu --workdir=runs/mqar_scale_gpu

configs/mqar.py's task (8 pairs, 64 symbols, 64 tokens) is solved by step
750 and separates nothing. Zoology (Arora et al. 2023, "Zoology: Measuring
and Improving Recall in Efficient Language Models", its MQAR figure) finds
attention solving MQAR at every model width while fixed-state models
(recurrences, gated convolutions) need a width that grows with the number
of key-value pairs. This sweep asks the same of txf's 2-layer decoder and
its LSTM baseline (model.family), at model.d_model 32, 64 and 128 (the LSTM's
hidden width; the decoder's 4 heads), with 2 seed replicas that differ in
initialisation and data order (data.seed_per_replica); the figure
accuracy_vs_width.png is Zoology's accuracy-against-width plot.

  CPU (default): 16 pairs over 256 symbols in 128 tokens, 1500 steps.
  gpu:           64 pairs over 8,192 symbols in 512 tokens (Zoology's
                 hardest setting), widths 64-512, 4000 steps, batch 64.

Accuracy counts the values after queried keys only (chance 1/128 on CPU,
1/4096 on the GPU setting: values are half the symbols). What would
contradict Zoology here: the LSTM matching attention at the smallest width,
or attention failing where the LSTM succeeds.

A first run (2026-11-28, 2-core CPU beside other work; stopped after 3.5 of
its 6 points, nothing committed) says the CPU setting is not yet sized to
separate anything: after 1500 steps the decoder's validation accuracy was
0.046 / 0.069 / 0.071 at width 32 / 64 / 128 (2 seeds, stds <= 0.006;
chance 0.008), the loss still falling, and the LSTM at width 32 sat at
chance through step 750. The points took 3-11 minutes each. Before it is
run for the findings it needs the steps that let attention solve the task
(configs/mqar.py's 8-pair task is solved near step 750 at width 64) or a
smaller task: that sizing is the next step.
"""

import ml_collections

from txf.configs import mqar
from txf.sweep.grid import make_grid

RUN_CONFIG = "mqar"
# One setting's task, model widths (both families'), and training.
SETTINGS = {
  "cpu": dict(
    seq_len=64,
    pairs=8,
    symbols=64,
    widths=[32, 64, 128],
    steps=1500,
    batch_size=32,
  ),
  "gpu": dict(
    seq_len=512,
    pairs=64,
    symbols=8192,
    widths=[64, 128, 256, 512],
    steps=4000,
    batch_size=64,
  ),
}


def train_for(run: ml_collections.ConfigDict, steps: int) -> None:
  """Sets `run` (a run config) to train `steps` steps, evaluating ten times:
  the last fifth of training then starts on an evaluation
  (txf.sweep.results.late_improvement)."""
  run.train.update(
    dict(steps=steps, warmup_steps=steps // 10, log_every=steps // 10, checkpoint_every=steps // 2)
  )
  run.eval.update(dict(every=steps // 10))


def get_config(setting: str | None = None) -> ml_collections.ConfigDict:
  setting = setting or "cpu"
  if setting not in SETTINGS:
    raise ValueError(f"sweeps/mqar_scale: setting {setting!r} is not one of {tuple(SETTINGS)}")
  chosen = SETTINGS[setting]
  run = mqar.get_config()
  run.replicas = 3
  run.data.update(
    dict(
      seq_len=chosen["seq_len"],
      num_kv_pairs=chosen["pairs"],
      num_symbols=chosen["symbols"],
      batch_size=chosen["batch_size"],
      seed_per_replica=True,
    )
  )
  train_for(run, chosen["steps"])
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid({"model.family": ["decoder", "lstm"], "model.d_model": chosen["widths"]})
  # Recall within the trained length is the question; the rows are generated,
  # so scoring longer windows would test another task.
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate=False))
  return config
