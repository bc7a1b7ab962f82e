"""Work directories on Cloud Storage (gs://), against a local emulator.

A gcp-storage-emulator server on 127.0.0.1 (in this process, in memory)
stands in for Cloud Storage: epath/gcsfs find it through
STORAGE_EMULATOR_HOST, orbax's bucket lookup (google-cloud-storage) too, and
tensorstore's gcs driver (orbax's array storage) through
TENSORSTORE_GCS_HTTP_URL, with GOOGLE_AUTH_TOKEN_FOR_TESTING instead of real
credentials. No network is used. The emulator's downloads lack the
x-goog-generation header Cloud Storage sends, which tensorstore reads as
generation 0 and then refuses as the condition of its next write ("Malformed
StorageGeneration", whenever OCDBT happens to re-read a manifest it is about
to replace): `_send_generation_headers` adds the header. gcsfs's moveTo calls
fail there (501) and gcsfs falls back to copy and delete.

Each test writes under its own prefix of one bucket, from a scratch current
directory, so a URL turned into a local path would show up as a `gs:` folder.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http import HTTPStatus

import aiohttp.resolver
import fsspec

# gcsfs's default file system asks Cloud Storage's gRPC control API about each
# bucket, which the emulator does not serve (the call never returns): use the
# plain JSON-API one. Read when gcsfs is imported.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
import gcsfs  # noqa: E402
import ml_collections  # noqa: E402
import pytest  # noqa: E402
from etils import epath  # noqa: E402
from gcp_storage_emulator import (
  server as emulator_server,  # noqa: E402
  settings as emulator_settings,  # noqa: E402
)
from gcp_storage_emulator.exceptions import NotFound as EmulatorNotFound  # noqa: E402
from gcp_storage_emulator.handlers import objects as emulator_objects  # noqa: E402

from conftest import (  # noqa: E402
  REPO,
  assert_same_states,
  restore_state,
  sigterm_at,
  tiny_config,
  without_timings,
)
from txf.runconfig.run_config import parse  # noqa: E402
from txf.rundir import (
  metrics,  # noqa: E402
  workdir as workdir_module,  # noqa: E402
)
from txf.rundir.workdir import (  # noqa: E402
  WorkdirError,
  WorkdirLock,
  check_reachable,
  check_writable,
)
from txf.sweep import figures, grid, results, runner  # noqa: E402
from txf.train import loop  # noqa: E402

BUCKET = "bucket"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _clear_client_caches():
  """Filesystems and clients are cached per process with the endpoint they
  were made with: drop them when the endpoint changes."""
  epath.backend.fsspec_backend._get_filesystem.cache_clear()
  gcsfs.GCSFileSystem.clear_instance_cache()
  from orbax.checkpoint._src.path import gcs_utils

  gcs_utils.get_bucket.cache_clear()


def _send_generation_headers():
  """Makes the emulator's object downloads carry x-goog-generation and
  x-goog-metageneration, as Cloud Storage's do."""

  def download(request, response, storage, *args, **kwargs):
    plain_download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except EmulatorNotFound:
      return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])

  # Routed directly and through objects.get (`alt=media`), which looks the
  # module's name up at each call.
  plain_download = emulator_objects.download
  emulator_objects.download = download
  for _, handlers in emulator_server.HANDLERS:
    for method, handler in handlers.items():
      if handler is plain_download:
        handlers[method] = download


def _serve_move():
  """Serves objects.move (`.../o/SRC/moveTo/o/DST`), which the emulator
  answers 501: gcsfs renames with it and, on a 501, retries with backoff
  before copying and deleting (~30 s for a checkpoint step's 17 objects)."""

  def move(request, response, storage, *args, **kwargs):
    params = request.params
    params["dest_bucket_name"] = params["bucket_name"]  # a move stays in its bucket
    emulator_objects.copy(request, response, storage)
    if response.status == HTTPStatus.OK:
      storage.delete_file(params["bucket_name"], params["object_id"])

  route = (
    rf"^{emulator_settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
    rf"/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
    {emulator_server.POST: move},
  )
  emulator_server.HANDLERS = (route, *emulator_server.HANDLERS)


_send_generation_headers()
_serve_move()


