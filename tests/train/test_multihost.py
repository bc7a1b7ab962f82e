"""Multi-process training on localhost: `python -m experiments.run` started as
two JAX processes (jax.distributed, CPU collectives) that train one model.

* Two processes x 2 CPU devices (mesh data=2 x fsdp=2) train N steps into one
  work directory: both exit 0, one checkpoint, one metrics row per step.
* The same global config in ONE process with 4 devices gives the same losses
  at every step: each process fed only its own rows of each global batch, and
  together they made up the same batch.
* That work directory resumed by one process on another mesh (2 devices,
  tensor=2: parameters split along other axes) continues to the reference's
  numbers: parameters, optimizer state and data position were restored and
  resharded.
* A one-process data-parallel run's checkpoint (its state replicated, so
  saved packed: txf.rundir.packed_state) resumed by two processes continues
  to the reference's numbers too.
* --coordinator_address without the other distributed flags is a flag error.

Runs are tiny (d_model 32, one layer); their cost is process start-up and
XLA compilation. train.decay='constant' makes the schedule independent of
train.steps, so a run of N steps and one of 2N share their first N updates.
"""

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, repo_commands
from txf.rundir import checkpoint
from txf.rundir.metrics import read_metrics

N = 4  # steps of the two-process run (and its checkpoint)
TOTAL = 2 * N  # steps after resuming
TIMEOUT = 240  # seconds, per run

TINY = {
  "model.d_model": 32,
  "model.num_layers": 1,
  "model.num_heads": 2,
  "data.seq_len": 32,
  "data.batch_size": 8,
  "data.max_corpus_bytes": 200_000,
  "train.warmup_steps": 1,
  "train.decay": "constant",
  "train.learning_rate": 0.01,
  "train.log_every": 1,
  "train.checkpoint_every": N,
  "eval.every": N,
  "eval.num_batches": 1,
  "eval.sample_tokens": 4,
}
MESH_2x2 = {"parallel.data": 2, "parallel.fsdp": 2, "parallel.tensor": 1}
# Resume mesh: parameters split over 'tensor' (heads, mlp, vocab) instead of
# over 'fsdp' (embed).
MESH_TENSOR = {"parallel.data": 1, "parallel.fsdp": 1, "parallel.tensor": 2}
# Data parallel only: every process and device holds the whole state.
MESH_DATA = {"parallel.data": 4, "parallel.fsdp": 1, "parallel.tensor": 1}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def command(workdir, fields, *extra):
  return [
    sys.executable,
    "-m",
    "experiments.run",
    "--config=configs/rope.py",
    f"--workdir={workdir}",
    *(f"--config.{k}={v}" for k, v in fields.items()),
    *extra,
  ]


def environment(num_devices: int) -> dict[str, str]:
  env = dict(
    os.environ, JAX_NUM_CPU_DEVICES=str(num_devices), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1"
  )
  # A forced host device count in XLA_FLAGS would override JAX_NUM_CPU_DEVICES.
  flags = [
    f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f
  ]
  # Compilation dominates these runs; unoptimised LLVM code halves it. Every
  # run here uses the same flags, so their numbers stay comparable.
  flags.append("--xla_backend_optimization_level=0")
  env["XLA_FLAGS"] = " ".join(flags)
  return env


@pytest.fixture(scope="module")
def one_process_commands():
  """conftest's `repo_commands` under `environment(1)`: commands that stop
  before jax.distributed starts, forked from one process that imported jax."""
  with repo_commands(**environment(1)) as server:
    yield server


@contextlib.contextmanager
def started(commands_and_envs, log_dir: pathlib.Path, name: str):
  """The processes, started, each writing to its log file: yields
  ([process], [log path]) in order; any still running on leaving is killed."""
  processes, paths = [], []
  try:
    for i, (cmd, env) in enumerate(commands_and_envs):
      path = log_dir / f"{name}.{i}.log"
      with open(path, "w") as log_file:  # a file, not a pipe: it never fills up
        processes.append(
          subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        )
      paths.append(path)
    yield processes, paths
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()


