"""Analysis of txf models: parameter and FLOP counts, attention maps, head ablation."""

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
