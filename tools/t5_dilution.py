"""Is what is left of the T5 bias's loss past 2x its softmax spreading over the last bucket?

  python -m tools.t5_dilution --runs=runs/t5_distance   # docs/data/t5_distance/dilution.json
  python -m tools.t5_dilution [--check]                 # the page's table and figure, from it

docs/results.md ("Why the T5 bias fails past 2x") found that with every
bucket trained (max distance 32 or 64) the T5 bias still loses about +0.9
nats from 1x to 16x the training length, and put forward a cause it did not
measure: past the last bucket's start s every key gets the same bias, so at
16x about 2,000 keys of a query share it where training showed at most
128 - s, and together they take a larger share of its attention than any
training query gave them.

`--runs` measures that on the trained points of sweeps/t5_distance whose
buckets were all trained (max distance 32, 64, 128), each replica's
parameters in three versions, scoring the 12,288 validation tokens the
sweep's extrapolation scored:

  as trained  the model itself
  corrected   each last-bucket key's bias lowered by log(n / n_train) when
              its query has n > n_train such keys (n_train = 128 - s, the
              most a training query had): together they weigh what n_train
              such keys would, but every key stays visible
  window 128  attention limited to the 128 most recent keys
              (model.window = 128): every key beyond the training span gone

At the training length all three are the same function. The corrected
version is an encoding registered here (`txf.register.position`), reading
the trained T5 table. Recorded per point: each replica's sliding-window loss
(stride half the window) at 128 and 2048 tokens per version, and, at 2048
tokens over the non-overlapping windows, the loss and the attention mass on
last-bucket keys (mean over layers and heads) by position, in bins of 16
positions, mean over replicas. If the spreading is the cause, the corrected
version's loss at 2048 falls to about its loss at 128 and its last-bucket
mass stays at the training length's; if the far keys hurt in another way
(their content, or no nearby start of the window), it stays near the loss as
trained.

Without `--runs`, this rewrites the table after the page's line
`<!-- t5_dilution -->` and writes docs/figures/t5_distance_dilution.png
from the committed file; `--check` writes nothing and exits 1 if the table
differs (tests/test_docs.py checks the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tools.page_tables import check_or_write, rewrite_tables
from txf.sweep import significance

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "t5_distance" / "dilution.json"
FIGURE = ROOT / "docs" / "figures" / "t5_distance_dilution.png"
MARKER = re.compile(r"^<!-- t5_dilution -->$")
MAX_DISTANCES = (32, 64, 128)  # 512 leaves buckets a training row never reaches
VERSIONS = ("as trained", "corrected", "window 128")
CORRECTED = "t5_bias_count_corrected"
LENGTH, BIN = 2048, 16


def _register_corrected_encoding() -> None:
  """model.position = CORRECTED: the T5 bias with each last-bucket key
  lowered by log(n / n_train) where its query has n > n_train of them."""
  from txf import register
  from txf.fields import documented, section
  from txf.layers.positions import T5BiasSettings
  from txf.ops import last_bucket_start, relative_position_bias

  @section()
  class CorrectedSettings(T5BiasSettings):
    """T5's settings, and the training length n_train counts from."""

    train_length: int = documented("the training length (n_train = it - s)", default=128)

  @register.position(
    CORRECTED, contributes="bias", table="relative", settings=CorrectedSettings, replace=True
  )
  def count_corrected(cfg, q_positions, k_positions, table_NxH, *, bidirectional):
    settings = cfg.settings("position")
    bias_BxHxTxS = relative_position_bias(
      table_NxH, q_positions, k_positions, bidirectional=bidirectional,
      max_distance=settings.t5_max_distance,
    )  # fmt: skip
    start = last_bucket_start(
      num_buckets=settings.t5_num_buckets, max_distance=settings.t5_max_distance
    )
    q_BxT, k_BxS = jnp.atleast_2d(q_positions), jnp.atleast_2d(k_positions)
    distance_BxTxS = q_BxT[..., :, None] - k_BxS[..., None, :]
    far_BxTxS = distance_BxTxS >= start
    n_far_BxT = jnp.sum(far_BxTxS, axis=-1)
    n_train = settings.train_length - start
    shift_BxT = -jnp.log(jnp.maximum(n_far_BxT / n_train, 1.0))
    return bias_BxHxTxS + jnp.where(far_BxTxS, shift_BxT[..., None], 0.0)[:, None]


def _versions(model: Any, train_length: int) -> dict[str, Any]:
  from txf.models import build

  cfg = model.cfg
  # The corrected encoding keeps the model's T5 settings (ModelConfig.replace).
  options = {"train_length": train_length}
  return {
    "as trained": model,
    "corrected": build(cfg.replace(position=CORRECTED, options=options)),
    "window 128": build(dataclasses.replace(cfg, window=train_length)),
  }