def launch(commands_and_envs, log_dir: pathlib.Path, name: str, *, all_exit=False):
  """Runs the processes to completion; returns [(returncode, log text)] in
  order. All are killed on timeout, and once one fails (the others would wait
  for it in a collective) unless `all_exit` (each is to fail on its own)."""
  with started(commands_and_envs, log_dir, name) as (processes, paths):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
      codes = [process.poll() for process in processes]
      if None not in codes or (not all_exit and any(code not in (None, 0) for code in codes)):
        break
      time.sleep(0.2)
  return [(p.returncode, path.read_text()) for p, path in zip(processes, paths)]


def two_commands(fields, started_with):
  """Processes 0 and 1 of one jax.distributed run, 2 devices each, process i
  started with `started_with[i]` (its work directory, more flags): the
  [(command, environment)] of each."""
  address = f"localhost:{free_port()}"
  distributed = [f"--coordinator_address={address}", "--num_processes=2"]
  return [
    (command(workdir, fields, *distributed, f"--process_id={i}", *extra), environment(2))
    for i, (workdir, extra) in enumerate(started_with)
  ]


def launch_two_processes(workdir, fields, run_dir, name):
  """Processes 0 and 1 of one jax.distributed run in `workdir`:
  [(returncode, output)] of each."""
  return launch(two_commands(fields, [(workdir, [])] * 2), run_dir, name)


def train_rows(workdir):
  return [row for row in read_metrics(workdir) if "loss" in row]


def eval_rows(workdir):
  return [row for row in read_metrics(workdir) if "eval_loss" in row]


def losses(rows):
  return {row["step"]: row["loss"] for row in rows}


def checkpoint_steps(workdir):
  directory = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("multihost")


@pytest.fixture(scope="module")
def two_processes(run_dir):
  """N steps by processes 0 and 1 of one jax.distributed run, 2 devices each."""
  workdir = run_dir / "two_processes"
  fields = {**TINY, **MESH_2x2, "train.steps": N}
  return workdir, launch_two_processes(workdir, fields, run_dir, "two_processes")


@pytest.fixture(scope="module")
def one_process(run_dir):
  """The same global config, mesh and device count in one process, run on to
  TOTAL steps (the same updates: a constant schedule)."""
  workdir = run_dir / "one_process"
  fields = {**TINY, **MESH_2x2, "train.steps": TOTAL}
  [result] = launch([(command(workdir, fields), environment(4))], run_dir, "one_process")
  return workdir, result


@pytest.mark.slow
def test_two_processes_train_one_model(two_processes):
  workdir, results = two_processes
  for index, (returncode, text) in enumerate(results):
    assert returncode == 0, f"process {index} exited {returncode}:\n{text[-4000:]}"
    # Each process saw the other's devices: one run, not two.
    assert f"step {N}/{N}" in text, text[-4000:]
    assert f"process {index} of 2: waiting up to 300 s for every process to join at " in text
  assert checkpoint_steps(workdir) == [N]
  assert (workdir / "checkpoints" / str(N) / "state").is_dir()

  # Written by process 0 only: one row per logged step, one eval, one sample.
  rows = train_rows(workdir)
  assert [row["step"] for row in rows] == list(range(1, N + 1))
  assert [row["step"] for row in eval_rows(workdir)] == [N]
  assert (workdir / "samples.txt").read_text().count(f"=== step {N} ===") == 1
  assert len(list((workdir / "tb").glob("events.out.tfevents.*"))) == 1

  values = [row["loss"] for row in rows]
  assert all(np.isfinite(values)), values
  assert values[-1] < values[0], values  # learning, with lr 1e-2


@pytest.mark.slow
def test_two_processes_match_one_process(two_processes, one_process):
  """Per-step losses of 2 processes x 2 devices == 1 process x 4 devices."""
  workdir, results = two_processes
  assert all(code == 0 for code, _ in results), [text[-2000:] for _, text in results]
  reference_dir, (returncode, text) = one_process
  assert returncode == 0, text[-4000:]

  two, one = losses(train_rows(workdir)), losses(train_rows(reference_dir))
  assert sorted(one) == list(range(1, TOTAL + 1))
  steps = list(range(1, N + 1))
  np.testing.assert_allclose([two[s] for s in steps], [one[s] for s in steps], rtol=1e-5)
  # Not vacuous: the batches differ from step to step, and so do the losses.
  assert len({round(one[s], 4) for s in steps}) == N
  two_eval = {r["step"]: r["eval_loss"] for r in eval_rows(workdir)}
  one_eval = {r["step"]: r["eval_loss"] for r in eval_rows(reference_dir)}
  np.testing.assert_allclose(two_eval[N], one_eval[N], rtol=1e-5)


