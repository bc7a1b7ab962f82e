"""Where an architecture's tensors live in its Hugging Face files.

Each family module (`txf.interop.bert`, `gpt2`, `llama`, `gpt_neox`, `t5`)
gives a `Layout` per architecture (its `LAYOUTS`); txf.interop.checkpoint
reads a file's tensor names through it before the family's rules convert
the tensors, and writes them back the same way:

  layout = gpt2.LAYOUTS["GPT2LMHeadModel"]
  layout.prefix                  # 'transformer.': the body, under a head
  layout.unused("none")          # the weights dropped (named) with head='none'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping


def unchanged(name: str) -> str:
  """A tensor name that no older release spelled otherwise."""
  return name


@dataclasses.dataclass(frozen=True)
class Layout:
  """An architecture's tensor names.

  Attributes:
    prefix: where the body's tensors live when the file has a head
      ('transformer.'; a head-less file names them without it).
    head_roots: first name parts of the head's tensors, which the prefix
      never precedes ('lm_head').
    tied_copies: {tensor: the tensor it repeats when the output is tied}.
    untied_output: the output projection's tensor, present only when it is
      not tied to the embedding.
    untied_copies: {tensor: the tensor it repeats}, for tensors an untied
      output reads in place of another (BERT's head bias: transformers 5
      reads `decoder.bias` when the output is untied, `bias` when tied):
      written twice by an untied export, and read in place of the other
      from an untied file.
    head_weights: regexes of the head's weights, dropped (named) with head='none'.
    unused_always: regexes of weights txf has no layer for, dropped (named)
      whatever the head.
    buffers: regexes of non-weights saved beside the weights (causal masks,
      position ids), dropped silently.
    rename_legacy: an older release's tensor name -> today's.
  """

  prefix: str
  head_roots: tuple[str, ...]
  tied_copies: Mapping[str, str]
  untied_output: str
  untied_copies: Mapping[str, str] = dataclasses.field(default_factory=dict)
  head_weights: tuple[str, ...] = ()
  unused_always: tuple[str, ...] = ()
  buffers: tuple[str, ...] = ()
  rename_legacy: Callable[[str], str] = unchanged

  def unused(self, head: str) -> tuple[str, ...]:
    """Regexes of the weights txf drops for a model of `head`."""
    return self.unused_always + (self.head_weights if head == "none" else ())
