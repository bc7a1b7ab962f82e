"""Tokenizers: text <-> int32 id arrays behind one small interface.

txf's own tokenizers reserve pad_id = 0, bos_id = 1 and eos_id = 2, so padded
batches, sequence starts and document separators mean the same thing for
every dataset; `HFTokenizer` (a pretrained checkpoint's tokenizer.json) keeps
its vocabulary's ids. `mask_id` is None where the vocabulary has no mask token
(the synthetic tasks, which are never masked).
"""

import abc
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
import tokenizers
from etils import epath

from txf.storage import os_reason

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


class Tokenizer(abc.ABC):
  """Common interface: `encode`, `decode` and the special ids.

  Attributes:
    vocab_size: number of ids; every id lies in [0, vocab_size).
    pad_id, bos_id, eos_id: 0, 1, 2 (HFTokenizer: its vocabulary's).
    mask_id: id of the MLM mask token, or None.
  """

  pad_id: int = PAD_ID
  bos_id: int = BOS_ID
  eos_id: int = EOS_ID
  mask_id: int | None = None
  vocab_size: int

  @property
  def sha256(self) -> str | None:
    """SHA-256 of the file contents that define the ids (a sentencepiece
    model, a tokenizer.json and its special-token files); None for a
    tokenizer defined by txf's code alone."""
    return None

  @abc.abstractmethod
  def encode(self, text: str) -> np.ndarray:
    """Returns the ids of `text`, int32 [len]; no bos/eos added."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Returns the text of `ids` (any int sequence), skipping special ids
    and ids outside [0, vocab_size) (a model's vocabulary may be larger
    than its tokenizer's: its samples can hold such ids)."""

  @property
  def special_ids(self) -> frozenset[int]:
    """Ids that carry no text: decode skips them and MLM never masks them."""
    ids = {self.pad_id, self.bos_id, self.eos_id, self.mask_id}
    return frozenset(i for i in ids if i is not None)


def _text_ids(
  ids: Sequence[int] | np.ndarray, special: Iterable[int], vocab_size: int
) -> list[int]:
  """The ids of `ids` that carry text: in [0, vocab_size) and not `special`
  (sentencepiece raised on an id past its pieces, tokenizers on a negative one)."""
  special = set(special)
  return [
    i for i in map(int, np.asarray(ids).reshape(-1)) if 0 <= i < vocab_size and i not in special
  ]


