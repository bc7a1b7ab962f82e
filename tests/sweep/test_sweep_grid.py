"""Tests for txf.sweep.grid: expansion, validation, selection, command lines."""

import shlex

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from conftest import REPO, load_config
from txf.commands import cli
from txf.sweep import grid
from txf.sweep.grid import GridError

BASE_CONFIG_FILE = REPO / "configs" / "base.py"


def sweep_config(fields, base=None, zip=None):
  config = ml_collections.ConfigDict()
  config.base = base if base is not None else load_config("base")
  config.grid = grid.make_grid(fields, zip=zip)
  config.sweep = ml_collections.ConfigDict(dict(seeds=2))
  return config


def test_expand_is_the_product_in_grid_order_first_field_slowest():
  config = sweep_config(
    {"model.position": ["rope", "alibi", "learned"], "model.norm_placement": ["pre", "post"]}
  )
  points = grid.expand(config)
  assert [p.index for p in points] == list(range(6))
  assert [(p.config.model.position, p.config.model.norm_placement) for p in points] == [
    ("rope", "pre"),
    ("rope", "post"),
    ("alibi", "pre"),
    ("alibi", "post"),
    ("learned", "pre"),
    ("learned", "post"),
  ]
  assert points[3].name == "position=alibi,norm_placement=post"
  assert points[3].overrides == {"model.position": "alibi", "model.norm_placement": "post"}
  # Each point owns a copy: the base and the other points are untouched.
  points[0].config.train.steps = 7
  assert config.base.model.position == "rope" and config.base.train.steps == 600
  assert points[1].config.train.steps == 600


def test_zipped_fields_vary_together_as_one_axis_after_the_product():
  config = sweep_config(
    {"model.norm_placement": ["pre", "post"]},
    zip={"train.learning_rate": [1e-3, 3e-3, 1e-2], "train.warmup_steps": [0, 60, 120]},
  )
  config.lock()  # as a config file's is
  points = grid.expand(config)
  settings = [
    (p.config.model.norm_placement, p.config.train.learning_rate, p.config.train.warmup_steps)
    for p in points
  ]
  assert settings == [
    ("pre", 1e-3, 0),
    ("pre", 3e-3, 60),
    ("pre", 1e-2, 120),
    ("post", 1e-3, 0),
    ("post", 3e-3, 60),
    ("post", 1e-2, 120),
  ]
  assert [p.index for p in points] == list(range(6))
  assert points[4].name == "norm_placement=post,learning_rate=0.003,warmup_steps=60"
  assert points[4].overrides == {
    "model.norm_placement": "post",
    "train.learning_rate": 3e-3,
    "train.warmup_steps": 60,
  }
  assert len({p.name for p in points}) == 6


def test_a_zip_alone_is_a_grid_and_names_stay_filesystem_safe():
  points = grid.expand(
    sweep_config({}, zip={"eval.sample_prompt": ["a/b", "c d"], "model.use_bias": [True, False]})
  )
  assert [p.name for p in points] == [
    "sample_prompt=a_b,use_bias=true",
    "sample_prompt=c_d,use_bias=false",
  ]
  assert [p.config.eval.sample_prompt for p in points] == ["a/b", "c d"]


@pytest.mark.parametrize(
  "fields,zipped,message",
  [
    (
      {},
      {"train.learning_rate": [1e-3, 3e-3], "train.warmup_steps": [0, 60, 120]},
      "zip: the lists must have one length, but train.learning_rate has 2, "
      "train.warmup_steps has 3 values",
    ),
    ({}, {"train.learning_rate": [1e-3]}, "zip: needs two or more fields"),
    ({}, {"train.learning_rate": [], "train.warmup_steps": []}, "must be a non-empty list"),
    (
      {"train.learning_rate": [1e-3]},
      {"train.learning_rate": [1e-3], "train.warmup_steps": [0]},
      "zip: train.learning_rate: also a multiplied field",
    ),
  ],
)
def test_bad_zips_are_rejected_naming_the_fields(fields, zipped, message):
  with pytest.raises(GridError, match=message.replace("(", r"\(")):
    grid.make_grid(fields, zip=zipped)


def test_a_hand_written_zip_entry_is_checked_row_by_row():
  config = sweep_config({"train.learning_rate,train.warmup_steps": [(1e-3, 0), (3e-3,)]})
  with pytest.raises(GridError, match=r"grid.train.learning_rate,train.warmup_steps: \(0.003,\)"):
    grid.expand(config)
  config = sweep_config(
    {"train.warmup_steps": [0], "train.learning_rate,train.warmup_steps": [(1, 2)]}
  )
  with pytest.raises(GridError, match="train.warmup_steps appears twice"):
    grid.expand(config)


