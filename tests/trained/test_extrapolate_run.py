"""Length extrapolation of a trained run (txf.trained.extrapolate and
python -m experiments.extrapolate).

One tiny run with a learned position table of 2x its training length (32 ->
table 64) is trained once for the module: 1x and 2x apply, 4x does not.
JAX's persistent compilation cache is on, as in test_train_setup.py.
"""

import hashlib
import json
import math
import os
import pathlib
import re
import shutil

import numpy as np
import pytest
from faulty_command import assert_only_its_checks_refuse

from conftest import tiny_config
from full_disk import files_in, full_disk, read_only
from txf.analysis.extrapolation import PROTOCOLS, window_losses
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.workdir import WorkdirError, WorkdirLock
from txf.storage import WriteError
from txf.sweep import results
from txf.train import loop
from txf.train.run_setup import adding_to_run
from txf.trained.extrapolate import check_extrapolation, extrapolate_run, format_table

STEPS = 4
SEQ_LEN = 32
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OUTPUTS = (results.EXTRAPOLATION_FILE, "extrapolation.png", "per_position_loss.png")


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny learned-position run (table of 64 rows) trained at seq_len 32."""
  workdir = tmp_path_factory.mktemp("learned")
  loop.run(
    parse(tiny_config("learned", steps=STEPS, model__max_len=2 * SEQ_LEN)),
    workdir,
    log=lambda line: None,
  )
  return workdir


def digests(directory):
  """{relative path: sha256} of the run's files, except the extrapolation outputs."""
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(pathlib.Path(directory).rglob("*"))
    if p.is_file() and p.name not in OUTPUTS
  }


