"""`ModelConfig`: the validated, immutable form of a config's `model` section.

Every model option is one field here (x-transformers style: one field per
feature, conflicting options rejected); the settings of a chosen registry
entry (RoPE's base, T5's buckets, a registered encoding's own) live in
`model.options`, and `cfg.settings("position")` reads them typed.
`ModelConfig.from_config` turns an `ml_collections.ConfigDict` (or a plain
dict) into this dataclass, rejecting unknown fields and impossible
combinations with a `ValueError` that names the field, before any parameter
is created.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from txf import checks
from txf.choices import Registry, reserve_setting_names, setting_defaults, share_settings
from txf.fields import documented, section
from txf.layers import positions
from txf.ops.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS


@dataclasses.dataclass(frozen=True)
class ModelFamily:
  """A `model.family` entry (txf.register.family).

  Attributes:
    module: the linen module class, built as module(cfg) (a ModelConfig):
      called like txf.models.Decoder for data.task 'lm' and 'classify'
      (tokens [B, T] -> its head's output), like Encoder for 'mlm' and
      'classify', like EncoderDecoder for 'seq2seq'.
    tasks: the data.task values it trains.
    generative: it continues from a 'cache' collection when called with
      use_cache=True (txf.decode generates with it).
    heads: the model.head values it carries beyond those whose entry names
      it (a registered family carrying txf's 'lm' head).
  """

  module: Any
  tasks: tuple[str, ...]
  generative: bool = False
  heads: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class OutputHead:
  """A `model.head` entry (txf.register.head).

  Attributes:
    module: the linen module class, built as module(cfg) and called as
      module(x_BxTxD, tokens_BxT, embedder) on the final hidden states
      (tokens_BxT: the model's input ids, embedder: its token Embedder);
      returns float32 logits: [B, T, V] for data.task 'lm', 'mlm' and
      'seq2seq', [B, num_classes] for 'classify'. None: the model returns
      its final hidden states [B, T, D].
    tasks: the data.task values whose loss reads its output.
    families: the model.family values that carry it.
    matmul_params: fn(cfg) -> the matmul weights it multiplies each token by
      (txf.analysis.counts.matmul_params, for a run's FLOPs per token and
      MFU); None: not declared, and a ModelConfig choosing it is refused,
      naming model.head.
  """

  module: Any
  tasks: tuple[str, ...]
  families: tuple[str, ...]
  matmul_params: Callable[[Any], int] | None = None


# The registries user code extends (txf.register). txf's own entries are
# registered by the module each names (imported when the registry is first
# read: those modules import this one), the positions' in their own module.
FAMILIES: Registry[ModelFamily] = Registry("model.family", builtins="txf.models")
HEADS: Registry[OutputHead] = Registry("model.head", builtins="txf.models")
POSITIONS = positions.ENCODINGS
ACTIVATIONS: Registry[Any] = Registry("model.activation", builtins="txf.layers.feedforward")
NORMS: Registry[Any] = Registry("model.norm", builtins="txf.layers.norm")
NORM_PLACEMENTS = ("pre", "post")
POOLINGS = ("cls", "mean", "max", "last")
DTYPES = ("float32", "bfloat16", "float16")
# How attention weighs its keys (txf.layers.attention.MultiHeadAttention).
ATTENTION_WEIGHTINGS = ("softmax", "linear")
# Initialisation schemes: (params, cfg, key) -> params, registered by
# txf.layers.inits (and user code: txf.register.init).
INITS: Registry[Any] = Registry("model.init", builtins="txf.layers.inits")
# The fields whose entries user code registers (and whose chosen entries'
# settings model.options holds).
REGISTRY_FIELDS: dict[str, Registry[Any]] = {
  "family": FAMILIES,
  "head": HEADS,
  "position": POSITIONS,
  "norm": NORMS,
  "activation": ACTIVATIONS,
  "init": INITS,
}
# model.options holds one value per setting name, whichever entries are chosen.
share_settings(*REGISTRY_FIELDS.values())
# The string fields with a set of values (--print_config lists them); a
# Registry's grows as user code registers entries (txf.register).
CHOICES: dict[str, Iterable[str | None]] = {
  "family": FAMILIES,
  "position": POSITIONS,
  "activation": ACTIVATIONS,
  "norm": NORMS,
  "norm_placement": NORM_PLACEMENTS,
  "head": HEADS,
  "pooling": POOLINGS,
  "dtype": DTYPES,
  "attention_impl": ATTENTION_IMPLEMENTATIONS,
  "attention": ATTENTION_WEIGHTINGS,
  "init": INITS,
}
# The fields that are True or False (scale_logits may also be None).
BOOL_FIELDS = (
  "gelu_approximate",
  "embed_norm",
  "scale_attention",
  "use_bias",
  "tie_embeddings",
  "share_embeddings",
  "remat",
  "scan_layers",
)


def family_heads(family: str) -> tuple[str, ...]:
  """The model.head values model.family `family` can carry: those whose
  entry names the family, and those the family's entry names."""
  named = FAMILIES[family].heads
  return tuple(name for name, head in HEADS.items() if family in head.families or name in named)


def declared_settings(choices: Mapping[str, str]) -> dict[str, Any]:
  """{setting: default} of the settings the chosen entries ({registry field:
  name}) declare."""
  declared: dict[str, Any] = {}
  for field, name in choices.items():
    declared.update(REGISTRY_FIELDS[field].options(name))
  return declared


def entry_settings(choices: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
  """{registry field: its chosen entry's settings instance, from `values`},
  each checked (a number finite, then its check(), where it has one), for
  the entries that have settings."""
  built = {}
  for field, name in choices.items():
    settings = REGISTRY_FIELDS[field].settings(name)
    if settings is not None:
      given = {f.name: values[f.name] for f in dataclasses.fields(settings)}
      for setting, value in given.items():
        # NaN passes every bound a check() compares it with (each comparison
        # is False), and few checks think of infinity: refused for every
        # entry, as a float field of the config is.
        if isinstance(value, numbers.Real) and not math.isfinite(value):
          raise ValueError(f"model.options.{setting}: must be a finite number, got {value!r}")
      built[field] = settings(**given)
      if hasattr(built[field], "check"):
        built[field].check()
  return built


def default_options() -> dict[str, Any]:
  """{setting: default} of every setting the registered entries declare
  (rope's rope_base, ..., t5_bias' t5_max_distance, and those of entries
  user code registered before: a config file's imports): the model.options
  a config starts from (configs/base.py), so the command line can set each
  one. ModelConfig keeps the chosen entries' only (_check_options)."""
  return {
    setting: default
    for registry in REGISTRY_FIELDS.values()
    for name in registry
    for setting, default in setting_defaults(registry.settings(name)).items()
  }


def setting_owners(setting: str) -> str:
  """The registered entries declaring `setting`, e.g. "model.position 'rope',
  'rope_ntk'" ('' for none)."""
  owners = {
    registry.field: [repr(name) for name in registry if setting in registry.options(name)]
    for registry in REGISTRY_FIELDS.values()
  }
  return "; ".join(f"{field} {', '.join(names)}" for field, names in owners.items() if names)


def setting_docs() -> dict[str, str]:
  """{setting: the entries declaring it, then its doc} of every registered
  entry's settings ("model.position 'rope', 'rope_ntk': wavelength base ..."),
  for --print_config."""
  docs: dict[str, str] = {}
  for registry in REGISTRY_FIELDS.values():
    for name in registry:
      settings = registry.settings(name)
      for field in dataclasses.fields(settings) if settings is not None else ():
        doc = field.metadata.get("doc")
        docs[field.name] = setting_owners(field.name) + (f": {doc}" if doc else "")
  return docs


# Former ModelConfig fields that are now settings of their entries, under
# the same names: model.X -> model.options.X (rope's and rope_ntk's, t5_bias').
# A run's config.json written before is read with them moved
# (txf.rundir.resume); a config given today naming one is refused.
MOVED_TO_OPTIONS = ("rope_base", "rope_scale", "t5_num_buckets", "t5_max_distance")


# Fields that change how the model computes -- its dropout, compute dtype,
# attention kernel, recomputation -- not its parameters: a resumed run and a
# train.init_from start may set them apart from the checkpoint they read
# (txf.rundir.resume, txf.train.pretrained).
COMPUTE_FIELDS = ("dropout_rate", "attention_dropout_rate", "dtype", "attention_impl", "remat")


# The heads of a language model, which read neither model.pooling nor
# model.num_classes (the classify head's).
LANGUAGE_MODEL_HEADS = ("lm", "mlm")
# Fields that None derives from others (ModelConfig._resolve); replace()
# derives them again unless they were given explicitly.
DERIVED_FIELDS = ("num_kv_heads", "head_dim", "d_ff", "scale_logits", "num_decoder_layers")

# The fields an LSTM language model (family='lstm', txf/models/lstm.py) reads;
# d_model is both its embedding and its hidden width, norm/norm_eps its final
# norm's. Every other field describes a Transformer (attention, positions,
# block norms, FFN, layer scan) and must keep its default with family='lstm'.
LSTM_FIELDS = (
  "family",
  "vocab_size",
  "d_model",
  "num_layers",
  "norm",
  "norm_eps",
  "dropout_rate",
  "tie_embeddings",
  "scale_logits",  # of the tied logits, as a Transformer's
  "head",
  "pad_id",
  "dtype",
  "options",  # those of a registered norm
)


class Options(dict):
  """model.options once checked: a dict (it converts to and from config
  sections and JSON as one) that hashes, as the frozen ModelConfig does."""

  def __hash__(self) -> int:  # type: ignore[override]
    return hash(tuple(sorted(self.items())))


@section()
class ModelConfig:
  """Hyperparameters of every txf model. Each field's doc (txf.fields) is the
  config reference `--print_config` prints.

  A field documented `None: X` is set to X at construction, so models read
  `cfg.num_kv_heads`, `cfg.head_dim`, `cfg.d_ff`, `cfg.scale_logits`,
  `cfg.num_decoder_layers` (None only outside encoder_decoder) and never a None.
  family='lstm' reads only LSTM_FIELDS and leaves the derived Transformer
  fields None.
  """

  family: str = documented(
    "decoder | encoder | encoder_decoder | lstm (txf.models) or a registered one", default="decoder"
  )
  vocab_size: int = documented(
    "token ids the embedding holds (a run config's None: the tokenizer's)", default=260
  )
  d_model: int = documented("width of the residual stream and embeddings", default=128)
  num_heads: int = documented("attention (query) heads", default=4)
  num_kv_heads: int | None = documented("None: = num_heads (MHA); 1: MQA; else GQA", default=None)
  head_dim: int | None = documented("None: d_model // num_heads", default=None)
  num_layers: int = documented("layers per stack", default=2)
  num_decoder_layers: int | None = documented(
    "encoder_decoder only; None: num_layers", default=None
  )
  d_ff: int | None = documented(
    "None: 4*d_model, or 8/3*d_model rounded up to a multiple of 8 if gated", default=None
  )
  activation: str = documented("relu | gelu | swiglu | geglu", default="gelu")
  gelu_approximate: bool = documented(
    "GELUs' tanh form (GPT-2, T5 v1.1); False: exact erf (BERT)", default=True
  )
  position: str = documented("a txf.layers.positions.ENCODINGS name", default="rope")
  max_len: int = documented(
    "a learned position table's size, so the longest sequence and KV cache it takes (other "
    "encodings: no limit of their own)",
    default=512,
  )
  norm: str = documented("layer | rms", default="layer")
  norm_eps: float = documented("added to the variance in every norm", default=1e-6)
  norm_placement: str = documented("pre: x + f(norm(x)); post: norm(x + f(x))", default="pre")
  embed_norm: bool = documented("a model.norm on the embedding sum (BERT, RoBERTa)", default=False)
  num_token_types: int = documented(
    "encoder: token-type (segment) embeddings (BERT: 2); 0: none", default=0
  )
  scale_attention: bool = documented("scores x head_dim^-0.5; False: unscaled (T5)", default=True)
  use_bias: bool = documented("biases on attention and FFN projections", default=False)
  dropout_rate: float = documented("residual and embedding dropout", default=0.0)
  attention_dropout_rate: float = documented("dropout on attention weights", default=0.0)
  tie_embeddings: bool = documented("output projection = token embedding^T", default=True)
  scale_logits: bool | None = documented(
    "logits x d_model^-0.5; None: when tied (T5 v1.0); GPT-2: False", default=None
  )
  share_embeddings: bool = documented("encoder_decoder: one table for both stacks", default=True)
  window: int | None = documented("sliding-window attention span", default=None)
  head: str = documented(
    "lm | mlm | classify | none (returns the hidden states) or a registered one", default="lm"
  )
  num_classes: int = documented("classify head only", default=2)
  pooling: str = documented("classify head: cls | mean | max | last", default="cls")
  pad_id: int = documented("the padding token id", default=0)
  init: str = documented(
    "initialisation: txf (each layer's own) | gpt2 (N(0, 0.02), residual / sqrt(2L))", default="txf"
  )
  dtype: str = documented("compute dtype; parameters stay float32", default="float32")
  attention: str = documented(
    "softmax | linear (elu+1 features, Katharopoulos et al. 2020: a fixed-size state per head)",
    default="softmax",
  )
  attention_impl: str | None = documented(
    "None (best available) | xla | cudnn | chunked (O(T) memory)", default=None
  )
  options: Mapping[str, Any] = documented(
    "{setting: value} of the chosen family, head, position, norm, activation and init "
    "(e.g. rope_base); each entry declares its own (cfg.settings)",
    default_factory=default_options,
  )
  remat: bool = documented("recompute block activations in backward", default=False)
  scan_layers: bool = documented("nn.scan over layers: compile time O(1) in depth", default=False)

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | Any) -> ModelConfig:
    """Builds and validates from a ConfigDict / dict; unknown fields fail."""
    items = dict(config.items()) if hasattr(config, "items") else dict(vars(config))
    moved = [name for name in MOVED_TO_OPTIONS if name in items]
    if moved:
      raise ValueError(f"model.{moved[0]}: moved to model.options.{moved[0]}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(f"model.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    return cls(**items)

  def __post_init__(self) -> None:
    # The derived fields given explicitly, and the chosen entries' settings
    # (field -> instance). frozen: only __post_init__ may set; not fields, so
    # equality ignores them (declared here, not in the class body).
    self._explicit: frozenset[str]
    self._settings: dict[str, Any]
    object.__setattr__(
      self,
      "_explicit",
      frozenset(name for name in DERIVED_FIELDS if getattr(self, name) is not None),
    )
    for name, choices in CHOICES.items():
      checks.choice(getattr(self, name), f"model.{name}", choices)
    self._check_options()
    for name in ("d_model", "num_heads", "num_layers", "max_len", "num_classes"):
      checks.positive_int(getattr(self, name), f"model.{name}")
    for name in ("num_kv_heads", "head_dim", "d_ff", "window", "num_decoder_layers"):
      checks.optional_positive_int(getattr(self, name), f"model.{name}")
    for name in BOOL_FIELDS:
      checks.boolean(getattr(self, name), f"model.{name}")
    if self.scale_logits is not None:
      checks.boolean(self.scale_logits, "model.scale_logits")
    # NaN or a negative eps passes everything until the first step diverges.
    checks.finite_at_least(self.norm_eps, "model.norm_eps", 0.0, open_=True)
    checks.int_at_least(self.pad_id, "model.pad_id", 0)
    if self.family == "lstm":
      self._check_lstm()  # none of the Transformer checks below apply
      self._resolve()
      return
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
        f"model.num_heads: {self.num_heads} does not divide model.d_model={self.d_model} "
        "(set model.head_dim to decouple them)"
      )
    if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"model.num_kv_heads: {self.num_kv_heads} does not divide model.num_heads={self.num_heads}"
      )
    self._check_position()
    self._check_linear_attention()
    self._check_cudnn()
    self._check_head()
    if self.family == "decoder" and self.head == "classify" and self.pooling == "cls":
      raise ValueError(
        "model.pooling: 'cls' on a causal decoder pools a token that saw only "
        "itself; use 'last' (or 'mean'/'max')"
      )
    checks.int_at_least(self.num_token_types, "model.num_token_types", 0)
    if self.num_token_types and self.family != "encoder":
      raise ValueError(
        f"model.num_token_types: only family='encoder' takes token types, not {self.family!r}"
      )
    if not self.gelu_approximate and not ACTIVATIONS[self.activation].gelu and self.head != "mlm":
      raise ValueError(
        f"model.gelu_approximate: False changes nothing: no GELU in "
        f"model.activation={self.activation!r} or model.head={self.head!r}"
      )
    if self.num_decoder_layers is not None and self.family != "encoder_decoder":
      raise ValueError("model.num_decoder_layers: only applies to family='encoder_decoder'")
    if not self.share_embeddings and self.family != "encoder_decoder":
      raise ValueError(
        "model.share_embeddings: False changes nothing: only family='encoder_decoder' has "
        "two embedding tables to share"
      )
    self._check_classify_fields()
    checks.fraction(self.dropout_rate, "model.dropout_rate")
    checks.fraction(self.attention_dropout_rate, "model.attention_dropout_rate")
    self._check_vocabulary()
    self._resolve()

  def _choices(self) -> dict[str, str]:
    """{registry field: the chosen entry} (family, head, position, ...)."""
    return {field: getattr(self, field) for field in REGISTRY_FIELDS}

  def _check_options(self) -> None:
    """model.options keeps the settings of the chosen entries, their
    defaults filling the rest, as `Options` (a dict that hashes); each
    entry's settings are built and checked. A setting only an entry not
    chosen declares is dropped (a config section holds every built-in one:
    default_options; a sweep over model.position keeps t5_bias' settings
    for its rope points); one no registered entry declares is an error."""
    if not hasattr(self.options, "items"):
      raise ValueError(
        f"model.options: expected a mapping of settings, got {type(self.options).__name__}"
      )
    given = dict(self.options.items())
    declared = declared_settings(self._choices())
    for name in given:
      if name not in declared and not setting_owners(name):
        raise ValueError(
          f"model.options.{name}: not a setting of any registered family, head, position, norm, "
          f"activation or init (the chosen ones': {sorted(declared) or 'none'})"
        )
    values = {name: given.get(name, default) for name, default in declared.items()}
    object.__setattr__(self, "options", Options(sorted(values.items())))
    object.__setattr__(self, "_settings", entry_settings(self._choices(), values))

  def settings(self, field: str) -> Any:
    """The settings of the chosen entry of registry field `field` (e.g.
    'position': a txf.layers.positions.RopeSettings for rope), or None for an
    entry registered without any."""
    if field not in REGISTRY_FIELDS:
      raise ValueError(f"settings: {field!r} is not one of {tuple(REGISTRY_FIELDS)}")
    return self._settings.get(field)

  def option(self, name: str) -> Any:
    """The value of the chosen entries' setting `name` (model.options)."""
    values = dict(self.options)
    if name not in values:
      raise ValueError(f"model.options.{name}: not a setting of this model (has {sorted(values)})")
    return values[name]

  @property
  def _head_dim(self) -> int:
    """head_dim as given or as _resolve will derive it (the checks run before)."""
    return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

  def _check_position(self) -> None:
    """What the registry entry of model.position needs: an even dimension,
    as large as it needs (its settings check themselves: _check_options),
    and of t5_bias in a family that generates, what its causal stack needs."""
    encoding = positions.encoding(self.position)
    dims = dict(d_model=self.d_model, head_dim=self._head_dim)
    if encoding.even is not None and dims[encoding.even] % 2:
      raise ValueError(
        f"model.position: {self.position} needs an even {encoding.even}, got {dims[encoding.even]}"
      )
    if encoding.even is not None and dims[encoding.even] < encoding.at_least:
      raise ValueError(
        f"model.position: {self.position} needs {encoding.even} >= {encoding.at_least}, "
        f"got {dims[encoding.even]}"
      )
    settings = self.settings("position")
    if isinstance(settings, positions.T5BiasSettings) and FAMILIES[self.family].generative:
      settings.check_causal()  # an encoder's stack is bidirectional alone: check() holds

  def _check_linear_attention(self) -> None:
    """attention='linear' weighs keys by positive features, so an additive
    score bias (ALiBi, T5) has nothing to add to, and only the XLA path
    (txf.ops.linear_attention) computes it."""
    if self.attention != "linear":
      return
    if positions.encoding(self.position).bias is not None:
      raise ValueError(
        f"model.attention: 'linear' takes no additive position bias (model.position="
        f"{self.position!r} adds one); use one that rotates q and k or embeds positions"
      )
    if self.attention_impl not in (None, "xla"):
      raise ValueError(
        f"model.attention_impl: {self.attention_impl!r} computes softmax attention; "
        "model.attention='linear' runs only as None or 'xla'"
      )

  def _check_cudnn(self) -> None:
    """attention_impl='cudnn' where no device could run it: cuDNN takes
    bfloat16 / float16 and head dims that are multiples of 8 up to 256, and
    only a causal window (every call failed in txf.ops.attention, naming
    neither field). Whether a GPU is there is the call's to say."""
    if self.attention_impl != "cudnn":
      return
    if self.dtype not in ("bfloat16", "float16"):
      raise ValueError(
        f"model.attention_impl: 'cudnn' takes bfloat16 or float16, not model.dtype={self.dtype!r}"
      )
    if self._head_dim % 8 or self._head_dim > 256:
      raise ValueError(
        f"model.attention_impl: 'cudnn' takes head dims that are multiples of 8 up to 256, "
        f"not {self._head_dim} (model.head_dim, or d_model // num_heads)"
      )
    if self.window is not None and self.family != "decoder":
      raise ValueError(
        f"model.attention_impl: 'cudnn' takes only a causal window; family={self.family!r} "
        f"attends both ways within model.window={self.window}"
      )

  def _check_head(self) -> None:
    """model.head: a registered head that fits model.family and declares its
    matmul_params, which the run's FLOPs per token need (found here, in one
    line, not at the run's start)."""
    if HEADS[self.head].matmul_params is None:  # an unknown head: the registry's error
      raise ValueError(
        f"model.head: {self.head!r} declares no matmul_params (txf.register.head), so the "
        "FLOPs per token of a model with it are not known"
      )
    fitting = family_heads(self.family)
    if self.head not in fitting:
      choose = (
        f"choose from {fitting}"
        if fitting
        else "it carries none: register.family(..., heads=('lm',)) or register.head(..., "
        f"families=({self.family!r},)) names one"
      )
      raise ValueError(
        f"model.head: {self.head!r} does not fit model.family={self.family!r} ({choose})"
      )

  def _check_classify_fields(self) -> None:
    """model.pooling and model.num_classes given to a language-model head
    (lm, mlm), which reads neither: a config recording them would claim a
    setting the run never used. ('none' keeps them: txf-embed reads a
    classify run's hidden states through it.)"""
    if self.head not in LANGUAGE_MODEL_HEADS:
      return
    for name in ("pooling", "num_classes"):
      default = type(self).__dataclass_fields__[name].default
      if getattr(self, name) != default:
        raise ValueError(
          f"model.{name}: {getattr(self, name)!r} changes nothing: only the classify head "
          f"reads it, not model.head={self.head!r} (keep its default {default!r})"
        )

  def _check_lstm(self) -> None:
    """family='lstm': only LSTM_FIELDS may differ from their defaults. The
    derived Transformer fields (num_kv_heads, head_dim, d_ff) stay None;
    scale_logits is resolved as a Transformer's."""
    for field in dataclasses.fields(self):
      if field.name not in LSTM_FIELDS and getattr(self, field.name) != field.default:
        raise ValueError(
          f"model.{field.name}: does not apply to model.family='lstm' (keep its default "
          f"{field.default!r}; an LSTM reads only {', '.join(LSTM_FIELDS)})"
        )
    for name, default in POSITIONS.options(self.position).items():
      if self.options[name] != default:
        raise ValueError(
          f"model.options.{name}: does not apply to model.family='lstm', which has no "
          f"model.position (keep its default {default!r})"
        )
    self._check_head()
    checks.fraction(self.dropout_rate, "model.dropout_rate")
    self._check_vocabulary()

  def _check_vocabulary(self) -> None:
    """model.vocab_size, and model.pad_id within it; nothing while the
    vocabulary is not known yet (a run config's None: `with_vocabulary`)."""
    if self.vocab_size is None:
      return
    checks.positive_int(self.vocab_size, "model.vocab_size")
    if not 0 <= self.pad_id < self.vocab_size:
      raise ValueError(f"model.pad_id: {self.pad_id} outside the vocabulary [0, {self.vocab_size})")

  @property
  def masks_padding(self) -> bool:
    """Its forward pass treats every token equal to model.pad_id as padding:
    an encoder's and an encoder-decoder's source keys, and the classify
    head's pooling."""
    return self.family in ("encoder", "encoder_decoder") or self.head == "classify"

  def check_padding(self, pad_id: int, eos_id: int) -> None:
    """For a model that `masks_padding`: model.pad_id must be the id the
    data pad with (the tokenizer's `pad_id`), and that id must be a padding
    token of its own, not its eos (a tokenizer.json without a pad token
    pads with its eos, GPT-2's 50256); otherwise real tokens would be
    masked, or padding attended, without a word.

    Raises:
      ValueError: naming model.pad_id or data.tokenizer.
    """
    if not self.masks_padding:
      return
    if self.pad_id != pad_id:
      raise ValueError(
        f"model.pad_id: {self.pad_id} is not the tokenizer's padding id {pad_id}, which the "
        f"data pad with; this model masks every token equal to model.pad_id "
        f"(set --config.model.pad_id={pad_id})"
      )
    if pad_id == eos_id:
      raise ValueError(
        f"data.tokenizer: its padding id {pad_id} is its eos token (it has no pad token of "
        "its own); this model masks every token equal to model.pad_id, so it would mask the "
        "documents' eos tokens: use a tokenizer with a pad token"
      )

  def with_vocabulary(self, vocab_size: int, num_classes: int | None = None) -> ModelConfig:
    """This config for a tokenizer of `vocab_size` ids: a model.vocab_size of
    None becomes it, a given one must hold it; `num_classes` (a
    classification dataset's labels; None: kept) becomes model.num_classes.
    Only these fields are checked again: the others are as checked already.

    Raises:
      ValueError: naming model.vocab_size or model.pad_id.
    """
    if self.vocab_size is not None and self.vocab_size < vocab_size:
      raise ValueError(
        f"model.vocab_size: {self.vocab_size} is smaller than the tokenizer's {vocab_size} ids"
      )
    fitted = copy.copy(self)
    # frozen: set on the new copy, as __post_init__ sets the derived fields.
    object.__setattr__(fitted, "vocab_size", self.vocab_size or vocab_size)
    if num_classes is not None:
      object.__setattr__(fitted, "num_classes", num_classes)
    fitted._check_vocabulary()
    return fitted

  def _resolve(self):
    """Fills the None fields with their derived values, once: each quantity
    then has one name (cfg.num_kv_heads, cfg.head_dim, cfg.d_ff, ...)."""
    resolved: dict[str, Any] = dict(scale_logits=self.tie_embeddings)
    if self.family != "lstm":  # the LSTM has none of the Transformer's derived fields
      resolved.update(
        num_kv_heads=self.num_heads,
        head_dim=self.d_model // self.num_heads,
        d_ff=self._default_d_ff(),
      )
    if self.family == "encoder_decoder":
      resolved["num_decoder_layers"] = self.num_layers
    for name, value in resolved.items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)  # frozen: only __post_init__ may set

  def _default_d_ff(self) -> int:
    if ACTIVATIONS[self.activation].gated:
      # 8/3 keeps a gated FFN's parameter count equal to an ungated 4x one
      # (Shazeer 2020); rounded up to a multiple of 8 for the matrix units.
      return -(-8 * self.d_model // 3 // 8) * 8
    return 4 * self.d_model

  def replace(self, **changes) -> ModelConfig:
    """A copy with `changes`. Derived fields (DERIVED_FIELDS) given explicitly
    to this config or in `changes` keep their values; the others derive again
    from the new fields (replace(d_model=256) doubles a derived d_ff).
    `options` in `changes` sets the settings it names; the others keep their
    values where the new choices still read them (replace(options={'rope_base':
    500.0}) keeps rope_scale; replace(position='alibi') drops rope's settings)."""
    rederived = {name: None for name in DERIVED_FIELDS if name not in self._explicit}
    options = {**self.options, **changes.pop("options", {})}
    return dataclasses.replace(self, **{**rederived, **changes, "options": options})


# A setting named as a field would sit beside it (model.d_model and
# model.options.d_model): refused at registration.
reserve_setting_names(
  {
    field.name: f"a ModelConfig field (model.{field.name})"
    for field in dataclasses.fields(ModelConfig)
  },
  *REGISTRY_FIELDS.values(),
)

T = TypeVar("T")


def derived(value: T | None) -> T:
  """A derived field (DERIVED_FIELDS) of a Transformer config, which
  __post_init__ has filled (never None there), typed without the None."""
  assert value is not None, "a derived ModelConfig field read on an LSTM config"
  return value
