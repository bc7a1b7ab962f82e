"""Positional encodings x Pre-/Post-LN: the six encodings x two norm placements.

  python -m experiments.sweep --config=configs/sweeps/pe_ln.py --workdir=runs/pe_ln

12 points, each configs/base.py as it stands (byte-level decoder LM on the
Python standard library, d_model=128, 2 layers, seq_len=128, batch 32, its
600-step cosine schedule with 60 warmup steps) with 2 seed replicas (seeds
0, 1 side by side in one program), evaluated every 60 steps (so the
flattening criterion's window, the last fifth, starts on an evaluation), then
at 1x-16x the training length on 12,288 validation tokens. Each point's run
directory is runs/pe_ln/<point name>, e.g.
runs/pe_ln/position=rope,norm_placement=pre; results.csv, results.md and the
plots land in runs/pe_ln. results.md's "flat" column says whether each
point's validation loss improved by less than 2% over its last fifth
(txf.sweep.results.FLAT_TOLERANCE).

Why this length, these seeds and this size. The sweep must train until the
encodings separate, within 90 minutes on a 2-core CPU. 250 steps (the
earlier setting) did not: there the T5 bias and the learned table were
within 0.05 nats of no position encoding, while with 1000 steps both are
about 0.4 nats ahead of it (single seed; docs/results.md). Timing: one seed
of configs/base.py costs 329 ms a step on the idle 2-core CPU
(docs/results.md, "Seeds as replicas"); timed side by side on the shared
CPU (benchmarks.run replicas, --replicas=2 --steps=10, 2026-11-25), the
slowest point, t5_bias, used the CPU time rope did (105 vs 104 CPU-s for the
same benchmark; the contended wall times were too noisy to compare) and two
seeds in one program cost 1.70x (t5_bias) to 1.89x (rope) one. So a point of
600 steps and 2 seeds is about 600 x 329 ms x 1.89 = 373 s of training on
the idle CPU, plus about 35 s of start-up and evaluations and 40 s of
extrapolation (two thirds of the 3-seed sweep's minute): about 90 minutes
for the 12 points (12 x 448 s), at the limit; lower the extrapolation's
tokens first if it runs over. 1000 steps at 2 seeds (about 2 hours) or 3
seeds at 600 steps do not fit; 2 seeds give a std per point, and a gap of a
few times it is the least a finding needs.

Measured since (2026-11-25, idle 2-core CPU): point 0 trained at about
9,200 tokens/s, 0.88 s a step for both seeds, 9-10 minutes a point with its
evaluations and extrapolation: about 2 hours for the sweep, not the 90
minutes estimated above (the 1.89x replica cost was measured under load).
configs/sweeps/pe_ln_gpu.py asks the same question with 7x the parameters
on a GPU (docs/results.md, section 1).

Not known yet: whether every point meets the flattening criterion at 600
steps. The criterion alone does not show that a run has converged: every
250-step single-seed run of configs/base.py met it (-0.9% to -1.3% over the
last fifth) although 1000 steps go 0.6 nats lower, and both 1000-step runs
(T5 bias, learned) missed it (-3.7%, -3.1%). This sweep has not been run
with these settings; its flat column will say which points flattened
(docs/results.md says what the 250-step sweep of 2026-11-23 did and did not
show).
"""

import ml_collections

from txf.configs import base
from txf.sweep.grid import make_grid

RUN_CONFIG = "configs/base.py"
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
