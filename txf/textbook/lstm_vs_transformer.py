"""A Transformer LM against an LSTM LM of about the same size, trained alike.

  results = run("runs/lstm_vs_transformer", base_config=txf.configs.base.get_config())

trains two language models from one base run config (its data, optimizer,
schedule, evaluation and seed), each through the same runner as
`txf-run` (`txf.train.loop.run`), into the run directories
`out_dir/runs/lstm_vs_transformer/transformer` and `.../lstm` (quick:
`runs/lstm_vs_transformer_quick/`):

  transformer  a decoder of TRANSFORMER_MODEL (4 layers, d_model 128, 4 heads;
               every other model field from the base config)
  lstm         family='lstm' with LSTM_LAYERS layers, its width d_model the one
               whose parameter count is nearest the Transformer's
               (`matched_lstm_width`); the base config's fields an LSTM reads
               (dropout, tied embeddings, pad id, dtype) carry over

Both see the same batches for the same steps. It returns a side-by-side
table (parameters, training FLOPs per token, training and validation loss,
validation perplexity, wall time, tokens/s, and each model's last sample;
txf-textbook writes it to `out_dir/lstm_vs_transformer.md`), writes
`out_dir/textbook_lstm_vs_transformer_loss.png` (training and validation
loss by step), and returns the numbers (the textbook experiments' protocol:
a JSON-ready dict with 'text', the markdown, and 'figures'). `quick=True`
shrinks both models, the data and the steps to seconds (for tests).

Wall time is that of the call that trained a run from scratch to its end
(compilation, evaluations and sampling included), kept in
`wall_time.json` in its run directory; a run resumed after an interruption
has none. A rerun on the same `out_dir` trains nothing more and reports the
same figures. Tokens/s is the runner's steady-state figure (compiling steps and
evaluations excluded), averaged over the logged windows.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath

from txf import models
from txf.analysis import count_params, flops_per_token
from txf.analysis.plots import line_plot
from txf.data import make_tokenizer
from txf.layers.model_config import LSTM_FIELDS, ModelConfig
from txf.progress import say
from txf.runconfig.run_config import RunConfig, parse
from txf.rundir.metrics import read_metrics, read_samples
from txf.textbook.training import derive_config, train_to_end

TRANSFORMER_MODEL = dict(family="decoder", num_layers=4, d_model=128, num_heads=4)
LSTM_LAYERS = 2
# The matched LSTM's parameter count is within this fraction of the
# Transformer's: within half of what one unit of width adds, about
# (16 L D + V) / 2 parameters (0.45% of the count at the default size, 2.9%
# at quick's).
PARAM_TOLERANCE = 0.03
NAME = "lstm_vs_transformer"
RUNS = ("transformer", "lstm")
LABELS = {"transformer": "Transformer", "lstm": "LSTM"}

# quick=True: test-sized models, data and schedule.
_QUICK_TRANSFORMER = dict(num_layers=1, d_model=32, num_heads=2)
_QUICK_FIELDS = {
  "data.seq_len": 32,
  "data.batch_size": 8,
  "data.max_corpus_bytes": 200_000,
  "train.warmup_steps": 4,
  "train.log_every": 1,
  "eval.num_batches": 1,
  "eval.sample_tokens": 16,
}
_QUICK_STEPS = 30
_WALL_TIME_FILE = "wall_time.json"


def param_shapes(cfg: ModelConfig) -> Any:
  """The model's params as shape structs (abstract init: nothing allocated)."""
  tokens_1x1 = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return jax.eval_shape(models.build(cfg).init, jax.random.key(0), tokens_1x1)["params"]


def num_params(cfg: ModelConfig) -> int:
  return count_params(param_shapes(cfg), cfg)["total"]


def matched_lstm_width(target_params: int, lstm_cfg: ModelConfig) -> int:
  """The d_model whose LSTM (`lstm_cfg` otherwise) has the parameter count
  nearest `target_params` (the smaller width on a tie).

  An LSTM's count is a quadratic in its width (kernels D x D, biases and
  the token table linear in D): its coefficients come from the counts at
  widths 1, 2 and 3, the real root gives the two widths around the target,
  and their exact counts decide.
  """
  count = lambda width: num_params(lstm_cfg.replace(d_model=width))
  c1, c2, c3 = (count(width) for width in (1, 2, 3))
  a = (c3 - 2 * c2 + c1) / 2
  b = c2 - c1 - 3 * a
  c = c1 - a - b
  root = (-b + np.sqrt(b * b - 4 * a * (c - target_params))) / (2 * a)
  below = max(int(np.floor(root)), 1)
  return min((below, below + 1), key=lambda width: abs(count(width) - target_params))


