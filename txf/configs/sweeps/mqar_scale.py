"""Multi-query associative recall: attention against the LSTM by width (Zoology's question).

  txf-sweep --config=sweeps/mqar_scale --workdir=runs/mqar_scale          # 2-core CPU, ~17 min
  txf-sweep --config=sweeps/mqar_scale:gpu --workdir=runs/mqar_scale_gpu

Zoology (Arora et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models", its MQAR figure) finds attention solving MQAR at
every model width while fixed-state models (recurrences, gated convolutions)
need a width that grows with the number of key-value pairs. This sweep asks
the same of txf's 2-layer decoder and its LSTM baseline (model.family), at
model.d_model 32, 64 and 128 (the LSTM's hidden width; the decoder's 4
heads), with 3 seed replicas that differ in initialisation and data order
(data.seed_per_replica); accuracy_vs_width.png is Zoology's
accuracy-against-width plot. sweeps/mqar_steps is its control (3x the steps).

  cpu (default): configs/mqar.py's task, 8 pairs over 64 symbols in 64
                 tokens (chance 1/32), 1500 steps of 32 rows.
  gpu:           64 pairs over 8,192 symbols in 512 tokens (Zoology's
                 hardest setting), widths 64-512, 4000 steps of 64 rows.
                 Its widest points fit one H200 (a deviceless compile,
                 `txf-compile --target=h200` with the point's overrides,
                 2026-11-28, jax 0.10.2): the train step needs 14.3 GiB
                 (decoder, width 512) and 9.0 GiB (LSTM) of 140.4 GiB.

The CPU task is below Zoology's range (16-64 pairs, 128-512 tokens) because
on 2 cores the width-64 decoder did not learn those tasks in 1000-2500 steps
of 32 rows (docs/results.md section 4 tabulates the sizing runs; with 128
rows a step the 8-pair, 128-token task was solved by step 500, so the limit
is the optimisation budget).

Expected (2026-11-28, 2-core CPU, docs/data/mqar_scale): final validation
accuracy, decoder 0.442 +- 0.482 / 1.000 +- 0.000 / 0.233 +- 0.022 at width
32 / 64 / 128 (at 32 one seed of three solved the task, at step 1050), LSTM
0.053 / 0.129 / 0.139; the decoder ahead at 64 and 128 by the findings
page's rule, not resolved at 32.
"""

from typing import NamedTuple

import ml_collections

from txf.configs import mqar
from txf.configs.sweeps import pick_setting
from txf.sweep.grid import make_grid

RUN_CONFIG = "mqar"


class Setting(NamedTuple):
  """One setting's task, model widths (both families'), and training."""

  seq_len: int
  pairs: int
  symbols: int
  widths: list[int]
  steps: int
  batch_size: int


SETTINGS = {
  "cpu": Setting(seq_len=64, pairs=8, symbols=64, widths=[32, 64, 128], steps=1500, batch_size=32),
  "gpu": Setting(
    seq_len=512, pairs=64, symbols=8192, widths=[64, 128, 256, 512], steps=4000, batch_size=64
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
  chosen = pick_setting("mqar_scale", SETTINGS, setting)
  run = mqar.get_config()
  run.replicas = 3
  run.data.update(
    dict(
      seq_len=chosen.seq_len,
      num_kv_pairs=chosen.pairs,
      num_symbols=chosen.symbols,
      batch_size=chosen.batch_size,
      seed_per_replica=True,
    )
  )
  train_for(run, chosen.steps)
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid({"model.family": ["decoder", "lstm"], "model.d_model": chosen.widths})
  # Recall within the trained length is the question; the rows are generated,
  # so scoring longer windows would test another task.
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate=False))
  return config
