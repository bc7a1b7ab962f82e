"""A position encoding with its own hyper-parameter, registered from outside txf.

Log-distance bias (the logarithmic form of KERPLE, Chi et al. 2022, with its
parameters fixed): head h adds -scale * m_h * log(1 + |i - j|) to the score
of query i and key j, m_h ALiBi's slopes. `model.options.log_bias_scale`
sets `scale` (default 1.0).
"""

import jax.numpy as jnp

from txf import ops, register
from txf.fields import documented, section


@section()
class LogDistanceSettings:
  """log_distance's settings, in model.options."""

  log_bias_scale: float = documented("the bias's scale (1: KERPLE's)", default=1.0)


@register.position("log_distance", contributes="bias", settings=LogDistanceSettings)
def log_distance(cfg, q_positions_BxT, k_positions_BxS, table, *, bidirectional):
  """float32 bias [B|1, H, T, S]."""
  slopes_H = ops.alibi_slopes(cfg.num_heads)
  distance_BxTxS = jnp.abs(q_positions_BxT[:, :, None] - k_positions_BxS[:, None, :])
  log_distance_BxTxS = jnp.log1p(distance_BxTxS.astype(jnp.float32))
  scale = cfg.settings("position").log_bias_scale
  return -scale * slopes_H[None, :, None, None] * log_distance_BxTxS[:, None]