def comparison_configs(
  base_config: ml_collections.ConfigDict, *, steps: int | None = None, quick: bool = False
) -> dict[str, ml_collections.ConfigDict]:
  """{'transformer': run config, 'lstm': run config}, both from `base_config`.

  Args:
    base_config: a full run config (e.g. configs/base.py's `get_config()`),
      not modified, with data.task='lm'. Its model section gives the
      Transformer's fields other than TRANSFORMER_MODEL (positions, norms,
      ...).
    steps: training steps of both; None: base_config.train.steps (with quick,
      30).
    quick: test-sized models (the Transformer at 1 layer, d_model 32, 2
      heads), sequences of 32 tokens, batches of 8, 200 kB of text.

  Raises:
    ValueError: naming the field, for a base config whose data cannot train
      a language model.
  """
  if base_config.data.task != "lm":
    raise ValueError(
      f"data.task: the comparison trains language models, got {base_config.data.task!r}"
    )
  model = {**TRANSFORMER_MODEL, **(_QUICK_TRANSFORMER if quick else {})}
  transformer = derive_config(
    base_config,
    {
      **{f"model.{field}": value for field, value in model.items()},
      **(_QUICK_FIELDS if quick else {}),
    },
  )
  if steps is None:
    steps = _QUICK_STEPS if quick else base_config.train.steps
  transformer.train.steps = steps
  # Each run evaluates (and samples) at the end, and at base_config's
  # interval when that is shorter.
  transformer.eval.every = min(transformer.eval.every, transformer.train.steps)

  lstm = copy.deepcopy(transformer)
  for field in dataclasses.fields(ModelConfig):
    if field.name not in LSTM_FIELDS:
      lstm.model[field.name] = field.default
  lstm.model.update(family="lstm", num_layers=LSTM_LAYERS)
  return {"transformer": transformer, "lstm": lstm}


def _match_width(runs: dict[str, RunConfig], runs_dir: epath.Path) -> dict[str, RunConfig]:
  """The runs with the LSTM's d_model set to match the Transformer's
  parameter count, each model's vocabulary the tokenizer's (which a
  sentencepiece tokenizer is trained for, once, in the Transformer's run
  directory)."""
  vocab_size = make_tokenizer(runs["transformer"].data, runs_dir / "transformer").vocab_size
  fitted = {name: run.with_vocabulary(vocab_size, None) for name, run in runs.items()}
  width = matched_lstm_width(num_params(fitted["transformer"].model), fitted["lstm"].model)
  return {**fitted, "lstm": fitted["lstm"].override({"model.d_model": width})}


def _train(run: RunConfig, workdir: epath.Path, log: Callable[[str], None]) -> dict[str, float]:
  """loop.run, timed when it trains the run from scratch (module docstring)."""
  fresh = not (workdir / "config.json").exists()
  start = time.perf_counter()
  final = train_to_end(run, workdir, log=log)
  if fresh:
    (workdir / _WALL_TIME_FILE).write_text(
      json.dumps({"seconds": time.perf_counter() - start}) + "\n"
    )
  return final


def _wall_time(workdir: epath.Path) -> float | None:
  path = workdir / _WALL_TIME_FILE
  return json.loads(path.read_text())["seconds"] if path.exists() else None


def _last_sample(workdir: epath.Path) -> str:
  """The text of the last '=== step N ===' record of samples.txt ('' if none)."""
  samples = read_samples(workdir)
  return samples[-1][1] if samples else ""


def _curves(workdir: epath.Path) -> dict[str, tuple[list[int], list[float]]]:
  """{'train': (steps, losses), 'validation': (steps, losses)} from metrics.jsonl."""
  rows = read_metrics(workdir)
  curve = lambda key: (
    [row["step"] for row in rows if key in row],
    [row[key] for row in rows if key in row],
  )
  return {"train": curve("loss"), "validation": curve("eval_loss")}


def _describe(cfg: ModelConfig) -> str:
  if cfg.family == "lstm":
    return f"LSTM, {cfg.num_layers} layers, d_model {cfg.d_model}"
  return (
    f"decoder, {cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.num_heads} heads, "
    f"{cfg.position} positions"
  )


def _summary(
  name: str, run: RunConfig, final: dict[str, float], workdir: epath.Path
) -> dict[str, Any]:
  cfg = run.model
  rows = read_metrics(workdir)
  speeds = [row["tokens_per_sec"] for row in rows if "tokens_per_sec" in row]
  curves = _curves(workdir)
  return {
    "model": _describe(cfg),
    "d_model": cfg.d_model,
    "num_layers": cfg.num_layers,
    "params": num_params(cfg),
    "flops_per_token": flops_per_token(cfg, run.data.seq_len),
    "steps": run.train.steps,
    "eval_loss": final["eval_loss"],
    "eval_perplexity": final["eval_perplexity"],
    "final_train_loss": curves["train"][1][-1] if curves["train"][1] else None,
    "wall_time_s": _wall_time(workdir),
    "tokens_per_sec": float(np.mean(speeds)) if speeds else None,
    "sample": _last_sample(workdir),
    "curves": curves,
    "workdir": os.fspath(workdir),
    "label": LABELS[name],
  }


