"""A run holds its work directory's lock (txf.rundir.workdir.holding) from
before it reads the run's config.json or writes its tokenizer: a second run
started on the same directory while the first sets up is refused in one line
and writes nothing, and a run refused while it sets up leaves no directory
behind."""

import os
import threading

import pytest

from conftest import tiny_config
from txf.data import tokenizers
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.resume import read_run_config
from txf.rundir.workdir import WorkdirError
from txf.train import loop


def test_a_second_run_started_while_the_first_sets_up_is_refused(tmp_path, monkeypatch):
  """The first run is held in its setup (a tokenizer training, say) while a
  second, on other data, starts: the second was checked against the
  directory's config.json (none yet), trained, and the first then took over
  its run under another config."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=2)
  first = parse(config)
  config.seed = first.seed + 1
  second = parse(config)
  setup_run, seen, started = loop.setup_run, {}, []

  def second_run():
    try:
      loop.run(second, workdir, log=lambda line: None)
    except Exception as error:
      seen["error"] = error
    seen["files"] = sorted(os.listdir(workdir))

  def slow_setup(run, directory):  # the first run's; the second runs meanwhile
    if not started:
      started.append(run)
      thread = threading.Thread(target=second_run)
      thread.start()
      thread.join(300)
    return setup_run(run, directory)

  monkeypatch.setattr(loop, "setup_run", slow_setup)
  loop.run(first, workdir, log=lambda line: None)
  assert isinstance(seen["error"], WorkdirError), seen
  assert str(seen["error"]).startswith(f"{workdir}: in use by another run ("), seen
  assert seen["files"] == [".lock"]  # the refused run wrote nothing
  assert read_run_config(workdir).seed == first.seed


@pytest.mark.parametrize("tokenizer", ["bytes", "hf"])
def test_a_run_refused_while_it_sets_up_leaves_no_directory(tmp_path, tokenizer):
  """An hf run's copy of its tokenizer's files left the directory behind."""
  fields = {}
  if tokenizer == "hf":
    files = tmp_path / "tokenizer"
    files.mkdir()
    for name, text in tokenizers.hf_tokenizer_files(tokenizers.ByteTokenizer()).items():
      (files / name).write_text(text)
    fields = dict(data__tokenizer="hf", data__tokenizer_path=str(files))
  config = tiny_config(steps=2, eval__sample_tokens=8, eval__sample_prompt="", **fields)
  workdir = tmp_path / "runs" / "run"
  with pytest.raises(ConfigError, match=r"^eval\.sample_prompt"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert not (tmp_path / "runs").exists()
