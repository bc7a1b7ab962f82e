"""A trained txf run as a Hugging Face model (txf.trained.export): train tiny ->
export -> load with txf's Hugging Face reader (and with transformers where it
is installed) -> the same logits; txf-generate / txf-embed on a run
directory; train.init_from a run directory; the fields that do not map.
"""

import functools
import json
import os
import re
import shutil
import time

import jax
import numpy as np
import pytest
from etils import epath
from train.test_gcs_workdir import REACH_S, UNREACHABLE, no_dns  # noqa: F401 (a fixture)

from conftest import FIXTURES, gone_pid, load_config, repo_commands, tiny_config
from full_disk import full_disk, read_only
from txf import storage
from txf.data import HFTokenizer
from txf.data.tokenizers import hf_tokenizer_files
from txf.interop import CheckpointError, load_pretrained
from txf.interop.rules import flatten
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.resume import is_run_directory, read_run_config
from txf.rundir.workdir import WorkdirError
from txf.storage import WriteError
from txf.train import loop
from txf.train.run_setup import adding_to_run, load_run, load_trained, setup_run
from txf.trained.export import (
  EXPORT_MARKER,
  EXPORT_NAMES,
  export_run,
  reachable_directory,
  write_directory,
)

OLD_RUN = FIXTURES / "run_822e561"  # txf's default decoder: RoPE, LayerNorm, no biases
HF_GPT2 = FIXTURES / "hf" / "gpt2"
TEXT = "def f(x):\n  return x  # é"
ATOL = 1e-4
# Tiny runs of each family's Hugging Face shape (two steps: the weights move
# off their initialisation).
SHAPES = {
  "gpt2": ("learned", dict(use_bias=True, scale_logits=False)),
  "bert": (
    "encoder_mlm",
    dict(
      norm_placement="post",
      embed_norm=True,
      use_bias=True,
      num_token_types=1,
      scale_logits=False,
      gelu_approximate=False,
    ),
  ),
  "t5": (
    "seq2seq",
    dict(position="t5_bias", norm="rms", use_bias=False, scale_attention=False),
  ),
}


def train_tiny(name, workdir):
  config_name, model = SHAPES[name]
  fields = {f"model__{field}": value for field, value in model.items()}
  config = tiny_config(config_name, steps=2, train__warmup_steps=1, **fields)
  loop.run(parse(config), workdir, log=lambda line: None)
  return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, compilation_cache_dir):
  """name -> the work directory of its tiny run, trained once for the module."""
  trained = {}

  def get(name):
    if name not in trained:
      trained[name] = train_tiny(name, tmp_path_factory.mktemp("runs") / name)
    return trained[name]

  return get


def inputs_of(name, tokenizer):
  """The model's inputs: TEXT's tokens [1, T]; for T5 (the reverse task's
  symbols) source and decoder tokens."""
  if name == "t5":
    return (np.array([[5, 6, 7, 8, 9]], np.int32), np.array([[1, 9, 8]], np.int32))
  return (tokenizer.encode(TEXT)[None],)