def test_zipped_points_reproduce_through_command_for(tmp_path):
  config = sweep_config({}, zip={"train.learning_rate": [1e-3], "train.warmup_steps": [7]})
  (point,) = grid.expand(config)
  command = grid.command_for(point, "configs/base.py", tmp_path, reference=load_config("base"))
  assert "--config.train.learning_rate=0.001" in command
  assert "--config.train.warmup_steps=7" in command


def test_names_are_filesystem_safe_and_keep_grid_order_with_full_paths_on_clashes():
  points = grid.expand(
    sweep_config(
      {
        "model.max_len": [256],
        "data.max_example_len": [8],
        "eval.sample_prompt": ["a/b c"],
        "model.use_bias": [True],
      }
    )
  )
  assert points[0].name == "max_len=256,max_example_len=8,sample_prompt=a_b_c,use_bias=true"
  assert points[0].config.eval.sample_prompt == "a/b c"


def test_names_that_collide_after_sanitising_are_rejected_naming_both_points():
  with pytest.raises(GridError, match=r"points 0 and 1 .*'sample_prompt=a_b'"):
    grid.expand(sweep_config({"eval.sample_prompt": ["a/b", "a b"]}))


def test_int_values_are_accepted_by_float_fields_through_configdict():
  points = grid.expand(sweep_config({"train.learning_rate": [1, 3e-4]}))
  assert [p.config.train.learning_rate for p in points] == [1.0, 3e-4]
  assert isinstance(points[0].config.train.learning_rate, float)


@pytest.mark.parametrize(
  "fields, message",
  [
    (
      {"model.num_layers": [2, "two"]},
      r"^point 1 \(num_layers=two\): model\.num_layers: 'two' has the wrong type",
    ),
    (
      {"model.position": ["rope"], "model.bogus": [1]},
      r"^point 0 \(position=rope,bogus=1\): model\.bogus: unknown field",
    ),
    ({"bogus.position": [1]}, r"^point 0 \(position=1\): bogus: unknown field"),
    ({"model.position.x": [1]}, r"^point 0 \(x=1\): model\.position\.x: unknown field"),
    ({"model": [1]}, r"^point 0 \(model=1\): model: is a section, not a field"),
  ],
)
def test_bad_overrides_name_the_point_and_the_field(fields, message):
  with pytest.raises(GridError, match=message):
    grid.expand(sweep_config(fields))


@pytest.mark.parametrize(
  "fields, message",
  [
    ({}, r"^grid: empty"),
    ({"model.position": []}, r"^grid\.model\.position: must be a non-empty list"),
    ({"model.position": "rope"}, r"^grid\.model\.position: must be a non-empty list"),
    ({"model.position": [("rope",)]}, r"^grid\.model\.position: \('rope',\) is not a str"),
  ],
)
def test_bad_grids_are_rejected_naming_the_field(fields, message):
  with pytest.raises(GridError, match=message):
    grid.expand(sweep_config(fields))


def test_a_sweep_config_without_a_grid_is_rejected():
  config = ml_collections.ConfigDict(dict(base=load_config("base")))
  with pytest.raises(GridError, match="^sweep config: grid: missing section"):
    grid.expand(config)


def check_learned_table(config):
  """A stand-in for the run config validator: its error names the field."""
  if config.model.position == "learned" and config.data.seq_len > config.model.max_len:
    raise ValueError(
      f"model.max_len: the learned table ({config.model.max_len}) is shorter "
      f"than data.seq_len={config.data.seq_len}"
    )


def test_validate_names_the_first_point_the_check_rejects():
  points = grid.expand(
    sweep_config({"model.position": ["rope", "learned"], "model.max_len": [512, 64]})
  )
  grid.validate(points[:3], check_learned_table)  # rope x both, learned x 512: fine
  with pytest.raises(
    GridError,
    match=r"^point 3 \(position=learned,max_len=64\): "
    r"model\.max_len: the learned table \(64\)",
  ):
    grid.validate(points, check_learned_table)


@pytest.fixture
def six_points(monkeypatch):
  monkeypatch.delenv(grid.SLURM_TASK_ENV, raising=False)
  return grid.expand(
    sweep_config(
      {"model.position": ["rope", "alibi", "learned"], "model.norm_placement": ["pre", "post"]}
    )
  )


def test_select_all_one_or_the_slurm_task(six_points, monkeypatch):
  assert grid.select(six_points) == six_points
  assert grid.select(six_points, 4) == [six_points[4]]
  monkeypatch.setenv(grid.SLURM_TASK_ENV, "5")
  assert grid.select(six_points) == [six_points[5]]
  assert grid.select(six_points, 0) == [six_points[0]]  # an explicit --index wins


