"""Initial scales of parameters against what their code's docstrings and the
references they cite state: model.init='txf' (each layer's own initialisers:
Glorot-uniform projections, token-type rows, the MLM transform), 'gpt2'
(txf.layers.inits.gpt2, with its residual scaling by depth) and the position
parameters. Each expected value is computed here from its formula.

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
Normal draws: the sample std's relative standard error is sqrt(1 / (2 N)),
the mean's standard error std / sqrt(N) (numpy_references' sample checks).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from numpy_references import normal_sample_checks, truncated_normal_std, uniform_sample_checks
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
  assert np.abs(table).max() <= bound  # exact here; the shared check allows float32 slack
  uniform_sample_checks(table, bound, "relative_position/table")


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
    normal_sample_checks(flatten_dict(params["params"], sep="/")[name], expected_std, name)


# ---------------------------------------------------------------------------
# model.init='txf' (each layer's own initialisers, txf.layers.inits): Glorot-
# uniform projections on the flattened [fan_in, fan_out] matrix
# (txf.layers.partitioning.projection_inits; attention.ProjectionWeights and
# projection.OutputProjection ask for it flat), no scaling by depth, zero
# biases, unit norm scales; N(0, 0.02) token-type rows (embedding.Embedder);
# the MLM head's transform nn.Dense's default, LeCun normal (flax's
# variance_scaling(1, 'fan_in', 'truncated_normal')).


def init_params(cfg, seed=0):
  """{'a/b/c': float64 array} of a freshly initialised model of `cfg` (init
  under jit: the same values, compiled once rather than op by op, about 3x
  faster on 2 cores)."""
  tokens = np.ones((1, 4), np.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  params = nn.meta.unbox(jax.jit(build(cfg).init)(jax.random.PRNGKey(seed), *inputs)["params"])
  return {name: np.asarray(x, np.float64) for name, x in flatten_dict(params, sep="/").items()}


# Every projection's kernel differs in shape from its transpose, so a draw
# with fan_in or fan_out in place of Glorot's average shows, and so does one
# with the fans of the unflattened [D, N, Dh] or [H, Dh, D] kernel (head_dim
# 16 x 4 heads = d_ff = 64, twice d_model).
GLOROT = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=16, d_ff=64, max_len=8)


def test_txf_projections_are_glorot_uniform_on_their_flattened_matrix():
  """model.init='txf' (the default): each attention q / k / v / output and
  FFN wi / gate / wo kernel of each layer, and untied logits, is Glorot
  uniform, U(+-sqrt(6 / (fan_in + fan_out))), with the fans of the kernel
  as a [inputs, outputs] matrix ([D, N * Dh] for q / k / v, [H * Dh, D] for
  the output, as ProjectionWeights and OutputProjection say they ask for
  it), the same at every depth (txf scales no projection by depth); biases
  0 and norm scales 1. The fans come from the config, not the kernels."""
  cfg = ModelConfig(
    **GLOROT, num_layers=2, activation="swiglu", use_bias=True, tie_embeddings=False
  )
  d, h, kv, dh, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff
  fans = {
    "self_attention/query": (d, h * dh),
    "self_attention/key": (d, kv * dh),
    "self_attention/value": (d, kv * dh),
    "self_attention/out": (h * dh, d),
    "ffn/wi": (d, f),
    "ffn/gate": (d, f),
    "ffn/wo": (f, d),
  }
  params = init_params(cfg)
  for layer in range(cfg.num_layers):
    for name, (fan_in, fan_out) in fans.items():
      kernel = params[f"stack/block_{layer}/{name}/kernel"]
      assert kernel.size == fan_in * fan_out, name
      bound = np.sqrt(6.0 / (fan_in + fan_out))
      uniform_sample_checks(kernel, bound, f"block_{layer}/{name}")
  logits = params["head/logits/kernel"]
  assert logits.shape == (d, cfg.vocab_size)
  uniform_sample_checks(logits, np.sqrt(6.0 / (d + cfg.vocab_size)), "head/logits")
  for name, value in params.items():
    if name.endswith("/bias"):
      np.testing.assert_array_equal(value, 0.0, err_msg=name)
    elif name.endswith("/scale"):
      np.testing.assert_array_equal(value, 1.0, err_msg=name)


# A small BERT-style encoder (token types, learned positions, biases, MLM
# head); 32 token types, more than BERT's 2, so that the table's std is
# measured to 8 %.
ENCODER = dict(
  vocab_size=64, d_model=64, num_heads=2, num_layers=2, max_len=64, family="encoder",
  head="mlm", position="learned", use_bias=True, num_token_types=32,
)  # fmt: skip


@functools.cache
def encoder_params(init):
  """init_params of the ENCODER config under model.init=`init` (shared: read only)."""
  return init_params(ModelConfig(**ENCODER, init=init))


def test_txf_token_type_rows_and_mlm_transform_start_at_their_stated_scales():
  """An encoder's token-type table (BERT's segment rows) is N(0, 0.02), as
  the position table (Embedder: "small next to the N(0, 1) token rows"),
  and the MLM head's [D, D] transform is nn.Dense's LeCun normal: a normal
  truncated at 2 std, rescaled to std 1 / sqrt(fan_in), so no entry beyond
  2 / sqrt(fan_in) / (the truncated unit normal's std), and (unlike a
  uniform of that std) some beyond sqrt(3 / fan_in)."""
  params = encoder_params("txf")
  types = params["embedder/token_type_table"]
  assert types.shape == (ENCODER["num_token_types"], ENCODER["d_model"])
  normal_sample_checks(types, 0.02, "token_type_table")
  transform = params["head/transform/kernel"]
  std = 1 / np.sqrt(ENCODER["d_model"])
  normal_sample_checks(transform, std, "head/transform")
  assert np.abs(transform).max() <= 2 * std / truncated_normal_std(2.0) * (1 + 1e-6)
  assert np.abs(transform).max() > np.sqrt(3) * std


# ---------------------------------------------------------------------------
# model.init='gpt2' (txf.layers.inits.gpt2): N(0, 0.02) projections, token
# and token-type rows, N(0, 0.01) position rows, N(0, 0.02 / sqrt(2 L)) for
# the projections that write into the residual stream; biases and norms as
# drawn. (tests/models/test_models.py measures it on larger models, slow.)


def test_gpt2_init_draws_each_group_at_its_stated_scale():
  """Each group of a small BERT-style encoder under model.init='gpt2', the
  stds from the module docstring's formulas: token, token-type rows and
  every kernel but the residual outputs 0.02 (the MLM transform too: "every
  projection"), position rows 0.01, attention output and FFN wo of each
  layer 0.02 / sqrt(2 L); biases 0, norm scales 1."""
  cfg = ModelConfig(**ENCODER, init="gpt2")
  params = encoder_params("gpt2")
  residual_std = 0.02 / np.sqrt(2 * cfg.num_layers)
  expected = {
    "embedder/token/embedding": 0.02,
    "embedder/token_type_table": 0.02,
    "embedder/position_table": 0.01,
    "head/transform/kernel": 0.02,
  }
  for layer in range(cfg.num_layers):
    block = f"stack/block_{layer}"
    for name in ("query", "key", "value"):
      expected[f"{block}/self_attention/{name}/kernel"] = 0.02
    expected[f"{block}/ffn/wi/kernel"] = 0.02
    for name in ("self_attention/out", "ffn/wo"):
      expected[f"{block}/{name}/kernel"] = residual_std
  for name, std in expected.items():
    normal_sample_checks(params[name], std, name)
  assert {n for n in params if n.endswith("kernel")} <= set(expected)
  for name, value in params.items():
    if name.endswith("/scale"):
      np.testing.assert_array_equal(value, 1.0, err_msg=name)
    elif name not in expected:
      np.testing.assert_array_equal(value, 0.0, err_msg=name)  # biases, norm offsets


def test_each_init_scheme_changes_exactly_the_parameters_it_names():
  """With the same key, model.init='gpt2' redraws every kernel, token,
  token-type and position table (not one value equal to txf's draw) and
  leaves every bias and norm parameter as txf draws them (bit for bit); a
  scheme that skipped the token-type table would keep txf's N(0, 0.02) rows,
  the same scale as GPT-2's, so only this comparison sees it."""
  txf, gpt2 = encoder_params("txf"), encoder_params("gpt2")
  assert txf.keys() == gpt2.keys()
  redrawn = ("kernel", "embedding", "token_type_table", "position_table")
  for name in txf:
    if name.rsplit("/", 1)[-1] in redrawn:
      assert not np.any(txf[name] == gpt2[name]), name
    else:
      np.testing.assert_array_equal(gpt2[name], txf[name], err_msg=name)
