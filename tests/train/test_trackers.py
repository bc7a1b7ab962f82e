"""Tests of the experiment trackers (txf.rundir.trackers): the check of
train.trackers' names, a tracker registered from user code (txf.register)
and fed by a tiny training run, and a Weights & Biases run logged offline
(no network) from a tiny training run, then resumed into the same wandb run."""

import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from conftest import REPO, tiny_config as tiny
from txf import register
from txf.runconfig import tracker_kinds
from txf.runconfig.run_config import parse
from txf.rundir import metrics, trackers
from txf.rundir.metrics import read_metrics
from txf.train import loop


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


@pytest.mark.parametrize(
  "value, names",
  [
    ("", ()),
    (None, ()),
    ("wandb", ("wandb",)),
    (" wandb, wandb ", ("wandb",)),
    (["wandb"], ("wandb",)),
  ],
)
def test_tracker_names(value, names):
  assert tracker_kinds.tracker_names(value) == names


@pytest.mark.parametrize("value", ["tensorboard", "wandb,x", 3, ["wandb", 1]])
def test_bad_tracker_names_name_the_field(value):
  with pytest.raises(ValueError, match=r"^train\.trackers: "):
    tracker_kinds.tracker_names(value)


class JsonlCopy:
  """docs/extending.md's tracker: each metrics row, sample and the final
  metrics appended to tracked.jsonl in the run's work directory."""

  def __init__(self, workdir):
    self.file = (workdir / "tracked.jsonl").open("a")

  def log_config(self, config):
    self._write(config=config)

  def log_metrics(self, step, scalars):
    self._write(step=step, **scalars)

  def log_sample(self, step, text):
    self._write(step=step, sample=text)

  def log_summary(self, metrics):
    self._write(summary=metrics)

  def close(self):
    self.file.close()

  def _write(self, **record):
    self.file.write(json.dumps(record) + "\n")


def test_a_registered_tracker_gets_the_runs_config_metrics_samples_and_summary(tmp_path):
  checked = []

  def check(workdir):  # under the directory's lock, before anything else is written
    checked.append(sorted(p.name for p in workdir.iterdir()) if workdir.exists() else None)

  with tracker_kinds.TRACKERS.scoped():
    register.tracker("jsonl_copy", check=check)(JsonlCopy)
    assert tracker_kinds.tracker_names("jsonl_copy, wandb") == ("jsonl_copy", "wandb")
    config = tiny(steps=4, train__trackers="jsonl_copy", eval__every=2, eval__sample_tokens=4)
    loop.run(parse(config), tmp_path / "run", log=lambda line: None)
  assert "jsonl_copy" not in tracker_kinds.TRACKERS  # scoped: undone
  assert checked == [[".lock"]]
  records = [json.loads(line) for line in (tmp_path / "run" / "tracked.jsonl").open()]
  assert records[0]["config"]["train"]["trackers"] == ["jsonl_copy"]
  rows = [{k: v for k, v in row.items() if k != "time"} for row in read_metrics(tmp_path / "run")]
  samples = [dict(step=step, sample=text) for step, text in metrics.read_samples(tmp_path / "run")]
  assert [r for r in records[1:-1] if "sample" not in r] == rows
  assert [r for r in records if "sample" in r] == samples and len(samples) == 2
  assert records[-1]["summary"]["eval_loss"] == rows[-1]["eval_loss"]


def test_a_registered_trackers_check_stops_the_run_before_anything_is_written(tmp_path):
  def check(workdir):
    raise ValueError("train.trackers: jsonl_copy: no server")

  with tracker_kinds.TRACKERS.scoped():
    register.tracker("jsonl_copy", check=check)(JsonlCopy)
    with pytest.raises(ValueError, match=r"^train\.trackers: jsonl_copy: no server$"):
      loop.run(parse(tiny(steps=2, train__trackers="jsonl_copy")), tmp_path / "run", log=print)
  assert not (tmp_path / "run").exists()


def test_a_registered_trackers_missing_package_is_named_before_it_starts(tmp_path):
  with tracker_kinds.TRACKERS.scoped():
    register.tracker("mlflow_copy", package="txf_no_such_package")(JsonlCopy)
    message = r"^train\.trackers: 'mlflow_copy' needs the txf_no_such_package package: "
    with pytest.raises(ValueError, match=message + r"pip install txf_no_such_package$"):
      tracker_kinds.tracker_names("mlflow_copy")
    register.tracker("mlflow_copy", package="txf_no_such_package", install="ask IT", replace=True)(
      JsonlCopy
    )
    with pytest.raises(ValueError, match=message + "ask IT$"):
      tracker_kinds.tracker_names(["mlflow_copy"])