def transformers_logits(directory, name, inputs):
  """transformers' logits for `inputs` from the exported directory (None
  without transformers and torch)."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  config = json.loads((directory / "config.json").read_text())
  model = getattr(transformers, config["architectures"][0]).from_pretrained(
    directory, attn_implementation="eager"
  )
  arguments = dict(input_ids=torch.tensor(inputs[0], dtype=torch.long))
  if name == "t5":
    arguments["decoder_input_ids"] = torch.tensor(inputs[1], dtype=torch.long)
  with torch.no_grad():
    return model.eval()(**arguments).logits.numpy()


@pytest.mark.slow  # trains three tiny runs
@pytest.mark.parametrize("name", ["gpt2", "bert", "t5"])
def test_a_run_exported_loads_as_the_same_model(name, runs, tmp_path):
  workdir = runs(name)
  written = export_run(workdir, tmp_path / "hf")
  architecture = {
    "gpt2": "GPT2LMHeadModel",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
  }[name]
  assert written.architecture == architecture and written.step == 2
  trained = load_trained(workdir)
  exported = load_pretrained(tmp_path / "hf")
  assert exported.config == trained.pretrained.config
  found, expected = flatten(exported.params), flatten(trained.pretrained.params)
  assert found.keys() == expected.keys()
  inputs = inputs_of(name, trained.tokenizer)
  logits = jax.jit(trained.pretrained.model().apply)({"params": trained.pretrained.params}, *inputs)
  again = jax.jit(exported.model().apply)({"params": exported.params}, *inputs)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(logits))
  assert not np.allclose(logits, logits.mean())  # a model, not a constant
  # generation_config.json: the run's special ids but the pad id (which
  # config.json holds), as export_files writes it.
  generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
  ids = {k: v for k, v in trained.pretrained.token_ids.items() if v is not None}
  assert "pad_token_id" in ids and generation == {k: ids[k] for k in ids if k != "pad_token_id"}
  if name == "t5":  # the reverse task's symbols have no tokenizer.json
    assert "tokenizer.json" not in written.files and "symbols" in written.no_tokenizer
    assert exported.token_ids["decoder_start_token_id"] == trained.tokenizer.bos_id
  else:  # the run's bytes, read back by the Hugging Face reader
    tokenizer = HFTokenizer(tmp_path / "hf")
    np.testing.assert_array_equal(tokenizer.encode(TEXT), trained.tokenizer.encode(TEXT))
    assert (tokenizer.pad_id, tokenizer.eos_id) == (0, 2)
  reference = transformers_logits(tmp_path / "hf", name, inputs)
  if reference is not None:  # transformers reads the directory as the same model
    np.testing.assert_allclose(reference, np.asarray(logits), atol=ATOL)


def test_what_is_a_run_directory(tmp_path):
  assert is_run_directory(OLD_RUN)
  assert not is_run_directory(HF_GPT2)
  assert not is_run_directory(tmp_path)
  (tmp_path / "config.json").write_text("{not json")
  assert not is_run_directory(tmp_path)


def unmappable_run(tmp_path):
  """OLD_RUN with sliding-window attention (no parameter changes, so its
  checkpoint still restores): a decoder no Hugging Face architecture here
  represents."""
  workdir = tmp_path / "windowed_run"
  shutil.copytree(OLD_RUN, workdir)
  config = json.loads((workdir / "config.json").read_text())
  config["model"]["window"] = 8
  (workdir / "config.json").write_text(json.dumps(config))
  return workdir


@pytest.mark.slow  # restores the run
def test_the_default_decoder_exports_as_gpt_neox(tmp_path):
  """OLD_RUN's model is txf's default (configs/rope.py): RoPE, LayerNorm, no
  biases, tied logits scaled by d_model^-0.5. GPT-NeoX holds it: attention
  without biases, zeros for its feed-forward biases, the output written
  untied as the embedding times d_model^-0.5."""
  written = export_run(OLD_RUN, tmp_path / "hf")
  assert written.architecture == "GPTNeoXForCausalLM" and written.step == 2
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (config["attention_bias"], config["tie_word_embeddings"]) == (False, False)
  assert config["rope_parameters"]["partial_rotary_factor"] == 1.0
  assert config["use_parallel_residual"] is False
  trained = load_trained(OLD_RUN)
  exported = load_pretrained(tmp_path / "hf")
  assert exported.config == trained.pretrained.config.replace(
    tie_embeddings=False, scale_logits=False
  )
  inputs = inputs_of("gpt_neox", trained.tokenizer)
  logits = jax.jit(trained.pretrained.model().apply)({"params": trained.pretrained.params}, *inputs)
  again = jax.jit(exported.model().apply)({"params": exported.params}, *inputs)
  np.testing.assert_allclose(np.asarray(again), np.asarray(logits), rtol=0, atol=1e-5)
  assert not np.allclose(logits, logits.mean())  # a model, not a constant
  reference = transformers_logits(tmp_path / "hf", "gpt_neox", inputs)
  if reference is not None:  # transformers reads the directory as the same model
    np.testing.assert_allclose(reference, np.asarray(logits), atol=ATOL)


@pytest.mark.slow  # restores the run
def test_an_export_that_does_not_map_names_every_field_and_writes_nothing(tmp_path):
  workdir = unmappable_run(tmp_path)
  with pytest.raises(CheckpointError) as raised:
    export_run(workdir, tmp_path / "hf")
  assert str(raised.value) == (
    "model.window: 8 cannot be written as GPTNeoXForCausalLM (needs None)"
  )
  assert not (tmp_path / "hf").exists()
  # Nor the directories above it that the export would have made.
  with pytest.raises(CheckpointError):
    export_run(workdir, tmp_path / "new" / "parent" / "hf")
  assert not (tmp_path / "new").exists()
  shutil.copytree(OLD_RUN, tmp_path / "run")
  with pytest.raises(ConfigError, match="is the run's work directory"):
    export_run(tmp_path / "run", tmp_path / "run")
  assert (tmp_path / "run" / "config.json").read_bytes() == (OLD_RUN / "config.json").read_bytes()


@pytest.mark.slow  # trains two tiny runs (shared with the tests above)
def test_a_second_export_replaces_the_first_whole(runs, tmp_path):
  """A run without a tokenizer (the reverse task's symbols) exported where a
  run with one was: the first's tokenizer.json is gone with the rest."""
  out = tmp_path / "hf"
  # A killed export's staged model: the next export removes it.
  (tmp_path / f".hf.{storage._HOST}-{gone_pid()}-0123456789ab.tmp").mkdir()
  first = export_run(runs("gpt2"), out)
  assert not first.replaced and (out / "tokenizer.json").exists()
  second = export_run(runs("t5"), out)
  assert second.replaced and second.no_tokenizer
  assert sorted(os.listdir(out)) == sorted([*second.files, EXPORT_MARKER])
  assert set(os.listdir(out)) | set(first.files) <= EXPORT_NAMES
  assert "tokenizer.json" not in second.files
  assert load_pretrained(out).architecture == "T5ForConditionalGeneration"
  assert os.listdir(tmp_path) == ["hf"]


def test_every_tokenizer_file_an_export_copies_is_its_own(tmp_path):
  """A run's Hugging Face tokenizer with a special_tokens_map.json: the
  export copied it, and the next export to the same --out was refused for
  holding "files txf-export did not write (special_tokens_map.json)"."""
  shutil.copytree(FIXTURES / "hf" / "bert", tmp_path / "tokenizer")
  special = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
  (tmp_path / "tokenizer" / "special_tokens_map.json").write_text(json.dumps(special))
  copied = set(hf_tokenizer_files(HFTokenizer(tmp_path / "tokenizer")))
  assert copied == {"tokenizer.json", *HFTokenizer.SPECIAL_FILES}
  assert copied <= EXPORT_NAMES


@pytest.mark.slow  # trains two tiny runs (shared with the tests above)
def test_a_run_of_the_wrong_family_is_named_before_its_text_is_read(runs):
  """txf-embed on an encoder-decoder run said "model.head: 'none' does not
  fit model.family='encoder_decoder'", a field nobody set; txf-generate on
  an encoder refused the prompt's symbols before saying it cannot generate."""
  from txf.commands.named_model import load_named_model

  with pytest.raises(ValueError, match=r"model\.family='encoder_decoder'; embeddings need an"):
    load_named_model(str(runs("t5")), hidden_states=True)
  with pytest.raises(ValueError, match=r"^model\.family: 'encoder' cannot generate"):
    load_named_model(str(runs("bert")), generates=True)
  assert load_named_model(str(runs("bert")), hidden_states=True).pretrained.config.head == "none"


def test_a_garbled_config_json_is_named_as_such(tmp_path):
  """txf-export, txf-analyze and txf-extrapolate said it was 'not a txf
  run's (no model and train sections)' of a file that is no JSON at all."""
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.json").write_text('{"model": {')
  with pytest.raises(ConfigError, match=r"holds no readable run: .*config\.json: not"):
    export_run(tmp_path / "run", tmp_path / "hf")
  assert os.listdir(tmp_path) == ["run"]


def test_a_hugging_face_directory_is_not_taken_for_a_run(tmp_path):
  """Was three chained tracebacks (KeyError 'data' from the run config's reader)."""
  with pytest.raises(ConfigError) as raised:
    export_run(HF_GPT2, tmp_path / "hf")
  assert str(raised.value) == (
    f"workdir: {HF_GPT2} holds no txf run: it is a Hugging Face model directory "
    "(GPT2LMHeadModel); the command takes the work directory of a txf run (txf-run's "
    "--workdir)"
  )
  assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("opens", [load_run, lambda path: adding_to_run(path).__enter__()])
def test_every_command_that_opens_a_run_says_a_hugging_face_directory_is_none(opens):
  """txf-analyze and txf-extrapolate (adding_to_run), txf-generate and txf-embed
  on a run (load_run) refuse it as txf-export does; txf-analyze said
  'config.add_cross_attention: unknown field' (the model's config read as a run's)."""
  with pytest.raises(ConfigError, match=r"holds no txf run: it is a Hugging Face model directory "):
    opens(HF_GPT2)


def test_an_out_holding_other_files_is_refused_before_the_run_is_read(tmp_path):
  """The out's error comes first, before any compute.
  A file of the user's is kept, not mixed with an export's."""
  out = tmp_path / "hf"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match=rf"^out: {out} holds files txf-export did not write "):
    export_run(OLD_RUN, out)
  assert os.listdir(out) == ["notes.txt"]


