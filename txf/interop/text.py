"""Running converted checkpoints on text: batches of texts, sentence
embeddings, generation.

  pretrained = load_pretrained(DIR, head="none")
  tokenizer = HFTokenizer(DIR)
  tokens_BxT = encode_batch(tokenizer, ["some text", "more"], pad_id=pretrained.config.pad_id)
  embeddings_BxD = sentence_embeddings(pretrained.model(), pretrained.params, tokens_BxT,
                                       pooling="mean", normalize=True)
  generated_BxN = generate_text(load_pretrained(GPT2_DIR), prompt_BxP, max_new_tokens=20)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from txf import decode
from txf.data.tokenizers import HFTokenizer
from txf.interop.checkpoint import Pretrained
from txf.interop.rules import CheckpointError
from txf.interop.tensors import CONFIG, file_inside, read_json
from txf.models import pool

MODULES = "modules.json"  # a sentence-transformers directory's list of modules
SENTENCE_POOLINGS = ("mean", "cls")
# sentence-transformers' Pooling config keys of those poolings.
_POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
# sentence-transformers' Normalize divides by max(|x|, eps) (torch's F.normalize).
NORMALIZE_EPS = 1e-12


def encode_batch(tokenizer: HFTokenizer, texts: Sequence[str], *, pad_id: int) -> np.ndarray:
  """int32 [B, T]: each text with the tokenizer's special tokens, right-padded with pad_id."""
  return pad_batch(
    texts, [tokenizer.encode(text, add_special_tokens=True) for text in texts], pad_id=pad_id
  )


def pad_batch(texts: Sequence[str], encoded: Sequence[np.ndarray], *, pad_id: int) -> np.ndarray:
  """int32 [B, T]: the ids of `texts` (`encoded`, one array each), right-padded with pad_id."""
  if not texts:
    raise ValueError("texts: nothing to encode")
  empty = [text for text, ids in zip(texts, encoded) if not len(ids)]
  if empty:
    raise ValueError(f"texts: {empty[0]!r} encodes to no tokens")
  tokens_BxT = np.full((len(texts), max(map(len, encoded))), pad_id, np.int32)
  for row, ids in enumerate(encoded):
    tokens_BxT[row, : len(ids)] = ids
  return tokens_BxT


def sentence_embeddings(
  model: nn.Module,
  params: Any,
  tokens_BxT: jax.typing.ArrayLike,
  *,
  pooling: str = "mean",
  normalize: bool = False,
  token_types_BxT: jax.Array | None = None,
) -> jax.Array:
  """Sentence embeddings [B, D] from an encoder with head='none' (see `pool_sentences`)."""
  cfg = model.cfg
  if cfg.family != "encoder" or cfg.head != "none":
    raise ValueError(
      f"model.head: sentence embeddings need an encoder with head='none', "
      f"got family={cfg.family!r}, head={cfg.head!r}"
    )
  kwargs: dict[str, Any] = {} if token_types_BxT is None else dict(token_types_BxS=token_types_BxT)
  # Any: flax types apply's result as the output or (output, mutated variables).
  hidden_BxTxD: Any = model.apply({"params": params}, tokens_BxT, **kwargs)
  return pool_sentences(
    hidden_BxTxD, jnp.asarray(tokens_BxT) != cfg.pad_id, pooling=pooling, normalize=normalize
  )


def pool_sentences(
  hidden_BxTxD: jax.Array, valid_BxT: jax.Array, *, pooling: str = "mean", normalize: bool = False
) -> jax.Array:
  """[B, T, D] hidden states -> [B, D] sentence embeddings.

  mean: averaged over the real tokens (valid), as sentence-transformers'
  mean pooling; cls: the first token's. normalize divides each by its L2
  norm (all-MiniLM-L6-v2 and most sentence encoders).
  """
  if pooling not in SENTENCE_POOLINGS:
    raise ValueError(f"pooling: {pooling!r} is not one of {SENTENCE_POOLINGS}")
  pooled_BxD = pool(hidden_BxTxD, valid_BxT, pooling)
  if normalize:
    norms_Bx1 = jnp.linalg.norm(pooled_BxD, axis=-1, keepdims=True)
    pooled_BxD = pooled_BxD / jnp.maximum(norms_Bx1, NORMALIZE_EPS)
  return pooled_BxD


