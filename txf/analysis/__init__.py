"""Analysis of txf models: parameter and FLOP counts."""

from txf.analysis.counts import count_params, flops_per_token, matmul_params, summarize

__all__ = ["count_params", "flops_per_token", "matmul_params", "summarize"]
