"""The generated datasets: each `data.name` one entry of txf.data.spec.GENERATED.

An entry says which `data.task` values it gives, reads and checks its own
fields of the `data` section, and makes its tokenizer, its batches and a
line describing it (the GeneratedTask protocol). txf registers its own here;
user code registers an `lm` task from a row function with
`txf.register.lm_task` (a RowTask), or any entry with
`txf.data.spec.GENERATED.register(name, entry)`.

  copy, reverse, sort, addition   Seq2SeqTask  (synthetic.py)
  listops                         ListOpsTask  (listops.py)
  induction                       InductionTask (incontext.py)
  mqar                            MQARTask     (incontext.py)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from txf.data import incontext, listops, synthetic
from txf.data.spec import GENERATED, DataSpec, int_field, required
from txf.data.tokenizers import Tokenizer


def _example_lengths(seq_len: int, min_len: int, max_len: int) -> dict[str, Any]:
  """The example-length fields, checked: min_example_len <= max_example_len,
  and the longest example fits seq_len with one token more (BOS before a
  listops expression, EOS after a target)."""
  if min_len > max_len:
    raise ValueError(f"data.min_example_len={min_len} exceeds data.max_example_len={max_len}")
  if max_len + 1 > seq_len:
    raise ValueError(
      f"data.seq_len={seq_len} is too small for data.max_example_len={max_len}: it needs one more"
    )
  return dict(min_example_len=min_len, max_example_len=max_len)


def _lengths_line(spec: DataSpec) -> str:
  """The log line of a task whose examples span min_example_len .. max_example_len tokens."""
  return (
    f"{spec.name} task, {spec.min_example_len}..{spec.max_example_len} tokens, "
    f"seq_len {spec.seq_len}"
  )


class _SymbolLMTask:
  """An `lm` task over data.num_symbols content ids (incontext.symbol_tokenizer)."""

  tasks: ClassVar[tuple[str, ...]] = ("lm",)
  num_classes: ClassVar[int | None] = None

  def tokenizer(self, spec: DataSpec) -> Tokenizer:
    return incontext.symbol_tokenizer(required(spec.num_symbols))


@dataclasses.dataclass(frozen=True)
class Seq2SeqTask:
  """A generated seq2seq task (synthetic.py): sources of min_example_len ..
  max_example_len symbols, `min_source_len` the shortest it can generate."""

  name: str
  min_source_len: int
  tasks: ClassVar[tuple[str, ...]] = ("seq2seq",)
  num_classes: ClassVar[int | None] = None

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    max_len = int_field(data, "max_example_len", 1)
    min_len = int_field(data, "min_example_len", self.min_source_len)
    return _example_lengths(data["seq_len"], min_len, max_len)

  def tokenizer(self, spec: DataSpec) -> Tokenizer:
    return synthetic.seq2seq_tokenizer(self.name)

  def source(self, spec: DataSpec, split: str, seed: int) -> synthetic.GeneratedSource:
    return synthetic.Seq2SeqSource(
      self.name,
      seed=seed,
      split=split,
      seq_len=spec.seq_len,
      min_len=required(spec.min_example_len),
      max_len=required(spec.max_example_len),
    )

  def describe(self, spec: DataSpec) -> str:
    return _lengths_line(spec)


def _check_listops_acceptance(min_len: int, max_len: int, depth: int) -> None:
  """Refuses a length range too few expressions fall in (listops.MIN_ACCEPTANCE):
  the generator redraws the others, so it would crawl, or give up mid-run."""
  share = listops.acceptance(min_len=min_len, max_len=max_len, max_depth=depth)
  if share < listops.MIN_ACCEPTANCE:
    raise ValueError(
      f"data.min_example_len={min_len}..data.max_example_len={max_len}: only "
      f"{share:.2g} of ListOps expressions at data.listops_max_depth={depth} have "
      f"that many tokens, below the {listops.MIN_ACCEPTANCE:g} the generator needs "
      "(it redraws the others); lower data.min_example_len, or raise "
      "data.max_example_len or data.listops_max_depth"
    )


@dataclasses.dataclass(frozen=True)
class ListOpsTask:
  """ListOps classification (listops.py): expressions of min_example_len ..
  max_example_len tokens, at most listops_max_depth nested operators."""

  tasks: ClassVar[tuple[str, ...]] = ("classify",)
  num_classes: ClassVar[int | None] = listops.NUM_CLASSES

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    max_len = int_field(data, "max_example_len", 1)
    depth = int_field(data, "listops_max_depth", 1)
    min_len = int_field(data, "min_example_len", 1)
    longest = listops.longest_expression(depth)
    if min_len > longest:
      raise ValueError(
        f"data.min_example_len={min_len} exceeds {longest} "
        f"tokens, the longest expression of depth {depth} "
        "(data.listops_max_depth)"
      )
    if max_len < listops.SHORTEST_EXPRESSION:
      raise ValueError(
        f"data.max_example_len={max_len} is below "
        f"{listops.SHORTEST_EXPRESSION} tokens, the shortest "
        "expression"
      )
    lengths = _example_lengths(data["seq_len"], min_len, max_len)
    _check_listops_acceptance(min_len, max_len, depth)
    return {**lengths, "listops_max_depth": depth}

  def tokenizer(self, spec: DataSpec) -> Tokenizer:
    return listops.listops_tokenizer()

  def source(self, spec: DataSpec, split: str, seed: int) -> synthetic.GeneratedSource:
    return listops.ListOpsSource(
      seed=seed,
      split=split,
      seq_len=spec.seq_len,
      min_len=required(spec.min_example_len),
      max_len=required(spec.max_example_len),
      max_depth=required(spec.listops_max_depth),
    )

  def describe(self, spec: DataSpec) -> str:
    return _lengths_line(spec)


@dataclasses.dataclass(frozen=True)
class InductionTask(_SymbolLMTask):
  """Repeated blocks (incontext.py): periods in [min_example_len,
  max_example_len] of distinct symbols, each row holding at least two copies
  of its block."""

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    min_len = int_field(data, "min_example_len", 1)
    max_len = int_field(data, "max_example_len", 1)
    num_symbols = int_field(data, "num_symbols", 1)
    if min_len > max_len:
      raise ValueError(f"data.min_example_len={min_len} exceeds data.max_example_len={max_len}")
    if max_len > num_symbols:
      raise ValueError(
        f"data.max_example_len={max_len} exceeds data.num_symbols={num_symbols}: "
        "a block holds distinct symbols"
      )
    if 2 * max_len > data["seq_len"] + 1:  # a row holds seq_len + 1 tokens
      raise ValueError(
        f"data.seq_len={data['seq_len']} is too small for "
        f"data.max_example_len={max_len}: a row of seq_len + 1 tokens needs two copies of a block"
      )
    return dict(num_symbols=num_symbols, min_example_len=min_len, max_example_len=max_len)

  def source(self, spec: DataSpec, split: str, seed: int) -> synthetic.GeneratedSource:
    return incontext.InductionSource(
      seed=seed,
      split=split,
      seq_len=spec.seq_len,
      num_symbols=required(spec.num_symbols),
      min_period=required(spec.min_example_len),
      max_period=required(spec.max_example_len),
    )

  def describe(self, spec: DataSpec) -> str:
    return (
      f"induction task, blocks of {spec.min_example_len}..{spec.max_example_len} of "
      f"{spec.num_symbols} symbols repeated, seq_len {spec.seq_len}"
    )


@dataclasses.dataclass(frozen=True)
class MQARTask(_SymbolLMTask):
  """Multi-query associative recall (incontext.py): num_kv_pairs pairs and
  as many queries fit the row; keys and values from separate halves of the
  symbols, noise from the symbols that are not keys."""

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    pairs = int_field(data, "num_kv_pairs", 1)
    num_symbols = int_field(data, "num_symbols", 2)
    if pairs > num_symbols // 2:
      raise ValueError(
        f"data.num_kv_pairs={pairs} exceeds data.num_symbols // 2 = "
        f"{num_symbols // 2}: keys and values are distinct symbols of "
        "separate halves"
      )
    if 4 * pairs > data["seq_len"] + 1:
      raise ValueError(
        f"data.seq_len={data['seq_len']} is too small for "
        f"data.num_kv_pairs={pairs}: pairs and queries need "
        f"{4 * pairs - 1} positions"
      )
    return dict(num_symbols=num_symbols, num_kv_pairs=pairs)

  def source(self, spec: DataSpec, split: str, seed: int) -> synthetic.GeneratedSource:
    return incontext.MQARSource(
      seed=seed,
      split=split,
      seq_len=spec.seq_len,
      num_symbols=required(spec.num_symbols),
      num_pairs=required(spec.num_kv_pairs),
    )

  def describe(self, spec: DataSpec) -> str:
    return (
      f"mqar task, {spec.num_kv_pairs} key-value pairs over {spec.num_symbols} symbols, "
      f"seq_len {spec.seq_len}"
    )


@dataclasses.dataclass(frozen=True)
class RowTask(_SymbolLMTask):
  """An `lm` task from a row function (txf.register.lm_task): `row(rng,
  seq_len, num_symbols, first_id)` -> (ids [seq_len + 1] in [first_id,
  first_id + num_symbols), target weights [seq_len]); data.num_symbols its
  alphabet."""

  name: str
  row: Callable[..., Any]

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    return dict(num_symbols=int_field(data, "num_symbols", 1))

  def source(self, spec: DataSpec, split: str, seed: int) -> synthetic.GeneratedSource:
    return incontext.RowSource(
      self.name,
      self.row,
      seed=seed,
      split=split,
      seq_len=spec.seq_len,
      num_symbols=required(spec.num_symbols),
    )

  def describe(self, spec: DataSpec) -> str:
    return f"{spec.name} task (registered), {spec.num_symbols} symbols, seq_len {spec.seq_len}"


GENERATED.register("copy", Seq2SeqTask("copy", min_source_len=1))
GENERATED.register("reverse", Seq2SeqTask("reverse", min_source_len=1))
GENERATED.register("sort", Seq2SeqTask("sort", min_source_len=1))
GENERATED.register("addition", Seq2SeqTask("addition", min_source_len=3))  # 'd+d'
GENERATED.register("listops", ListOpsTask())
GENERATED.register("induction", InductionTask())
GENERATED.register("mqar", MQARTask())