def test_an_earlier_export_holding_a_file_of_the_users_is_not_replaced(tmp_path):
  """Was replaced whole, the user's notes and folder beside it removed."""
  out = tmp_path / "hf"
  write_directory(out, {"config.json": b"1", "model.safetensors": b"w", EXPORT_MARKER: b"m"})
  (out / "NOTES.md").write_text("mine")
  (out / "sub").mkdir()
  with pytest.raises(ConfigError, match=rf"^out: {out} holds files txf-export did not write "):
    export_run(OLD_RUN, out)
  assert sorted(os.listdir(out)) == sorted(
    [EXPORT_MARKER, "NOTES.md", "config.json", "model.safetensors", "sub"]
  )
  assert (out / "NOTES.md").read_text() == "mine"


def test_a_read_only_or_remote_out_is_refused_before_the_run_is_read(tmp_path):
  """Were a SafetensorError / OSError traceback, after the run was restored."""
  with read_only(tmp_path), pytest.raises(ConfigError) as raised:
    export_run(OLD_RUN, tmp_path / "hf")
  assert str(raised.value) == (f"out: {tmp_path}: not a writable directory (Read-only file system)")
  with pytest.raises(ConfigError, match="^out: gs://bucket/hf: txf-export writes a local dir"):
    export_run(OLD_RUN, "gs://bucket/hf")
  assert os.listdir(tmp_path) == []
  # `out` itself read-only (a read-only volume) under a writable parent: it
  # failed after the run was read, its rename refused.
  (tmp_path / "volume").mkdir()
  with read_only(tmp_path / "volume"), pytest.raises(ConfigError) as raised:
    export_run(OLD_RUN, tmp_path / "volume")
  assert str(raised.value).startswith(f"out: {tmp_path / 'volume'}: not a writable directory")