def _binned(values_T: np.ndarray) -> list[float]:
  return [float(v) for v in values_T.reshape(-1, BIN).mean(axis=1)]


def measure_point(workdir: pathlib.Path) -> dict[str, Any]:
  """One sweep point's record (module docstring)."""
  from etils import epath

  from txf.analysis.attention import attention_maps, mass_beyond
  from txf.analysis.extrapolation import window_losses
  from txf.ops import last_bucket_start
  from txf.trained.extrapolate import load_with_stream

  record = json.loads((workdir / "extrapolation.json").read_text())
  run, tokens_N = load_with_stream(epath.Path(workdir), record["num_tokens"])
  train_length = run.setup.run.data.seq_len
  t5 = run.setup.model.cfg.settings("position")
  start = last_bucket_start(num_buckets=t5.t5_num_buckets, max_distance=t5.t5_max_distance)
  replicas = [run.setup.replica_params(run.params, r) for r in range(run.setup.run.replicas)]
  batch_tokens = run.setup.run.data.batch_size * train_length  # as txf-extrapolate's batches
  windows_WxT = tokens_N[: (len(tokens_N) - 1) // LENGTH * LENGTH].reshape(-1, LENGTH)
  versions = {}
  for name, model in _versions(run.setup.model, train_length).items():
    maps = jax.jit(functools.partial(attention_maps, model, deterministic=True))
    sliding: dict[str, list[float]] = {str(train_length): [], str(LENGTH): []}
    loss_T, mass_T = np.zeros(LENGTH), np.zeros(LENGTH)
    for params in replicas:
      for length in (train_length, LENGTH):
        losses = window_losses(
          model, params, tokens_N[None], seq_len=length, protocol="sliding",
          stride=length // 2, batch_size=max(batch_tokens // length, 1),
        )  # fmt: skip
        sliding[str(length)].append(losses.mean_loss)
      loss_T += window_losses(
        model, params, tokens_N[None], seq_len=LENGTH, batch_size=1
      ).per_position_loss() / len(replicas)
      for window_T in windows_WxT:
        by_layer = maps(params, jnp.asarray(window_T[None]))
        mass_LxT = np.stack([mass_beyond(w, start)[0].mean(axis=0) for w in by_layer.values()])
        mass_T += mass_LxT.mean(axis=0) / (len(replicas) * len(windows_WxT))
    versions[name] = {
      "sliding": sliding,
      "loss_by_position": _binned(loss_T),
      "last_bucket_mass_by_position": _binned(mass_T),
    }
  return {
    "t5_max_distance": t5.t5_max_distance,
    "last_bucket_start": start,
    "train_length": train_length,
    "tokens": len(tokens_N),
    "windows": len(windows_WxT),
    "versions": versions,
  }


def measure(runs: pathlib.Path) -> dict[str, Any]:
  _register_corrected_encoding()
  points = []
  for max_distance in MAX_DISTANCES:
    points.append(measure_point(runs / f"t5_max_distance={max_distance}"))
    print(f"t5_dilution: max distance {max_distance} measured", file=sys.stderr)
  return {"length": LENGTH, "bin": BIN, "points": points}


def _stat(values: list[float]) -> tuple[float, float, int]:
  return float(np.mean(values)), float(np.std(values, ddof=1)), len(values)


def _paired_ps(data: dict[str, Any]) -> list[float | None]:
  """Per point, the paired t-test's p of corrected against as trained, then
  of corrected against the window: the three versions score the same
  replicas on the same tokens, so replica r's losses pair up."""
  ps = []
  for point in data["points"]:
    sliding = {name: point["versions"][name]["sliding"][str(data["length"])] for name in VERSIONS}
    for other in ("as trained", "window 128"):
      ps.append(significance.compare(sliding["corrected"], sliding[other], paired=True).p)
  return ps


def _p_text(p: float | None, holm_p: float | None) -> str:
  return "n/a" if p is None or holm_p is None else f"{p:.3g} (Holm {holm_p:.3g})"


def table(data: dict[str, Any]) -> list[str]:
  """The page's table: per max distance, the last-bucket attention mass at
  the training length's last 16 positions and at 2048's, as trained and
  corrected; the sliding-window loss at 2048 per version (mean ± std over
  replicas) and at the training length; the paired t-test's p of corrected
  against as trained and against the window, with its p Holm-adjusted over
  the table's tests (one family, txf.sweep.significance's rule)."""
  ps = _paired_ps(data)
  adjusted = significance.holm(ps)
  lines = [
    "| T5 max distance | last bucket from | last-bucket mass @112-127 | @2032-2047 as trained "
    "| @2032-2047 corrected | sliding @128 | sliding @2048 as trained | corrected | window 128 "
    f"| paired p (Holm over {len(ps)}): corrected vs as trained "
    "| paired p (Holm): corrected vs window |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for i, point in enumerate(data["points"]):
    versions, train = point["versions"], str(point["train_length"])
    mass = {name: versions[name]["last_bucket_mass_by_position"] for name in VERSIONS}
    at_train = point["train_length"] // data["bin"] - 1
    sliding = {name: versions[name]["sliding"][str(data["length"])] for name in VERSIONS}
    cells = [
      str(point["t5_max_distance"]),
      str(point["last_bucket_start"]),
      f"{mass['as trained'][at_train]:.3f}",
      f"{mass['as trained'][-1]:.3f}",
      f"{mass['corrected'][-1]:.3f}",
      "{:.3f} ± {:.3f}".format(*_stat(versions["as trained"]["sliding"][train])[:2]),
      *("{:.3f} ± {:.3f}".format(*_stat(sliding[name])[:2]) for name in VERSIONS),
      _p_text(ps[2 * i], adjusted[2 * i]),
      _p_text(ps[2 * i + 1], adjusted[2 * i + 1]),
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def rewrite(page_text: str, data: dict[str, Any]) -> str:
  return rewrite_tables(page_text, MARKER, lambda match, before: table(data))


def figure(data: dict[str, Any], path: pathlib.Path) -> None:
  """Two panels over position in a 2048-token window: the attention mass on
  last-bucket keys (as trained, corrected) and the loss (all three versions,
  in spans of 128 positions: the 16-position bins of 5 windows are noisy),
  one colour per max distance, one line style per version. The legend says
  each once: the colours, then the styles (window 128 drawn in the right
  panel only)."""
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  from matplotlib.lines import Line2D

  from txf.analysis.plots import save_figure

  length, bin_ = data["length"], data["bin"]
  span = data["points"][0]["train_length"]
  styles = {"as trained": "-", "corrected": "--", "window 128": ":"}
  fig, (mass_axes, loss_axes) = plt.subplots(1, 2, figsize=(12, 5.5))
  colours = ("tab:blue", "tab:orange", "tab:green")
  for colour, point in zip(colours, data["points"]):
    for name in VERSIONS:
      version = point["versions"][name]
      if name != "window 128":  # its mass is the corrected version's up to 128, then none
        mass_axes.plot(
          np.arange(length // bin_) * bin_ + bin_ / 2,
          version["last_bucket_mass_by_position"], styles[name], color=colour,
        )  # fmt: skip
      loss_S = np.reshape(version["loss_by_position"], (-1, span // bin_)).mean(axis=1)
      loss_axes.plot(
        np.arange(length // span) * span + span / 2, loss_S, styles[name], marker=".",
        color=colour,
      )  # fmt: skip
  for axes in (mass_axes, loss_axes):
    axes.axvline(span, color="grey", lw=0.8)
    axes.set_xlabel("query position in a 2048-token window (tokens)")
    axes.grid(alpha=0.3)
  mass_axes.set_ylabel("attention on last-bucket keys (fraction of each query's)")
  mass_axes.set_title("Attention on keys that share the last bucket's bias")
  loss_axes.set_ylabel("validation loss (nats per byte-token)")
  loss_axes.set_title(f"Loss by position (each point: the mean over {span} positions)")
  handles = [
    Line2D([], [], color=colour, label=f"max distance {point['t5_max_distance']}")
    for colour, point in zip(colours, data["points"])
  ] + [
    Line2D([], [], color="grey", linestyle=styles[name],
           label=f"{name} (right panel only)" if name == "window 128" else name)
    for name in VERSIONS
  ]  # fmt: skip
  fig.legend(handles=handles, loc="lower center", ncol=2, fontsize="small")
  fig.suptitle(
    "T5 bias past its training length (grey line): "
    "the count correction against the model as trained"
  )
  fig.tight_layout(rect=(0, 0.14, 1, 1))
  save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=pathlib.Path, help="the sweep's workdir: measure anew")
  parser.add_argument("--check", action="store_true")
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs" / "results.md")
  args = parser.parse_args(argv)
  if args.runs is not None:
    missing = [m for m in MAX_DISTANCES if not (args.runs / f"t5_max_distance={m}").is_dir()]
    if missing:
      print(f"--runs: {args.runs} has no point t5_max_distance={missing[0]}", file=sys.stderr)
      return 2
    DATA.write_text(json.dumps(measure(args.runs), indent=1) + "\n")
  data = json.loads(DATA.read_text())
  if not args.check:
    figure(data, FIGURE)
  return check_or_write(
    args.page, lambda text: rewrite(text, data), args.check, "t5_dilution table"
  )


if __name__ == "__main__":
  sys.exit(main())