@pytest.fixture(scope="module")
def emulator():
  """The emulator, serving gs://bucket for the module, and the environment
  that points every client at it."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  env = {
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
    "NO_GCE_CHECK": "True",
  }
  patch = pytest.MonkeyPatch()
  server = emulator_server.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
  server.start()
  for name, value in env.items():
    patch.setenv(name, value)
  patch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  _clear_client_caches()
  yield
  server.stop()
  patch.undo()
  _clear_client_caches()


@pytest.fixture
def scratch_cwd(tmp_path, monkeypatch):
  """A scratch current directory; asserts at the end that no `gs:` folder
  (a URL taken for a local path) appeared in it."""
  monkeypatch.chdir(tmp_path)
  yield tmp_path
  assert not (tmp_path / "gs:").exists()


def bucket_files(prefix: str) -> set[str]:
  """Object names under gs://BUCKET/prefix, relative to it, read afresh."""
  fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True, use_listings_cache=False)
  root = f"{BUCKET}/{prefix}/"
  return {name[len(root) :] for name in fs.find(root)}


def run_quietly(config, workdir, log=None):
  lines = []
  result = loop.run(parse(config), workdir, log=log or lines.append)
  return result, "\n".join(lines)


def test_a_ranged_read_gives_the_generation_a_conditional_write_needs(emulator):
  """What OCDBT does to a manifest: read part of it, then replace it on the
  condition that it is unchanged (fails with generation 0 from a bare
  emulator)."""
  import tensorstore as ts

  store = ts.KvStore.open({"driver": "gcs", "bucket": BUCKET}).result()
  written = store.write("generations/manifest", b"first").result()
  read = store.read("generations/manifest", byte_range=slice(1, 3)).result()
  assert read.value == b"ir"
  assert read.stamp.generation == written.generation
  store.write("generations/manifest", b"second", if_equal=read.stamp.generation).result()
  assert store.read("generations/manifest").result().value == b"second"


# --- the main job -------------------------------------------------------------


@pytest.mark.slow  # trains a run
def test_a_run_on_gcs_writes_everything_to_the_bucket_and_resumes_exactly(
  emulator, scratch_cwd, sigterm_is_caught, compilation_cache_dir
):
  """Steps 1-8 on a local disk == steps 1-2 on gs://, preempted, then 3-8
  resumed there: the same eval, the same rows at every step, the same
  samples; every output is an object in the bucket."""
  config = tiny_config(steps=8, eval__every=4, train__checkpoint_every=4, eval__sample_tokens=3)
  expected, _ = run_quietly(config, scratch_cwd / "local")
  workdir = f"gs://{BUCKET}/resume"

  lines = []
  run_quietly(config, workdir, log=sigterm_at(2, lines))
  assert any(line.startswith("preempted: saved step 2") for line in lines), lines
  assert sigterm_is_caught == []
  result, text = run_quietly(config, workdir)
  assert "resumed from step 2" in text
  assert result == expected

  local = scratch_cwd / "local"
  assert without_timings(metrics.read_metrics(workdir)) == without_timings(
    metrics.read_metrics(local)
  )
  assert [row["step"] for row in metrics.read_metrics(workdir) if "loss" in row] == list(
    range(1, 9)
  )
  files = bucket_files("resume")
  assert {"config.json", "metrics.jsonl", "samples.txt"} <= files
  assert epath.Path(f"{workdir}/samples.txt").read_text() == (local / "samples.txt").read_text()
  assert json.loads(epath.Path(f"{workdir}/config.json").read_text()) == json.loads(
    (local / "config.json").read_text()
  )
  assert len([f for f in files if f.startswith("tb/events.out.tfevents.")]) == 2  # a session each
  steps = {f.split("/")[1] for f in files if f.startswith("checkpoints/")}
  assert {"4", "8"} <= steps
  assert not any(".write-probe" in f for f in files)
  # The final state, read back from the bucket, is the local run's.
  assert_same_states(restore_state(workdir, 8), restore_state(local, 8))


def _truncate_objects(directory: str, prefix: str) -> None:
  """Cuts every array object of a checkpoint step to 3 bytes (a corrupt save),
  as conftest.truncate_state_files does on a local disk."""
  names = [name for name in bucket_files(prefix) if name.split("/")[-2:-1] == ["d"]]
  assert names
  for name in names:
    path = epath.Path(directory) / name
    path.write_bytes(path.read_bytes()[:3])