@pytest.mark.parametrize(
  "index, env, message",
  [
    (6, None, r"^--index=6: out of range \(the grid has 6 points, indices 0\.\.5\)"),
    (-1, None, r"^--index=-1: out of range"),
    (None, "6", r"^SLURM_ARRAY_TASK_ID=6: out of range"),
    (None, "two", r"^SLURM_ARRAY_TASK_ID=two: not an integer"),
  ],
)
def test_select_rejects_bad_indices_naming_their_source(
  six_points, monkeypatch, index, env, message
):
  if env is not None:
    monkeypatch.setenv(grid.SLURM_TASK_ENV, env)
  with pytest.raises(grid.PointIndexError, match=message):
    grid.select(six_points, index)


def parse_run_command(command):
  """(config, workdir) that txf-run's flags parse from `command`."""
  args = shlex.split(command)
  assert args[0] == "txf-run"
  argv = ["run", *args[1:]]
  values = flags.FlagValues()
  config_flag = config_flags.DEFINE_config_file(
    "config", None, "run config", flag_values=values, lock_config=True, sys_argv=argv
  )
  workdir_flag = flags.DEFINE_string("workdir", None, "run directory", flag_values=values)
  values(argv)
  return config_flag.value, workdir_flag.value


def test_command_for_reproduces_every_field_the_point_changes(tmp_path):
  base = load_config("base")
  # The sweep's base differs from the file too: those fields must be passed.
  base.train.steps = 20
  base.model.tie_embeddings = False
  base.eval.sample_prompt = "x = 'a b'"
  points = grid.expand(
    sweep_config(
      {
        "model.norm_placement": ["post"],
        "train.learning_rate": [1e-5, 2],
        "model.use_bias": [True],
        "data.seq_len": [64],
      },
      base=base,
    )
  )
  commands = []
  for point in points:
    workdir = tmp_path / point.name
    commands.append(
      grid.command_for(point, str(BASE_CONFIG_FILE), workdir, reference=load_config("base"))
    )
    config, parsed_workdir = parse_run_command(commands[-1])
    assert config.to_dict() == point.config.to_dict()
    assert isinstance(config.train.learning_rate, float)
    assert parsed_workdir == str(workdir)
  assert "--config.train.learning_rate=1e-05" in commands[0]
  assert "--config.train.learning_rate=2.0" in commands[1]
  assert "--config.model.use_bias=true" in commands[0]
  assert "--config.model.position" not in commands[0]  # unchanged fields are not passed


def test_command_for_sets_derived_fields_and_rejects_what_the_command_line_cannot_set():
  points = grid.expand(sweep_config({"model.window": [None, 16]}))
  reference = load_config("base")
  assert "window" not in grid.command_for(points[0], "configs/base.py", "w", reference=reference)
  # model.window is a typed placeholder (None by default): the command line sets it.
  assert "--config.model.window=16" in grid.command_for(
    points[1], "configs/base.py", "w", reference=reference
  )
  # ...and sets one back to None, as txf-run parses it (it could not).
  reference.model.window = 16
  command = grid.command_for(points[0], "configs/base.py", "w", reference=reference)
  assert "--config.model.window=None" in command
  assert cli._none_overrides(["txf-run", "--config.model.window=None"]) == (
    ["txf-run"],
    ["model.window"],
  )
  reference.model.bogus = 1
  with pytest.raises(GridError, match=r"^point 1 \(window=16\): model\.bogus: in only one"):
    grid.command_for(points[1], "configs/base.py", "w", reference=reference)


def grid_items(grid_config):
  return [(key, list(values)) for key, values in grid_config.items()]


def test_override_grid_narrows_adds_and_removes_fields():
  """--grid=FIELD=VALUES: the grid as the command line narrows it; values
  read as the base declares the field; the points keep their names."""
  from txf.configs.sweeps import pe_ln

  sweep = pe_ln.get_config()
  narrowed = grid.override_grid(sweep, ["model.position=rope,alibi"])
  assert grid_items(narrowed) == [
    ("model.position", ["rope", "alibi"]),
    ("model.norm_placement", ["pre", "post"]),
  ]
  full = {point.name for point in grid.expand(sweep)}
  sweep.grid = narrowed
  names = [point.name for point in grid.expand(sweep)]
  assert len(names) == 4 and set(names) <= full
  sweep = pe_ln.get_config()
  assert grid_items(
    grid.override_grid(
      sweep,
      ["model.norm_placement=", "train.learning_rate=1e-3, 3e-3", "model.embed_norm=true"],
    )
  ) == [
    ("model.position", ["sinusoidal", "learned", "rope", "alibi", "t5_bias", "none"]),
    ("train.learning_rate", [1e-3, 3e-3]),
    ("model.embed_norm", [True]),
  ]
  assert grid_items(grid.override_grid(sweep, ["model.window=None,16"]))[-1] == (
    "model.window",
    [None, 16],
  )
  assert len(list(sweep.grid.items())) == 2  # the config itself is left as it was
  # A string field None by default is set back to None as txf-run sets it
  # (it was the text 'None': "'None' is not one of (None, 'xla', ...)").
  assert grid_items(grid.override_grid(sweep, ["model.attention_impl=None,xla"]))[-1] == (
    "model.attention_impl",
    [None, "xla"],
  )


