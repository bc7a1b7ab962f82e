"""Sentence embeddings from a pretrained BERT-style encoder.

  txf-embed --model=DIR "some text" ["more text" ...] [--pooling=mean|cls]
      [--normalize|--nonormalize]
  python -m experiments.embed --model=DIR "some text" [flags]   # in a checkout

DIR is a Hugging Face model directory (config.json, model.safetensors,
tokenizer.json) of a BERT, RoBERTa or MiniLM sentence encoder, or its
Hugging Face Hub name (bert-base-uncased, sentence-transformers/all-MiniLM-L6-v2:
read from the Hub's cache, or downloaded; txf.interop.hub), converted by
txf.interop, or the directory of a txf encoder run (its latest checkpoint's
final hidden states, its tokenizer; txf.trained.export). Prints one JSON line
per text: {"text": ..., "embedding": [...]}.
Pooling and normalisation default to what a sentence-transformers directory
declares (modules.json; all-MiniLM-L6-v2: mean, L2-normalised), otherwise to
mean pooling over the real tokens, not normalised. `cls` is the first
token's state: a Hugging Face directory's text is encoded with its
tokenizer's special tokens ([CLS] first), a txf run's as its tokenizer
encodes text, with none added (for a txf classifier trained with BOS first,
as ListOps, that is not the position its head pools). An unusable directory or
argument exits 2 with one line naming it; a URL (gs://) is looked at once,
and one that cannot be reached is that line within half a minute.
"""

from __future__ import annotations

import json

from absl import flags, logging

from txf.commands.cli import fail, run_command

_MODEL = flags.DEFINE_string(
  "model",
  None,
  "Hugging Face encoder: a directory or Hub name, or a txf encoder run.",
  required=True,
)
_POOLING = flags.DEFINE_enum(
  "pooling",
  None,
  ["mean", "cls"],
  "mean: over the real tokens; cls: the first token's (a Hugging Face tokenizer's [CLS]; a txf "
  "run adds none) (default: the directory's, else mean).",
)
_NORMALIZE = flags.DEFINE_bool(
  "normalize", None, "Divide each embedding by its L2 norm (default: the directory's, else no)."
)


def main(argv) -> None:
  texts = argv[1:]
  # After flag parsing: fast --help.
  from txf.commands.named_model import load_named_model
  from txf.interop.text import sentence_embeddings, sentence_transformers_pooling
  from txf.rundir.workdir import WorkdirError

  logging.set_verbosity(logging.WARNING)
  try:
    named = load_named_model(_MODEL.value, hidden_states=True)
    pretrained = named.pretrained
    tokens_BxT = named.encode(texts)
    # A sentence-transformers directory's (modules.json); a run declares none.
    pooling, normalize = sentence_transformers_pooling(named.directory) or ("mean", False)
    if pretrained.config.family != "encoder":
      raise ValueError(f"{_MODEL.value}: {pretrained.architecture} is not an encoder")
    pooling = _POOLING.value or pooling
    normalize = normalize if _NORMALIZE.value is None else _NORMALIZE.value
    embeddings_BxD = sentence_embeddings(
      pretrained.model(), pretrained.params, tokens_BxT, pooling=pooling, normalize=normalize
    )
  except (ValueError, WorkdirError) as error:  # CheckpointError too
    fail("model", error)
  for text, embedding in zip(texts, embeddings_BxD.tolist()):
    print(json.dumps({"text": text, "embedding": [round(value, 7) for value in embedding]}))


def cli() -> None:
  """The `txf-embed` console script and `python -m experiments.embed`."""
  run_command(main, arguments="the texts to embed (positional arguments)")


if __name__ == "__main__":
  cli()
