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
"""

import ml_collections

from txf.configs.sweeps import mqar_scale
from txf.sweep.grid import make_grid


def get_config(setting: str | None = None) -> ml_collections.ConfigDict:
  config = mqar_scale.get_config(setting)
  widths = list(config.grid["model.d_model"])
  config.grid = make_grid({"model.attention": ["softmax", "linear"], "model.d_model": widths})
  return config