# After a failed restore, orbax's tensorstore sometimes completes a future on an
# already-closed asyncio loop (a harmless "Event loop is closed" in a thread).
@pytest.mark.slow  # trains a run
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_corrupt_checkpoint_on_gcs_falls_back_and_moves_later_rows_aside(
  emulator, scratch_cwd, compilation_cache_dir
):
  workdir = f"gs://{BUCKET}/corrupt"
  run_quietly(tiny_config(steps=8, train__checkpoint_every=4), workdir)
  first = [row for row in metrics.read_metrics(workdir) if "loss" in row]
  _truncate_objects(f"{workdir}/checkpoints/8/state", "corrupt/checkpoints/8/state")

  result, text = run_quietly(tiny_config(steps=12, train__checkpoint_every=4), workdir)
  assert "resumed from step 4" in text and "eval_loss" in result
  steps = {name.split("/")[0] for name in bucket_files("corrupt/checkpoints")}
  assert {"8.corrupt", "8", "12"} <= steps
  rows = [row for row in metrics.read_metrics(workdir) if "loss" in row]
  assert [row["step"] for row in rows] == list(range(1, 13))
  dropped = [
    json.loads(line)
    for line in epath.Path(f"{workdir}/metrics.dropped.jsonl").read_text().splitlines()
  ]
  assert [row["step"] for row in dropped if "loss" in row] == [5, 6, 7, 8]
  # Retrained from step 4's state and data position: the same losses.
  assert [row["loss"] for row in rows[4:8]] == [row["loss"] for row in first[4:8]]


@pytest.mark.slow  # trains a sweep
def test_a_sweep_on_gcs_writes_its_results_to_the_bucket(
  emulator, scratch_cwd, compilation_cache_dir
):
  sweep = ml_collections.ConfigDict()
  sweep.base = tiny_config(steps=4)
  sweep.grid = grid.make_grid({"model.position": ["rope", "alibi"]})
  sweep.sweep = ml_collections.ConfigDict({"extrapolate": False})
  workdir = f"gs://{BUCKET}/sweep"
  rows = runner.run_sweep(sweep, workdir, log=lambda line: None)
  files = bucket_files("sweep")
  assert {results.RESULTS_CSV, results.RESULTS_MD, figures.LOSS_CURVES_PNG} <= files
  for row in rows:
    point_dir = f"{workdir}/{row.point.name}"
    final = [r["eval_loss"] for r in metrics.read_metrics(point_dir) if "eval_loss" in r][-1]
    assert row.status == "done" and row.eval_loss.mean == final
    assert f"{row.point.name}/config.json" in files
  table = epath.Path(f"{workdir}/{results.RESULTS_CSV}").read_text()
  assert all(row.point.name in table for row in rows) and len(rows) == 2
  assert epath.Path(f"{workdir}/{figures.LOSS_CURVES_PNG}").read_bytes().startswith(b"\x89PNG")


# --- pieces: metrics, lock, writability ------------------------------------------


def _history(workdir):
  """A run's worth of rows and samples, then a restart at step 3."""
  with metrics.MetricsWriter(workdir) as writer:
    for step in range(1, 6):
      writer.write(step, {"loss": step / 10})
    writer.write_sample(2, "text 2\nmore")
    writer.write_sample(4, "text 4")
  with metrics.MetricsWriter(workdir, start_step=3) as writer:
    writer.write(4, {"loss": 4.5})
    return writer.dropped


def test_metrics_on_gcs_are_the_files_a_local_writer_writes(emulator, scratch_cwd):
  local, remote = scratch_cwd / "local", epath.Path(f"gs://{BUCKET}/writer")
  assert _history(local) == _history(remote) == {"metrics.jsonl": 2, "samples.txt": 1}
  for name in (
    metrics.METRICS_FILE,
    metrics.DROPPED_METRICS_FILE,
    metrics.SAMPLES_FILE,
    metrics.DROPPED_SAMPLES_FILE,
  ):
    # The same rows but for their wall time.
    untimed = lambda path: re.sub(r'"time": [0-9.e+-]+, ', "", path.read_text())
    assert untimed(remote / name) == untimed(local / name), name
  events = [name for name in bucket_files("writer") if name.startswith("tb/")]
  assert len(events) == 2 and all(
    (remote / name).read_bytes() for name in events
  )  # copied in, not empty


def test_metrics_on_gcs_reach_the_bucket_while_the_writer_is_open(emulator, scratch_cwd):
  workdir = f"gs://{BUCKET}/live"
  with metrics.MetricsWriter(workdir) as writer:
    writer.write(1, {"loss": 1.0})
    rows = metrics.read_metrics(workdir)
    assert without_timings(rows) == [{"step": 1, "loss": 1.0}]  # the first at once
    writer.write(2, {"loss": 2.0})
    writer.flush()  # later ones at most once a second, and at flush
    assert [row["step"] for row in metrics.read_metrics(workdir)] == [1, 2]
    assert any(name.startswith("tb/") for name in bucket_files("live"))


def test_the_lock_on_gcs_is_not_enforced_and_says_so(emulator, scratch_cwd, caplog):
  with WorkdirLock(f"gs://{BUCKET}/lock"):
    with WorkdirLock(f"gs://{BUCKET}/lock"):
      pass
  assert caplog.text.count("lock is not enforced on object storage") == 2
  assert bucket_files("lock") == set()