def test_an_existing_out_under_a_read_only_parent_is_refused_before_the_run_is_read(tmp_path):
  """An `out` that exists and is writable, but not a mount point, is
  replaced by a copy staged in its parent: a read-only parent is refused
  in one line before anything is read (probing `out` alone, the export
  failed at the staging, after the run was restored and converted)."""
  parent, out = tmp_path / "ro", tmp_path / "ro" / "hf"
  out.mkdir(parents=True)
  with read_only(parent, except_under=out), pytest.raises(ConfigError) as raised:
    export_run(OLD_RUN, out)
  assert str(raised.value) == f"out: {parent}: not a writable directory (Read-only file system)"
  assert os.listdir(parent) == ["hf"] and os.listdir(out) == []


def test_an_export_into_a_volume_under_a_read_only_parent_is_written(tmp_path, monkeypatch):
  """The usual container layout: a writable volume (holding a fresh file
  system's lost+found) under a read-only directory. The parent's probe
  refused it; the volume alone is written."""
  parent, volume = tmp_path / "mnt", tmp_path / "mnt" / "volume"
  (volume / "lost+found").mkdir(parents=True)
  monkeypatch.setattr(os.path, "ismount", lambda path: os.fspath(path) == os.fspath(volume))
  with read_only(parent, except_under=volume):
    written = export_run(OLD_RUN, volume)
  assert os.fspath(written.directory) == str(volume)
  assert {EXPORT_MARKER, "config.json", "lost+found"} <= set(os.listdir(volume))