def sentence_transformers_pooling(directory: str | epath.PathLike) -> tuple[str, bool] | None:
  """(pooling, normalize) that a sentence-transformers directory declares
  (modules.json, its Pooling module's config.json), or None when it has none.

  Raises:
    CheckpointError: naming the file and key of a broken declaration, or a
      module path outside `directory` (checked before it is read).
  """
  directory = epath.Path(directory)
  if not (directory / MODULES).exists():
    return None
  kinds = _module_kinds(directory)
  pooling = "mean"
  if "Pooling" in kinds:
    module_dir = file_inside(
      directory, kinds["Pooling"].get("path"), f"{directory / MODULES}: Pooling module's path"
    )
    config = read_json(module_dir / CONFIG)
    chosen = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if len(chosen) != 1 or chosen[0] not in _POOLING_MODES:
      raise CheckpointError(
        f"{module_dir / CONFIG}: pooling {chosen} is not one of {sorted(_POOLING_MODES)} alone"
      )
    pooling = _POOLING_MODES[chosen[0]]
  return pooling, "Normalize" in kinds


def _module_kinds(directory: epath.Path) -> dict[str, dict[str, Any]]:
  """modules.json's modules by their class name ('Pooling', 'Normalize', ...)."""
  path = directory / MODULES
  kinds = {}
  for i, module in enumerate(read_json(path, list)):
    kind = module.get("type") if isinstance(module, dict) else None
    if not isinstance(kind, str):
      raise CheckpointError(
        f"{path}: module {i}: expected an object with a string 'type', got {module!r}"
      )
    kinds[kind.rsplit(".", 1)[-1]] = module
  return kinds


def generate_text(
  pretrained: Pretrained,
  prompt_BxP: np.ndarray,
  *,
  max_new_tokens: int,
  prompt_lengths_B: np.ndarray | None = None,
  rng: jax.Array | None = None,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
) -> np.ndarray:
  """Generated tokens [B, max_new_tokens] (KV cache, txf.decode), pad after EOS.

  A decoder continues each prompt, right-padded with model.pad_id, of the
  lengths given (`prompt_lengths_B`) or counted as its leading tokens that
  are not pad_id (a prompt holding pad_id then needs its length given). An
  encoder-decoder reads the prompts as its encoder inputs and decodes from
  its decoder start token (config.json's decoder_start_token_id, T5's pad).
  Rows stop at config.json's eos_token_id. rng None: greedy.
  """
  cfg, model = pretrained.config, pretrained.model()
  prompt_BxP = np.asarray(prompt_BxP)
  sampling = dict(
    rng=rng,
    temperature=temperature,
    top_k=top_k,
    top_p=top_p,
    eos_id=pretrained.token_ids.get("eos_token_id"),
  )
  if cfg.family == "encoder_decoder":
    start = pretrained.token_ids.get("decoder_start_token_id")
    start_Bx1 = np.full((len(prompt_BxP), 1), cfg.pad_id if start is None else start, np.int32)
    # The start token may equal pad_id (T5): its length is given, not counted.
    generated_BxT = decode.generate(
      model,
      pretrained.params,
      jnp.asarray(start_Bx1),
      encoder_tokens_BxS=jnp.asarray(prompt_BxP),
      prompt_lengths_B=jnp.ones(len(prompt_BxP), jnp.int32),
      max_new_tokens=max_new_tokens,
      **sampling,
    )
    return np.asarray(generated_BxT)[:, 1:]
  # A family that cannot generate (an encoder), or a head without next-token
  # logits: decode.generate's check_generative names the field.
  if prompt_lengths_B is None:
    real_BxP = prompt_BxP != cfg.pad_id
    prompt_lengths_B = np.sum(np.cumprod(real_BxP, axis=1), axis=1)
    if np.any(real_BxP.sum(axis=1) != prompt_lengths_B):
      raise ValueError(
        f"prompt: holds token {cfg.pad_id} (model.pad_id) inside a prompt; give prompt_lengths_B"
      )
  prompt_lengths_B = np.asarray(prompt_lengths_B)
  tokens_BxT = np.asarray(
    decode.generate(
      model,
      pretrained.params,
      jnp.asarray(prompt_BxP),
      prompt_lengths_B=jnp.asarray(prompt_lengths_B),
      max_new_tokens=max_new_tokens,
      **sampling,
    )
  )
  return np.stack(
    [row[length : length + max_new_tokens] for row, length in zip(tokens_BxT, prompt_lengths_B)]
  )
