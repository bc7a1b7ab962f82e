"""Hugging Face model directories <-> a txf ModelConfig and params.

  pretrained = load_pretrained("models/gpt2")   # config.json + model.safetensors
  logits = pretrained.model().apply({"params": pretrained.params}, tokens_BxT)
  pretrained.save("out/gpt2")                   # config.json + model.safetensors again
  save_pretrained(cfg, params, "out/mine")      # a txf model of a matching shape

Families: BERT-style encoders (bert.py), decoders as GPT-2 (gpt2.py), Llama
(llama.py) or GPT-NeoX (gpt_neox.py), and T5-style encoder-decoders (t5.py),
picked by config.json's `architectures` when reading; when writing, by the
model's family and, for a decoder, its fields (`decoder_family`). Each family
module has the same functions (`model_config`, `rules`, `hf_config_of`,
...) and its architectures' tensor names (`LAYOUTS`, txf.interop.layout);
this module does the rest the same way for all.

Nothing is guessed: an unsupported architecture or config value, a missing
tensor, a tensor no rule reads, or a shape that differs stops the load with a
CheckpointError naming them. Two kinds of tensors are dropped, and named:
buffers saved next to the weights (GPT-2's causal masks, BERT's position
ids), and weights txf has no layer for (BERT's pooler and next-sentence
head, or a head not asked for with head='none'), which are logged as a
warning and listed in `Pretrained.unused`. A tied output saved as its own
tensor (`lm_head.weight` equal to the embedding) is checked equal and read
once; one that differs makes an untied output.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from txf import models
from txf.interop import bert, decoder, gpt2, gpt_neox, hf_config, llama, rules, t5
from txf.interop.hub import resolve_model
from txf.interop.rules import CheckpointError
from txf.interop.tensors import CONFIG, SAFETENSORS, read_json, read_tensors, safetensors_bytes
from txf.layers.model_config import REGISTRY_FIELDS, ModelConfig

FAMILIES = (bert, gpt2, llama, gpt_neox, t5)
# config.json's model_type -> the architecture assumed when `architectures` is absent.
DEFAULT_ARCHITECTURES = {
  "bert": "BertModel",
  "roberta": "RobertaModel",
  "gpt2": "GPT2LMHeadModel",
  "llama": "LlamaForCausalLM",
  "gpt_neox": "GPTNeoXForCausalLM",
  "t5": "T5ForConditionalGeneration",
}
# model.family -> the families that write it (a decoder's: `decoder_family`).
_EXPORT_FAMILIES = {
  "encoder": (bert,),
  "decoder": (gpt2, llama, gpt_neox),
  "encoder_decoder": (t5,),
}
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A converted checkpoint.

  Attributes:
    config: the txf ModelConfig of the checkpoint (float32 compute).
    params: nested dict of float32 numpy arrays, the model's `params`.
    architecture: the HF architecture it was read as (and is saved as).
    token_ids: config.json's pad/bos/eos/decoder_start token ids (None where absent).
    unused: names of the weights that were dropped (see the module docstring).
  """

  config: ModelConfig
  params: dict[str, Any]
  architecture: str
  token_ids: dict[str, int | None]
  unused: tuple[str, ...] = ()

  def model(self) -> nn.Module:
    return models.build(self.config)

  def save(self, directory: str | epath.PathLike) -> None:
    """Writes this checkpoint back as its architecture (config.json + model.safetensors)."""
    save_pretrained(
      self.config, self.params, directory, architecture=self.architecture, token_ids=self.token_ids
    )


def _family(hf: Mapping[str, Any]) -> tuple[ModuleType, str]:
  """The family module and architecture of a config.json."""
  architectures = hf.get("architectures") or [DEFAULT_ARCHITECTURES.get(hf.get("model_type", ""))]
  for architecture in architectures:
    for family in FAMILIES:
      if architecture in family.ARCHITECTURES:
        return family, architecture
  supported = sorted(a for family in FAMILIES for a in family.ARCHITECTURES)
  found = hf.get("architectures") or hf.get("model_type")
  if found is None and {"model", "train"} <= set(hf):  # 'architecture None is not supported'
    raise CheckpointError(
      "config.json: a txf run's (its work directory), not a Hugging Face checkpoint's: "
      "txf.train.run_setup.load_run restores it, txf-export writes it as one"
    )
  raise CheckpointError(
    f"config.json: architecture {found!r} is not supported (supported: {', '.join(supported)})"
  )