def final_eval_loss(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [row["eval_loss"] for row in rows if row["step"] == STEPS and "eval_loss" in row][-1]


@pytest.mark.slow  # its fixture trains a run
def test_extrapolation_of_a_learned_table_run(trained):
  before = digests(trained)
  lines = []
  record = extrapolate_run(trained, (1, 2, 4), log=lines.append)
  assert digests(trained) == before  # config.json and checkpoints untouched
  for name in OUTPUTS[1:]:
    assert (trained / name).read_bytes().startswith(PNG_MAGIC)
  assert lines[-1] == "wrote " + ", ".join(
    str(trained / name) for name in [*OUTPUTS[1:], OUTPUTS[0]]
  )

  assert record["lengths"] == [32, 64, 128] and record["applicable"] == [True, True, False]
  # Default budget: the evaluator's eval.num_batches x batch_size windows of 33 tokens.
  assert record["num_tokens"] == 1 * 8 * (SEQ_LEN + 1)
  # At 1x the non-overlapping windows are the evaluator's: float32 sums of the
  # eval step against float64 sums of float32 per-token losses.
  assert record["loss"]["non_overlapping"][0] == pytest.approx(final_eval_loss(trained), rel=1e-5)
  assert record["scored_tokens"]["non_overlapping"][:2] == [8 * 32, 4 * 64]
  assert record["scored_tokens"]["sliding"][:2] == [263, 263]  # every token but the first
  for protocol in PROTOCOLS:
    assert all(math.isfinite(loss) for loss in record["loss"][protocol][:2])
    assert record["loss"][protocol][2] is None
  assert record["reason"][:2] == [None, None]
  assert record["reason"][2].startswith(
    "model.max_len: data.seq_len of 128 positions is longer than the learned position table (64"
  )
  assert record["stride"] == [16, 32, None]

  # The longest applicable length's per-position loss, averaging to its loss.
  per_position = record["per_position"]
  assert per_position["length"] == 64 and len(per_position["loss"]) == 64
  assert np.mean(per_position["loss"]) == pytest.approx(
    record["loss"]["non_overlapping"][1], rel=1e-9
  )
  read = results.read_extrapolation(trained)
  assert read.lengths == (32, 64, 128) and read.applicable == (True, True, False)
  assert read.loss["sliding"] == tuple(record["loss"]["sliding"])
  assert read.per_position_length == 64 and len(read.per_position_loss) == 64

  # One progress line per length, as each is done.
  assert len(lines) == 4  # a line per length, then the files written
  for at, line in enumerate(lines[:3]):
    assert line.startswith(f"extrapolate: length {record['lengths'][at]} ({at + 1} of 3, ")
    assert re.search(r"\| elapsed \d+s$", line), line
  assert f"non_overlapping {record['loss']['non_overlapping'][0]:.4f}" in lines[0]
  assert f"sliding {record['loss']['sliding'][1]:.4f}" in lines[1]
  assert "| n/a (model.max_len: " in lines[2]

  table = format_table(record)
  assert "n/a" in table and "model.max_len" in table
  assert f"{record['loss']['non_overlapping'][0]:.4f}" in table


@pytest.mark.slow  # its fixture trains a run
def test_a_record_where_no_length_applies_leaves_no_earlier_figures_beside_it(trained, tmp_path):
  """4x and 8x pass the learned table: the record holds n/a alone, and the
  earlier record's figures (of 1x and 2x) stayed beside it as if its own."""
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  extrapolate_run(workdir, (1, 2))
  assert all((workdir / name).exists() for name in OUTPUTS)
  record = extrapolate_run(workdir, (4, 8))
  assert record["applicable"] == [False, False] and record["per_position"] is None
  assert [name for name in OUTPUTS if (workdir / name).exists()] == [results.EXTRAPOLATION_FILE]


@pytest.mark.slow  # its fixture trains a run
def test_a_token_budget_and_stride_of_ones_own(trained):
  record = extrapolate_run(trained, (1, 2), stride=8, num_tokens=300)
  assert record["num_tokens"] == 300  # eval.num_batches raised to 2 batches for it
  assert record["stride"] == [8, 8]
  assert record["scored_tokens"]["non_overlapping"] == [(300 // 33) * 32, (300 // 65) * 64]
  assert record["scored_tokens"]["sliding"] == [299, 299]


@pytest.mark.slow  # its fixture trains a run
@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(factors=(2, 1)), "factors must be distinct positive ints in increasing order"),
    (dict(factors=(1, 0)), r"factors\[1\]: must be an integer >= 1"),  # was factors[]
    (dict(stride=33), "stride must be at most the shortest length 32, got 33"),
    (dict(stride=0), r"^stride: must be an integer >= 1"),
    (dict(num_tokens=10**7), "num_tokens: the validation split holds only"),
    (
      dict(num_tokens=40, factors=(1, 2)),
      "num_tokens: 40 validation tokens hold no window of 65 tokens",
    ),
    (
      dict(num_tokens=64, factors=(1, 2)),  # one short of a window of 2x
      r"^num_tokens: 64 validation tokens hold no window of 65 tokens \(length 64\)",
    ),
  ],
)
def test_bad_arguments_are_refused_naming_them(trained, kwargs, message):
  before = digests(trained)
  with pytest.raises(ValueError, match=message):
    extrapolate_run(trained, **kwargs)
  assert digests(trained) == before


@pytest.mark.slow  # its fixture trains a run
def test_the_boundaries_of_stride_and_token_count_are_accepted(trained):
  """A stride of the shortest length, a window's tokens exactly and every
  token the evaluator's one batch holds (8 windows of 33) are accepted."""
  assert check_extrapolation(trained, (1, 2), stride=32).settings["stride"] == [32, 32]
  request = check_extrapolation(trained, (1, 2), num_tokens=65)
  assert request.settings["num_tokens"] == len(request.tokens_N) == 65
  request = check_extrapolation(trained, (1,), num_tokens=8 * (SEQ_LEN + 1))
  assert request.settings["num_tokens"] == len(request.tokens_N) == 264


