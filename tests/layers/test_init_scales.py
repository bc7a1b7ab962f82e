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
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from txf.layers import Embedder
from txf.models import ModelConfig, build

T5_SHAPES = [(32, 4), (256, 8)]  # the base config's table, and one large enough for tight stats


def t5_table(num_buckets, num_heads, seed=0):
  """The relative-bias table [buckets, heads] of a freshly initialised decoder."""
  cfg = ModelConfig(
    vocab_size=32,
    d_model=8 * num_heads,
    num_heads=num_heads,
    num_layers=1,
    max_len=16,
    position="t5_bias",
    options=dict(t5_num_buckets=num_buckets, t5_max_distance=4 * num_buckets),
  )
  tokens = np.zeros((1, 4), np.int32)
  params = flatten_dict(
    nn.meta.unbox(build(cfg).init(jax.random.PRNGKey(seed), tokens)["params"]), sep="/"
  )
  (table,) = [
    np.asarray(x, np.float64)
    for name, x in params.items()
    if name.endswith("relative_position/table")
  ]
  return table


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("num_buckets, num_heads", T5_SHAPES)
def test_t5_table_is_fan_avg_uniform(num_buckets, num_heads):
  table = t5_table(num_buckets, num_heads)
  assert table.shape == (num_buckets, num_heads)
  bound = np.sqrt(6.0 / (num_buckets + num_heads))
  count = table.size
  assert np.abs(table).max() <= bound
  std_error = np.sqrt((9 / 5 - 1) / (4 * count))
  np.testing.assert_allclose(
    table.std(), np.sqrt(2.0 / (num_buckets + num_heads)), rtol=5 * std_error
  )
  within_half = np.mean(np.abs(table) < bound / 2)
  assert abs(within_half - 0.5) < 5 * np.sqrt(1 / (4 * count))


def test_learned_position_rows_start_small_beside_unit_token_rows():
  """Token rows N(0, 1) (tied logits divided by sqrt(D)) and the learned
  position table N(0, 0.02): position signal at 1/50 of the token scale.
  Normal entries: the sample std's relative standard error is sqrt(1 / (2 N))."""
  vocab, max_len, d_model = 256, 512, 64
  embedder = Embedder(
    ModelConfig(vocab_size=vocab, d_model=d_model, position="learned", max_len=max_len)
  )
  tokens = jnp.zeros((1, 4), jnp.int32)
  params = nn.meta.unbox(embedder.init(jax.random.PRNGKey(0), tokens, jnp.arange(4)[None]))
  for name, expected_std in (("token/embedding", 1.0), ("position_table", 0.02)):
    table = np.asarray(flatten_dict(params["params"], sep="/")[name], np.float64)
    np.testing.assert_allclose(table.std(), expected_std, rtol=5 * np.sqrt(1 / (2 * table.size)))
    assert abs(table.mean()) < 5 * expected_std / np.sqrt(table.size)
