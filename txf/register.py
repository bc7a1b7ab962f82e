"""Extend txf from your own code: register a choice, then name it in a config.

  import txf.models
  from txf import register

  @section()
  class LogDistanceSettings:
    log_bias_scale: float = documented("multiplies the bias", default=1.0)

  @register.position("log_distance", contributes="bias", settings=LogDistanceSettings)
  def log_distance(cfg, q_positions_BxT, k_positions_BxS, table, *, bidirectional):
    ...  # float32 [B|1, H, T, S]; cfg.settings("position").log_bias_scale

  @register.norm("scale")
  def scale_norm(layer, x_BxTxD, cfg):
    ...  # parameters through layer.param(...); cfg.norm_eps

  @register.activation("squared_relu")
  def squared_relu(x, cfg):
    ...

  @register.init("small")
  def small_init(params, cfg, key):
    ...  # the boxed parameters flax drew, redrawn as the scheme wants

  @register.lm_task("parity")
  def parity_row(rng, seq_len, num_symbols, first_id):
    ...  # (ids [seq_len + 1], target weights [seq_len])

  @register.text_source("jsonl", argument="PATH")
  def jsonl_documents(path, split, max_bytes):
    ...  # the split's documents (str), at most max_bytes of text

  @register.head("mlp_lm", tasks=("lm",), families=("decoder",), matmul_params=...)
  class MLPHead(nn.Module):  # built as MLPHead(cfg)
    cfg: ModelConfig
    @nn.compact
    def __call__(self, x_BxTxD, tokens_BxT, embedder):
      ...  # float32 logits [B, T, V]

  @register.family("parallel", tasks=("lm",), heads=("lm",), generative=True)
  class ParallelDecoder(txf.models.Decoder):  # built as ParallelDecoder(cfg)
    ...

  @register.task("prefix_lm", batches="lm")
  class PrefixLM:  # its two functions, of a batch of `batches`' fields
    def model_inputs(batch): ...  # the model's positional inputs
    def labels_and_weights(batch): ...  # (labels, float32 loss weights)

  @register.tokenizer("lower_bytes")
  def lower_bytes(spec, workdir):
    ...  # a txf.data.Tokenizer for the DataSpec (workdir: None outside a run)

  @register.decay("rsqrt_cooldown")
  def rsqrt_cooldown(phase):
    ...  # the schedule after warmup, a jax function of s = t - W (txf.runconfig.optim.DecayPhase)

  @register.tracker("jsonl_copy")
  class JsonlCopy:  # built as JsonlCopy(workdir), on process 0
    ...  # log_config, log_metrics, log_sample, log_summary, close

A config file that imports the module holding these (`import my_norm`
beside it: txf puts a config file's directory on the import path) sets
`config.model.norm = "scale"` (`config.data.task`, `config.data.tokenizer`, `config.train.decay`,
`config.train.trackers` alike) and trains with `txf-run --config=my_config.py`;
`--print_config` lists the new choices, and `model.options` holds the
values of the chosen entry's settings (`--config.model.options.log_bias_scale=2`),
as it does those of txf's own (rope's rope_base). An entry declares its
settings as a small dataclass (`settings=`; txf.fields.section and
documented give each field its default and doc, and a check() method may
refuse values), or as `options={"log_bias_scale": 1.0}` ({setting:
default}, the same without docs). Nothing in txf is edited. What each entry
receives is documented at its registry: txf.layers.positions.ENCODINGS,
txf.layers.norm (NORMS), txf.layers.feedforward (ACTIVATIONS),
txf.layers.inits (INITS), txf.data.generated (GENERATED), txf.data.text (TEXT),
txf.layers.model_config (FAMILIES: ModelFamily, HEADS: OutputHead),
txf.data.spec (TOKENIZERS), txf.runconfig.tasks (TASKS: TaskKind),
txf.runconfig.optim (DECAYS: DecayPhase), txf.runconfig.tracker_kinds
(TRACKERS: TrackerKind); docs/extending.md has a worked
example of each (most in examples/extending/). Each decorator refuses, in
one ValueError line, what would fail at the entry's first use: a function
that cannot be called as its readers call it (txf.choices.require_signature),
a class without the methods they call, a setting named as a ModelConfig field;
and a position encoding, norm, activation or head is wrapped in a check of
its result's shape (txf.choices.ShapeChecked), one line naming the entry
when the config's check first traces the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from txf.choices import (
  ShapeChecked,
  require_method_signatures,
  require_methods,
  require_signature,
  setting_defaults,
  settings_class,
  shape_checked_module,
)
from txf.data.generated import RowTask
from txf.data.spec import GENERATED, TASKS, TEXT, TOKENIZERS, CheckedTokenizer
from txf.data.text import DocumentSource
from txf.layers.feedforward import Activation
from txf.layers.model_config import (
  ACTIVATIONS,
  FAMILIES,
  HEADS,
  INITS,
  NORMS,
  ModelConfig,
  ModelFamily,
  OutputHead,
)
from txf.layers.positions import ENCODINGS, PositionEncoding
from txf.runconfig.optim import DECAYS
from txf.runconfig.tasks import TASK_FUNCTIONS, TaskKind
from txf.runconfig.tracker_kinds import TRACKERS, TrackerKind
from txf.runconfig.tracking import TRACKER_ARGUMENTS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
_KINDS = {"embedding": "embed", "rotation": "rotate", "bias": "bias"}
# The ModelConfig dimensions a position encoding may need even
# (txf.layers.model_config.ModelConfig._check_position reads these).
_EVEN = ("d_model", "head_dim")
# What each kind of position encoding is called with: (positional, keyword)
# arguments (txf.layers.embedding, txf.layers.attention).
_POSITION_ARGUMENTS = {
  "embedding": (("cfg", "positions", "table"), ()),
  "rotation": (("cfg", "x", "positions"), ()),
  "bias": (("cfg", "q_positions", "k_positions", "table"), ("bidirectional",)),
}


# What each registered function must return, from the arguments it is
# called with: (shape, its letters) for txf.choices.ShapeChecked.
def _embedding_shape(cfg: Any, positions: Any, table: Any) -> tuple[tuple[int, ...], str]:
  return (positions.shape[0], positions.shape[-1], cfg.d_model), "[B|1, T, D]"


def _rotation_shape(cfg: Any, x: Any, positions: Any) -> tuple[tuple[int, ...], str]:
  return tuple(x.shape), "x's [B, T, H, Dh]"


def _bias_shape(
  cfg: Any, q_positions: Any, k_positions: Any, table: Any, **keywords: Any
) -> tuple[tuple[int, ...], str]:
  batch = max(q_positions.shape[0], k_positions.shape[0])
  return (batch, cfg.num_heads, q_positions.shape[-1], k_positions.shape[-1]), "[B|1, H, T, S]"


def _logits_shape(head: Any, x: Any, tokens: Any, embedder: Any) -> tuple[tuple[int, ...], str]:
  return (*x.shape[:2], head.cfg.vocab_size), "[B, T, V]"


def _classes_shape(head: Any, x: Any, tokens: Any, embedder: Any) -> tuple[tuple[int, ...], str]:
  return (x.shape[0], head.cfg.num_classes), "[B, num_classes]"


def _norm_shape(layer: Any, x: Any, cfg: Any) -> tuple[tuple[int, ...], str]:
  return tuple(x.shape), "x's shape"


def _activation_shape(x: Any, cfg: Any) -> tuple[tuple[int, ...], str]:
  return tuple(x.shape), "x's shape"


_POSITION_SHAPES: dict[str, Callable[..., tuple[tuple[int, ...], str]]] = {
  "embedding": _embedding_shape,
  "rotation": _rotation_shape,
  "bias": _bias_shape,
}


def position(
  name: str,
  *,
  contributes: str,
  table: str | None = None,
  even: str | None = None,
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers the decorated function as `model.position = name`.

  Args:
    contributes: 'embedding' (fn(cfg, positions, table) -> [B|1, T, D]),
      'rotation' (fn(cfg, x [B, T, H, Dh], positions) -> x) or 'bias'
      (fn(cfg, q positions, k positions, table, *, bidirectional) -> float32
      [B|1, H, T, S]); txf.layers.positions.
    table: 'absolute' or 'relative' where it owns a learned table (a
      relative one holds t5_num_buckets rows: its settings declare that
      setting, e.g. a subclass of txf.layers.positions.T5BiasSettings).
    even: 'd_model' or 'head_dim' where that dimension must be even.
    settings: its settings dataclass, read through cfg.settings("position").
    options: or {setting: default}, read through cfg.option(setting).
    replace: replace an entry of that name.
  """
  if contributes not in _KINDS:
    raise ValueError(f"contributes: {contributes!r} is not one of {tuple(_KINDS)}")
  if even not in (None, *_EVEN):
    raise ValueError(f"even: {even!r} is not one of {_EVEN}")
  declared = setting_defaults(settings_class(ENCODINGS.field, name, settings, options))
  if table == "relative" and "t5_num_buckets" not in declared:
    raise ValueError(
      f"model.position: {name!r}: a 'relative' table holds t5_num_buckets rows; declare that "
      "setting (settings=a txf.layers.positions.T5BiasSettings subclass)"
    )

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature(
      "register.position",
      name,
      fn,
      *_POSITION_ARGUMENTS[contributes],
      declared=f", contributes={contributes!r}",
    )
    checked = ShapeChecked(
      fn,
      f"model.position {name!r}",
      _POSITION_SHAPES[contributes],
      broadcast=contributes != "rotation",
    )
    function: dict[str, Any] = {_KINDS[contributes]: checked}  # embed=, rotate= or bias=
    entry = PositionEncoding(contributes, **function, table=table, even=even)
    ENCODINGS.register(
      name, entry, settings=settings, options=options, replace=replace, provider=fn
    )
    return fn

  return add


