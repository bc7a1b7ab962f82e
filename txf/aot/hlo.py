"""What a compiled program does, read from its optimised HLO text
(`compiled.as_text()`): the instructions that launch work on the device
(kernels on a GPU), their bytes, their libraries, and the collectives.

Only the computations the device runs instruction by instruction are read:
the entry computation and the bodies of control flow (while, conditional,
call). A fusion's own computation runs as one kernel, so its instructions
are not counted. An instruction inside a loop body runs once per iteration
where XLA knows the trip count (scanned layers: once per layer): its
`times` says how often, and every figure of a program weighs it so; a
loop whose trip count is unknown (a token loop that stops early) counts
once. A conditional counts every branch.

Bytes of an instruction are its operands' plus its result's, each buffer
counted whole (the traffic an unfused kernel must move at least once; a
kernel that reads an operand twice moves more), except what it is known
not to move (`Instruction.moved`): an operand a fusion reads only through
slices counts their bytes, a buffer updated in place (a fusion rooted in a
dynamic-update-slice, a dynamic-update-slice) counts the update.
"""

from __future__ import annotations

import dataclasses
import re

DTYPE_BYTES = {
  "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1,
  "f8e4m3fnuz": 1, "f8e4m3b11fnuz": 1, "f8e3m4": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
  "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16,
  "s4": 0.5, "u4": 0.5, "s2": 0.25, "u2": 0.25, "token": 0,
}  # fmt: skip

# The collectives by kind: each has a synchronous opcode and an asynchronous
# -start one (GPUs run them as start/done pairs; the -done half waits).
COLLECTIVES = {
  opcode: kind
  for kind in (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast",
  )
  for opcode in (kind, f"{kind}-start")
}  # fmt: skip
# Opcodes that launch device work; bookkeeping ops (parameter, tuple,
# get-tuple-element, bitcast, constant, the -done halves of async pairs) do not.
LAUNCHING = {
  "fusion", "custom-call", "copy", "copy-start", "sort", "scatter", "gather", "reduce",
  "transpose", "dot", "convolution", "reduce-window", "select-and-scatter", "dynamic-slice",
  "dynamic-update-slice", "rng-bit-generator", "cholesky", "triangular-solve", "fft",
  *COLLECTIVES,
}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_CONTROL = re.compile(
  r"\b(?:body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One device-work instruction of the program.

  Attributes:
    name: its HLO name.
    opcode: 'fusion', 'custom-call', 'all-gather-start', ...
    target: a custom call's target (`__cudnn$fmhaSoftmax`,
      `__cublas$lt$matmul`), or a fusion's kind (`kLoop`, `kInput`,
      `__triton_nested_gemm_fusion`, ...); '' otherwise.
    result_bytes: its result's bytes (every element of a tuple).
    operand_bytes: its operands' bytes.
    op_name: the JAX source path of the operation (its metadata), e.g.
      `jit(train_step)/transpose(jvp(Decoder))/.../self_attention/...`.
    times: how often it runs in one run of the program: the product of the
      known trip counts of the loops around it (module docstring).
    moved: the bytes it moves each time (module docstring); `bytes`.
  """

  name: str
  opcode: str
  target: str
  result_bytes: float
  operand_bytes: float
  op_name: str
  times: int = 1
  moved: float | None = None  # None: operands and result whole

  @property
  def bytes(self) -> float:
    return self.result_bytes + self.operand_bytes if self.moved is None else self.moved

  @property
  def is_gemm(self) -> bool:
    """A matrix product: a cuBLAS call, a Triton GEMM fusion or a dot."""
    target = self.target.lower()
    return self.opcode in ("dot", "convolution") or any(
      word in target for word in ("gemm", "matmul", "cublas")
    )

  @property
  def is_cudnn_attention(self) -> bool:
    return self.target.startswith("__cudnn$fmha")


def shape_bytes(text: str) -> float:
  """Bytes of every array shape written in `text` (`f32[2,3]{1,0}`, tuples too)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(text):
    if dtype not in DTYPE_BYTES:
      continue
    count = 1
    for dim in filter(None, dims.split(",")):
      count *= int(dim)
    total += count * DTYPE_BYTES[dtype]
  return total


