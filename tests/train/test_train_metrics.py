"""Tests for txf.rundir.metrics (JSONL + TensorBoard) and txf.hardware."""

import json
import time
import types
from html import escape as html_escape

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tensorboard_files import read_hparams, read_tensorboard_events, read_tensorboard_scalars
from txf import hardware
from txf.rundir import console, metrics


def without_time(rows):
  return [{k: v for k, v in row.items() if k != "time"} for row in rows]


def test_jsonl_round_trip_converts_array_scalars(tmp_path):
  rows = [
    (
      10,
      {
        "loss": jnp.float32(2.5),
        "tokens": np.int64(4096),
        "learning_rate": 1e-3,
        "grad_norm": jnp.asarray(0.75, jnp.bfloat16),
      },
    ),
    (20, {"loss": np.float32(2.25), "tokens": 8192, "nan_check": jnp.nan}),
  ]
  before = time.time()
  with metrics.MetricsWriter(tmp_path) as writer:
    for step, scalars in rows:
      writer.write(step, scalars)
  got = metrics.read_metrics(tmp_path)
  assert [row["step"] for row in got] == [10, 20]
  # Each row's wall time, in seconds since the epoch.
  assert before <= got[0]["time"] <= got[1]["time"] <= time.time()
  assert isinstance(got[0]["time"], float)
  for (_, scalars), row in zip(rows, got):
    assert set(row) == {"step", "time", *scalars}
    for name, value in scalars.items():
      np.testing.assert_equal(row[name], float(value))
  assert isinstance(got[0]["tokens"], int)
  # Plain JSON on disk, one object per line.
  lines = (tmp_path / metrics.METRICS_FILE).read_text().splitlines()
  assert json.loads(lines[0])["loss"] == 2.5


def test_reopen_appends(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"loss": 3.0})
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(2, {"loss": 2.0})
  assert without_time(metrics.read_metrics(tmp_path)) == [
    {"step": 1, "loss": 3.0},
    {"step": 2, "loss": 2.0},
  ]


def test_row_cut_off_by_crash_is_skipped_and_not_glued(tmp_path, caplog):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"loss": 3.0})
  with open(tmp_path / metrics.METRICS_FILE, "a") as f:
    f.write('{"step": 2, "lo')
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(2, {"loss": 2.0})
  assert without_time(metrics.read_metrics(tmp_path)) == [
    {"step": 1, "loss": 3.0},
    {"step": 2, "loss": 2.0},
  ]
  assert "line 2" in caplog.text


def test_a_sample_cut_off_by_a_crash_does_not_swallow_the_next(tmp_path):
  """A kill mid-append left '=== st'; the next session's header was glued
  to it, and that sample read as text of the one before."""
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write_sample(3, "def f")
  with open(tmp_path / metrics.SAMPLES_FILE, "a") as f:
    f.write("=== st")
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write_sample(6, "def g")
  assert [step for step, _ in metrics.read_samples(tmp_path)] == [3, 6]
  assert metrics.read_samples(tmp_path)[1] == (6, "def g")


