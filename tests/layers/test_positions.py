"""Every registered position encoding (txf.layers.positions.ENCODINGS) in a decoder.

Parametrised over the registry, so a new entry is tested without a new test:
decoding it token by token with the KV cache gives the full forward pass's
logits (and tests/models/test_models.py checks that the decoder it gives is causal,
also over the registry).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import models
from txf.layers import positions
from txf.layers.model_config import POSITIONS, ModelConfig

B, T = 2, 7
# rope_scale > 1 so that the encodings reading it (rope, rope_ntk) scale.
TINY = dict(
  vocab_size=50, d_model=32, num_heads=4, num_layers=2, max_len=16, options=dict(rope_scale=2.0)
)


def decoder_and_params(position):
  model = models.build(ModelConfig(**TINY, position=position))
  tokens = jnp.ones((B, T), jnp.int32)
  params = nn.meta.unbox(model.init(jax.random.key(0), tokens)["params"])
  return model, params


def tokens(seed):
  return jax.random.randint(jax.random.key(seed), (B, T), 1, TINY["vocab_size"])


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("position", sorted(positions.ENCODINGS))
def test_cached_decoding_matches_full_pass(position):
  model, params = decoder_and_params(position)
  inputs = tokens(3)
  cache = model.init(jax.random.key(0), inputs, use_cache=True)["cache"]
  step_logits = []
  for t in range(T):
    logits, variables = model.apply(
      {"params": params, "cache": cache}, inputs[:, t : t + 1], use_cache=True, mutable=["cache"]
    )
    cache = variables["cache"]
    step_logits.append(logits)
  full = model.apply({"params": params}, inputs)
  np.testing.assert_allclose(jnp.concatenate(step_logits, axis=1), full, atol=1e-5)


def test_config_choices_are_the_registry():
  assert POSITIONS is positions.ENCODINGS
  assert POSITIONS.names()[:3] == ("sinusoidal", "learned", "rope")
  with pytest.raises(ValueError, match=r"model\.position: 'xpos' is not one of"):
    ModelConfig(position="xpos")


@pytest.mark.parametrize(
  "entry",
  [
    dict(contributes="bias"),  # no bias callable
    dict(contributes="rotation", embed=lambda *a: None),  # the wrong callable
    dict(contributes="nothing", rotate=lambda *a: None),
    dict(contributes="angle"),
    dict(contributes="nothing", table="global"),
  ],
)
def test_entry_must_match_what_it_contributes(entry):
  with pytest.raises(ValueError):
    positions.PositionEncoding(**entry)


@pytest.mark.parametrize(
  "position, dims, refused",
  [
    ("sinusoidal", dict(d_model=30, num_heads=5), None),
    ("sinusoidal", dict(d_model=33, num_heads=3), "needs an even d_model, got 33"),
    ("rope", dict(d_model=8, num_heads=4), None),  # head_dim 2: one rotated pair
    ("rope", dict(d_model=12, num_heads=4), "needs an even head_dim, got 3"),
    ("rope_ntk", dict(d_model=16, num_heads=4), None),  # head_dim 4
    # NTK's base is scaled by scale ** (D / (D - 2)): a head_dim of 2 failed
    # at init, naming no field.
    ("rope_ntk", dict(d_model=8, num_heads=4), "needs head_dim >= 4, got 2"),
  ],
)
def test_an_encoding_refuses_the_dimensions_it_cannot_take(position, dims, refused):
  config = dict(TINY, **dims, position=position)
  if refused is None:
    model = models.build(ModelConfig(**config))
    logits = model.apply(model.init(jax.random.key(0), tokens(0)), tokens(1))
    assert np.all(np.isfinite(logits))
    return
  with pytest.raises(ValueError, match=rf"^model\.position: {position} {refused}$"):
    ModelConfig(**config)