def test_an_export_into_a_mount_point_writes_into_it(tmp_path, monkeypatch):
  """A container's volume cannot be renamed over (EBUSY: exit 1 after the
  run was read): the files are written into it, an earlier export's others
  removed."""
  volume = tmp_path / "volume"
  volume.mkdir()
  inode = os.stat(volume).st_ino
  monkeypatch.setattr(os.path, "ismount", lambda path: os.fspath(path) == os.fspath(volume))
  write_directory(volume, {"config.json": b"1", "tokenizer.json": b"t", EXPORT_MARKER: b"m"})
  write_directory(volume, {"config.json": b"2", EXPORT_MARKER: b"m"})
  assert os.stat(volume).st_ino == inode  # the mount point itself, never renamed
  assert sorted(os.listdir(volume)) == [EXPORT_MARKER, "config.json"]
  assert (volume / "config.json").read_bytes() == b"2"
  assert sorted(os.listdir(tmp_path)) == ["volume"]  # no temporary left


def test_an_out_that_names_no_directory_of_its_own_is_refused_before_the_run_is_read(
  tmp_path, monkeypatch
):
  """'.' and '' were a traceback (an empty name to stage beside) after the
  run was restored; 'X/..' a write error leaving X created; a link to an
  earlier export was replaced by a directory, leaving the export it named
  and a '.NAME.<hex>.old' link behind. 'X/..' is X."""
  here = tmp_path / "here"
  here.mkdir()
  monkeypatch.chdir(here)
  for out in (".", "..", str(here)):
    with pytest.raises(ConfigError, match=r"^out: .* holds the current directory"):
      export_run(OLD_RUN, out)
  with pytest.raises(ConfigError, match="^out: empty; name the directory"):
    export_run(OLD_RUN, "")
  earlier = tmp_path / "earlier"
  write_directory(earlier, {"config.json": b"1", EXPORT_MARKER: b"m"})
  (tmp_path / "link").symlink_to(earlier)
  with pytest.raises(ConfigError, match=rf"^out: {tmp_path / 'link'} is a symbolic link \(to "):
    export_run(OLD_RUN, tmp_path / "link")
  assert sorted(os.listdir(tmp_path)) == ["earlier", "here", "link"]
  written = export_run(OLD_RUN, tmp_path / "new" / "sub" / "..")
  assert os.fspath(written.directory) == str(tmp_path / "new")
  assert EXPORT_MARKER in os.listdir(tmp_path / "new") and "sub" not in os.listdir(tmp_path / "new")