def encode_checked(tokenizer: Tokenizer, text: str) -> np.ndarray:
  """tokenizer.encode(text), where the data first sees a tokenizer's ids
  (a registered one's too), refused if one lies outside [0, vocab_size):
  the model's embedding clamps a traced id, so such ids trained on without
  a word.

  Raises:
    ValueError: naming data.tokenizer, the tokenizer's class and the id.
  """
  ids = np.asarray(tokenizer.encode(text))
  if ids.size and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
    bad = ids.min() if ids.min() < 0 else ids.max()
    raise ValueError(
      f"data.tokenizer: {type(tokenizer).__name__}.encode gave id {bad}, outside its "
      f"vocabulary [0, {tokenizer.vocab_size}) (its vocab_size)"
    )
  return ids


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes: pad 0, bos 1, eos 2, mask 3, byte b -> id b + 4 (260 ids)."""

  mask_id = 3
  _OFFSET = 4
  vocab_size = _OFFSET + 256

  def encode(self, text: str) -> np.ndarray:
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return data.astype(np.int32) + self._OFFSET

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    byte_ids = ids[(ids >= self._OFFSET) & (ids < self.vocab_size)]
    data = (byte_ids - self._OFFSET).astype(np.uint8).tobytes()
    return data.decode("utf-8", errors="replace")


class SymbolTokenizer(Tokenizer):
  """A fixed list of symbols after pad 0, bos 1, eos 2 (for synthetic tasks).

  Args:
    symbols: the symbols, in id order from 3.
    separator: '' for one symbol per character; otherwise symbols are
      whitespace-separated words in encoded text and joined with `separator`
      by decode.
  """

  _OFFSET = 3

  def __init__(self, symbols: Sequence[str], separator: str = ""):
    if len(set(symbols)) != len(symbols) or not symbols:
      raise ValueError(f"symbols must be distinct and non-empty: {symbols!r}")
    self.symbols = tuple(symbols)
    self.separator = separator
    self.vocab_size = self._OFFSET + len(symbols)
    self._ids = {s: i + self._OFFSET for i, s in enumerate(symbols)}

  def encode(self, text: str) -> np.ndarray:
    pieces = text.split() if self.separator else list(text)
    unknown = sorted(set(pieces) - self._ids.keys())
    if unknown:
      raise ValueError(f"text has symbols outside the vocabulary: {unknown!r}")
    return np.array([self._ids[p] for p in pieces], dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self.separator.join(
      self.symbols[i - self._OFFSET]
      for i in np.asarray(ids).reshape(-1)
      if self._OFFSET <= i < self.vocab_size
    )


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece model with txf's special ids.

  Ids: pad 0, bos 1, eos 2, unk 3, mask 4 ('<mask>'), '\\n' 5, then pieces.
  Models come from `SentencePieceTokenizer.train`: identity normalisation,
  no dummy prefix and byte fallback make decode(encode(text)) == text (source
  code keeps its whitespace) for any text without '<mask>' or U+2581 ('▁'):
  a literal '<mask>' is encoded as the mask id, which decode drops, and '▁'
  is sentencepiece's mark for a space, decoded as ' '.
  """

  unk_id = 3
  mask_id = 4
  MASK_PIECE = "<mask>"
  # Ids every model holds before learned pieces: 5 specials, '\n', 256 bytes.
  RESERVED_IDS = 5 + 1 + 256
  # sentencepiece's default max_sentence_length: longer lines are not trained on.
  MAX_LINE_BYTES = 4192

  def __init__(self, model_path: str | os.PathLike):
    # Read through epath: the model may be in a gs:// work directory.
    try:
      proto = epath.Path(model_path).read_bytes()
    except OSError as error:  # a directory, no permission: a traceback before
      raise ValueError(f"model_path {model_path} cannot be read ({os_reason(error)})") from None
    if not proto:  # sentencepiece loads nothing and logs on every later call
      raise ValueError(f"model_path {model_path} is not a sentencepiece model: it is empty")
    self._sha256 = hashlib.sha256(proto).hexdigest()
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as error:  # a damaged or foreign file
      reason = str(error).strip().split("\n")[0]
      raise ValueError(f"model_path {model_path} is not a sentencepiece model: {reason}") from None
    self.vocab_size = self._sp.get_piece_size()
    found = (
      self._sp.pad_id(),
      self._sp.bos_id(),
      self._sp.eos_id(),
      self._sp.unk_id(),
      self._sp.piece_to_id(self.MASK_PIECE),
    )
    expected = (self.pad_id, self.bos_id, self.eos_id, self.unk_id, self.mask_id)
    if found != expected:
      raise ValueError(
        f"model_path {model_path} has special ids (pad, bos, eos, unk, "
        f"mask) = {found}, expected {expected}: train it with "
        "SentencePieceTokenizer.train"
      )

  @property
  def special_ids(self) -> frozenset[int]:
    return super().special_ids | {self.unk_id}

  @property
  def sha256(self) -> str:
    """SHA-256 of the model file."""
    return self._sha256

  @staticmethod
  def file_name(vocab_size: int) -> str:
    """The model's file in a run's work directory (txf.data.make_tokenizer)."""
    return f"sentencepiece_{vocab_size}.model"

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._sp.decode(_text_ids(ids, self.special_ids, self.vocab_size))

  @classmethod
  def train(
    cls, texts: Iterable[str], vocab_size: int, model_prefix_path: str | os.PathLike
  ) -> "SentencePieceTokenizer":
    """Trains a unigram model on `texts` and writes `<model_prefix_path>.model`.

    Training is deterministic (one thread, input order kept), so every
    process that trains on the same texts writes the same file; the file is
    replaced atomically, so concurrent trainers never expose a partial one.

    Args:
      texts: documents; they are split into lines for training (sentencepiece
        skips lines over MAX_LINE_BYTES, and refuses texts of no other) and
        '\\n' is a piece of its own.
      vocab_size: largest vocabulary (a small text may give fewer pieces);
        must exceed RESERVED_IDS plus the text's common characters (about
        100 for source code).
      model_prefix_path: output path without the '.model' suffix.
    """
    if vocab_size <= cls.RESERVED_IDS:
      raise ValueError(f"vocab_size={vocab_size} must exceed the {cls.RESERVED_IDS} reserved ids")
    lines = [line for text in texts for line in text.split("\n") if line]
    if not lines:
      raise ValueError("texts hold no text to train on")
    if all(len(line.encode("utf-8")) > cls.MAX_LINE_BYTES for line in lines):
      # sentencepiece skips such lines, then fails with an internal error.
      raise ValueError(
        f"texts hold no line of at most {cls.MAX_LINE_BYTES} bytes, the longest sentencepiece "
        "trains on (minified or long-line text: use data.tokenizer='bytes')"
      )
    model = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=cls.pad_id,
        bos_id=cls.bos_id,
        eos_id=cls.eos_id,
        unk_id=cls.unk_id,
        user_defined_symbols=[cls.MASK_PIECE, "\n"],
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        byte_fallback=True,
        num_threads=1,
        shuffle_input_sentence=False,
        max_sentence_length=cls.MAX_LINE_BYTES,
        minloglevel=2,
      )
    except RuntimeError as error:
      # Every common character of the text needs an id of its own.
      if "required_chars" not in str(error):
        raise
      needed = re.search(r"required_chars\. \d+ vs (\d+)", str(error))
      raise ValueError(
        f"{vocab_size} pieces leave too few ids for the characters of texts"
        + (f" (they need {needed[1]})" if needed else f": {error}")
      ) from None
    path = epath.Path(f"{os.fspath(model_prefix_path)}.model")
    if "://" not in os.fspath(path):  # object stores have no directories to make
      path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(model.getvalue())
    partial.replace(path)
    return cls(path)


class HFTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json`, through the `tokenizers` library.

  The roles of the special tokens come from the tokenizer_config.json and
  special_tokens_map.json saved beside it: pad (else eos, GPT-2's padding
  convention), bos (else cls, else pad: T5's decoder starts from its pad),
  eos (else sep), mask and unk.

  `encode` adds no special tokens, as every txf tokenizer;
  `encode(text, add_special_tokens=True)` adds what the checkpoint's own
  tokenizer adds ([CLS] ... [SEP] for BERT, </s> after T5's input).

  Args:
    path: a tokenizer.json, or the directory holding it.
  """

  _ROLES = ("pad", "bos", "eos", "mask", "unk", "cls", "sep")
  # The files beside tokenizer.json that name the special tokens' roles.
  SPECIAL_FILES = ("special_tokens_map.json", "tokenizer_config.json")

  def __init__(self, path: str | os.PathLike):
    file = self.json_file(path)
    self.file = file
    if not file.exists():
      raise ValueError(f"{file}: no tokenizer.json there")
    try:
      self._tokenizer = tokenizers.Tokenizer.from_str(file.read_text())
    except Exception as error:  # tokenizers raises plain Exceptions on bad files
      raise ValueError(f"{file}: not a tokenizers tokenizer.json ({error})") from None
    # A saved tokenizer.json may pad or truncate every encoding (all-MiniLM's
    # pads to 128 tokens): txf pads batches itself and never cuts text.
    self._tokenizer.no_padding()
    self._tokenizer.no_truncation()
    self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
    roles = self._special_tokens(file.parent)
    found = {role: self._token_id(file, role, token) for role, token in roles.items()}
    eos_id = found.get("eos", found.get("sep"))
    pad_id = found.get("pad", eos_id)
    if pad_id is None or eos_id is None:
      raise ValueError(
        f"{file}: names no eos (or sep) token; txf needs one to separate "
        "documents (tokenizer_config.json: eos_token)"
      )
    self.eos_id, self.pad_id = eos_id, pad_id
    self.bos_id = found.get("bos", found.get("cls", pad_id))
    self.mask_id = found.get("mask")
    self.unk_id = found.get("unk")
    added = json.loads(file.read_text()).get("added_tokens") or []
    self._special = frozenset(
      {token["id"] for token in added if token.get("special")} | set(found.values())
    )

  @staticmethod
  def _special_tokens(directory: epath.Path) -> dict[str, str]:
    """{role: token text} from special_tokens_map.json, then tokenizer_config.json."""
    roles = {}
    for name in HFTokenizer.SPECIAL_FILES:
      if not (directory / name).exists():
        continue
      saved = json.loads((directory / name).read_text())
      for role in HFTokenizer._ROLES:
        token = saved.get(f"{role}_token")
        if isinstance(token, dict):  # {"content": "[PAD]", "lstrip": false, ...}
          token = token.get("content")
        if isinstance(token, str):
          roles[role] = token
    return roles

  @staticmethod
  def json_file(path: str | os.PathLike) -> epath.Path:
    """The tokenizer.json that `path` (the file, or the directory holding
    it) names."""
    path = epath.Path(path)
    return path / "tokenizer.json" if path.is_dir() else path

  def files(self) -> list[epath.Path]:
    """The files that define its ids: tokenizer.json and the special-token
    files beside it that exist, in that order."""
    beside = (self.file.parent / name for name in self.SPECIAL_FILES)
    return [file for file in (self.file, *beside) if file.exists()]

  @property
  def sha256(self) -> str:
    """SHA-256 over `files` (each file's name, length and bytes)."""
    digest = hashlib.sha256()
    for file in self.files():
      data = file.read_bytes()
      digest.update(f"{file.name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()

  def _token_id(self, file: epath.Path, role: str, token: str) -> int:
    token_id = self._tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{file}: its {role} token {token!r} is not in the vocabulary")
    return token_id

  @property
  def special_ids(self) -> frozenset[int]:
    return self._special

  def encode(self, text: str, add_special_tokens: bool = False) -> np.ndarray:
    ids = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    return np.asarray(ids, dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._tokenizer.decode(_text_ids(ids, self._special, self.vocab_size))


# ---------------------------------------------------------------------------
# A txf tokenizer as a Hugging Face tokenizer.json (txf-export).

# The roles of txf's special ids, as tokenizer_config.json names them.
_SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}


def _gpt2_byte_chars() -> dict[int, str]:
  """GPT-2's printable stand-in for each byte (what tokenizers' ByteLevel
  pre-tokenizer and decoder map bytes to and back)."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
  kept += range(ord("®"), ord("ÿ") + 1)
  chars, extra = {b: chr(b) for b in kept}, 0
  for b in range(256):
    if b not in chars:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


def _byte_tokenizer_json() -> tokenizers.Tokenizer:
  """ByteTokenizer's ids as a byte-level BPE without merges: each byte one
  token, id byte + 4; the special tokens are vocabulary entries only, so a
  text holding '<s>' is read as its bytes, as txf reads it."""
  chars = _gpt2_byte_chars()
  vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<mask>": ByteTokenizer.mask_id}
  vocab.update({chars[b]: b + ByteTokenizer._OFFSET for b in range(256)})
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
    add_prefix_space=False, use_regex=False
  )
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  return tokenizer


def _sentencepiece_tokenizer_json(tokenizer: SentencePieceTokenizer) -> tokenizers.Tokenizer:
  """A txf sentencepiece model (see SentencePieceTokenizer.train) as a
  tokenizers Unigram: the same pieces and scores, spaces as '▁' (identity
  normalisation, no dummy prefix), byte fallback, '<mask>' and '\\n' matched
  first (user-defined symbols). A text holding '<pad>', '<s>', '</s>' or
  '<unk>' itself reads them as those ids (as Hugging Face's own conversions
  of sentencepiece models do), where sentencepiece reads their characters."""
  processor = tokenizer._sp
  vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(len(processor))]
  converted = tokenizers.Tokenizer(
    tokenizers.models.Unigram(vocab, unk_id=tokenizer.unk_id, byte_fallback=True)
  )
  converted.normalizer = tokenizers.normalizers.Replace(" ", "\u2581")
  converted.decoder = tokenizers.decoders.Sequence(
    [
      tokenizers.decoders.Replace("\u2581", " "),
      tokenizers.decoders.ByteFallback(),
      tokenizers.decoders.Fuse(),
    ]
  )
  converted.add_tokens(
    [
      tokenizers.AddedToken(piece, normalized=False, special=False)
      for piece in (SentencePieceTokenizer.MASK_PIECE, "\n")
    ]
  )
  return converted


def _as_the_run_encodes(text: str, turned_off: Mapping[str, Any]) -> str:
  """A Hugging Face tokenizer file's JSON `text` with each key of
  `turned_off` it sets (one that adds special tokens to, pads or cuts every
  encoding) set to its value there (null or false)."""
  saved = json.loads(text)
  found = [key for key in turned_off if saved.get(key)]
  if not found:
    return text
  for key in found:
    saved[key] = turned_off[key]
  return json.dumps(saved, indent=2, ensure_ascii=False) + "\n"


# What a Hugging Face tokenizer's files may do to every encoding that a run's
# HFTokenizer does not (it turns padding and truncation off, and encodes
# without special tokens), turned off in an export's copy of them: the ids a
# tokenizers user gets from the export (Rust, a serving stack) are the run's.
_TOKENIZER_JSON_OFF = {"post_processor": None, "padding": None, "truncation": None}
_SPECIAL_FILES_OFF = {"add_bos_token": False, "add_eos_token": False}

# The tokenizers hf_tokenizer_files writes out, exactly these classes.
_CONVERTIBLE = (ByteTokenizer, SentencePieceTokenizer, HFTokenizer)


def hf_tokenizer_files(tokenizer: Tokenizer) -> dict[str, str]:
  """The files of a Hugging Face tokenizer that encodes and decodes as
  `tokenizer` does: file name -> text (tokenizer.json, and
  tokenizer_config.json naming its special tokens, which HFTokenizer and
  transformers read). bytes and sentencepiece tokenizers are converted; an
  HFTokenizer's own files are copied without what adds special tokens to,
  pads or cuts every encoding (tokenizer.json's post_processor, padding and
  truncation, tokenizer_config.json's add_bos_token / add_eos_token): a run
  encodes its text without them, so a copy with them (BERT's [CLS] ...
  [SEP], all-MiniLM's padding to 128) gave the export other ids, and other
  outputs, than the run.

  Raises:
    ValueError: a tokenizer with no such form (the generated tasks'
      symbols, or a registered tokenizer: a subclass of these, such as
      docs/extending.md's lower-casing bytes, encodes as its own code says,
      which a converted file would not).
  """
  if type(tokenizer) is HFTokenizer:
    directory = tokenizer.file.parent
    files = {"tokenizer.json": _as_the_run_encodes(tokenizer.file.read_text(), _TOKENIZER_JSON_OFF)}
    for name in HFTokenizer.SPECIAL_FILES:
      if (directory / name).exists():
        files[name] = _as_the_run_encodes((directory / name).read_text(), _SPECIAL_FILES_OFF)
    return files
  special: dict[str, object] = dict(_SPECIAL_TOKENS, mask_token="<mask>")
  if type(tokenizer) is ByteTokenizer:
    converted = _byte_tokenizer_json()
    # transformers adds the tokens this file names as special and reads them
    # as those ids where a text holds them; txf reads such a text's bytes.
    special["split_special_tokens"] = True
  elif type(tokenizer) is SentencePieceTokenizer:
    converted = _sentencepiece_tokenizer_json(tokenizer)
    special["unk_token"] = "<unk>"
  else:
    registered = isinstance(tokenizer, _CONVERTIBLE)
    what = "its own encoding" if registered else "a generated task's symbols"
    raise ValueError(f"{type(tokenizer).__name__} ({what}) has no Hugging Face tokenizer.json form")
  # The class named: AutoTokenizer otherwise takes config.json's model_type's
  # (GPTNeoXTokenizer, BertTokenizer), rebuilt from the vocabulary alone,
  # whose ids are not the run's (or which fails: BERT's lacks [UNK]).
  config = dict(
    special,
    tokenizer_class="PreTrainedTokenizerFast",
    model_max_length=int(1e30),
    clean_up_tokenization_spaces=False,
  )
  return {
    "tokenizer.json": converted.to_str(pretty=True),
    "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
  }
