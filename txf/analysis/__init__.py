"""Analysis of txf models: parameter and FLOP counts, attention maps."""

from txf.analysis.attention import attention_maps
from txf.analysis.counts import count_params, flops_per_token, matmul_params, summarize

__all__ = ["attention_maps", "count_params", "flops_per_token", "matmul_params", "summarize"]