def _split_computations(text: str) -> dict[str, tuple[bool, list[str]]]:
  """{computation name: (is the entry, its instruction lines)}."""
  computations: dict[str, tuple[bool, list[str]]] = {}
  current: list[str] | None = None
  for line in text.splitlines():
    header = re.match(r"(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if header and not line.startswith(" "):
      current = []
      computations[header[2]] = (bool(header[1]), current)
    elif current is not None and line.startswith(" "):
      current.append(line)
  return computations


def _matching(text: str, start: int) -> int:
  """The index just past the bracket that closes the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _parse(line: str) -> tuple[str, str, str, str, str] | None:
  """(name, result type, opcode, operands, attributes) of an instruction line."""
  match = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
  if not match:
    return None
  rest = line[match.end() :]
  if rest.startswith("("):
    end = _matching(rest, 0)
  else:
    end = rest.find(" ")
  result, rest = rest[:end], rest[end:].lstrip()
  opcode = re.match(r"([a-z][\w\-]*)\(", rest)
  if not opcode:
    return None
  close = _matching(rest, opcode.end() - 1)
  return match[1], result, opcode[1], rest[opcode.end() : close - 1], rest[close:]


def _target(opcode: str, attributes: str) -> str:
  if opcode == "custom-call":
    found = re.search(r'custom_call_target="([^"]*)"', attributes)
    return found[1] if found else ""
  if opcode == "fusion":
    found = re.search(r'"kind":"(__[^"]*)"', attributes)  # a Triton fusion's kind
    if found:
      return found[1]
    kind = re.search(r"kind=(k\w+)", attributes)
    return kind[1] if kind else ""
  return ""


def _operand_bytes(operands: str, shapes: dict[str, float]) -> float:
  """Bytes of an operand list: each operand's written type, or the type of
  the instruction of its name (`shapes`)."""
  total = 0.0
  for operand in operands.split(","):
    operand = re.sub(r"/\*.*?\*/", "", operand).strip()  # /*index=5*/
    if operand:
      total += shape_bytes(operand) or shapes.get(operand.split()[-1].lstrip("%"), 0.0)
  return total


# Ops that read their result's bytes of their first operand, not all of it.
_PARTIAL_READS = {"dynamic-slice", "slice", "gather"}
# Ops that only rename a buffer.
_PASS_THROUGH = {"bitcast", "reshape"}


@dataclasses.dataclass(frozen=True)
class _Op:
  """An instruction: its result's bytes, opcode, operands' names,
  attributes, and whether it is its computation's root."""

  result_bytes: float
  opcode: str
  operands: list[str]
  attributes: str
  root: bool


def computation_ops(lines: list[str]) -> dict[str, _Op]:
  """A computation's instructions by name."""
  found = {}
  for line in lines:
    parsed = _parse(line)
    if parsed is None:
      continue
    name, result, opcode, operands, attributes = parsed
    found[name] = _Op(
      shape_bytes(result),
      opcode,
      re.findall(r"%([\w.\-]+)", operands),
      attributes,
      line.lstrip().startswith("ROOT "),
    )
  return found


def fusion_bytes(computation: list[str]) -> float:
  """The bytes a fusion moves: each operand whole, except one it reads only
  through slices (their results' bytes; a gather's or a dynamic-slice's
  indices are read whole) or updates in place (not read);
  its results whole, except an operand's update in place (the update's
  bytes)."""
  ops = computation_ops(computation)
  users: dict[str, list[str]] = {}
  for name, op in ops.items():
    for operand in op.operands:
      users.setdefault(operand, []).append(name)

  def source(name: str) -> str:
    while name in ops and ops[name].opcode in _PASS_THROUGH:
      name = ops[name].operands[0]
    return name

  def sliced(reader: str, read: str) -> bool:
    """Whether `reader` reads `read` only as the operand it slices (its
    first: a gather's or a dynamic-slice's indices it reads whole)."""
    operands = ops[reader].operands
    return ops[reader].opcode in _PARTIAL_READS and operands[0] == read and read not in operands[1:]

  root = next(name for name, op in ops.items() if op.root)
  outputs = ops[root].operands if ops[root].opcode == "tuple" else [root]
  in_place, moved = set(), 0.0
  for output in outputs:
    op = ops[source(output)]
    if op.opcode == "dynamic-update-slice":
      in_place.add(source(op.operands[0]))
      moved += ops[op.operands[1]].result_bytes
    else:
      moved += ops[output].result_bytes
  for name, op in ops.items():
    if op.opcode != "parameter" or name in in_place:
      continue
    readers: list[tuple[str, str]] = []  # (reader, the name it reads the parameter by)
    frontier = [name]
    while frontier:
      read = frontier.pop()
      for user in users.get(read, []):
        if ops[user].opcode in _PASS_THROUGH:
          frontier.append(user)
        else:
          readers.append((user, read))
    if readers and all(sliced(reader, read) for reader, read in readers):
      moved += min(op.result_bytes, sum(ops[reader].result_bytes for reader, _ in readers))
    else:
      moved += op.result_bytes
  return moved


def aliased_outputs_bytes(result: str, attributes: str) -> float:
  """The bytes of a custom call's outputs that are updated inputs (written
  in place, where it writes only what changes)."""
  aliased = re.search(r"output_to_operand_aliasing=\{(.*?)\}\s*(,|$)", attributes)
  if not aliased:
    return 0.0
  indices = {int(i) for i in re.findall(r"\{(\d+)\}:", aliased[1])}
  shapes = [shape_bytes(f"{d}[{s}]") for d, s in _SHAPE.findall(result)]
  return sum(size for i, size in enumerate(shapes) if i in indices)


def _trip_count(attributes: str) -> int:
  """A while loop's known trip count (its backend config), else 1."""
  found = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', attributes)
  return int(found[1]) if found else 1


def _runs(
  computations: dict[str, tuple[bool, list[str]]], *, into_fusions: bool = False
) -> dict[str, int]:
  """{computation: how often it runs in one run of the program}, from the
  entry through control flow (a while loop's body and condition as many
  times as its known trip count) and, `into_fusions`, into the computations
  fusions call (where TPU programs keep their collectives)."""
  runs: dict[str, int] = {}

  def walk(name: str, times: int, seen: frozenset[str]) -> None:
    if name in seen or name not in computations:
      return
    runs[name] = runs.get(name, 0) + times
    for line in computations[name][1]:
      parsed = _parse(line)
      if parsed is None:
        continue
      opcode, attributes = parsed[2], parsed[4]
      called = _called(line)
      if into_fusions and opcode == "fusion":
        called |= set(re.findall(r"\bcalls=%?([\w.\-]+)", attributes))
      trips = _trip_count(attributes) if opcode == "while" else 1
      for inner in called:
        walk(inner, times * trips, seen | {name})

  for name, (entry, _) in computations.items():
    if entry:
      walk(name, 1, frozenset())
  return runs


def _moved(
  computations: dict[str, tuple[bool, list[str]]],
  opcode: str,
  result: str,
  operands: str,
  attributes: str,
  shapes: dict[str, float],
) -> float | None:
  """The bytes an instruction moves where less than its buffers whole
  (module docstring); None where it moves them whole."""
  if opcode == "fusion":
    fused = re.search(r"calls=%?([\w.\-]+)", attributes)
    return fusion_bytes(computations[fused[1]][1]) if fused and fused[1] in computations else None
  if opcode == "dynamic-update-slice":  # reads and writes the update, in place
    update = [part.strip().lstrip("%") for part in operands.split(",")][1]
    return 2 * (shape_bytes(update) or shapes.get(update.split()[-1], 0.0))
  # A custom call's aliased output counts whole here: a train step's kernels
  # (the fused loss) rewrite theirs whole, unlike a decoding step's cache.
  return None


def instructions(text: str) -> list[Instruction]:
  """The device-work instructions of an optimised HLO module's text, in
  order, each once with how often it runs (`Instruction.times`)."""
  computations = _split_computations(text)
  runs = _runs(computations)
  found = []
  for name in computations:
    if name not in runs:
      continue
    shapes: dict[str, float] = {}
    for line in computations[name][1]:
      parsed = _parse(line)
      if parsed is None:
        continue
      instruction, result, opcode, operands, attributes = parsed
      shapes[instruction] = shape_bytes(result)
      if opcode not in LAUNCHING:
        continue
      operand_bytes = _operand_bytes(operands, shapes)
      op_name = re.search(r'op_name="([^"]*)"', attributes)
      moved = _moved(computations, opcode, result, operands, attributes, shapes)
      found.append(
        Instruction(
          instruction,
          opcode,
          _target(opcode, attributes),
          shapes[instruction],
          operand_bytes,
          op_name[1] if op_name else "",
          runs[name],
          moved,
        )
      )
  return found


def _called(line: str) -> set[str]:
  """The computations an instruction line runs as control flow."""
  names = set(_CONTROL.findall(line))
  for group in _BRANCHES.findall(line):
    names |= {name.strip().lstrip("%") for name in group.split(",")}
  return names


def loop_kernels(text: str) -> int:
  """Device-work instructions one iteration of the program's busiest while
  loop launches, its body's and its condition's (0 without a loop): for a
  decoding program, the kernels per generated token. Control flow inside the
  body (a nested loop, a branch) counts its instructions once
  (txf.aot.report.loop_traffic weighs a nested loop by its trip count)."""
  computations = _split_computations(text)

  def launches(name: str, seen: frozenset[str]) -> int:
    if name in seen or name not in computations:
      return 0
    count = 0
    for line in computations[name][1]:
      parsed = _parse(line)
      if parsed is None:
        continue
      count += parsed[2] in LAUNCHING
      if parsed[2] != "fusion":  # a fusion's own computation is one kernel
        count += sum(launches(called, seen | {name}) for called in _called(line))
    return count

  loops = [  # each while loop's body and condition: both run every iteration
    _called(line)
    for _, lines in computations.values()
    for line in lines
    if (parsed := _parse(line)) and parsed[2] == "while"
  ]
  return max((sum(launches(name, frozenset()) for name in loop) for loop in loops), default=0)


# A TPU reduce-scatter: a fusion calling an all-reduce-scatter computation.
_REDUCE_SCATTER_CALL = r"calls=%?(all-reduce-scatter[\w.\-]*)"


def collectives(text: str) -> dict[str, dict[str, float]]:
  """{kind: {"count", "bytes"}} of the collectives of an optimised HLO
  module's text, wherever they sit: TPU programs run them inside fusions
  (asynchronous collective fusions; a reduce-scatter is a fusion calling an
  `all-reduce-scatter` computation). Bytes: the larger of each one's operands
  and result (the whole buffer it gathers, reduces or scatters on each
  device)."""
  totals: dict[str, dict[str, float]] = {}
  computations = _split_computations(text)
  runs = _runs(computations, into_fusions=True)
  # The all-reduce inside a reduce-scatter fusion's computation is that
  # reduce-scatter, counted at its fusion (it was counted as an all-reduce too).
  scattering = set(re.findall(_REDUCE_SCATTER_CALL, text))
  for computation, (_, lines) in computations.items():
    if computation.lstrip("%") in scattering:
      continue
    times = runs.get(computation, 0)
    shapes: dict[str, float] = {}
    for line in lines:
      parsed = _parse(line)
      if parsed is None:
        continue
      name, result, opcode, operands, attributes = parsed
      result_bytes = shapes[name] = shape_bytes(result)
      kind = COLLECTIVES.get(opcode)
      if opcode == "fusion" and re.search(_REDUCE_SCATTER_CALL, attributes):
        kind = "reduce-scatter"
      if kind is None:
        continue
      operand_bytes = _operand_bytes(operands, shapes)
      if opcode.endswith("-start"):  # its result holds the operand too
        result_bytes -= operand_bytes
      if not times:  # in no computation the program runs
        continue
      row = totals.setdefault(kind, {"count": 0, "bytes": 0.0})
      row["count"] += times
      row["bytes"] += times * max(operand_bytes, result_bytes)
  return totals


def region(op_name: str) -> str:
  """Which part of a txf train step an instruction belongs to, by its JAX
  source path: 'optimizer' (outside the gradient: the update, clipping, the
  non-finite check), 'loss' (the loss function, its GPU kernel and the
  output head),
  'attention' (inside a self- or cross-attention layer) or 'model' (the rest
  of the forward and backward pass)."""
  if "jvp(" not in op_name:
    return "optimizer"
  if any(word in op_name for word in ("jvp()", "/head/", "take_along_axis", "cross_entropy")):
    return "loss"
  if re.search(r"(self|cross)_attention/", op_name):
    return "attention"
  return "model"
