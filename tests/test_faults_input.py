"""Bad inputs to the pure functions and builders fail loudly or stay finite.

Token ids outside the vocabulary: a ValueError where the ids are concrete, a
documented clamp (finite embeddings equal to the clamped ids') under jit.
A `model` config that is not a mapping: a TypeError naming the model config.
A config value that would fail only once training starts (NaN, an infinity,
label_smoothing >= 1, a seed past int32): a ValueError naming the field.
"""

import functools
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import load_config, tiny_config
from txf import models
from txf.decode import generation
from txf.layers import Embedder
from txf.layers.model_config import ModelConfig
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.resume import read_run_config
from txf.sweep.runner import check_point_config
from txf.train.run_setup import setup_run

V, D = 6, 4


@pytest.fixture(scope="module")
def embedder_and_variables():
  embedder = Embedder(ModelConfig(vocab_size=V, d_model=D, num_heads=2, position="none", max_len=8))
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


# field -> values that passed validation and failed only at the first step
# (a traceback, "diverged by step 1", an OverflowError), after the work
# directory was written; each is now a config error naming the field.
LATE_FAILURES = {
  "eval.temperature": [float("nan"), -0.5, float("inf")],
  "train.label_smoothing": [1.5, 1.0, -0.1, float("nan")],
  "train.z_loss": [float("nan"), -1.0, float("inf")],
  "train.weight_decay": [float("inf")],
  "train.eps": [float("inf")],
  "train.grad_clip_norm": [float("inf")],
  "model.norm_eps": [float("nan"), -1.0, 0.0, float("inf")],
  "model.options.rope_base": [float("nan"), -10.0],
  "model.options.rope_scale": [float("nan"), float("inf")],
  "model.pad_id": [1.5],
  "model.use_bias": ["false"],
  "model.options.t5_max_distance": [0],
  "seed": [99999999999999999999, 2**31, -1],
  "train.steps": [2**31],  # the train state's int32 step count would wrap
  "model.vocab_size": ["big"],
  "data.seed_per_replica": ["yes", 1, None],
}
# The config whose model reads the field, where rope's does not.
FIELD_CONFIGS = {"model.options.t5_max_distance": "t5_bias"}


@pytest.mark.parametrize(
  "field,value", [(field, value) for field, values in LATE_FAILURES.items() for value in values]
)
def test_values_that_used_to_fail_after_setup_are_config_errors(field, value):
  # A dict: a config.json may hold any type.
  fields = load_config(FIELD_CONFIGS.get(field, "rope")).to_dict()
  *sections, name = field.split(".")
  functools.reduce(dict.__getitem__, sections, fields)[name] = value
  config = ml_collections.ConfigDict(fields)
  with pytest.raises(ValueError, match=rf"^{re.escape(field)}: "):
    parse(config).with_vocabulary(260, None)


def test_a_seed_whose_replicas_overflow_is_a_config_error():
  config = load_config("rope")
  config.seed, config.replicas = 2**31 - 2, 3
  with pytest.raises(ValueError, match=r"^seed: 2147483646 \+ replicas=3 - 1 is above"):
    parse(config)
  config.replicas = 2
  parse(config)
  # Replica r's data stream is data seed + r: the same bound, named by the field.
  config.seed, config.data.seed, config.data.seed_per_replica = 0, 2**31 - 2, True
  config.replicas = 3
  with pytest.raises(ValueError, match=r"^data.seed_per_replica: .* 2147483646 \+ r, above"):
    parse(config)
  config.replicas = 2
  assert parse(config).data_seeds == (
    2**31 - 2,
    2**31 - 1,
  )


def test_a_bad_grid_value_is_caught_by_the_sweeps_point_check():
  """The sweep checks every point with check_point_config before point 0 trains."""
  config = tiny_config()
  config.train.label_smoothing = 1.5
  with pytest.raises(ValueError, match=r"^train\.label_smoothing: must be in \[0, 1\)"):
    check_point_config(config)


def test_a_sample_longer_than_the_learned_position_table_is_a_config_error_before_compute():
  """It used to surface as a traceback from the sampler's compilation."""
  # The sampler feeds the prompt and every new token but the last: 3 + 31 - 1.
  config = tiny_config(
    model__position="learned", model__max_len=32, eval__sample_prompt="def", eval__sample_tokens=31
  )
  with pytest.raises(
    ConfigError,
    match=r"model\.max_len: eval\.sample_prompt plus "
    r"eval\.sample_tokens of 33 positions is longer than the learned "
    r"position table \(32 rows\)",
  ):
    setup_run(parse(config))
  config.eval.sample_tokens = 30  # 3 + 30 - 1 = 32 rows: fits
  setup = setup_run(parse(config))
  # The same boundary as the sampler's own: 30 new tokens lower, 31 do not.
  prompt_1xP = jnp.asarray(setup.train_data.tokenizer.encode("def"))[None]
  params = setup.init().params
  lower_generate = generation.build_generate(lower=True)
  lower_generate(setup.model, params, prompt_1xP, max_new_tokens=30)
  with pytest.raises(ValueError, match="a cache of 33 positions"):
    lower_generate(setup.model, params, prompt_1xP, max_new_tokens=31)


# A run's config.json, corrupted: every case a ValueError naming the file (a
# JSON message without it, an AttributeError or a TypeError traceback before).
CORRUPT_RUN_CONFIGS = {
  '{"seed": 0, "model": {': "not valid JSON",
  "[1, 2, 3]": "expected a JSON object, got list",
  '{"seed": 0, "model": 3}': "model: expected a JSON object, got int",
}


@pytest.mark.parametrize("text", list(CORRUPT_RUN_CONFIGS))
def test_a_corrupt_run_config_json_is_an_error_naming_the_file(tmp_path, text):
  (tmp_path / "config.json").write_text(text)
  with pytest.raises(
    ValueError,
    match=rf"^{re.escape(str(tmp_path / 'config.json'))}: "
    rf"{re.escape(CORRUPT_RUN_CONFIGS[text])}",
  ):
    read_run_config(tmp_path)


@pytest.mark.parametrize("name", ["seed", "train", "parallel"])
def test_a_run_config_json_missing_a_section_is_an_error_naming_it(tmp_path, name):
  """Read as the defaults, it would resume the run with another config."""
  saved = json.loads(load_config("rope").to_json_best_effort())
  del saved[name]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  with pytest.raises(
    ConfigError, match=rf"^{re.escape(str(tmp_path / 'config.json'))}: {name}: missing"
  ):
    read_run_config(tmp_path)


def test_a_run_config_json_value_of_the_wrong_type_is_an_error_naming_the_file(tmp_path):
  config = load_config("rope")
  saved = json.loads(config.to_json_best_effort())
  saved["train"]["steps"] = "twenty"
  (tmp_path / "config.json").write_text(json.dumps(saved))
  with pytest.raises(
    ConfigError, match=rf"^{re.escape(str(tmp_path / 'config.json'))}: train\.steps: "
  ):
    read_run_config(tmp_path)
