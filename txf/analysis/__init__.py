"""Evaluating txf models and trained runs: parameter and FLOP counts,
attention maps, head scores and ablation, circuits, length extrapolation.

Pure functions of a model, its parameters and arrays; a trained run's
directory is read for them by txf.trained."""

from txf.analysis.ablation import ablation_loss_fns, attention_shapes, head_mask
from txf.analysis.attention import attention_maps
from txf.analysis.counts import count_params, flops_per_token, matmul_params, summarize

__all__ = [
  "ablation_loss_fns",
  "attention_maps",
  "attention_shapes",
  "count_params",
  "flops_per_token",
  "head_mask",
  "matmul_params",
  "summarize",
]