def test_a_directory_is_written_whole_and_replaces_an_earlier_one(tmp_path):
  """The second export of a run without a tokenizer leaves no tokenizer.json
  of the first (txf-generate decoded garbage with it)."""
  out = tmp_path / "hf"
  write_directory(out, {"config.json": b"1", "tokenizer.json": b"t", EXPORT_MARKER: b"m"})
  write_directory(out, {"config.json": b"2", EXPORT_MARKER: b"m"})
  assert sorted(os.listdir(out)) == [EXPORT_MARKER, "config.json"]
  assert (out / "config.json").read_bytes() == b"2"
  assert os.listdir(tmp_path) == ["hf"]  # no temporary left


@pytest.mark.parametrize("fails_at", [1, 3])
def test_a_full_disk_leaves_the_directory_as_it_was(tmp_path, fails_at):
  """Was config.json, model.safetensors and a 0-byte generation_config.json,
  no tokenizer, and a traceback."""
  out = tmp_path / "hf"
  earlier = {"config.json": b"old", "tokenizer.json": b"t", EXPORT_MARKER: b"m"}
  write_directory(out, earlier)
  files = {"config.json": b"new", "model.safetensors": b"w" * 64, "generation_config.json": b"g"}
  with full_disk(re.escape(str(tmp_path)), fails_at), pytest.raises(WriteError) as raised:
    write_directory(out, files)
  assert "No space left on device" in str(raised.value) and "\n" not in str(raised.value)
  assert {name: (out / name).read_bytes() for name in os.listdir(out)} == earlier
  assert os.listdir(tmp_path) == ["hf"]  # no temporary left


def test_a_ctrl_c_between_the_renames_puts_the_earlier_export_back(tmp_path, monkeypatch):
  """The earlier export, moved aside, was lost when a KeyboardInterrupt came
  before the new one was renamed into place (only an OSError put it back)."""
  out = tmp_path / "hf"
  earlier = {"config.json": b"old", EXPORT_MARKER: b"m"}
  write_directory(out, earlier)
  rename = type(epath.Path(out)).rename
  renames = []

  def interrupted_second(self, target):
    renames.append(self)
    if len(renames) == 2:  # out is aside; the new one not yet in place
      raise KeyboardInterrupt
    return rename(self, target)

  monkeypatch.setattr(type(epath.Path(out)), "rename", interrupted_second)
  with pytest.raises(KeyboardInterrupt):
    write_directory(out, {"config.json": b"new", EXPORT_MARKER: b"m"})
  monkeypatch.undo()
  assert {name: (out / name).read_bytes() for name in os.listdir(out)} == earlier
  assert os.listdir(tmp_path) == ["hf"]  # nothing left aside


@pytest.mark.usefixtures("no_dns")
def test_an_unreachable_bucket_is_one_error_in_time(tmp_path):
  """txf-export's run, and txf-generate's / txf-embed's --model
  (reachable_directory): were 4 tracebacks after ~50 s."""
  for start in (
    lambda: export_run("gs://bucket/run", tmp_path / "hf"),
    lambda: reachable_directory("gs://bucket/run", "model"),
  ):
    began = time.monotonic()
    with pytest.raises(WorkdirError, match=UNREACHABLE):
      start()
    assert time.monotonic() - began < REACH_S + 3
  assert os.listdir(tmp_path) == []


@pytest.mark.slow  # commands (each in a process of its own) and a tiny run
def test_commands_take_a_run_directory(runs, tmp_path):
  """txf-export writes the directory; txf-generate continues a prompt the
  same from the run and from its export; txf-embed embeds with an encoder
  run's hidden states. Each command runs as `python -m` runs it, in a
  process forked from one that imported jax once (tests/command_server.py)."""
  with repo_commands(JAX_PLATFORMS="cpu") as server:
    check_commands(runs, tmp_path, functools.partial(server.run, timeout=120))


