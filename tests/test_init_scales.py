"""Initial scales of the position parameters against the references they cite.

The T5 relative-bias table follows t5x / flaxformer's RelativePositionBiases,
variance_scaling(1.0, 'fan_avg', 'uniform'): for a [buckets, heads] table the
entries are uniform on +-a, a = sqrt(6 / (buckets + heads)), so their std is
a / sqrt(3) = sqrt(2 / (buckets + heads)). The expected values are computed
here in float64 from those formulas.

Tolerances: with N entries the sample std of a uniform variable has a relative
standard error of sqrt((9/5 - 1) / (4 N)) (kurtosis 9/5) and the fraction of
entries within a / 2 (expected 1/2) a standard error of sqrt(1 / (4 N)); the
bounds below are 5 standard errors wide. A unit normal table (txf's old
initialisation) breaks the +-a bound and the std by a factor of about 4.
"""

import flax.linen as nn
from flax.traverse_util import flatten_dict
import jax
import numpy as np
import pytest

from txf.models import ModelConfig, build

T5_SHAPES = [(32, 4), (256, 8)]  # the base config's table, and one large enough for tight stats


def t5_table(num_buckets, num_heads, seed=0):
  """The relative-bias table [buckets, heads] of a freshly initialised decoder."""
  cfg = ModelConfig(vocab_size=32, d_model=8 * num_heads, num_heads=num_heads, num_layers=1,
                    max_len=16, position="t5_bias", t5_num_buckets=num_buckets,
                    t5_max_distance=4 * num_buckets)
  tokens = np.zeros((1, 4), np.int32)
  params = flatten_dict(nn.meta.unbox(build(cfg).init(jax.random.PRNGKey(seed), tokens)["params"]),
                        sep="/")
  (table,) = [np.asarray(x, np.float64) for name, x in params.items()
              if name.endswith("relative_position/table")]
  return table


@pytest.mark.parametrize("num_buckets, num_heads", T5_SHAPES)
def test_t5_table_is_fan_avg_uniform(num_buckets, num_heads):
  table = t5_table(num_buckets, num_heads)
  assert table.shape == (num_buckets, num_heads)
  bound = np.sqrt(6.0 / (num_buckets + num_heads))
  count = table.size
  assert np.abs(table).max() <= bound
  std_error = np.sqrt((9 / 5 - 1) / (4 * count))
  np.testing.assert_allclose(table.std(), np.sqrt(2.0 / (num_buckets + num_heads)),
                             rtol=5 * std_error)
  within_half = np.mean(np.abs(table) < bound / 2)
  assert abs(within_half - 0.5) < 5 * np.sqrt(1 / (4 * count))
