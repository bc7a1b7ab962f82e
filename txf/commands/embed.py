"""Sentence embeddings from a pretrained BERT-style encoder.

  txf-embed --model=DIR "some text" ["more text" ...] [--pooling=mean|cls]
      [--normalize|--nonormalize]
  python -m experiments.embed --model=DIR "some text" [flags]   # in a checkout

DIR is a Hugging Face model directory (config.json, model.safetensors,
tokenizer.json) of a BERT, RoBERTa or MiniLM sentence encoder, converted by
txf.interop. Prints one JSON line per text: {"text": ..., "embedding": [...]}.
Pooling and normalisation default to what a sentence-transformers directory
declares (modules.json; all-MiniLM-L6-v2: mean, L2-normalised), otherwise to
mean pooling over the real tokens, not normalised. An unusable directory or
argument exits 2 with one line naming it.
"""

from __future__ import annotations

import json

from absl import flags, logging

from txf.commands.cli import fail, run_command

_MODEL = flags.DEFINE_string(
  "model", None, "Hugging Face model directory of an encoder.", required=True
)
_POOLING = flags.DEFINE_enum(
  "pooling",
  None,
  ["mean", "cls"],
  "mean: over the real tokens; cls: the first token's (default: the directory's, else mean).",
)
_NORMALIZE = flags.DEFINE_bool(
  "normalize", None, "Divide each embedding by its L2 norm (default: the directory's, else no)."
)


def main(argv) -> None:
  texts = argv[1:]
  # After flag parsing: fast --help.
  from txf.data import HFTokenizer
  from txf.interop import load_pretrained
  from txf.interop.text import encode_batch, sentence_embeddings, sentence_transformers_pooling

  logging.set_verbosity(logging.WARNING)
  try:
    pretrained = load_pretrained(_MODEL.value, head="none")
    if pretrained.config.family != "encoder":
      raise ValueError(f"{_MODEL.value}: {pretrained.architecture} is not an encoder")
    pooling, normalize = sentence_transformers_pooling(_MODEL.value) or ("mean", False)
    pooling = _POOLING.value or pooling
    normalize = normalize if _NORMALIZE.value is None else _NORMALIZE.value
    tokens_BxT = encode_batch(HFTokenizer(_MODEL.value), texts, pad_id=pretrained.config.pad_id)
    embeddings_BxD = sentence_embeddings(
      pretrained.model(), pretrained.params, tokens_BxT, pooling=pooling, normalize=normalize
    )
  except ValueError as error:  # CheckpointError too
    fail("model", error)
  for text, embedding in zip(texts, embeddings_BxD.tolist()):
    print(json.dumps({"text": text, "embedding": [round(value, 7) for value in embedding]}))


def cli() -> None:
  """The `txf-embed` console script and `python -m experiments.embed`."""
  run_command(main, arguments="the texts to embed (positional arguments)")


if __name__ == "__main__":
  cli()
