"""A choice's own settings (issue 56): a dataclass registered with its entry,
their values in model.options, read typed (`cfg.settings("position")`), for
txf's entries and registered ones alike; the former flat fields
(model.rope_base, ...) of a run's config.json read as options.
"""

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FIXTURES, REPO, load_config
from numpy_references import np_rope, np_t5_bucket
from txf import register
from txf.fields import documented, section
from txf.layers import positions
from txf.layers.embedding import RelativePositionTable
from txf.layers.model_config import (
  MOVED_TO_OPTIONS,
  NORMS,
  POSITIONS,
  ModelConfig,
  default_options,
  setting_docs,
)
from txf.layers.positions import RopeSettings, T5BiasSettings
from txf.ops import positional
from txf.runconfig.run_config import parse, to_json
from txf.rundir.resume import config_changes, read_run_config
from txf.sweep import grid

TINY = dict(vocab_size=50, d_model=32, num_heads=4, num_layers=1, max_len=64)
# The built-in settings and their defaults (RopeSettings, T5BiasSettings).
BUILTIN = dict(rope_base=10000.0, rope_scale=1.0, t5_num_buckets=32, t5_max_distance=128)


# --- declared with the entry, checked, read typed ----------------------------------


def test_the_builtin_settings_are_their_entries_and_the_base_configs_options():
  assert POSITIONS.settings("rope") is POSITIONS.settings("rope_ntk") is RopeSettings
  assert POSITIONS.settings("t5_bias") is T5BiasSettings
  others = set(POSITIONS) - {"rope", "rope_ntk", "t5_bias"}
  assert all(POSITIONS.settings(name) is None for name in others)
  assert default_options() == BUILTIN
  # configs/base.py holds each, so --config.model.options.<setting>=... can set it.
  assert load_config("base").model.options.to_dict() == BUILTIN
  assert setting_docs()["rope_base"] == (
    "model.position 'rope', 'rope_ntk': wavelength base of the rotation frequencies"
  )
  assert setting_docs()["t5_num_buckets"] == "model.position 't5_bias': relative-position buckets"


def test_a_registered_entrys_settings_start_in_the_base_config_as_txfs_own_do():
  """A config file that imported a registered encoding and chose it could not
  set its setting on the command line: base.py held txf's own only
  ('model.options.scale: unknown field'), though config.json recorded it."""
  with NORMS.scoped():
    register.norm("gained", options={"norm_gain": 2.0})(lambda layer, x, cfg: x)
    assert default_options() == {**BUILTIN, "norm_gain": 2.0}
    config = load_config("base")
    config.model.options.norm_gain = 3.0  # what --config.model.options.norm_gain=3 does
    config.model.norm = "gained"
    assert parse(config).model.options["norm_gain"] == 3.0
    # Not chosen, the setting is left out of the run's config.
    config.model.norm = "rms"
    assert "norm_gain" not in parse(config).model.options
  assert default_options() == BUILTIN


@pytest.mark.parametrize(
  "position, setting, accepted, refused",
  [
    ("rope", "rope_base", 1e-6, 0.0),  # > 0
    ("rope", "rope_base", 1e12, math.inf),  # finite
    ("rope_ntk", "rope_scale", 1.0, 0.999),  # >= 1
    ("rope", "rope_scale", 1e6, math.nan),
    ("t5_bias", "t5_num_buckets", 4, 3),  # two exact buckets per direction
    ("t5_bias", "t5_num_buckets", 6, 5),  # half on each side (failed at init, unnamed)
    ("t5_bias", "t5_num_buckets", 254, 4.5),  # 127 exact buckets: under max_distance 128
    ("t5_bias", "t5_max_distance", 17, 16),  # past the 16 exact buckets of 32
  ],
)
def test_each_setting_takes_the_ends_of_its_range_and_refuses_past_them(
  position, setting, accepted, refused
):
  cfg = ModelConfig(**TINY, position=position, options={setting: accepted})
  assert cfg.option(setting) == getattr(cfg.settings("position"), setting) == accepted
  with pytest.raises(ValueError, match=rf"^model\.options\.{setting}: [^\n]*$"):
    ModelConfig(**TINY, position=position, options={setting: refused})