def _head(family: ModuleType, architecture: str, head: str | None) -> str:
  natural = family.ARCHITECTURES[architecture]
  if head is None:
    return natural
  # A family whose txf model returns no hidden states (T5's encoder_decoder
  # carries its LM head only: 'none' was refused as if config.json were wrong).
  hidden = ("none",) if getattr(family, "HIDDEN_STATES", True) else ()
  if head not in (natural, *hidden):
    choices = " or ".join(repr(choice) for choice in (natural, *hidden))
    raise CheckpointError(f"head: {architecture} has no {head!r} head (choose {choices})")
  return head


def _canonical_names(
  tensors: Mapping[str, np.ndarray], family: ModuleType, architecture: str
) -> dict[str, np.ndarray]:
  """Names as the family's rules spell them: legacy names renamed, the body
  under its prefix ('bert.', 'transformer.'), whether or not the file was
  saved with a head (the original GPT-2 files have none)."""
  layout = family.LAYOUTS[architecture]
  canonical = {}
  for name, tensor in tensors.items():
    name = layout.rename_legacy(name)
    if not name.startswith(layout.prefix) and name.split(".")[0] not in layout.head_roots:
      name = layout.prefix + name
    if name in canonical:
      raise CheckpointError(f"tensor {name} appears twice in the checkpoint")
    canonical[name] = tensor
  return canonical


def _matching(tensors: Mapping[str, np.ndarray], patterns: tuple[str, ...]) -> list[str]:
  return sorted(name for name in tensors if any(re.fullmatch(p, name) for p in patterns))