def test_tensorboard_event_files_hold_the_scalars_in_groups(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(5, {"loss": 1.5, "loss/1": 1.75, "eval_accuracy": jnp.float32(0.25)})
    writer.write(6, {"loss": 1.25, "learning_rate": 1e-3, "tokens_per_sec": 1000.0})
    writer.write(7, {"eval_loss_std": 0.5, "mfu": 0.5, "eval/x": 2.0})
  scalars = read_tensorboard_scalars(tmp_path / metrics.TENSORBOARD_DIR)
  assert scalars == {
    ("train/loss", 5): 1.5,
    ("train/loss/1", 5): 1.75,
    ("eval/accuracy", 5): 0.25,
    ("train/loss", 6): 1.25,
    ("train/learning_rate", 6): pytest.approx(1e-3),
    ("perf/tokens_per_sec", 6): 1000.0,
    ("eval/loss_std", 7): 0.5,
    ("perf/mfu", 7): 0.5,
    ("eval/x", 7): 2.0,
  }
  # metrics.jsonl keeps the names it was given.
  assert set(metrics.read_metrics(tmp_path)[0]) == {
    "step",
    "time",
    "loss",
    "loss/1",
    "eval_accuracy",
  }


def test_disabled_writer_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  with metrics.MetricsWriter(workdir, enabled=False) as writer:
    writer.write(1, {"loss": 1.0})
    writer.flush()
  assert not workdir.exists()
  assert metrics.read_metrics(workdir) == []


@pytest.mark.parametrize(
  "scalars, message",
  [
    ({"loss": jnp.ones((2,))}, "'loss'.*shape"),
    ({"name": "abc"}, "'name'.*number"),
    ({"step": 3}, "'step'"),
    ({"time": 3.0}, "'time'"),
  ],
)
def test_bad_scalars_raise_before_writing(tmp_path, scalars, message):
  with metrics.MetricsWriter(tmp_path) as writer:
    with pytest.raises(ValueError, match=message):
      writer.write(1, {"ok": 1.0, **scalars})
  assert metrics.read_metrics(tmp_path) == []


def test_format_progress():
  line = console.format_progress(
    250,
    1000,
    {
      "loss": jnp.float32(2.34567),
      "learning_rate": 3e-4,
      "tokens_per_sec": 51234.4,
      "mfu": 0.4123,
      "steps_per_sec": 2.0,
      "other": 7,
    },
  )
  assert line == (
    "step 250/1000 (25.0%) | loss 2.3457 | lr 3.000e-04 | 51,234 tok/s | mfu 41.2% | eta 6m15s"
  )
  assert console.format_progress(0, 10, {}) == "step 0/10 (0.0%)"
  long_run = console.format_progress(0, 10_000, {"steps_per_sec": 1.0})
  assert long_run.endswith("eta 2h46m")  # 10,000 s = 2h46m40s
  with pytest.raises(ValueError, match="total"):
    console.format_progress(1, 0, {})


def test_format_progress_shows_elapsed_and_counts_evaluations_in_its_eta():
  # 100 steps in 300 s of wall time, evaluations included, although the
  # steps alone ran at 2/s: 900 steps to go take 2700 s, not 450 s.
  line = console.format_progress(
    100, 1000, {"loss": 2.0, "steps_per_sec": 2.0}, elapsed=300.0, steps_run=100
  )
  assert line == "step 100/1000 (10.0%) | loss 2.0000 | elapsed 5m00s | eta 45m00s"
  # A resumed run: only the steps this process ran count.
  resumed = console.format_progress(600, 1000, {}, elapsed=50.0, steps_run=100)
  assert resumed.endswith("| elapsed 50s | eta 3m20s")
  # Nothing run yet: the step rate's ETA, or none.
  assert console.format_progress(0, 10, {"steps_per_sec": 1.0}, elapsed=5.0).endswith(
    "| elapsed 5s | eta 10s"
  )
  assert console.format_progress(0, 10, {}, elapsed=5.0) == "step 0/10 (0.0%) | elapsed 5s"
  assert "\x1b" not in line and "\r" not in line  # plain lines for a log file


def test_the_eta_leaves_the_compiling_step_out(monkeypatch):
  # Resumed at step 446: the first step compiles for 30 s, the next four take
  # 0.1 s each. The ETA was 150 steps x 30.4 s / 5 = 15m12s; it is 15 s.
  from txf.train import loop

  clock = iter([0.0, 30.0, 30.4])  # started, compiled, now
  monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
  window = loop._Throughput()
  for step in range(5):
    window.add({"loss": jnp.zeros(())}, compiling=step == 0)
  assert window.timed() == pytest.approx((0.4, 4))
  line = console.format_progress(
    450, 600, {}, elapsed=30.4, steps_run=window.steps_run, timed=(0.4, 4)
  )
  assert line.endswith("| elapsed 30s | eta 15s")


def fake_device(kind):
  return types.SimpleNamespace(device_kind=kind)


@pytest.mark.parametrize(
  "kind, dtype, expected",
  [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756.5e12),
    ("NVIDIA H100 NVL", "float16", 835.5e12),
    ("NVIDIA H200", jnp.bfloat16, 989.5e12),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
    ("NVIDIA A100 80GB PCIe", "bfloat16", 312e12),
    ("NVIDIA L4", "bfloat16", 121e12),
    ("Tesla V100-SXM2-16GB", "float16", 125e12),
    ("Tesla V100-SXM2-16GB", "bfloat16", None),
    ("TPU v4", "bfloat16", 275e12),
    ("TPU v5 lite", "bfloat16", 197e12),
    ("TPU v5e", "bfloat16", 197e12),
    ("TPU v5", "bfloat16", 459e12),
    ("TPU v5p", "bfloat16", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12),
    ("NVIDIA H100 80GB HBM3", "float32", None),
    ("NVIDIA L40S", "bfloat16", None),
    ("TPU v4 lite", "bfloat16", None),
    ("cpu", "bfloat16", None),
  ],
)
def test_peak_flops_lookup(kind, dtype, expected):
  assert hardware.peak_flops_per_device(fake_device(kind), dtype) == expected