@pytest.mark.slow  # its fixture trains a run
def test_the_sliding_losses_are_those_of_the_stride_asked_for_at_any_batch_size(trained):
  """--stride=8 scored the sliding windows at the default stride (16)
  unnoticed; one window per model call (batch_tokens below a window) is the
  same loss."""
  record = extrapolate_run(trained, (1,), stride=8, batch_tokens=1)
  request = check_extrapolation(trained, (1,))
  params = request.run.setup.replica_params(request.run.params, 0)
  direct = {
    stride: window_losses(
      request.run.setup.model,
      params,
      request.tokens_N[None],
      seq_len=SEQ_LEN,
      protocol="sliding",
      stride=stride,
    ).mean_loss
    for stride in (8, 16)
  }
  # float32 losses of one window per call against 8 per call: the same sums.
  assert record["loss"]["sliding"][0] == pytest.approx(direct[8], rel=1e-6)
  assert abs(direct[8] - direct[16]) > 1e-4  # the stride matters here
  assert record["scored_tokens"]["sliding"] == [263]
  assert record["loss"]["non_overlapping"][0] == pytest.approx(final_eval_loss(trained), rel=1e-5)


def test_the_table_prints_each_protocols_loss_in_its_column():
  record = {
    "step": 4,
    "train_length": 32,
    "num_tokens": 264,
    "factors": [1, 2],
    "lengths": [32, 64],
    "applicable": [True, False],
    "reason": [None, "too long"],
    "stride": [8, None],
    "loss": {"non_overlapping": [2.5, None], "sliding": [1.25, None]},
  }
  assert format_table(record).splitlines() == [
    "step 4, training length 32 tokens, 264 validation tokens; loss in nats/token",
    " length factor non-overlapping   sliding stride",
    "     32     1x          2.5000    1.2500      8",
    "     64     2x             n/a       n/a         (too long)",
  ]


def test_an_encoder_run_is_refused(tmp_path):
  workdir = tmp_path / "run"
  loop.run(parse(tiny_config("encoder_mlm", steps=1)), workdir, log=lambda line: None)
  with pytest.raises(
    ValueError, match=r"^data.task: length extrapolation needs a causal language model .* 'mlm'$"
  ):
    extrapolate_run(workdir)
  assert not any((workdir / name).exists() for name in OUTPUTS)


def test_a_run_on_generated_rows_is_refused(tmp_path):
  """Induction's rows are independent examples whose first block is weighted
  0: joined into one stream and scored whole, its 1x loss was not its
  eval_loss (2.17 against 1.28 for a 500-step run) and exited 0."""
  workdir = tmp_path / "run"
  loop.run(parse(tiny_config("induction", steps=2)), workdir, log=lambda line: None)
  with pytest.raises(
    ValueError, match=r"^data.name: length extrapolation scores a text stream, .* 'induction'"
  ):
    extrapolate_run(workdir)


