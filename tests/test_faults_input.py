"""Bad inputs to the pure functions and builders fail loudly or stay finite.

Token ids outside the vocabulary: a ValueError where the ids are concrete, a
documented clamp (finite embeddings equal to the clamped ids') under jit.
A `model` config that is not a mapping: a TypeError naming the model config.
eval.temperature = NaN: a ValueError naming the field.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config, tiny_config

from txf import decode, models
from txf.layers import Embedder
from txf.train.config import ConfigError, check_run_config
from txf.train.setup import setup_run

V, D = 6, 4


@pytest.fixture(scope="module")
def embedder_and_variables():
  embedder = Embedder(vocab_size=V, d_model=D, position="none", max_len=8, dtype=jnp.float32)
  tokens = jnp.zeros((1, 3), jnp.int32)
  return embedder, embedder.init(jax.random.PRNGKey(0), tokens, jnp.arange(3)[None])


@pytest.mark.parametrize("bad_id", [V, V + 10, -1])
def test_concrete_token_id_outside_vocabulary_is_a_value_error(embedder_and_variables, bad_id):
  embedder, variables = embedder_and_variables
  tokens = jnp.array([[0, bad_id, 2]], jnp.int32)
  with pytest.raises(ValueError, match=rf"tokens: id {bad_id} outside the vocabulary \[0, {V}\)"):
    embedder.apply(variables, tokens, jnp.arange(3)[None])


def test_float_token_ids_are_a_value_error(embedder_and_variables):
  embedder, variables = embedder_and_variables
  with pytest.raises(ValueError, match="tokens must be integer ids, got dtype float32"):
    embedder.apply(variables, jnp.zeros((1, 3), jnp.float32), jnp.arange(3)[None])


def test_token_ids_under_jit_are_clamped_to_the_vocabulary(embedder_and_variables):
  """Under jit (ids unknown at trace time) id >= V reads row V - 1 and a
  negative id reads row 0: finite, where a plain gather gives NaN or wraps."""
  embedder, variables = embedder_and_variables
  table = np.asarray(nn.meta.unbox(variables["params"])["token"]["embedding"], np.float64)
  apply = jax.jit(lambda tokens: embedder.apply(variables, tokens, jnp.arange(3)[None]))
  out = np.asarray(apply(jnp.array([[V, -3, 2]], jnp.int32)))
  np.testing.assert_allclose(out[0], table[[V - 1, 0, 2]], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("config", [None, 3, "decoder", [("family", "decoder")]])
def test_build_rejects_a_non_mapping_model_config(config):
  with pytest.raises(TypeError, match=rf"model config: .* got {type(config).__name__}"):
    models.build(config)


@pytest.mark.parametrize("temperature", [float("nan"), -0.5])
def test_eval_temperature_nan_or_negative_is_a_config_error(temperature):
  """NaN used to pass `temperature < 0` and turn every sample into spaces."""
  config = load_config("rope")
  config.eval.temperature = temperature
  with pytest.raises(ValueError, match=r"eval\.temperature: must be >= 0"):
    check_run_config(config, vocab_size=260, num_classes=None)


def test_a_sample_longer_than_the_learned_position_table_is_a_config_error_before_compute():
  """It used to surface as a traceback from the sampler's compilation."""
  # The sampler feeds the prompt and every new token but the last: 3 + 31 - 1.
  config = tiny_config(model__position="learned", model__max_len=32,
                       eval__sample_prompt="def", eval__sample_tokens=31)
  with pytest.raises(ConfigError, match=r"model\.max_len: eval\.sample_prompt plus "
                     r"eval\.sample_tokens of 33 positions is longer than the learned "
                     r"position table \(32 rows\)"):
    setup_run(config)
  config.eval.sample_tokens = 30  # 3 + 30 - 1 = 32 rows: fits
  setup = setup_run(config)
  # The same boundary as the sampler's own: 30 new tokens lower, 31 do not.
  prompt_1xP = jnp.asarray(setup.train_data.tokenizer.encode("def"))[None]
  params = setup.init().params
  decode.generate(setup.model, params, prompt_1xP, max_new_tokens=30, lower=True)
  with pytest.raises(ValueError, match="a cache of 33 positions"):
    decode.generate(setup.model, params, prompt_1xP, max_new_tokens=31, lower=True)