def test_check_writable_on_gcs_probes_and_never_creates_a_bucket(emulator, scratch_cwd):
  check_writable(f"gs://{BUCKET}/probe/run")
  assert bucket_files("probe") == set()  # the probe is removed
  # It was the failed request's URL in parentheses.
  with pytest.raises(WorkdirError, match=r"^gs://no-such-bucket/run: no such bucket$"):
    check_writable("gs://no-such-bucket/run")
  fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True, use_listings_cache=False)
  assert not fs.exists("no-such-bucket")


# --- without the gcs extra, and URLs that are not ---------------------------------

# The extra's packages, which pip installs however txf came ('txf[gcs]' asks an index for txf).
NO_EXTRA = (
  r"^workdir: gs://bucket/run needs gcsfs for gs:// paths: "
  r"pip install 'gcsfs>=2024\.2' 'google-cloud-storage>=2\.14' \(txf's gcs extra\)$"
)


def test_without_the_gcs_extra_every_entry_point_fails_naming_it(scratch_cwd, monkeypatch):
  from txf.trained.extrapolate import extrapolate_run
  from txf.trained.head_analysis import analyze_run

  monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError
  sweep = ml_collections.ConfigDict(
    {"base": tiny_config(), "grid": grid.make_grid({"model.position": ["rope"]})}
  )
  for start in (
    lambda: loop.run(parse(tiny_config()), "gs://bucket/run"),
    lambda: runner.run_sweep(sweep, "gs://bucket/run"),
    lambda: extrapolate_run("gs://bucket/run", [1]),
    lambda: analyze_run("gs://bucket/run"),
  ):
    with pytest.raises(WorkdirError, match=NO_EXTRA):
      start()
  assert os.listdir(scratch_cwd) == []


@pytest.mark.slow  # a subprocess
def test_cli_without_the_gcs_extra_exits_2_with_one_line(scratch_cwd):
  code = (
    "import runpy, sys; sys.modules['gcsfs'] = None; "
    f"sys.argv = ['run', '--config={REPO}/configs/rope.py', '--workdir=gs://bucket/run']; "
    "runpy.run_module('experiments.run', run_name='__main__')"
  )
  done = subprocess.run(
    [sys.executable, "-c", code],
    cwd=scratch_cwd,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
  )
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == (
    "workdir error: workdir: gs://bucket/run needs gcsfs for gs:// paths: "
    "pip install 'gcsfs>=2024.2' 'google-cloud-storage>=2.14' (txf's gcs extra)"
  ), done.stderr[-3000:]
  assert os.listdir(scratch_cwd) == []


@pytest.mark.parametrize(
  "url, message",
  [
    ("gs:/bucket/run", "gs:/bucket/run is a URL that lost a slash; write it as gs://bucket/run"),
    ("memory://run", "memory://run: unsupported URL scheme memory://"),
  ],
)
def test_a_url_that_is_not_one_stops_the_run_before_anything_is_written(scratch_cwd, url, message):
  with pytest.raises(WorkdirError, match=f"^workdir: {message}"):
    loop.run(parse(tiny_config()), url)
  assert os.listdir(scratch_cwd) == []


# --- a bucket that cannot be reached ------------------------------------------

# The tests' bound on the first look at a gs:// work directory: each test
# that meets an unreachable bucket waits it out. 0.5 s missed gcsfs's first
# retry log once on CI's loaded 2 cores (the message lacked 'last logged').
REACH_S = 1.0


@pytest.fixture
def no_dns(monkeypatch):
  """Cloud Storage's host name does not resolve, as on a machine without a
  network: aiohttp's resolver fails as the system's does, so gcsfs meets
  the ClientConnectorDNSError and retries it for half a minute a request.
  Nothing leaves the machine: the host is localhost (after the test, a port
  nobody listens on), the token anonymous. The first look at a gs:// work
  directory is bounded by REACH_S seconds."""

  async def resolve(self, host, port=0, family=socket.AF_INET):
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

  monkeypatch.setattr(aiohttp.resolver.DefaultResolver, "resolve", resolve)
  monkeypatch.setenv("NO_GCE_CHECK", "True")
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  monkeypatch.setattr(workdir_module, "REACH_TIMEOUT_S", REACH_S)
  # The warm-up's look goes on retrying meanwhile: at another host, so that
  # what it logs cannot pass for a test's look's (UNREACHABLE names localhost).
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://warm-up:1")
  _clear_client_caches()
  _wait_for_a_retry_log()
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{_free_port()}")
  _clear_client_caches()
  yield
  _clear_client_caches()


