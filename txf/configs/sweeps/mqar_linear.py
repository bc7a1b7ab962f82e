"""MQAR: softmax against linear attention in the same decoder, by width.

  txf-sweep --config=sweeps/mqar_linear --workdir=runs/mqar_linear     # 2-core CPU
  txf-sweep --config=sweeps/mqar_linear:gpu --workdir=runs/mqar_linear_gpu

Zoology (Arora et al. 2023) puts the recall gap on the state a model keeps:
softmax attention keeps every key, linear attention (Katharopoulos et al.
2020, model.attention='linear') a fixed [head_dim, head_dim] state per head.
This sweep holds everything else of sweeps/mqar_scale's decoder (its task,
settings, 2 layers of 4 heads, RoPE, widths, 3 seeds that differ in
initialisation and data order) and varies only model.attention, so its
softmax points repeat mqar_scale's decoder points (same configs, seeds and
batches). What would contradict Zoology here: linear attention matching
softmax attention where softmax solves the task.

Expected (2026-11-28, 2-core CPU, docs/data/mqar_linear): final validation
accuracy, softmax 0.442 +- 0.482 / 1.000 +- 0.000 / 0.233 +- 0.022 at width
32 / 64 / 128 (mqar_scale's decoders, bit for bit), linear 0.165 +- 0.023 /
0.261 +- 0.020 / 0.327 +- 0.005; softmax ahead at 64, linear at 128 (where
softmax's 1500-step schedule fails: sweeps/mqar_steps), 32 not resolved.

The gpu setting's widest linear point fits one H200 (a deviceless compile,
`txf-compile --target=h200` with its overrides, 2026-11-28, jax 0.10.2):
the train step needs 13.9 GiB of 140.4 GiB.
"""

import ml_collections

from txf.configs.sweeps import mqar_scale
from txf.sweep.grid import make_grid


def get_config(setting: str | None = None) -> ml_collections.ConfigDict:
  config = mqar_scale.get_config(setting)
  widths = list(config.grid["model.d_model"])
  config.grid = make_grid({"model.attention": ["softmax", "linear"], "model.d_model": widths})
  return config