def test_an_unknown_tracker_lists_the_registered_ones():
  with tracker_kinds.TRACKERS.scoped():
    register.tracker("jsonl_copy")(JsonlCopy)
    with pytest.raises(ValueError) as raised:
      tracker_kinds.tracker_names("wandb,nope")
  assert str(raised.value) == "train.trackers: 'nope' is not one of ('wandb', 'jsonl_copy')"


def read_wandb_records(path):
  """The Records of a wandb .wandb transaction log (LevelDB's log format:
  32 KiB blocks of chunks <crc u32><length u16><type u8><data>, after a
  7-byte ':W&B' header; wandb's own reader left its Python package)."""
  from wandb.proto import wandb_internal_pb2

  data = pathlib.Path(path).read_bytes()
  assert data[:4] == b":W&B"
  block, pos, records, pending = 32768, 7, [], b""
  while pos + 7 <= len(data):
    left = block - pos % block
    length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7]) if left >= 7 else (0, 0)
    if length == 0 and kind == 0:  # zero padding at a block's end
      pos += left
      continue
    pending += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # a FULL record, or the LAST chunk of one
      records.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b""
  return records


def offline_run(wandb_dir, run_id):
  """(run ids, history {step: {key: value}}, summary, config) of every
  offline wandb run of `run_id` under `wandb_dir`, in start order."""
  import json

  files = sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
  assert files, list(wandb_dir.rglob("*"))
  ids, history, summary, config = [], {}, {}, {}
  for file in files:
    for record in read_wandb_records(file):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        ids.append(record.run.run_id)
      elif kind == "history":
        row = {
          item.key or "/".join(item.nested_key): json.loads(item.value_json)
          for item in record.history.item
        }
        history.setdefault(row["_step"], {}).update(row)
      elif kind == "summary":
        summary.update(
          {item.key: json.loads(item.value_json) for item in record.summary.update if item.key}
        )
      elif kind == "config":
        config.update({item.key: json.loads(item.value_json) for item in record.config.update})
  return ids, history, summary, config


def table_rows(run_dir, row, key):
  """The rows of the wandb table logged as `key` in a history `row` of an
  offline run (a reference, flattened into '<key>/path', ..., to a file of
  the run's files/)."""
  import json

  assert row[f"{key}/_type"] == "table-file", row
  table = json.loads((run_dir / "files" / row[f"{key}/path"]).read_text())
  assert table["columns"] == ["step", "sample"]
  return [tuple(values) for values in table["data"]]