@pytest.mark.slow
def test_resume_on_one_process_and_another_mesh(two_processes, one_process, run_dir):
  workdir, results = two_processes
  assert all(code == 0 for code, _ in results), [text[-2000:] for _, text in results]
  resumed = run_dir / "resumed"
  shutil.copytree(workdir, resumed)
  fields = {**TINY, **MESH_TENSOR, "train.steps": TOTAL}
  [(returncode, text)] = launch([(command(resumed, fields), environment(2))], run_dir, "resumed")
  assert returncode == 0, text[-4000:]
  assert re.search(rf"resumed from step {N} in \S*resumed", text), text[-4000:]
  assert f"step {TOTAL}/{TOTAL}" in text
  assert checkpoint_steps(resumed) == [N, TOTAL]

  rows = train_rows(resumed)
  assert [row["step"] for row in rows] == list(range(1, TOTAL + 1))  # appended once
  # Steps N+1.. continue from the restored parameters, optimizer state and data
  # position, as the uninterrupted run did (on a mesh that splits them differently:
  # float32 sums in another order, hence a tolerance; a wrong data position or a
  # lost optimizer state would be off by far more).
  reference_dir, (reference_code, reference_text) = one_process
  assert reference_code == 0, reference_text[-4000:]
  reference = losses(train_rows(reference_dir))
  resumed_losses = losses(rows)
  steps = list(range(N + 1, TOTAL + 1))
  np.testing.assert_allclose(
    [resumed_losses[s] for s in steps], [reference[s] for s in steps], rtol=1e-5
  )
  resumed_eval = {r["step"]: r["eval_loss"] for r in eval_rows(resumed)}
  reference_eval = {r["step"]: r["eval_loss"] for r in eval_rows(reference_dir)}
  np.testing.assert_allclose(resumed_eval[TOTAL], reference_eval[TOTAL], rtol=1e-5)


@pytest.fixture(scope="module")
def one_process_replicated(run_dir):
  """N steps in one process on a data-parallel mesh of 4 devices: its
  state is replicated, and its checkpoint packed."""
  workdir = run_dir / "one_process_replicated"
  fields = {**TINY, **MESH_DATA, "train.steps": N}
  [result] = launch([(command(workdir, fields), environment(4))], run_dir, "one_process_replicated")
  return workdir, result


@pytest.mark.slow
def test_a_packed_checkpoint_resumes_on_two_processes(one_process_replicated, one_process, run_dir):
  workdir, (returncode, text) = one_process_replicated
  assert returncode == 0, text[-4000:]
  extras = json.loads((workdir / "checkpoints" / str(N) / "extras" / "metadata").read_text())
  assert checkpoint.LAYOUT_KEY in extras  # packed
  resumed = run_dir / "resumed_packed"
  shutil.copytree(workdir, resumed)
  fields = {**TINY, **MESH_DATA, "train.steps": TOTAL}
  results = launch_two_processes(resumed, fields, run_dir, "resumed_packed")
  for index, (code, output) in enumerate(results):
    assert code == 0, f"process {index} exited {code}:\n{output[-4000:]}"
  assert re.search(rf"resumed from step {N} in \S*resumed_packed", results[0][1])
  reference_dir, (reference_code, reference_text) = one_process
  assert reference_code == 0, reference_text[-4000:]
  reference, resumed_losses = losses(train_rows(reference_dir)), losses(train_rows(resumed))
  steps = list(range(N + 1, TOTAL + 1))
  np.testing.assert_allclose(
    [resumed_losses[s] for s in steps], [reference[s] for s in steps], rtol=1e-5
  )


