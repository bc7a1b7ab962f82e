"""The installed distribution: txf alone, its commands as console scripts that
find the shipped configs by name, run from outside the checkout."""

import os
import pathlib
import site
import subprocess
import sys
import zipfile

import pytest

from txf.configs import find, names, resolve

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
def test_txf_run_from_a_fresh_environment_outside_the_checkout(wheel, tmp_path):
  venv = tmp_path / "venv"
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
  workdir = tmp_path / "run"
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  result = subprocess.run(
    [
      str(venv / "bin" / "txf-run"),
      "--config=rope",
      f"--workdir={workdir}",
      "--config.train.steps=3",
      "--config.train.warmup_steps=1",
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
