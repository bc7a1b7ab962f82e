"""T5's relative bias past its training length: is its last bucket the cause?

  txf-sweep --config=sweeps/t5_distance --workdir=runs/t5_distance
  SWEEP_CONFIG=configs/sweeps/t5_distance.py:gpu bash benchmarks/gpu.sh sweep   # one GPU call

docs/results.md section 2 finds the T5 bias (32 buckets, max distance 128)
losing +1.0 nats at 2x the training length (128 tokens) and puts it on
`model.options.t5_max_distance` being the training length: in this causal model
the last bucket starts at distance 113, so in training it held at most 15
keys of a query, against about 1,935 at 16x. This sweep tests that cause.
The cpu setting (default): 4 points, sweeps/pe_ln's T5-bias Pre-LN point (d_model 64, seq_len 128,
1800 steps) with t5_max_distance 32, 64, 128 (pe_ln's) and 512, and 3 seed
replicas that differ in data order too (data.seed_per_replica: replica r
trains as the single run of seed r with data seed r); each is evaluated at
1x-16x the training length on 12,288 validation tokens. Where each max
distance puts the last bucket (causal, 32 buckets;
txf.ops.relative_position_bucket):

cpu, training length 128, distances < 2048 (16x):
  max      last bucket    buckets a 128-token    distances < 2048 in
  distance from distance  row trains             untrained buckets
  32       31             31                     0
  64       59             32                     0
  128      113            32                     0
  512      413            26                     1,908

gpu, training length 256, distances < 4096 (16x):
  max      last bucket    buckets a 256-token    distances < 4096 in
  distance from distance  row trains             untrained buckets
  64       59             32                     0
  128      113            32                     0
  256      216            32                     0
  1024     790            27                     3,816

If the last bucket's sparse training is the cause, the loss at 8x and 16x
falls as max distance shrinks (at 32 the last bucket is trained on most of
each row), and 512, whose far buckets are never trained, is worst. If the
loss past 2x does not order by max distance, the cause is elsewhere (the
softmax spreading over more keys hurts every encoding but ALiBi, whose
bias grows with distance).

Measured (2026-11-28, 2-core CPU, 58 minutes of which the first point ran
beside the test suite; about 11 minutes a point idle; docs/results.md,
raw outputs in docs/data/t5_distance): every point's mean flat, but in each
one seed still falling 2.1-2.5% (not flat by the per-seed rule); validation loss at
128 tokens 1.635-1.640 at every distance; sliding-window loss at 2048
tokens 2.48 / 2.44 / 2.68 / 3.12 for max distance 32 / 64 / 128 / 512. So
the last bucket explains about a fifth of the loss at 16x, untrained
buckets (512) make it much worse, and +0.9 nats remain at 32 and 64.
Those are the count of keys sharing the last bucket: lowering each one's
bias by log(n / n_train) at inference brings the loss at 2048 tokens to
within 0.003-0.016 nats of the loss at 128 (`python -m tools.t5_dilution`,
docs/results.md).

The gpu setting asks the same of sweeps/pe_ln_gpu's T5-bias Pre-LN point
(training length 256, d_model 256, 4 layers, 2000 steps), where section 1
used max distance 128 and still lost 1.9-2.1 nats at 16x (its table's
figures; that run's raw outputs were not kept, so they are not recomputable
until its rerun commits them): max distance 64,
128, 256 (the training length) and 1024, 3 seeds of both kinds. Not yet run
(it waits for a GPU).
"""

import ml_collections

from txf.configs.sweeps import pe_ln, pe_ln_gpu, pick_setting
from txf.sweep.grid import make_grid

# Setting -> (its sweep of the 12 encoding x placement points, the max
# distances): each list holds the training length and 4x it.
SETTINGS = {"cpu": (pe_ln, [32, 64, 128, 512]), "gpu": (pe_ln_gpu, [64, 128, 256, 1024])}


def get_config(setting: str | None = None) -> ml_collections.ConfigDict:
  sweep, distances = pick_setting("t5_distance", SETTINGS, setting)
  config = sweep.get_config()
  config.base.replicas = 3
  config.base.data.seed_per_replica = True
  config.base.model.update(dict(position="t5_bias", norm_placement="pre"))
  config.grid = make_grid({"model.options.t5_max_distance": distances})
  return config