def test_a_directory_without_a_run_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="^workdir: .* holds no run"):
    extrapolate_run(tmp_path)


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_refuses_only_what_its_checks_refuse(trained, commands):
  """A ValueError from the checks is one line and exit 2; one raised after
  them is a fault of txf's: its traceback and exit 1 (it was `extrapolate error:
  ...`, exit 2, reading as a refused flag)."""
  assert_only_its_checks_refuse(
    commands,
    "txf.commands.extrapolate",
    "txf.trained.extrapolate",
    "extrapolate",
    trained,
    "--stride=33",
    "extrapolate",
  )


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_prints_the_table_and_writes_its_files(trained, tmp_path, commands):
  config_json = (trained / "config.json").read_bytes()
  for name in OUTPUTS:
    (trained / name).unlink(missing_ok=True)
  done = commands.run(
    "experiments.extrapolate", f"--workdir={trained}", "--factors=1,2,4", timeout=300
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "n/a" in done.stdout and "128" in done.stdout
  # Every line stamped with the wall-clock time off a terminal (the lengths'
  # summaries were not).
  stamped = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (.*)")
  lines = [line for line in done.stderr.splitlines() if "extrapolate:" in line]
  assert all(stamped.match(line) for line in lines), lines
  lines = [stamped.match(line)[1] for line in lines]
  assert [line.split(" (")[0] for line in lines if " of 3, " in line] == [
    "extrapolate: length 32",
    "extrapolate: length 64",
    "extrapolate: length 128",
  ]
  # Each applicable length's windows counted as they are scored (txf.progress):
  # from 0 to all of them; none for 128 (n/a).
  counted = [line for line in lines if " of 3, " not in line]
  for length in (32, 64):
    ends = [
      re.fullmatch(rf"extrapolate: length {length}: (\d+)/(\d+) windows.*", line)
      for line in counted
    ]
    counts = [(int(m[1]), int(m[2])) for m in ends if m]
    assert counts[0][0] == 0 and counts[-1][0] == counts[-1][1] == counts[0][1] > 0, counts
  assert not any("length 128:" in line for line in counted)
  assert "extrapolate:" not in done.stdout  # the table alone
  assert json.loads((trained / results.EXTRAPOLATION_FILE).read_text())["applicable"] == [
    True,
    True,
    False,
  ]
  for name in OUTPUTS[1:]:
    assert (trained / name).read_bytes().startswith(PNG_MAGIC)
  # Its last line on stderr names the files written (the sweep's summary does too).
  assert stamped.match(done.stderr.splitlines()[-1])[1] == "wrote " + ", ".join(
    str(trained / name) for name in [*OUTPUTS[1:], OUTPUTS[0]]
  )
  assert (trained / "config.json").read_bytes() == config_json

  done = commands.run("experiments.extrapolate", f"--workdir={tmp_path}", timeout=300)
  assert done.returncode == 2 and "holds no run" in done.stderr


@pytest.mark.slow  # its fixture trains a run
def test_adding_to_a_read_only_run_is_refused_before_anything_is_computed(trained):
  before = digests(trained)
  with (
    read_only(trained),
    pytest.raises(
      WorkdirError, match=rf"^{trained}: not a writable directory \(Read-only file system\)$"
    ),
    adding_to_run(trained),
  ):
    pytest.fail("entered")
  assert digests(trained) == before


def test_adding_to_a_directory_without_a_run_creates_nothing(tmp_path):
  with (
    pytest.raises(ConfigError, match="^workdir: .* holds no run"),
    adding_to_run(tmp_path / "typo"),
  ):
    pytest.fail("entered")
  assert os.listdir(tmp_path) == []


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_refuses_a_run_still_training_in_one_line(trained, commands):
  """Another process holds the run (here this one, as a training run would):
  before, the command extrapolated it and wrote into the live run."""
  for name in OUTPUTS:
    (trained / name).unlink(missing_ok=True)
  with WorkdirLock(trained):
    before = digests(trained)
    done = commands.run(
      "experiments.extrapolate", f"--workdir={trained}", "--factors=1,2", timeout=300
    )
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines() == [
    f"workdir error: {trained}: in use by another run ({(trained / '.lock').read_text().strip()}); "
    "wait for it to finish or use another --workdir"
  ]
  assert not any((trained / name).exists() for name in OUTPUTS)
  assert digests(trained) == before


@pytest.mark.slow  # its fixture trains a run
def test_a_full_disk_while_writing_the_record_keeps_the_previous_one(trained):
  """The figures and the record are one set: the record failing left the
  new figures beside the old record."""
  path = trained / results.EXTRAPOLATION_FILE
  extrapolate_run(trained, (1, 2))
  before = {name: (trained / name).read_bytes() for name in OUTPUTS}
  with (
    full_disk(files_in(trained), len(OUTPUTS)),
    pytest.raises(  # the plots, then the record
      WriteError, match=f"^{path}: No space left on device$"
    ),
  ):
    extrapolate_run(trained, (1, 2), stride=8)  # other sliding losses: other figures
  assert {name: (trained / name).read_bytes() for name in OUTPUTS} == before
  assert not [p for p in trained.iterdir() if p.name.endswith(".tmp")]


def test_the_stream_leaves_out_a_packed_rows_padding():
  """A packed TFDS stream's last row is padded after its end: its pads were
  concatenated into the stream and scored as text. Rows of padding alone are
  left out as before, and full rows are kept whole."""
  import types

  from txf.data.packed import lm_batch
  from txf.trained.extrapolate import _validation_stream

  windows = np.array([[5, 6, 7, 8], [9, 10, 0, 0], [0, 0, 0, 0]])
  real = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], bool)
  batch = lm_batch(windows, real, eos_id=2, segmented=True)
  stream = _validation_stream(types.SimpleNamespace(eval_data=[batch]))
  np.testing.assert_array_equal(stream, [5, 6, 7, 8, 9, 10])