def test_a_narrowed_point_keeps_its_name_whatever_type_the_file_wrote():
  """The file's 10000 for a float field named its point 'rope_base=10000';
  --grid read '10000' as 10000.0, named the point 'rope_base=10000.0' and
  trained again what had finished under the other name."""
  sweep = sweep_config({"model.options.rope_base": [10000, 500], "train.learning_rate": [1e-3]})
  full = [point.name for point in grid.expand(sweep)]
  sweep.grid = grid.override_grid(sweep, ["model.options.rope_base=10000"])
  (narrowed,) = grid.expand(sweep)
  assert narrowed.name == full[0] == "rope_base=10000,learning_rate=0.001"
  # A value the file does not list is read as the field's type.
  sweep.grid = grid.override_grid(sweep, ["model.options.rope_base=20000"])
  assert grid.expand(sweep)[0].name == "rope_base=20000.0,learning_rate=0.001"


def test_override_grid_gives_a_zipped_group_with_all_its_fields():
  sweep = ml_collections.ConfigDict(dict(base=load_config("base")))
  sweep.grid = grid.make_grid(
    {"model.norm_placement": ["pre", "post"]},
    zip={"train.learning_rate": [1e-3, 3e-3], "train.warmup_steps": [0, 60]},
  )
  first, second = "train.learning_rate", "train.warmup_steps"
  zipped = f"{first}{grid.ZIP_SEPARATOR}{second}"
  with pytest.raises(grid.GridError, match=f"zipped with {second}.*--grid for each"):
    grid.override_grid(sweep, [f"{first}=1e-2"])
  rezipped = dict(grid_items(grid.override_grid(sweep, [f"{second}=30,90", f"{first}=1,2"])))
  assert [tuple(row) for row in rezipped[zipped]] == [(1.0, 30), (2.0, 90)]
  with pytest.raises(grid.GridError, match="^--grid: zip: the lists must have one length"):
    grid.override_grid(sweep, [f"{first}=1,2", f"{second}=3"])
  assert grid_items(grid.override_grid(sweep, [f"{first}=", f"{second}="])) == [
    ("model.norm_placement", ["pre", "post"])
  ]


@pytest.mark.parametrize(
  "spec, message",
  [
    ("model.position", "^--grid=model.position: expected --grid=FIELD=VALUE"),
    ("model.postion=rope", "^--grid=model.postion=rope: model.postion: not a field"),
    ("model.num_layers=two", "^--grid=model.num_layers=two: model.num_layers: 'two' is not an"),
    ("model.embed_norm=yes", "'yes' is not true or false"),
    ("model.position=rope,rope", "^--grid: model.position: a value is given twice"),
  ],
)
def test_override_grid_names_a_bad_flag(spec, message):
  from txf.configs.sweeps import pe_ln

  with pytest.raises(grid.GridError, match=message):
    grid.override_grid(pe_ln.get_config(), [spec])


def test_override_grid_leaves_a_field_to_sweep():
  from txf.configs.sweeps import pe_ln

  with pytest.raises(grid.GridError, match="no field is left to sweep"):
    grid.override_grid(pe_ln.get_config(), ["model.position=", "model.norm_placement="])
  with pytest.raises(grid.GridError, match="model.position is given twice"):
    grid.override_grid(pe_ln.get_config(), ["model.position=rope", "model.position=alibi"])


def test_fields_sharing_a_last_part_are_named_by_their_whole_paths():
  """Where two grid fields end in the same part (the run's seed and the
  data's), both are named by their dotted paths, the others by their last
  part: named 'seed=0,seed=1', the points of a grid sweeping both would
  not say which seed is which."""
  fields = {"seed": [0], "data.seed": [1], "model.position": ["rope"]}
  (point,) = grid.expand(sweep_config(fields))
  assert point.name == "seed=0,data.seed=1,position=rope"