def _number(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _markdown(runs: dict[str, dict[str, Any]], run: RunConfig, data: str) -> str:
  """The side-by-side table, then each model's last sample."""
  rows = [
    ("model", "model", "{}"),
    ("parameters", "params", ",d"),
    ("training FLOPs/token", "flops_per_token", ".3g"),
    ("steps", "steps", "d"),
    ("final training loss (nats/token)", "final_train_loss", ".4f"),
    ("validation loss (nats/token)", "eval_loss", ".4f"),
    ("validation perplexity", "eval_perplexity", ".3f"),
    ("wall time (s)", "wall_time_s", ".1f"),
    ("tokens/s", "tokens_per_sec", ",.0f"),
  ]
  header = "| | " + " | ".join(runs[name]["label"] for name in RUNS) + " |"
  lines = [
    "# Transformer vs LSTM language model",
    "",
    f"Data: {data}. Both trained {run.train.steps} steps on the same batches "
    f"({run.data.batch_size} x {run.data.seq_len} tokens), same optimizer and "
    "schedule.",
    "",
    header,
    "|---|" + "---|" * len(RUNS),
  ]
  for label, key, spec in rows:
    cells = [runs[name][key] for name in RUNS]
    cells = [value if spec == "{}" else _number(value, spec) for value in cells]
    lines.append(f"| {label} | " + " | ".join(str(cell) for cell in cells) + " |")
  for name in RUNS:
    lines += [
      "",
      f"{runs[name]['label']} sample (last evaluation, prompt {run.eval.sample_prompt!r}):",
      "",
      "```",
      runs[name]["sample"],
      "```",
    ]
  return "\n".join(lines) + "\n"


def _plot(runs: dict[str, dict[str, Any]], path: epath.Path) -> epath.Path:
  series, styles = {}, {}
  for colour, name in zip(("C0", "C1"), RUNS):
    run_ = runs[name]
    for kind, linestyle in (("train", "-"), ("validation", "--")):
      label = f"{run_['label']} {kind} ({run_['params']:,} params)"
      series[label] = tuple(np.asarray(values, float) for values in run_["curves"][kind])
      styles[label] = {"color": colour, "linestyle": linestyle}
  return line_plot(
    series,
    path,
    title="Transformer vs LSTM language model: loss",
    xlabel="training step",
    ylabel="loss (nats/token)",
    styles=styles,
  )


def run(
  out_dir: str | os.PathLike,
  *,
  base_config: ml_collections.ConfigDict,
  steps: int | None = None,
  quick: bool = False,
  log: Callable[[str], None] = say,
) -> dict[str, Any]:
  """Trains both models (see the module docstring) and writes the table and plot.

  Args:
    out_dir: directory of the outputs and (under runs/lstm_vs_transformer/,
      quick: runs/lstm_vs_transformer_quick/) the two runs; local or gs://.
    base_config: the run config both derive from (configs/base.py's
      `get_config()`; txf does not import configs/); not modified.
    steps: training steps of each model; None: base_config.train.steps
      (quick: 30).
    quick: test-sized models, data and steps.
    log: receives the runs' progress lines (the table is returned as 'text',
      for the caller to print).

  Returns:
    {'transformer': {...}, 'lstm': {...}, 'param_ratio': LSTM / Transformer
    parameters, 'text': the markdown table, 'figures': [the loss-curve
    PNG's path]};
    each run's dict holds model (a description), d_model, num_layers,
    params, flops_per_token, steps, eval_loss, eval_perplexity
    (= exp(eval_loss)), final_train_loss, wall_time_s, tokens_per_sec,
    sample, curves ({'train'|'validation': (steps, losses)}), workdir and
    label.

  Raises:
    ValueError (a ConfigError from the runner among them): naming the field,
      before any training.
  """
  out_dir = epath.Path(out_dir)
  # As the other textbook runs: quick ones their own directory, which the
  # full run (another config) could not resume.
  runs_dir = out_dir / "runs" / (f"{NAME}_quick" if quick else NAME)
  configs = comparison_configs(base_config, steps=steps, quick=quick)
  trained = _match_width({name: parse(config) for name, config in configs.items()}, runs_dir)
  data_lines = []

  def run_log(line: str) -> None:
    if line.startswith("data: "):
      data_lines.append(line.splitlines()[0][len("data: ") :])
    log(line)

  runs = {}
  for name in RUNS:
    log(f"== {LABELS[name]}: {_describe(trained[name].model)}")
    final = _train(trained[name], runs_dir / name, run_log)
    runs[name] = _summary(name, trained[name], final, runs_dir / name)
  text = _markdown(runs, trained["transformer"], data_lines[0])
  plot = _plot(runs, out_dir / f"textbook_{NAME}_loss.png")
  return {
    **runs,
    "param_ratio": runs["lstm"]["params"] / runs["transformer"]["params"],
    "text": text,
    "figures": [os.fspath(plot)],
  }