def check_commands(runs, tmp_path, run_command):
  workdir = runs("gpt2")
  result = run_command("experiments.export", f"--workdir={workdir}", f"--out={tmp_path / 'hf'}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"wrote {tmp_path / 'hf'}: GPT2LMHeadModel of step 2 (")
  again = run_command("experiments.export", f"--workdir={workdir}", f"--out={tmp_path / 'hf'}")
  assert again.returncode == 0, again.stderr
  assert again.stdout == f"replaced the earlier export in {tmp_path / 'hf'}\n" + result.stdout
  outputs = []
  for model in (workdir, tmp_path / "hf"):
    result = run_command(
      "experiments.generate", f"--model={model}", "--prompt=def ", "--max_new_tokens=5"
    )
    assert result.returncode == 0, result.stderr
    outputs.append(result.stdout)
  assert outputs[0] == outputs[1] and outputs[0].startswith("prompt: def \ngenerated: ")

  result = run_command("experiments.embed", f"--model={runs('bert')}", "a", "bc")
  assert result.returncode == 0, result.stderr
  rows = [json.loads(line) for line in result.stdout.splitlines()]
  assert [row["text"] for row in rows] == ["a", "bc"]
  assert [len(row["embedding"]) for row in rows] == [32, 32]  # d_model
  windowed = unmappable_run(tmp_path)
  result = run_command("experiments.export", f"--workdir={windowed}", f"--out={tmp_path / 'x'}")
  assert result.returncode == 2 and result.stderr.startswith("export error: model.window: 8 ")
  assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_the_pretrained_config_of_a_txf_run_keeps_its_sample(tmp_path, monkeypatch):
  """configs/pretrained.py:RUN of a run on generated data (its prompt in
  the task's symbols): base's text prompt 'def ' was refused, outside the
  run's vocabulary, until eval.sample_tokens=0 was given."""
  from txf.configs import pretrained as pretrained_config
  from txf.rundir import resume

  (tmp_path / resume.CONFIG_FILE).write_text("{}")  # a run directory, as far as asked
  symbols = parse(load_config("induction")).override(
    {"eval.sample_prompt": "a b", "eval.sample_tokens": 5}
  )
  monkeypatch.setattr(resume, "is_run_directory", lambda directory: True)
  monkeypatch.setattr(resume, "read_held_config", lambda directory, trained: (symbols, None))
  config = pretrained_config.get_config(str(tmp_path))
  assert (config.eval.sample_prompt, config.eval.sample_tokens) == ("a b", 5)
  assert parse(config).data == symbols.data


@pytest.mark.slow  # a tiny run, and the init compiled
def test_a_run_starts_from_a_txf_run(runs, tmp_path):
  """train.init_from=RUN: the new run's first state holds the run's weights;
  configs/pretrained.py:RUN writes the run's model and data sections."""
  from txf.configs import pretrained as pretrained_config

  workdir = runs("gpt2")
  config = pretrained_config.get_config(str(workdir))
  saved = read_run_config(workdir)
  assert parse(config).model == saved.model and parse(config).data == saved.data
  assert config.train.init_from == str(workdir)
  config.train.update(dict(steps=2, warmup_steps=1))
  state = setup_run(parse(config), tmp_path / "fine_tuned").init()
  expected = flatten(load_trained(workdir).pretrained.params)
  found = flatten(state.params)
  assert found.keys() == expected.keys() and int(state.step) == 0
  for path, value in expected.items():
    np.testing.assert_array_equal(np.asarray(found[path]), value, err_msg=path)
  config.model.d_ff = 64
  with pytest.raises(ConfigError, match=r"model.d_ff: 64 differs .* train.init_from="):
    setup_run(parse(config), tmp_path / "other")