def _wait_for_a_retry_log(within_s: float = 30.0) -> None:
  """Looks at the unreachable bucket once, untimed, until gcsfs logs its
  first retry: what gcsfs does on first use in a process (a client, its
  session, lazy imports) is done before a test's timed look."""
  logs = workdir_module._HeldLogs(("gcsfs",))

  def look_once() -> None:
    try:
      epath.Path("gs://bucket/warm-up").exists()
    except Exception:  # gcsfs gives up in the end: no thread error in a later test
      pass

  with logs:
    look = threading.Thread(target=look_once, daemon=True)
    look.start()
    waited = time.monotonic()
    while logs.last is None and time.monotonic() - waited < within_s:
      time.sleep(0.01)
  assert logs.last is not None, f"gcsfs logged nothing within {within_s} s"


UNREACHABLE = (
  rf"^gs://bucket/run: no answer within {REACH_S:g} s; last logged: .*"
  r"Cannot connect to host localhost:\d+ .*\[Name or service not known\]$"
)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_an_unreachable_bucket_stops_every_entry_point_in_one_line_in_time(no_dns, scratch_cwd):
  from txf.trained.extrapolate import extrapolate_run
  from txf.trained.head_analysis import analyze_run

  sweep = ml_collections.ConfigDict(
    {"base": tiny_config(), "grid": grid.make_grid({"model.position": ["rope"]})}
  )
  for start in (
    lambda: loop.run(parse(tiny_config()), "gs://bucket/run"),
    lambda: runner.run_sweep(sweep, "gs://bucket/run", summarize_only=True),
    lambda: extrapolate_run("gs://bucket/run", [1]),
    lambda: analyze_run("gs://bucket/run"),
  ):
    began = time.monotonic()
    with pytest.raises(WorkdirError, match=UNREACHABLE):
      start()
    assert time.monotonic() - began < REACH_S + 3
  assert os.listdir(scratch_cwd) == []


def test_a_look_that_fails_at_once_is_reported_with_its_reason():
  class Forbidden(epath.gpath.PosixGPath):  # a bucket this account may not read
    def exists(self):
      raise PermissionError(13, "Forbidden")

  began = time.monotonic()
  with pytest.raises(WorkdirError, match=r"^gs://bucket/run: cannot be reached \(Forbidden\)$"):
    check_reachable(Forbidden("gs://bucket/run"))
  assert time.monotonic() - began < 1


@pytest.mark.slow  # subprocesses
def test_cli_on_an_unreachable_bucket_exits_2_with_one_line_in_time(scratch_cwd):
  """The reporter's commands: before, 151 and 198 lines of gcsfs's retries
  and tracebacks after a minute, exit 1."""
  sweep = scratch_cwd / "tiny.py"
  sweep.write_text(
    "import ml_collections\n"
    "from txf.configs import rope\n"
    "from txf.sweep.grid import make_grid\n"
    "def get_config():\n"
    "  return ml_collections.ConfigDict(\n"
    "    {'base': rope.get_config(), 'grid': make_grid({'model.position': ['rope', 'alibi']})}\n"
    "  )\n"
  )
  for command, config in (("run", "rope"), ("sweep", sweep)):
    code = (
      "import runpy, socket, sys, aiohttp.resolver, txf.rundir.workdir as w\n"
      "async def resolve(self, host, port=0, family=0):\n"
      "  raise socket.gaierror(socket.EAI_NONAME, 'Name or service not known')\n"
      "aiohttp.resolver.DefaultResolver.resolve = resolve\n"
      f"w.REACH_TIMEOUT_S = {REACH_S}\n"
      f"sys.argv = ['{command}', '--config={config}', '--workdir=gs://bucket/run']\n"
      f"runpy.run_module('experiments.{command}', run_name='__main__')\n"
    )
    began = time.monotonic()
    done = subprocess.run(
      [sys.executable, "-c", code],
      cwd=scratch_cwd,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(
        os.environ,
        PYTHONPATH=str(REPO),
        JAX_PLATFORMS="cpu",
        STORAGE_EMULATOR_HOST=f"http://localhost:{_free_port()}",
        NO_GCE_CHECK="True",
        FSSPEC_GCS_TOKEN="anon",
        GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
      ),
    )
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert re.match(UNREACHABLE.replace("^", "^workdir error: "), line), line
    assert took < 60, took  # imports and the config check, then REACH_S
  assert sorted(os.listdir(scratch_cwd)) == ["tiny.py"]