def norm(
  name: str,
  *,
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers fn(layer, x [..., D], cfg) -> [..., D] as `model.norm = name`
  (settings / options: as `position`'s, read through cfg.settings("norm"))."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.norm", name, fn, ("layer", "x", "cfg"))
    checked = ShapeChecked(fn, f"model.norm {name!r}", _norm_shape)
    NORMS.register(name, checked, settings=settings, options=options, replace=replace)
    return fn

  return add


def init(
  name: str,
  *,
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers fn(params, cfg, key) -> params as `model.init = name`: an
  initialisation scheme, applied to the boxed parameters flax's init drew
  (txf.layers.inits.gpt2 is one); settings / options: as `position`'s."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.init", name, fn, ("params", "cfg", "key"))
    return INITS.register(name, fn, settings=settings, options=options, replace=replace)

  return add


def activation(
  name: str,
  *,
  gated: bool = False,
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers fn(x, cfg) -> act(x) as `model.activation = name`; `gated`:
  the FFN multiplies act(x W_gate) by x W_in (d_ff derived as 8/3 D);
  settings / options: as `position`'s."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.activation", name, fn, ("x", "cfg"))
    entry = Activation(
      ShapeChecked(fn, f"model.activation {name!r}", _activation_shape), gated=gated
    )
    ACTIVATIONS.register(
      name, entry, settings=settings, options=options, replace=replace, provider=fn
    )
    return fn

  return add


def lm_task(name: str, *, replace: bool = False) -> Decorator:
  """Registers a row function (rng, seq_len, num_symbols, first_id) -> (ids
  int [seq_len + 1] in [first_id, first_id + num_symbols), target weights
  bool or 0/1 [seq_len]: others are refused) as `data.name = name` with data.task 'lm'
  (txf.data.generated.RowTask; a dataset of another kind registers its own
  entry in txf.data.spec.GENERATED)."""

  def add(row: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.lm_task", name, row, ("rng", "seq_len", "num_symbols", "first_id"))
    GENERATED.register(name, RowTask(name, row), replace=replace, provider=row)
    return row

  return add


def text_source(
  name: str,
  *,
  argument: str | None = None,
  describe: Callable[[str], str] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers fn(argument, split, max_bytes) -> the split's documents (a
  list of str, at most max_bytes of text in all; None: no cap; split:
  'train', 'validation' or 'test') as `data.name = name` with data.task
  'lm' or 'mlm', tokenized by data.tokenizer (txf.data.text.DocumentSource).

  Args:
    argument: what follows '<name>:' in data.name, as its docs name it
      (e.g. 'PATH'); None: the name alone (fn gets '').
    describe: (argument) -> what the documents are, for the run's log.
    replace: replace an entry of that name.
  """

  def add(load: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.text_source", name, load, ("argument", "split", "max_bytes"))
    if describe is not None:
      require_signature("register.text_source", name, describe, ("argument",))
    described = describe or (lambda arg: f"{name}:{arg} (registered)" if arg else name)
    entry = DocumentSource(load, described, argument=argument)
    TEXT.register(name, entry, replace=replace, provider=load)
    return load

  return add


def family(
  name: str,
  *,
  tasks: tuple[str, ...],
  generative: bool = False,
  heads: tuple[str, ...] = (),
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers a linen module class as `model.family = name`.

  Args:
    tasks: the data.task values it trains; it is built as module(cfg) and
      called as txf.models.Decoder is for 'lm' and 'classify', Encoder for
      'mlm' and 'classify', EncoderDecoder for 'seq2seq'. It reads the
      Transformer fields of ModelConfig (checked as a Transformer's).
    generative: it decodes from a 'cache' collection with use_cache=True
      (txf.decode generates with it).
    heads: the model.head values it carries (e.g. txf's 'lm'; it builds
      HEADS[cfg.head].module(cfg)), besides the heads registered naming it.
    settings: its settings dataclass, read through cfg.settings("family").
    options: or {setting: default}, read through cfg.option(setting).
    replace: replace an entry of that name.
  """

  def add(module: Any) -> Any:
    _check_class("register.family", name, module)
    tasks_ = _names("register.family", name, "tasks", tasks)
    heads_ = _names("register.family", name, "heads", heads)
    entry = ModelFamily(module, tasks_, generative=generative, heads=heads_)
    FAMILIES.register(
      name, entry, settings=settings, options=options, replace=replace, provider=module
    )
    return module

  return add


def _names(where: str, name: str, argument: str, values: Any) -> tuple[str, ...]:
  """`values` as a tuple of names; ValueError for a lone string ('lm' was
  read as the tasks 'l' and 'm') or anything not a sequence of strings."""
  names = None if isinstance(values, str) else _as_tuple(values)
  if names is None or not all(isinstance(v, str) for v in names):
    raise ValueError(
      f"{where}: {name!r}: {argument} must be a tuple of names, got {values!r}"
      + (f" (write ({values!r},))" if isinstance(values, str) else "")
    )
  return names


def _as_tuple(values: Any) -> tuple[Any, ...] | None:
  """`values` as a tuple, read once (a generator too); None if not iterable."""
  try:
    return tuple(values)
  except TypeError:
    return None


def _check_class(where: str, name: str, module: Any) -> None:
  """A family or head is a linen module class, built as module(cfg)."""
  if not isinstance(module, type):
    raise ValueError(f"{where}: {name!r}: expected a linen module class, got {module!r}")


def head(
  name: str,
  *,
  tasks: tuple[str, ...],
  families: tuple[str, ...],
  matmul_params: Callable[[ModelConfig], int] | None = None,
  settings: type | None = None,
  options: Mapping[str, Any] | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers a linen module class as `model.head = name`: built as
  module(cfg), called as module(x_BxTxD, tokens_BxT, embedder) on the final
  hidden states (txf.models.output_heads).

  Args:
    tasks: the data.task values whose loss reads its output: float32 logits
      [B, T, V] for 'lm', 'mlm' and 'seq2seq', [B, num_classes] for
      'classify' (the shape checked when the model is traced, for a head of
      one of the two).
    families: the model.family values that carry it.
    matmul_params: fn(cfg) -> the matmul weights it multiplies each token
      by (its kernels, and the vocabulary projection through
      embedder.attend: D * V), which the FLOP count of a run's throughput
      (MFU) needs; a model config choosing a head that declares none is
      refused, naming it.
    settings: its settings dataclass, read through cfg.settings("head").
    options: or {setting: default}, read through cfg.option(setting).
    replace: replace an entry of that name.
  """

  def add(module: Any) -> Any:
    _check_class("register.head", name, module)
    tasks_ = _names("register.head", name, "tasks", tasks)
    families_ = _names("register.head", name, "families", families)
    if matmul_params is not None:
      require_signature("register.head", name, matmul_params, ("cfg",))
    # The output's shape follows its tasks: one of both kinds is not checked.
    shapes = {_classes_shape if task == "classify" else _logits_shape for task in tasks_}
    built = module
    if len(shapes) == 1:
      built = shape_checked_module(module, f"model.head {name!r}", shapes.pop())
    entry = OutputHead(built, tasks_, families_, matmul_params)
    HEADS.register(
      name, entry, settings=settings, options=options, replace=replace, provider=module
    )
    return module

  return add


def tokenizer(name: str, *, replace: bool = False) -> Decorator:
  """Registers fn(spec, workdir) -> a txf.data.Tokenizer as `data.tokenizer =
  name`, the tokenizer of the text datasets (spec: the checked
  txf.data.DataSpec; workdir: the run's work directory, where a tokenizer
  trained on the data is kept, or None outside a run). Built once a run, by
  txf.data.make_tokenizer, which refuses a result that is not a Tokenizer;
  txf's bytes, sentencepiece and hf are its entries too."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.tokenizer", name, fn, ("spec", "workdir"))
    TOKENIZERS.register(name, CheckedTokenizer(name, fn), replace=replace, provider=fn)
    return fn

  return add


def decay(name: str, *, replace: bool = False) -> Decorator:
  """Registers fn(phase) -> the learning rate after warmup as `train.decay =
  name`: phase, a txf.runconfig.optim.DecayPhase (peak, end_fraction, warmup W,
  steps D), the result a jax function of s = t - W, s >= 0 (an optax schedule;
  warmup before it is txf's; the run config's check traces it once at an
  int32 scalar s and refuses a result that does not trace to a float
  scalar: txf.runconfig.optim.make_schedule). It raises ValueError naming a train field
  whose value it cannot take (rsqrt: train.warmup_steps = 0)."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    require_signature("register.decay", name, fn, ("phase",))
    return DECAYS.register(name, fn, replace=replace)

  return add


def tracker(
  name: str,
  *,
  check: Callable[[Any], None] | None = None,
  package: str | None = None,
  install: str | None = None,
  replace: bool = False,
) -> Decorator:
  """Registers a class or function (workdir) -> a tracker as a
  `train.trackers` name: an object with txf.runconfig.tracking.Tracker's methods
  (log_config, log_metrics, log_sample, log_summary, close), started on
  process 0 with the run's work directory (an etils.epath.Path).

  Args:
    check: fn(workdir) raising ValueError naming what is missing, where the
      tracker could not start there (a login): run before anything is written.
    package: the module it imports that txf does not install; a run naming
      the tracker without it is a config error saying how to install it.
    install: that command (None: 'pip install <package>').
    replace: replace an entry of that name.
  """

  def add(start: Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(start, type):  # a function's tracker is checked when it starts
      require_method_signatures(TRACKERS.field, name, start, TRACKER_ARGUMENTS)
    require_signature("register.tracker", name, start, ("workdir",))
    if check is not None:
      require_signature("register.tracker", name, check, ("workdir",))
    entry = TrackerKind(start, check=check, package=package, install=install)
    TRACKERS.register(name, entry, replace=replace, provider=start)
    return start

  return add


def task(
  name: str,
  *,
  batches: str,
  causal_lm: bool = False,
  perplexity: bool = False,
  per_example: bool = False,
  replace: bool = False,
) -> Decorator:
  """Registers a class (or any object) with model_inputs(batch) -> the
  model's positional inputs and labels_and_weights(batch) -> (labels,
  float32 loss weights) as `data.task = name`: a task kind
  (txf.runconfig.tasks.TaskKind), trained with the weighted cross-entropy of
  the model's logits against its labels unless it has its own
  loss_sums(logits, labels, weights, *, label_smoothing, z_loss) and
  metric_sums(logits, labels, weights) (TaskKind's hooks).

  Args:
    batches: the batch format it reads, 'lm', 'mlm', 'seq2seq' or
      'classify' (txf/data/__init__.py): the datasets giving it and the
      model families and heads training that task serve it.
    causal_lm: its model predicts each token from those before it only:
      evaluations sample, length extrapolation and decode compilation apply.
    perplexity: evaluations report eval_perplexity.
    per_example: one label per example (throughput counts examples).
    replace: replace an entry of that name.
  """

  def add(kind: Any) -> Any:
    require_methods(TASKS.field, name, kind, TASK_FUNCTIONS)
    for function in TASK_FUNCTIONS:
      require_signature("register.task", name, getattr(kind, function), ("batch",))
    if hasattr(kind, "loss_sums"):
      require_signature(
        "register.task",
        name,
        kind.loss_sums,
        ("logits", "labels", "weights"),
        ("label_smoothing", "z_loss"),
      )
    if hasattr(kind, "metric_sums"):
      require_signature("register.task", name, kind.metric_sums, ("logits", "labels", "weights"))
    entry = TaskKind(
      batches,
      kind.model_inputs,
      kind.labels_and_weights,
      causal_lm=causal_lm,
      perplexity=perplexity,
      per_example=per_example,
      **{hook: getattr(kind, hook) for hook in ("loss_sums", "metric_sums") if hasattr(kind, hook)},
    )
    TASKS.register(name, entry, replace=replace, provider=kind)
    return kind

  return add