@pytest.mark.parametrize(
  "family, exact", [("encoder", 8), ("decoder", 16), ("encoder_decoder", 16)]
)
def test_t5_max_distance_must_pass_the_exact_buckets_of_the_familys_stacks(family, exact):
  """An encoder's stack is bidirectional alone (num_buckets / 4 exact buckets
  a side): a max_distance of 9 over 32 buckets is T5's bucketing there (it
  was refused for every family, as a causal stack's 16 exact buckets
  would); the families with a causal stack refuse it."""
  head = dict(encoder="mlm", decoder="lm", encoder_decoder="lm")[family]
  make = functools.partial(ModelConfig, **TINY, family=family, head=head, position="t5_bias")
  assert make(options=dict(t5_max_distance=exact + 1)).option("t5_max_distance") == exact + 1
  with pytest.raises(ValueError, match=rf"^model\.options\.t5_max_distance: [^\n]* {exact} exact"):
    make(options=dict(t5_max_distance=exact))
  offsets = np.arange(-40, 41)
  got = positional.relative_position_bucket(
    jnp.asarray(offsets), bidirectional=True, num_buckets=32, max_distance=exact + 1
  )
  want = [np_t5_bucket(int(offset), True, 32, exact + 1) for offset in offsets]
  np.testing.assert_array_equal(np.asarray(got), want)


def test_a_model_keeps_its_chosen_entries_settings_and_drops_the_others():
  cfg = ModelConfig(**TINY, options=dict(BUILTIN, rope_base=500.0, t5_max_distance=64))
  assert cfg.options == dict(rope_base=500.0, rope_scale=1.0)
  assert cfg.settings("position") == RopeSettings(rope_base=500.0)
  t5 = ModelConfig(**TINY, position="t5_bias", options=dict(t5_num_buckets=12))
  assert t5.settings("position") == T5BiasSettings(t5_num_buckets=12, t5_max_distance=128)
  alibi = ModelConfig(**TINY, position="alibi", options=dict(rope_base=500.0))
  assert alibi.options == {} and alibi.settings("position") is None
  assert cfg.settings("norm") is None
  with pytest.raises(ValueError, match=r"^settings: 'rope' is not one of \('family'"):
    cfg.settings("rope")
  with pytest.raises(ValueError, match=r"^model\.options\.rope_bse: not a setting of any regis"):
    ModelConfig(**TINY, options=dict(rope_bse=500.0))


def test_a_run_notes_a_setting_given_that_no_chosen_entry_reads():
  """--config.model.options.rope_base=500 with ALiBi trained without a word
  (only --print_config said it is not read); its default, or an encoding
  that reads it, gives no note."""
  config = load_config("alibi")
  assert parse(config).notes == ()
  config.model.options.rope_base = 500.0
  assert parse(config).notes == (
    "model.options.rope_base=500.0 changes nothing: no chosen entry reads it "
    "(read by model.position 'rope', 'rope_ntk' only)",
  )
  config.model.position = "rope"
  assert parse(config).notes == ()


def test_a_run_notes_a_data_field_given_that_its_dataset_does_not_read():
  """--config.data.mlm_probability=0.9 on a language model was printed as
  set by --print_config, recorded as null in config.json and said nothing;
  its default, or a task that reads it, gives no note."""
  config = load_config("rope")
  assert parse(config).notes == ()
  config.data.mlm_probability = 0.9
  config.data.num_symbols = 7
  assert parse(config).notes == (
    "data.mlm_probability=0.9 changes nothing: data.name 'pystdlib' (data.task 'lm') "
    "does not read it",
    "data.num_symbols=7 changes nothing: data.name 'pystdlib' (data.task 'lm') does not read it",
  )
  config.data.task, config.data.num_symbols = "mlm", 32
  config.model.update(family="encoder", head="mlm")
  assert parse(config).notes == ()


def test_replace_sets_the_settings_named_and_keeps_those_still_read():
  cfg = ModelConfig(**TINY, options=dict(rope_base=500.0, rope_scale=2.0))
  assert cfg.replace(options=dict(rope_scale=3.0)).options == dict(rope_base=500.0, rope_scale=3.0)
  assert cfg.replace(position="rope_ntk").options == cfg.options
  t5 = cfg.replace(position="t5_bias", options=dict(t5_max_distance=64))
  assert t5.options == dict(t5_num_buckets=32, t5_max_distance=64)


