"""The model a command's --model flag names (txf-generate, txf-embed): a
txf run directory, or a Hugging Face model directory or Hub name."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from txf.commands.cli import run_errors

if TYPE_CHECKING:
  import numpy as np

  from txf.data import Tokenizer
  from txf.interop import Pretrained


@dataclasses.dataclass(frozen=True)
class NamedModel:
  """A model read for a command.

  Attributes:
    pretrained: the model and its parameters.
    tokenizer: a run's own tokenizer, or the Hugging Face directory's.
    directory: where it was read from (a Hub name: its cached directory).
    encode: texts -> int32 [B, T], right-padded with the model's pad_id: a
      run's tokens without special ones (as its own batches and samples
      read text), a Hugging Face tokenizer's with its special tokens;
      ValueError for no texts or one that encodes to no tokens.
  """

  pretrained: Pretrained
  tokenizer: Tokenizer
  directory: str
  encode: Callable[[Sequence[str]], np.ndarray]


def load_named_model(
  name: str, *, hidden_states: bool = False, generates: bool = False
) -> NamedModel:
  """The model `name` names: a txf run directory's trained model (its latest
  checkpoint) with the run's tokenizer, or a Hugging Face model directory or
  Hub name (read from the Hub's cache, or downloaded) converted by
  txf.interop, with its tokenizer.

  A URL (gs://) is looked at once, in bounded time. hidden_states: the
  model returns its final hidden states (the head's weights dropped), as
  txf.interop's head 'none'; otherwise its own head's output. generates: a
  run's model must run as a causal LM (`TrainedModel.check_runs_causally`).

  Raises:
    ValueError, WorkdirError: naming what the directory lacks (a
      CheckpointError is a ValueError). A run that does not restore, or
      has no checkpoint, exits 2 with one line (`cli.run_errors`).
  """
  # Here, not at the top: importing txf loads jax, which --help need not wait for.
  from txf.data import HFTokenizer
  from txf.decode.cache import check_generative
  from txf.interop import load_pretrained, resolve_model
  from txf.interop.text import encode_batch, pad_batch
  from txf.rundir.resume import is_run_directory
  from txf.storage import is_local
  from txf.train.run_setup import load_trained
  from txf.trained.export import reachable_directory, without_head

  if not name:
    raise ValueError("model: empty; name a txf run, a Hugging Face model directory or a Hub name")
  directory = resolve_model(name)
  path = reachable_directory(directory, "model")
  if is_local(path) and not path.is_dir():  # else '<path>/config.json: no such file'
    what = "is a file, not a model directory" if path.exists() else "is no directory"
    raise ValueError(f"model: {directory} {what}")
  if is_run_directory(directory):
    with run_errors():  # a run without a checkpoint, one that does not restore
      trained = load_trained(directory)
    if trained.replica_read:  # on stderr: stdout holds the command's output
      print(f"model: {directory}: {trained.replica_read}", file=sys.stderr)
    family = trained.pretrained.config.family
    if generates:
      # Before a prompt is encoded: a classifier's vocabulary refused the
      # prompt's symbols first, naming the prompt, not the model.
      check_generative(trained.pretrained.model())
      trained.check_runs_causally()
    if hidden_states and family != "encoder":
      # Else without_head's head='none' was refused for a family without one.
      raise ValueError(
        f"model: {directory} is a txf run of model.family={family!r}; embeddings need an encoder"
      )
    pretrained = without_head(trained.pretrained) if hidden_states else trained.pretrained
    tokenizer = trained.tokenizer

    def encode(texts: Sequence[str]) -> np.ndarray:
      encoded = [tokenizer.encode(text) for text in texts]
      return pad_batch(texts, encoded, pad_id=pretrained.config.pad_id)

    return NamedModel(pretrained, tokenizer, directory, encode)
  pretrained = load_pretrained(directory, head="none" if hidden_states else None)
  hf_tokenizer = HFTokenizer(directory)

  def encode_hf(texts: Sequence[str]) -> np.ndarray:
    return encode_batch(hf_tokenizer, texts, pad_id=pretrained.config.pad_id)

  return NamedModel(pretrained, hf_tokenizer, directory, encode_hf)
