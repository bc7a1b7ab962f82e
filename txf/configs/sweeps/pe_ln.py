"""Positional encodings x Pre-/Post-LN: the six encodings x two norm placements.

  txf-sweep --config=sweeps/pe_ln --workdir=runs/pe_ln

12 points, each configs/base.py narrowed to d_model 64 (byte-level decoder
LM on the Python standard library, 2 layers, 4 heads, 116k parameters,
seq_len 128, batch 32) and trained for 1800 steps (7.4M tokens per seed;
cosine schedule, 180 warmup steps, peak lr 3e-3) with 2 seed replicas
(seeds 0, 1 side by side in one program), evaluated every 120 steps (so an
evaluation opens the flattening criterion's window, the last fifth), then
at 1x-16x the training length on 12,288 validation tokens. Each point's run
directory is runs/pe_ln/<point name>, e.g.
runs/pe_ln/position=rope,norm_placement=pre; results.csv, results.md and the
plots land in runs/pe_ln. results.md's "flat" column says whether each
point's validation loss improved by less than 2% over its last fifth
(txf.sweep.results.FLAT_TOLERANCE).

Why this size. The sweep must train every point until its validation loss
flattens, within 90 minutes on a 2-core CPU. configs/base.py's own size
(d_model 128) does not fit: at 600 steps, about 2 hours for the sweep,
none of the 5 points run was flat (-2.1% to -2.7% over the last fifth,
2026-11-25). At d_model 64 a step of both seeds costs about 0.2 s on the idle
2-core CPU (0.23 s for the T5 bias, whose bucketed bias table is gathered
and scattered every step), so 1800 steps fit; trial runs of the two slowest
learners at that length (2026-11-26, both seeds) were flat: learned
positions -1.6%, T5 bias -1.7% over the last fifth.

Measured (2026-11-26, idle 2-core CPU, Python 3.11.7; docs/results.md
section 2): 82 minutes for the sweep, extrapolation included. Expected
result: every point flat (-0.9% to -1.7% over the last fifth), none
diverged; final validation loss (nats/token, Pre-LN) RoPE 1.61, T5 bias
1.64, ALiBi 1.70, learned 1.76, sinusoidal 1.77, NoPE 2.16 (Post-LN within
0.03 of each); only ALiBi's loss stays flat from 1x to 16x. The corpus is
the host Python's standard library, so the numbers move with its version.
"""

import ml_collections

from txf.configs import base
from txf.sweep.grid import make_grid

RUN_CONFIG = "base"  # the run config txf ships by that name, from any directory
STEPS = 1800


def get_config() -> ml_collections.ConfigDict:
  run = base.get_config()
  run.model.update(dict(d_model=64))
  run.replicas = 2
  # Fifteen evaluations: the last fifth of training starts on one
  # (txf.sweep.results.late_improvement). No samples: they cost time and the
  # sweep reports losses.
  run.train.update(
    dict(steps=STEPS, warmup_steps=STEPS // 10, log_every=STEPS // 15, checkpoint_every=STEPS // 2)
  )
  run.eval.update(dict(every=STEPS // 15, sample_tokens=0))
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid(
    {
      "model.position": ["sinusoidal", "learned", "rope", "alibi", "t5_bias", "none"],
      "model.norm_placement": ["pre", "post"],
    }
  )
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate_tokens=12_288))
  return config