def test_peak_flops_default_device_is_cpu_here():
  assert hardware.peak_flops_per_device() is None


def test_peak_flops_rejects_non_dtype():
  with pytest.raises(ValueError, match="dtype"):
    hardware.peak_flops_per_device(fake_device("TPU v4"), "not-a-dtype")


def test_mfu_arithmetic():
  # 6e9 FLOPs/token at 1e5 tokens/s on 4 devices of 1e15 FLOP/s peak.
  assert hardware.mfu(6e9, 1e5, 4, 1e15) == pytest.approx(6e14 / 4e15)
  assert hardware.mfu(6e9, 1e5, 4, None) is None
  for args, name in [
    ((-1, 1, 1, 1e12), "flops_per_token"),
    ((1, -1, 1, 1e12), "tokens_per_second"),
    ((1, 1, 0, 1e12), "num_devices"),
    ((1, 1, 1, 0.0), "peak"),
  ]:
    with pytest.raises(ValueError, match=name):
      hardware.mfu(*args)


def test_mfu_counts_the_meshs_devices_not_the_hosts(monkeypatch):
  """A run set up on 4 of 8 devices (setup_run(devices=...)) divided by all
  8: its MFU was half what its devices did."""
  from txf.train import loop

  setup = fake_setup(per_example=False)
  monkeypatch.setattr(jax, "device_count", lambda *args: 8)
  window = loop._Throughput()
  window.add({}, compiling=False)
  figures = window.figures(setup)
  assert figures["mfu"] == pytest.approx(6e6 * figures["tokens_per_sec"] / (4 * 1e12), rel=1e-12)


def fake_setup(per_example):
  """A RunSetup's fields _Throughput reads: 1000 tokens (or examples) a step."""
  return types.SimpleNamespace(
    tokens_per_step=1000,
    flops_per_token=6e6,
    mesh=types.SimpleNamespace(size=4),
    peak_flops=1e12,
    task="classify" if per_example else "lm",
  )


@pytest.mark.parametrize("per_example", [False, True])
def test_a_classifiers_throughput_is_named_examples_per_sec(per_example):
  # A classifier's step counts examples: its rows and console said tok/s.
  from txf.train import loop

  window = loop._Throughput()
  window.add({}, compiling=False)
  figures = window.figures(fake_setup(per_example))
  rate = "examples_per_sec" if per_example else "tokens_per_sec"
  other = "tokens_per_sec" if per_example else "examples_per_sec"
  assert other not in figures
  assert figures[rate] == pytest.approx(1000 / figures["step_time"], rel=1e-12)
  line = console.format_progress(1, 2, figures)
  assert (" ex/s" in line) is per_example and (" tok/s" in line) is not per_example


