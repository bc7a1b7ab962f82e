"""A trained txf run as a Hugging Face model directory.

  txf-export --workdir=RUN --out=DIR
  python -m experiments.export --workdir=RUN --out=DIR   # in a checkout: the same command

Writes the latest checkpoint of the run in RUN (its first seed replica) into
DIR as Hugging Face writes a model: config.json and model.safetensors
(txf.interop: a decoder as GPT-2, Llama or GPT-NeoX by its fields, an
encoder as BERT, an encoder-decoder as T5), tokenizer.json and
tokenizer_config.json (the run's bytes, sentencepiece or Hugging Face
tokenizer; the generated tasks' symbols have none, which it says), and
generation_config.json. DIR then loads with txf-generate --model=DIR,
txf.interop.load_pretrained, and transformers' from_pretrained. Prints what
it wrote. RUN may be local or a URL (gs://), looked at once before anything
is read: one that cannot be reached exits 2 with one line within half a
minute.

DIR is the export's own: it is written whole or not at all (into a
temporary sibling, then renamed into place), so a full disk leaves it as it
was (one line `write error: ...`, exit 1). A DIR that holds an earlier
export (its .txf-export file) is replaced whole, which the command says; a
DIR holding any other file is refused. A run whose model no Hugging Face
architecture txf writes represents (a decoder: GPT-2 for learned positions,
else Llama for RMSNorm, else GPT-NeoX; an alibi decoder, a window, Post-LN,
...) exits 2 with one line naming every field that does not map, writing
nothing; so does a RUN without a trained run (a Hugging Face directory,
say), and a DIR that is not the export's to write: a run's directory, one
holding other files, a read-only one, a symbolic link (name the directory
it links to), the current directory or one above it, a URL (export
locally, then copy it).
"""

from __future__ import annotations

from absl import flags, logging

from txf.commands.cli import fail, refuse_empty, run_command, run_errors

_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory of a trained txf run.", required=True
)
_OUT = flags.DEFINE_string(
  "out",
  None,
  "Local directory to write the Hugging Face model into: a new or empty one, or an earlier "
  "export (replaced).",
  required=True,
)
refuse_empty(_WORKDIR)


def main(argv) -> None:
  # After flag parsing: fast --help.
  from txf.interop import CheckpointError
  from txf.runconfig.run_config import ConfigError
  from txf.rundir.workdir import WorkdirError
  from txf.trained.export import export_run

  logging.set_verbosity(logging.WARNING)
  with run_errors():
    try:
      written = export_run(_WORKDIR.value, _OUT.value)
    except CheckpointError as error:
      fail("export", error)
    except (ConfigError, WorkdirError) as error:
      # export_run names the argument it refuses first; --out is a flag, no
      # config field or work directory (run_errors' labels for the others).
      if str(error).startswith(f"{_OUT.name}: "):
        fail("flag", error)
      raise
  if written.replaced:
    print(f"replaced the earlier export in {written.directory}")
  print(
    f"wrote {written.directory}: {written.architecture} of step {written.step} "
    f"({', '.join(written.files)})"
  )
  if written.replica:
    print(f"the model is {written.replica}")
  if written.no_tokenizer:
    print(f"no tokenizer.json: {written.no_tokenizer}")


def cli() -> None:
  """The `txf-export` console script and `python -m experiments.export`."""
  run_command(main)


if __name__ == "__main__":
  cli()