def _drop_tied_copies(tensors: dict[str, np.ndarray], copies: Mapping[str, str]) -> None:
  """Removes each tied copy that equals its source (a copy that differs stays)."""
  for copy, source in copies.items():
    if copy in tensors and source in tensors and np.array_equal(tensors[copy], tensors[source]):
      del tensors[copy]


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """{'a/b/kernel': shape} of the txf model of cfg (abstract: no arrays made)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  abstract = jax.eval_shape(models.build(cfg).init, jax.random.key(0), *inputs)["params"]
  return {path: tuple(leaf.shape) for path, leaf in rules.flatten(nn.meta.unbox(abstract)).items()}


def load_pretrained(directory: str | epath.PathLike, *, head: str | None = None) -> Pretrained:
  """Reads a HF model directory (config.json and its weights) as txf.

  Args:
    directory: holds config.json and model.safetensors (or a sharded
      model.safetensors.index.json, or pytorch_model.bin with torch installed);
      or a Hugging Face Hub name ('gpt2', 'openai-community/gpt2'), read from
      the Hub's cache or downloaded (txf.interop.hub.resolve_model).
    head: None: the architecture's own ('mlm' for BertForMaskedLM, 'lm' for
      GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM and T5, 'none'
      for BertModel / GPT2Model / LlamaModel / GPTNeoXModel); 'none': the
      final hidden states instead (the head's weights are dropped, named).

  Raises:
    CheckpointError: naming what does not fit (see the module docstring).
  """
  directory = epath.Path(resolve_model(directory) if isinstance(directory, str) else directory)
  hf = read_json(directory / CONFIG)
  try:
    family, architecture = _family(hf)
  except CheckpointError as error:
    raise CheckpointError(f"{directory}/{error}") from None
  head = _head(family, architecture, head)
  layout = family.LAYOUTS[architecture]
  tensors = _canonical_names(read_tensors(directory), family, architecture)
  for name in _matching(tensors, layout.buffers):
    del tensors[name]
  _drop_tied_copies(tensors, layout.tied_copies)
  if hf.get("tie_word_embeddings") is True and layout.untied_output in tensors:
    # transformers ties the output to the embedding on load, as config.json
    # says, and never reads the file's own (differing) output matrix.
    logging.warning(
      "%s: config.json ties the output to the embedding (tie_word_embeddings): its %s, "
      "which differs from the embedding, is not used (as transformers does not use it)",
      directory,
      layout.untied_output,
    )
    del tensors[layout.untied_output]
  if layout.untied_output in tensors:  # what an untied output reads replaces the tied one's
    for copy, source in layout.untied_copies.items():
      if copy in tensors:
        tensors[source] = tensors.pop(copy)
  unused = _matching(tensors, layout.unused(head))
  # The head's weights that head='none' drops were asked to go: no warning.
  unexpected = _matching(tensors, layout.unused_always)
  if unexpected:
    logging.warning(
      "%s: txf does not use %d weights of %s: %s",
      directory,
      len(unexpected),
      architecture,
      ", ".join(unexpected),
    )
  for name in unused:
    del tensors[name]
  tied = layout.untied_output not in tensors
  try:
    cfg = family.model_config(hf, architecture, head, tied)
    token_ids = {key: hf_config.token_id(hf, key) for key in TOKEN_ID_KEYS}
  except ValueError as error:  # a key (CheckpointError) or a ModelConfig field it sets
    message = str(error).removeprefix(f"{CONFIG}: ")
    raise CheckpointError(f"{directory / CONFIG}: {message}") from None
  conversion = family.rules(cfg, architecture)
  rules.check_rules_cover(conversion, param_shapes(cfg), str(directory))
  flat = rules.to_txf(conversion, tensors, where=str(directory))
  return Pretrained(
    config=cfg,
    params=rules.unflatten(flat),
    architecture=architecture,
    token_ids=token_ids,
    unused=tuple(unused),
  )


def read_model_config(directory: str | epath.PathLike, *, head: str | None = None) -> ModelConfig:
  """The txf ModelConfig of a HF model directory. The weights are read too:
  whether the output is tied is decided by them (see the module docstring)."""
  return load_pretrained(directory, head=head).config


def save_pretrained(
  cfg: ModelConfig | Mapping[str, Any],
  params: Mapping[str, Any],
  directory: str | epath.PathLike,
  *,
  architecture: str | None = None,
  token_ids: Mapping[str, int | None] | None = None,
) -> None:
  """Writes a txf model as a HF model directory: config.json + model.safetensors
  (`pretrained_files`, same arguments; `directory` is created if needed and
  those two files replaced).

  Raises:
    CheckpointError: as `pretrained_files`, before anything is written.
  """
  files = pretrained_files(cfg, params, architecture=architecture, token_ids=token_ids)
  directory = epath.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  for name, data in files.items():
    (directory / name).write_bytes(data)


def decoder_family(cfg: ModelConfig) -> ModuleType:
  """The family a decoder is written as, by its fields: GPT-2 for learned
  positions; otherwise Llama for RMSNorm and GPT-NeoX for the rest (LayerNorm).
  Each represents exactly the decoders its `hf_config_of` does not refuse
  (and names every field of one it cannot hold)."""
  if cfg.position == "learned":
    return gpt2
  return llama if cfg.norm == "rms" else gpt_neox


def _check_builtin_entries(cfg: ModelConfig) -> None:
  """Refuses a chosen entry that user code registered: a built-in's name
  taken with replace=True (a centred 'rms') computes what the Hugging Face
  architecture of that name does not, and was written as it without a word.
  The init scheme is left out: a trained model's function does not read it."""
  for field, registry in REGISTRY_FIELDS.items():
    name = getattr(cfg, field)
    provider = registry.provenance(name)
    if field != "init" and not provider["builtin"]:
      raise CheckpointError(
        f"model.{field}: {name!r} is {provider['module']}.{provider['function']}, not txf's "
        "own (registered by user code), so no Hugging Face architecture holds it"
      )


def _export_family(cfg: ModelConfig, architecture: str | None) -> tuple[ModuleType, str]:
  """The family module and architecture `cfg` is written as (`architecture`:
  the caller's choice, or None)."""
  _check_builtin_entries(cfg)
  if cfg.family not in _EXPORT_FAMILIES:
    raise CheckpointError(
      f"model.family: {cfg.family!r} has no Hugging Face architecture txf writes (encoder: "
      "BERT, decoder: GPT-2, Llama or GPT-NeoX, encoder_decoder: T5)"
    )
  families = _EXPORT_FAMILIES[cfg.family]
  heads = sorted({head for family in families for head in family.ARCHITECTURES.values()})
  if cfg.head not in heads:  # a registered head (txf.register.head) has no HF counterpart
    raise CheckpointError(
      f"model.head: {cfg.head!r} has no Hugging Face architecture txf writes "
      f"(model.family={cfg.family!r}: {', '.join(heads)})"
    )
  if architecture is None:
    family = decoder_family(cfg) if cfg.family == "decoder" else families[0]
    return family, family.default_architecture(cfg)
  for family in families:
    if architecture in family.ARCHITECTURES:
      return family, architecture
  raise CheckpointError(
    f"architecture: {architecture!r} is not a model.family={cfg.family!r} architecture "
    f"(choose from {', '.join(a for family in families for a in family.ARCHITECTURES)})"
  )


def pretrained_files(
  cfg: ModelConfig | Mapping[str, Any],
  params: Mapping[str, Any],
  *,
  architecture: str | None = None,
  token_ids: Mapping[str, int | None] | None = None,
) -> dict[str, bytes]:
  """A txf model as the files of a HF model directory: {'config.json': ...,
  'model.safetensors': ...}, for the caller to write.

  Args:
    cfg: the model's config; its family picks the HF family (encoder: BERT,
      decoder: GPT-2, Llama or GPT-NeoX by its fields (`decoder_family`),
      encoder_decoder: T5).
    params: the model's params (boxed or not).
    architecture: e.g. 'RobertaForMaskedLM'; None: the family's for cfg.head.
    token_ids: pad/bos/eos/decoder_start token ids to record (None values
      are left out; pad_token_id defaults to cfg.pad_id).

  Raises:
    CheckpointError: naming a config field the architecture cannot hold
      (every one, in one line), or parameters that do not fit cfg.
  """
  cfg = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_config(cfg)
  family, architecture = _export_family(cfg, architecture)
  hf = {"pad_token_id": cfg.pad_id, **family.hf_config_of(cfg, architecture)}
  hf.update(
    {
      key: value
      for key, value in (token_ids or {}).items()
      if key in TOKEN_ID_KEYS and value is not None
    }
  )
  conversion = family.rules(cfg, architecture)
  rules.check_rules_cover(conversion, param_shapes(cfg), "export")
  tensors = rules.to_hf(conversion, rules.flatten(nn.meta.unbox(params)), where="export")
  layout = family.LAYOUTS[architecture]
  output = layout.untied_output
  if cfg.tie_embeddings and not hf["tie_word_embeddings"] and cfg.head != "none":
    tensors[output] = tensors[layout.tied_copies[output]]
  if not hf["tie_word_embeddings"]:
    for copy, source in layout.untied_copies.items():
      if source in tensors:
        tensors[copy] = tensors[source]
  if cfg.family == "decoder" and decoder.logit_scale(cfg) is not None:
    # No decoder architecture scales its logits: its output matrix holds the scale.
    tensors[output] = decoder.scaled_output(tensors[output], cfg)
  if family.ARCHITECTURES[architecture] == "none":
    # Head-less architectures name their tensors without the body prefix.
    tensors = {name.removeprefix(layout.prefix): value for name, value in tensors.items()}
  return {
    CONFIG: (json.dumps(hf, indent=2, sort_keys=True) + "\n").encode("utf-8"),
    SAFETENSORS: safetensors_bytes(tensors),
  }