@pytest.mark.parametrize("config", ["encoder_classify", "encoder_mlm"])
def test_a_steps_flops_are_its_tokens_flops_whatever_its_throughput_counts(config):
  """A classifier's throughput counts examples; its FLOPs were still counted
  per token, so its MFU (and txf-compile's FLOPs and roofline) came out
  seq_len times too low. By hand: B rows of T tokens, each token 6N +
  attention, the classifier's head 6 D C a row."""
  from conftest import tiny_config
  from txf.analysis import flops_per_token
  from txf.runconfig.run_config import parse
  from txf.train.run_setup import fit_vocabulary, setup_run

  run, _ = fit_vocabulary(parse(tiny_config(config)), None)
  setup = setup_run(run)
  B, T = run.data.batch_size, run.data.seq_len
  assert setup.tokens_per_step == (B if config == "encoder_classify" else B * T)
  by_hand = B * T * flops_per_token(run.model, T)  # the head's term is per row / T
  assert setup.flops_per_token * setup.tokens_per_step == pytest.approx(by_hand, rel=1e-12)


def test_memory_bytes_is_the_allocators_limit_or_the_hosts_memory():
  gpu = types.SimpleNamespace(platform="gpu", memory_stats=lambda: {"bytes_limit": 80 << 30})
  assert hardware.memory_bytes(gpu) == 80 << 30
  assert hardware.memory_bytes(types.SimpleNamespace(platform="tpu", memory_stats=dict)) is None
  meminfo = dict(line.split(":") for line in open("/proc/meminfo").read().splitlines())
  mem_total = int(meminfo["MemTotal"].split()[0]) * 1024  # kB
  assert hardware.memory_bytes(jax.devices("cpu")[0]) == mem_total