@pytest.mark.slow
def test_wandb_logs_config_metrics_samples_and_resumes_the_same_run(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.delenv("WANDB_DIR", raising=False)
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_PROJECT", "txf-test")
  monkeypatch.chdir(tmp_path)
  workdir = tmp_path / "run"
  config = tiny(steps=4, train__trackers="wandb", eval__every=2, eval__sample_tokens=8)
  loop.run(parse(config), workdir, log=lambda line: None)
  # wandb's files are the run's: in its work directory, not the current one's.
  assert not (tmp_path / "wandb").exists()
  run_id = (workdir / trackers.WANDB_ID_FILE).read_text().strip()
  ids, history, summary, logged_config = offline_run(workdir, run_id)
  assert ids == [run_id]
  rows = read_metrics(workdir)
  final = [row for row in rows if "eval_loss" in row][-1]
  assert final["step"] == 4
  # The final eval loss: in the history at its step and in the summary, grouped.
  assert history[4]["eval/loss"] == pytest.approx(final["eval_loss"])
  assert summary["eval/loss"] == pytest.approx(final["eval_loss"])
  for row in rows:
    if "loss" in row:
      assert history[row["step"]]["train/loss"] == pytest.approx(row["loss"])
    if "tokens_per_sec" in row:
      assert history[row["step"]]["perf/tokens_per_sec"] == pytest.approx(row["tokens_per_sec"])
  # The samples: one table of (step, sample), each logging it whole.
  samples = metrics.read_samples(workdir)
  assert [step for step, _ in samples] == [2, 4]
  (run_dir,) = (workdir / "wandb").glob(f"offline-run-*-{run_id}")
  assert table_rows(run_dir, history[4], trackers.WANDB_SAMPLES) == samples
  # The resolved config, derived fields filled in.
  assert logged_config["model"]["head_dim"] == 16
  assert logged_config["train"]["trackers"] == ["wandb"]

  # Restarted with more steps: the same wandb run goes on, its table from the start.
  config = tiny(steps=6, train__trackers="wandb", eval__every=2, eval__sample_tokens=8)
  loop.run(parse(config), workdir, log=lambda line: None)
  assert (workdir / trackers.WANDB_ID_FILE).read_text().strip() == run_id
  ids, history, summary, _ = offline_run(workdir, run_id)
  assert ids == [run_id, run_id]
  final = [row for row in read_metrics(workdir) if "eval_loss" in row][-1]
  assert final["step"] == 6
  assert history[6]["eval/loss"] == pytest.approx(final["eval_loss"])
  assert summary["eval/loss"] == pytest.approx(final["eval_loss"])
  samples = metrics.read_samples(workdir)
  assert [step for step, _ in samples] == [2, 4, 6]
  run_dir = sorted((workdir / "wandb").glob(f"offline-run-*-{run_id}"))[-1]
  assert table_rows(run_dir, history[6], trackers.WANDB_SAMPLES) == samples


@pytest.mark.parametrize(
  "name, tag",
  [
    ("loss", "train/loss"),
    ("loss/1", "train/loss/1"),
    ("loss_std", "train/loss_std"),
    ("learning_rate", "train/learning_rate"),
    ("eval_loss", "eval/loss"),
    ("eval_perplexity/0", "eval/perplexity/0"),
    ("tokens_per_sec", "perf/tokens_per_sec"),
    ("mfu", "perf/mfu"),
    ("eval/sample", "eval/sample"),
  ],
)
def test_metric_tags_group_by_what_they_measure(name, tag):
  assert trackers.metric_tag(name) == tag


def test_wandb_writes_into_the_work_directory_unless_told(tmp_path, monkeypatch):
  from etils import epath

  monkeypatch.delenv("WANDB_DIR", raising=False)
  assert trackers.wandb_dir(epath.Path(tmp_path)) == str(tmp_path)
  assert trackers.wandb_dir(epath.Path("gs://bucket/run")) is None  # wandb's default
  monkeypatch.setenv("WANDB_DIR", "/elsewhere")
  assert trackers.wandb_dir(epath.Path(tmp_path)) == "/elsewhere"


def test_without_wandb_installed_naming_it_says_what_to_install(tmp_path, monkeypatch):
  import sys

  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
  # The config check says so, before anything is written ...
  # The package, which pip installs however txf was installed ('txf[wandb]' only from an index).
  hint = r"pip install 'wandb>=0\.19' \(txf's wandb extra\)$"
  with pytest.raises(
    ValueError, match=r"^train\.trackers: 'wandb' needs the wandb package: " + hint
  ):
    tracker_kinds.tracker_names("wandb")
  # ... and so would starting it.
  with pytest.raises(ImportError, match=hint):
    trackers.make_trackers(("wandb",), tmp_path)


@pytest.mark.slow  # a subprocess (imports only: it stops before any compute)
def test_wandb_without_a_login_is_one_line_exit_2_before_anything_is_written(tmp_path):
  """It was wandb's 37-line UsageError, exit 1, after the run had written
  .lock, checkpoints/ and wandb_run_id.txt."""
  pytest.importorskip("wandb")
  home = tmp_path / "home"  # no ~/.netrc, no wandb settings
  home.mkdir()
  env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
  env.update(HOME=str(home), WANDB_API_KEY="", JAX_PLATFORMS="cpu")
  workdir = tmp_path / "run"
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      "--config=rope",
      f"--workdir={workdir}",
      "--config.train.trackers=wandb",
      "--config.data.max_corpus_bytes=200000",
    ],
    cwd=tmp_path,
    env=dict(env, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [
    "config error: train.trackers: wandb has no API key (none in WANDB_API_KEY, ~/.netrc or "
    "its settings): run `wandb login`, or set WANDB_MODE=offline to log offline"
  ]
  assert not workdir.exists()