# --- what the layers read: float64 numpy references -----------------------------


def test_rope_rotates_with_its_settings():
  """rope and rope_ntk at base 500, scale 2.5 against float64 RoFormer
  (rope_ntk: base * scale^(D/(D-2)), positions unscaled); atol 1e-5."""
  x = np.random.default_rng(0).normal(size=(2, 9, 4, 8)).astype(np.float32)
  at = np.arange(9)
  settings = dict(rope_base=500.0, rope_scale=2.5)
  ntk_base = 500.0 * 2.5 ** (8 / 6)
  for position, base, scale in (("rope", 500.0, 2.5), ("rope_ntk", ntk_base, 1.0)):
    cfg = ModelConfig(**TINY, position=position, options=settings)
    rotated = positions.encoding(position).rotate(cfg, jnp.asarray(x), jnp.asarray(at)[None])
    expected = np_rope(x.astype(np.float64), at, base, scale)
    np.testing.assert_allclose(rotated, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_t5_bias_buckets_with_its_settings(bidirectional):
  """12 buckets, max distance 40: the table has 12 rows, and each score's
  bias is its numpy bucket's row (exact: a gather)."""
  cfg = ModelConfig(**TINY, position="t5_bias", options=dict(t5_num_buckets=12, t5_max_distance=40))
  params = RelativePositionTable(cfg).init(jax.random.key(0))["params"]
  table = nn.meta.unbox(params)["table"]
  assert table.shape == (12, cfg.num_heads)
  at = np.arange(64)
  bias = positions.encoding("t5_bias").bias(
    cfg, at[None], at[None], table, bidirectional=bidirectional
  )
  relative = at[None, :] - at[:, None]
  buckets = np.vectorize(np_t5_bucket)(relative, bidirectional, 12, 40)
  np.testing.assert_array_equal(bias[0], np.moveaxis(np.asarray(table)[buckets], -1, 0))


# --- one way for built-in and registered entries -------------------------------


def _no_bias(cfg, q_positions, k_positions, table, *, bidirectional):
  return None


@section()
class ScaleSettings:
  scale: float = documented("a scale", default=2.0)


def test_options_and_a_settings_dataclass_register_the_same_form():
  with POSITIONS.scoped():
    register.position("by_options", contributes="bias", options={"scale": 2.0})(_no_bias)
    register.position("by_class", contributes="bias", settings=ScaleSettings)(_no_bias)
    for name in ("by_options", "by_class"):
      assert dataclasses.is_dataclass(POSITIONS.settings(name))
      assert POSITIONS.options(name) == {"scale": 2.0}
      cfg = ModelConfig(**TINY, position=name, options={"scale": 3.0})
      assert cfg.settings("position").scale == cfg.option("scale") == 3.0
      assert ModelConfig(**TINY, position=name).option("scale") == 2.0
    assert setting_docs()["scale"] == "model.position 'by_options', 'by_class': a scale"
  assert "by_class" not in POSITIONS and "scale" not in setting_docs()


@section()
class NoDefault:
  scale: float = documented("a scale")


@section()
class IntDefault:
  """A float setting whose default is an int: model.options typed it int, so
  --config.model.options.scale=1.5 was a flag error and 1.5 in a config a
  cast error."""

  scale: float = documented("a scale", default=1)


@pytest.mark.parametrize(
  "arguments, message",
  [
    (dict(options={"scale": 1.0}, settings=ScaleSettings), "pass settings or options, not both"),
    (dict(settings={"scale": 1.0}), "settings must be a dataclass type"),
    (dict(settings=NoDefault), "setting 'scale' has no default"),
    (
      dict(settings=IntDefault),
      r"setting 'scale': annotated float, but its default 1 is of type int \(write 1\.0\)",
    ),
    (dict(options={"scale": [1.0]}), "options: mutable default"),
    (dict(table="relative", options={"scale": 1.0}), "a 'relative' table holds t5_num_buckets"),
  ],
)
def test_a_bad_registration_is_refused_naming_the_entry(arguments, message):
  with POSITIONS.scoped(), pytest.raises(ValueError, match=rf"^model\.position: 'bad': {message}"):
    register.position("bad", contributes="bias", **arguments)(_no_bias)


# --- the former flat fields ----------------------------------------------------


@pytest.mark.parametrize("name", MOVED_TO_OPTIONS)
def test_a_flat_field_given_today_names_its_new_place(name):
  with pytest.raises(ValueError, match=rf"^model\.{name}: moved to model\.options\.{name}$"):
    ModelConfig.from_config({**TINY, name: BUILTIN[name]})


def test_a_committed_t5_run_reads_its_max_distance_as_an_option_and_resumes():
  """docs/data's t5_distance point 32 (config.json: model.t5_max_distance
  32): read as model.options, the model today's sweep config gives, and no
  model field changed for a resume."""
  run = REPO / "docs" / "data" / "t5_distance" / "t5_max_distance=32"
  assert json.loads((run / "config.json").read_text())["model"]["t5_max_distance"] == 32
  saved = read_run_config(run)
  assert not set(MOVED_TO_OPTIONS) & set(to_json(saved)["model"])
  assert saved.model.options == dict(t5_num_buckets=BUILTIN["t5_num_buckets"], t5_max_distance=32)
  (point,) = [p for p in grid.expand(load_config("sweeps.t5_distance")) if p.name == run.name]
  today = parse(point.config)
  assert [name for name, _, _ in config_changes(today, saved) if name.startswith("model.")] == []
  cfg, today_cfg = saved.model.with_vocabulary(260), today.model.with_vocabulary(260)
  assert cfg == today_cfg and cfg.settings("position") == T5BiasSettings(t5_max_distance=32)


def test_an_old_rope_run_with_other_settings_gives_the_same_model(tmp_path):
  """tests/fixtures/run_822e561's config.json with rope_base 500, rope_scale
  2 as its flat fields: the model of options with those values."""
  saved = json.loads((FIXTURES / "run_822e561" / "config.json").read_text())
  saved["model"].update(rope_base=500.0, rope_scale=2.0)
  (tmp_path / "config.json").write_text(json.dumps(saved))
  cfg = read_run_config(tmp_path).model.with_vocabulary(260)
  fields = {k: v for k, v in saved["model"].items() if k not in MOVED_TO_OPTIONS}
  expected = ModelConfig(**{**fields, "vocab_size": 260, "options": {}}).replace(
    options=dict(rope_base=500.0, rope_scale=2.0)
  )
  assert cfg == expected and cfg.settings("position") == RopeSettings(500.0, 2.0)


# --- the command line ----------------------------------------------------------


@pytest.mark.slow  # a subprocess: ~10 s
def test_the_command_line_sets_a_setting_and_print_config_shows_each_with_its_entry():
  result = subprocess.run(
    [sys.executable, "-m", "experiments.run", "--config=t5_bias", "--print_config"]
    + ["--config.model.options.t5_max_distance=64"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert result.returncode == 0, result.stderr
  printed = dict(line.split(" = ", 1) for line in result.stdout.splitlines())
  assert printed["model.options.t5_max_distance"] == (
    "64  (base: 128)  # model.position 't5_bias': distances from here on share the last bucket"
  )
  assert printed["model.options.t5_num_buckets"].startswith("32  # model.position 't5_bias': ")
  for setting in ("rope_base", "rope_scale"):
    assert printed[f"model.options.{setting}"].startswith(
      f"{BUILTIN[setting]!r}  (not read: no chosen entry declares it)  # model.position 'rope', "
    )


@pytest.mark.slow  # a subprocess: ~5 s
def test_a_flat_field_on_the_command_line_names_its_new_place():
  result = subprocess.run(
    [sys.executable, "-m", "experiments.run", "--config=rope", "--print_config"]
    + ["--config.model.rope_base=500000"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert result.returncode == 2 and not result.stdout
  assert result.stderr.splitlines() == [
    "config error: model.rope_base: moved to model.options.rope_base"
  ]