class HalvesTheFirstAxis:
  """A sharding that leaves each device half of the leading axis."""

  def shard_shape(self, shape):
    return (shape[0] // 2, *shape[1:])


def test_bytes_per_device_counts_a_sharded_leaf_by_its_shard():
  # The sharded leaf: a stand-in for an array, as jax.tree.leaves sees one.
  tree = {
    "whole": np.zeros((3, 5), np.float32),
    "abstract": jax.ShapeDtypeStruct((7,), jnp.bfloat16),
    "sharded": types.SimpleNamespace(shape=(8, 3), dtype=jnp.int8, sharding=HalvesTheFirstAxis()),
    "scalar": jnp.zeros((), jnp.int32),
  }
  assert hardware.bytes_per_device(tree) == 3 * 5 * 4 + 7 * 2 + 4 * 3 + 4


def test_check_fits_refuses_a_byte_past_the_device():
  device = types.SimpleNamespace(
    platform="gpu", device_kind="NVIDIA H100", memory_stats=lambda: {"bytes_limit": 3 << 30}
  )
  hardware.check_fits("model", "the parameters", 3 << 30, device)
  with pytest.raises(
    ValueError, match=r"^model: the parameters need 3.0 GiB on one device, more than the 3.0 GiB "
  ):
    hardware.check_fits("model", "the parameters", (3 << 30) + 1, device)
  unknown = types.SimpleNamespace(platform="tpu", memory_stats=dict)
  hardware.check_fits("model", "the parameters", 1 << 60, unknown)  # nothing to refuse by


def test_samples_are_tensorboard_text_preformatted(tmp_path):
  code = "def f(x):\n  if x < 2:\n\n    return x  # *one*"
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write_sample(4, code)
    writer.write_sample(8, "import os")
  texts = {
    event.step: value.tensor.string_val[0].decode()
    for event in read_tensorboard_events(tmp_path / metrics.TENSORBOARD_DIR)
    for value in event.summary.value
    if value.tag.startswith(metrics.SAMPLE_TAG)
  }
  assert texts == {4: metrics.preformatted(code), 8: "    import os"}
  # Tagged for TensorBoard's text dashboard.
  plugins = {
    value.metadata.plugin_data.plugin_name
    for event in read_tensorboard_events(tmp_path / metrics.TENSORBOARD_DIR)
    for value in event.summary.value
  }
  assert plugins == {"text"}
  # As TensorBoard renders it (Markdown): one <pre> block holding the text as it is.
  markdown = pytest.importorskip("markdown")
  html = markdown.markdown(texts[4])
  assert html == f"<pre><code>{html_escape(code, quote=False)}\n</code></pre>"
  # samples.txt keeps the text itself, which read_samples reads back.
  assert metrics.read_samples(tmp_path) == [(4, code), (8, "import os")]


def test_samples_txt_escapes_control_characters_and_reads_them_back(tmp_path):
  sampled = [
    "a\x1b[2Jb\rc\x00d\x7f\te\nf",  # a terminal escape, a carriage return, a NUL, DEL
    "back\\x41slash \\ and \\x",  # what looks like an escape stays itself
    "=== step 3 ===\n=== step 3 ===x",  # a line that would read as a record header
    "",
  ]
  with metrics.MetricsWriter(tmp_path) as writer:
    for step, text in enumerate(sampled):
      writer.write_sample(step, text)
  raw = (tmp_path / metrics.SAMPLES_FILE).read_bytes()
  assert not set(raw) & (set(range(0x20)) - {0x09, 0x0A} | {0x7F})
  assert raw.count(b"=== step ") == len(sampled) + 1  # the headers, and the line ending in 'x'
  assert b"a\\x1b[2Jb\\x0dc\\x00d\\x7f\te\nf\n" in raw
  assert metrics.read_samples(tmp_path) == list(enumerate(sampled))
  # A restart at step 1 moves the later records aside, the escaped header line with them.
  assert metrics.drop_records_after(tmp_path, 1) == {metrics.SAMPLES_FILE: 2}
  assert metrics.read_samples(tmp_path) == list(enumerate(sampled[:2]))


def three_rows(workdir):
  """metrics.jsonl of steps 1, 2 and 3 (loss 1.0, 2.0, 3.0), read back."""
  with metrics.MetricsWriter(workdir) as writer:
    for step in (1, 2, 3):
      writer.write(step, {"loss": float(step)})
  return metrics.read_metrics(workdir)


def test_a_move_aside_cut_off_before_its_rewrite_is_not_appended_twice(tmp_path, monkeypatch):
  """The rows are appended to the .dropped file before metrics.jsonl is
  rewritten; a start stopped between the two (a full disk, a kill) left the
  rows in both, and the next start appended them again."""
  rows = three_rows(tmp_path)

  def rewrite_fails(path, data):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(metrics, "write_file", rewrite_fails)
  with pytest.raises(Exception, match="No space left"):
    metrics.drop_records_after(tmp_path, 1)
  monkeypatch.undo()
  assert metrics.read_metrics(tmp_path) == rows  # the rewrite did not happen
  assert metrics.drop_records_after(tmp_path, 1) == {metrics.METRICS_FILE: 2}
  dropped = [json.loads(line) for line in (tmp_path / metrics.DROPPED_METRICS_FILE).open()]
  assert dropped == rows[1:] and metrics.read_metrics(tmp_path) == rows[:1]
  # A later restart's own rows are appended after them.
  with metrics.MetricsWriter(tmp_path, start_step=1) as writer:
    writer.write(2, {"loss": 2.5})
  metrics.drop_records_after(tmp_path, 1)
  dropped = [json.loads(line) for line in (tmp_path / metrics.DROPPED_METRICS_FILE).open()]
  assert [row["loss"] for row in dropped] == [2.0, 3.0, 2.5]


def test_a_move_aside_whose_append_fails_leaves_every_row_where_it_was(tmp_path, monkeypatch):
  """metrics.dropped.jsonl is appended before metrics.jsonl is rewritten: a
  failed append (a full disk) loses no row."""
  rows = three_rows(tmp_path)

  def append_fails(path, data):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(metrics, "append_bytes", append_fails)
  with pytest.raises(OSError, match="No space left"):
    metrics.drop_records_after(tmp_path, 1)
  assert metrics.read_metrics(tmp_path) == rows
  assert not (tmp_path / metrics.DROPPED_METRICS_FILE).exists()


def test_a_row_cut_off_after_the_step_resumed_from_goes_aside_with_the_later_rows(tmp_path):
  """A kill cut a row after step 2's (a full disk, then more rows): resuming
  from 2 left the fragment mid-file, before the rows trained again (every
  reader warned at it, json.loads per line failed); one before step 2's
  rows stays where it is."""
  path = tmp_path / metrics.METRICS_FILE
  lines = [json.dumps({"step": step, "loss": float(step)}) for step in (1, 2, 3)]
  path.write_text(f'{lines[0]}\n{{"ste\n{lines[1]}\n{{"step": 3, "lo\n{lines[2]}\n')
  assert metrics.drop_records_after(tmp_path, 2) == {metrics.METRICS_FILE: 2}
  assert path.read_text() == f'{lines[0]}\n{{"ste\n{lines[1]}\n'
  dropped = (tmp_path / metrics.DROPPED_METRICS_FILE).read_text().splitlines()
  assert dropped == ['{"step": 3, "lo', lines[2]]


def test_evaluating_a_step_again_moves_its_evaluation_and_every_later_row_aside(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"loss": 1.0})
    writer.write(2, {"loss": 2.0})
    writer.write(2, {"eval_loss": 2.5})
    writer.write(3, {"loss": 3.0})
  rows = metrics.read_metrics(tmp_path)
  assert metrics.drop_records_after(tmp_path, 2, evaluation=True) == {metrics.METRICS_FILE: 2}
  assert metrics.read_metrics(tmp_path) == rows[:2]
  dropped = [json.loads(line) for line in (tmp_path / metrics.DROPPED_METRICS_FILE).open()]
  assert dropped == rows[2:]


