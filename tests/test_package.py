"""The installed distribution: txf alone, its commands as console scripts that
find the shipped configs by name, run from outside the checkout."""

import email
import os
import pathlib
import site
import subprocess
import sys
import tomllib
import zipfile

import pytest

from txf.configs import find, names, resolve
from txf.extras import EXTRAS, install_hint

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_shipped_configs_are_found_by_their_bare_name_only():
  assert find("rope").name == "rope.py" and find("sweeps/pe_ln").parent.name == "sweeps"
  # A path or a suffix named the shipped rope.py too (normalised, .with_suffix(".py")).
  for name in ("rope.py", "configs/rope.py", "./rope", "rope.txt", "rope.yaml", "rope/"):
    assert find(name) is None, name
  for name in ("no_such", "__init__", "../setup", "/etc/passwd", "", "sweeps"):
    assert find(name) is None, name
  assert "rope" in names() and "sweeps/pe_ln" in names() and "__init__" not in names()


def test_a_config_path_is_that_file_and_a_bare_name_the_shipped_one(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for path in ("./rope.py", "rope.py", "rope.txt", "rope/"):
    assert resolve(path) is None, path
  (tmp_path / "rope.py").write_text("def get_config(): ...\n")
  assert resolve("rope.py").resolve() == (tmp_path / "rope.py").resolve()
  assert resolve("./rope.py").resolve() == (tmp_path / "rope.py").resolve()
  assert resolve("rope") == find("rope")  # no file named 'rope' here
  assert resolve("no_such.py") is None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  out = tmp_path_factory.mktemp("wheel")
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "--no-build-isolation",
      "-q",
      "-w",
      str(out),
      str(ROOT),
    ],
    check=True,
    capture_output=True,
    timeout=300,
  )
  (path,) = out.glob("txf-*.whl")
  return path


@pytest.mark.slow
def test_the_wheel_holds_txf_and_its_configs_only(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  top_level = {name.split("/")[0] for name in names}
  top_level = {name for name in top_level if not name.endswith(".dist-info")}
  assert top_level == {"txf"}
  assert "txf/configs/rope.py" in names and "txf/configs/sweeps/pe_ln.py" in names
  entry_points = (
    zipfile.ZipFile(wheel)
    .read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    .decode()
  )
  assert "txf-run = txf.commands.run:cli" in entry_points


@pytest.mark.slow
def test_the_wheel_is_typed_and_its_metadata_says_what_txf_is(wheel):
  archive = zipfile.ZipFile(wheel)
  assert "txf/py.typed" in archive.namelist()  # PEP 561: mypy reads txf's annotations
  metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
  headers = email.message_from_bytes(metadata)
  assert headers["Author"] == "The txf maintainers"
  assert headers["Keywords"].split(",")[:3] == ["transformers", "jax", "flax"]
  classifiers = headers.get_all("Classifier")
  assert "Typing :: Typed" in classifiers
  assert "Intended Audience :: Science/Research" in classifiers


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
  """(venv, env): a fresh virtual environment with the wheel's txf installed,
  and the environment to run its programs in (no PYTHONPATH: never the
  checkout's txf)."""
  venv = tmp_path_factory.mktemp("installed") / "venv"
  subprocess.run(
    [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
  )
  python = venv / "bin" / "python"
  # The dependencies come from this environment's site-packages, added as a
  # plain path (its .pth files, the checkout's editable txf among them, are
  # not processed); txf itself only from the wheel.
  (sites,) = subprocess.run(
    [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()
  pathlib.Path(sites, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "--python",
      str(python),
      "install",
      "-q",
      "--no-deps",
      "--no-index",
      str(wheel),
    ],
    check=True,
    capture_output=True,
    timeout=300,
    env=env,
  )
  return venv, env


@pytest.mark.slow
def test_txf_run_from_a_fresh_environment_outside_the_checkout(installed, tmp_path):
  venv, env = installed
  python = venv / "bin" / "python"
  workdir = tmp_path / "run"
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  result = subprocess.run(
    [
      str(venv / "bin" / "txf-run"),
      "--config=rope",
      f"--workdir={workdir}",
      "--config.train.steps=3",  # a smoke test: rope's 60 warmup steps are clamped to 3
      "--config.train.log_every=1",
      "--config.model.num_layers=1",
      "--config.model.d_model=32",
      "--config.data.seq_len=32",
      "--config.data.batch_size=4",
      "--config.eval.num_batches=1",
      "--config.eval.sample_tokens=0",
      "--config.data.max_corpus_bytes=200000",
    ],
    cwd=outside,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "eval @ 3" in result.stdout
  assert "train.warmup_steps: 60 is more than train.steps=3; clamped to 3" in result.stdout
  first = result.stdout.splitlines()[0]  # the shipped config, from the wheel
  assert first.startswith(f"config: {venv}") and first.endswith("/txf/configs/rope.py"), first
  where = subprocess.run(
    [str(python), "-c", "import txf; print(txf.__file__)"],
    cwd=outside,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert str(venv) in where and str(ROOT) not in where  # the wheel's txf, not the checkout's
  assert (workdir / "checkpoints").is_dir() and (workdir / "config.json").is_file()


def readme_library_snippet():
  """The README's "Using the library" code, as a user would save it."""
  readme = (ROOT / "README.md").read_text()
  section = readme[readme.index("## Using the library") :]
  return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_readme_library_snippet_runs_as_a_file_from_any_directory(installed, tmp_path):
  # `from configs import base` failed outside a checkout (and inside one, run
  # as a script). The snippet runs as written, from elsewhere, against the
  # wheel, shortened only in its step count, work directory and data size.
  venv, env = installed
  snippet = readme_library_snippet()
  shortened = {
    "config.train.steps = 200": "config.train.steps = 2\n"
    "config.eval.num_batches = 1\nconfig.eval.sample_tokens = 0\n"
    "config.data.max_corpus_bytes = 200_000",
    '"/tmp/txf/base"': repr(str(tmp_path / "base")),
  }
  for line, short in shortened.items():
    assert line in snippet, line
    snippet = snippet.replace(line, short)
  script = tmp_path / "elsewhere" / "readme.py"
  script.parent.mkdir()
  script.write_text(
    snippet
    + "\nassert out.shape == (2, 16, 4, 32) and w.shape == (2, 4, 16, 16)"
    + "\nassert logits.shape == (2, 16, 260) and greedy.shape == best.shape == (2, 12)"
    + "\nprint('eval_loss', trained.setup.evaluate(trained.params)['eval_loss'])\n"
  )
  result = subprocess.run(
    [str(venv / "bin" / "python"), script.name],
    cwd=script.parent,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "eval_loss " in result.stdout
  assert (tmp_path / "base" / "checkpoints").is_dir()


def test_what_a_message_asks_to_install_is_the_extra_pyproject_declares():
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  extras = extras["optional-dependencies"]
  for name, packages in EXTRAS.items():
    assert list(packages) == extras[name], name
  assert install_hint("gcs") == (
    "pip install 'gcsfs>=2024.2' 'google-cloud-storage>=2.14' (txf's gcs extra)"
  )