@pytest.mark.slow
def test_processes_started_otherwise_are_refused_before_any_compute(tmp_path):
  """Process 1 given another learning rate trained one model with both and
  exited 0; processes given directories apart (a path on each host's own
  disk) hung at the first checkpoint. Each process exits 2 with the line."""
  fields = {**TINY, **MESH_2x2, "train.steps": N}
  workdir = tmp_path / "run"
  apart = [(workdir, []), (workdir, ["--config.train.learning_rate=0.05"])]
  for index, (returncode, text) in enumerate(
    launch(two_commands(fields, apart), tmp_path, "learning_rates", all_exit=True)
  ):
    assert returncode == 2, f"process {index} exited {returncode}:\n{text[-4000:]}"
    assert text.strip().splitlines()[-1] == (
      "config error: train.learning_rate: process 1 was started with 0.05, process 0 with "
      "0.01: start every process of a run with the same config and flags"
    )
  apart = [(tmp_path / "host0", []), (tmp_path / "host1", [])]
  for index, (returncode, text) in enumerate(
    launch(two_commands(fields, apart), tmp_path, "workdirs", all_exit=True)
  ):
    assert returncode == 2, f"process {index} exited {returncode}:\n{text[-4000:]}"
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"workdir error: {apart[index][0]}: process 1 does not see"), last
  assert not any(path.exists() for path in (workdir, tmp_path / "host0", tmp_path / "host1"))


@pytest.mark.slow
@pytest.mark.parametrize(
  "signal_name, sent_to, status, reason",
  [("SIGTERM", [1], 0, "preempted"), ("SIGINT", [0, 1], 130, "interrupted")],
)
def test_a_signal_saves_every_process_at_one_step(tmp_path, signal_name, sent_to, status, reason):
  """A SIGTERM to one process (a preemption) or a Ctrl-C to both: txf's own
  SIGTERM handler had replaced jax.distributed's preemption service, so
  both processes exited 143 (130) and the steps trained were lost."""
  workdir = tmp_path / "run"
  many = 100_000
  fields = {**TINY, **MESH_2x2, "train.steps": many, "train.checkpoint_every": many}
  fields["eval.every"] = many
  commands = two_commands(fields, [(workdir, [])] * 2)
  with started(commands, tmp_path, "signal") as (processes, logs):
    deadline = time.monotonic() + TIMEOUT
    while not (workdir / "metrics.jsonl").exists() or len(train_rows(workdir)) < 2:
      assert time.monotonic() < deadline and None in [p.poll() for p in processes]
      time.sleep(0.2)
    for index in sent_to:
      processes[index].send_signal(getattr(signal, signal_name))
    codes = [process.wait(timeout=TIMEOUT) for process in processes]
  texts = [log.read_text() for log in logs]
  assert codes == [status, status], "\n".join(text[-3000:] for text in texts)
  [saved] = checkpoint_steps(workdir)
  assert 2 <= saved < many
  assert f"{reason}: saved step {saved}; rerun the same command to resume" in texts[0]


@pytest.mark.slow
@pytest.mark.parametrize(
  "extra, named",
  [
    (["--coordinator_address=localhost:1"], ["--num_processes", "--process_id"]),
    (
      ["--coordinator_address=localhost:1", "--num_processes=2", "--process_id=2"],
      ["--process_id"],
    ),
    # An IndexError traceback; 'localhost:notaport' waited silently.
    (
      ["--coordinator_address=localhost", "--num_processes=2", "--process_id=0"],
      ["--coordinator_address: 'localhost' is not HOST:PORT"],
    ),
    (
      ["--coordinator_address=localhost:notaport", "--num_processes=2", "--process_id=0"],
      ["--coordinator_address"],
    ),
  ],
)
def test_distributed_flag_errors(one_process_commands, tmp_path, extra, named):
  workdir = tmp_path / "run"
  _, _, module, *args = command(workdir, {**TINY, "train.steps": 1}, *extra)
  done = one_process_commands.run(module, *args, timeout=TIMEOUT)
  assert done.returncode == 2, done.stderr[-3000:]
  last_line = done.stderr.strip().splitlines()[-1]
  assert last_line.startswith("flag error: "), done.stderr[-3000:]
  for flag in named:
    assert flag in last_line, last_line
  assert not workdir.exists()