@pytest.mark.parametrize("evaluating_again, purge_step", [(False, 3), (True, 2)])
def test_a_resumed_session_hides_in_tensorboard_only_the_steps_it_writes_again(
  tmp_path, evaluating_again, purge_step
):
  """Resuming from step 2 trains 3 on again: TensorBoard hides steps 3 on
  (a SessionLog START at 3), not step 2's row; evaluating step 2 again
  hides step 2 too (its train row is written again)."""
  with metrics.MetricsWriter(tmp_path) as writer:
    for step in (1, 2, 3):
      writer.write(step, {"loss": float(step)})
  metrics.MetricsWriter(tmp_path, start_step=2, evaluating_again=evaluating_again).close()
  events = read_tensorboard_events(tmp_path / metrics.TENSORBOARD_DIR)
  assert [event.step for event in events if event.HasField("session_log")] == [purge_step]


def test_a_negative_step_is_refused_before_anything_is_written(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    with pytest.raises(ValueError, match=r"^step must be >= 0, got -1\.$"):
      writer.write(-1, {"loss": 1.0})
  assert (tmp_path / metrics.METRICS_FILE).read_bytes() == b""


def test_a_row_whose_step_is_not_an_int_is_skipped(tmp_path, caplog):
  """A step of true (== 1) or 1.0 collided with step 1's row."""
  lines = ['{"step": 1, "loss": 1.0}', '{"step": true, "loss": 9.0}', '{"step": 1.0, "loss": 9.0}']
  (tmp_path / metrics.METRICS_FILE).write_text("\n".join(lines) + "\n")
  assert without_time(metrics.read_metrics(tmp_path)) == [{"step": 1, "loss": 1.0}]
  assert caplog.text.count("not a row with an int step") == 2


def test_the_same_sample_moved_aside_twice_is_kept_twice(tmp_path):
  # A run resumed from step 1 twice samples step 2 the same both times:
  # two moves of their own, not one interrupted (samples hold no time).
  for _ in range(2):
    with metrics.MetricsWriter(tmp_path, start_step=1) as writer:
      writer.write_sample(2, "def f():")
    metrics.drop_records_after(tmp_path, 1)
  dropped = (tmp_path / metrics.DROPPED_SAMPLES_FILE).read_text()
  assert dropped.count("def f():") == 2


def test_hparams_hold_the_values_and_name_the_final_metrics(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(10, {"eval_loss": 2.5, "eval_accuracy": 0.25})
    writer.write_hparams(
      10,
      {"model.d_model": 64, "model.position": "rope", "model.window": None, "train.lr": 1e-3},
      {"eval_loss": np.float32(2.5), "eval_accuracy": 0.25},
    )
  logdir = tmp_path / metrics.TENSORBOARD_DIR
  hparams, metric_tags = read_hparams(logdir)
  assert hparams == {
    "model.d_model": 64.0,
    "model.position": "rope",
    "model.window": "null",
    "train.lr": 1e-3,
  }
  assert sorted(metric_tags) == ["eval/accuracy", "eval/loss"]
  # The dashboard reads each metric's value from the scalars of that tag.
  assert read_tensorboard_scalars(logdir)[("eval/loss", 10)] == 2.5


def test_hparams_are_recorded_once_per_run_not_once_per_resumed_session(tmp_path):
  hparams, final = {"model.d_model": 64, "train.steps": 10}, {"eval_loss": 2.5}
  sessions = [(None, hparams), (10, hparams), (10, hparams), (10, {**hparams, "train.steps": 20})]
  for start_step, values in sessions:  # a finished run's end completed again, then extended
    with metrics.MetricsWriter(tmp_path, start_step=start_step) as writer:
      writer.write_hparams(values["train.steps"], values, final)
  records = [
    event.step
    for event in read_tensorboard_events(tmp_path / metrics.TENSORBOARD_DIR)
    for value in event.summary.value
    if value.tag == "_hparams_/session_start_info"
  ]
  assert records == [10, 20]  # the first record, and the extended run's new values


def test_a_session_resumed_before_the_step_of_the_hparams_record_writes_it_again(tmp_path):
  """A run that ended at step 5 resumed from its checkpoint at 4: TensorBoard
  hides the record at step 5 (its purge from step 5 on), so the session
  writes the record again."""
  hparams, final = {"model.d_model": 64, "train.steps": 5}, {"eval_loss": 2.5}
  for start_step in (None, 4):
    with metrics.MetricsWriter(tmp_path, start_step=start_step) as writer:
      writer.write_hparams(5, hparams, final)
  records = [
    event.step
    for event in read_tensorboard_events(tmp_path / metrics.TENSORBOARD_DIR)
    for value in event.summary.value
    if value.tag == "_hparams_/session_start_info"
  ]
  assert records == [5, 5]


class RecordingTracker:
  def __init__(self):
    self.calls = []

  def log_config(self, config):
    self.calls.append(("config", dict(config)))

  def log_metrics(self, step, scalars):
    self.calls.append(("metrics", step, dict(scalars)))

  def log_sample(self, step, text):
    self.calls.append(("sample", step, text))

  def log_summary(self, final):
    self.calls.append(("summary", dict(final)))

  def close(self):
    self.calls.append(("close",))


def test_writer_fans_out_to_trackers(tmp_path):
  tracker = RecordingTracker()
  with metrics.MetricsWriter(tmp_path, trackers=(tracker,)) as writer:
    writer.write(1, {"loss": jnp.float32(2.0)})
    writer.write_sample(1, "text")
    writer.write_hparams(1, {"model.d_model": 8}, {"eval_loss": 1.5})
  assert tracker.calls == [
    ("metrics", 1, {"loss": 2.0}),
    ("sample", 1, "text"),
    ("summary", {"eval_loss": 1.5}),
    ("close",),
  ]


def test_disabled_writer_leaves_trackers_alone(tmp_path):
  tracker = RecordingTracker()
  with metrics.MetricsWriter(tmp_path / "run", enabled=False, trackers=(tracker,)) as writer:
    writer.write(1, {"loss": 1.0})
  assert tracker.calls == []


def test_durations_print_as_the_progress_lines_show_them():
  assert [console.format_duration(s) for s in (0.4, 45, 425, 3720, 3599.6)] == [
    "0s",
    "45s",
    "7m05s",
    "1h02m",
    "1h00m",
  ]
  assert console.format_duration(float("inf")) == "?"
