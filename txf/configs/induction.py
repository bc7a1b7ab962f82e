"""A 2-layer decoder learns an induction circuit on repeated random blocks.

  txf-run --config=induction --workdir=/tmp/txf/induction
  txf-analyze --workdir=/tmp/txf/induction --ablate=L1H0,L1H1 --periods=24,23

Each row is one block of 4..16 distinct random symbols (of 32) repeated to
fill 48 tokens (txf.data.incontext); loss and accuracy count the second copy
onwards only. A variable period is what makes the model copy by content (a
layer-0 previous-token head feeding a layer-1 induction head) instead of
fixed-offset positional heads. docs/induction.md has the analysis.

Expected on 2 CPU cores (shared with other jobs): about 5 minutes;
eval_accuracy 0.999 at step 500 and 1.0000 at 3000 (seeds 0, 1 and 2,
2026-11-27; docs/data/induction). txf-analyze then reports two or three
layer-0 previous-token heads and four layer-1 induction heads (0.80-0.96 at
probe periods 24 and 23, which --periods=24,23 asks for as docs/induction.md
does; without it txf-analyze probes 23 and 19, leaving out 24, which blocks
of 4, 6, 8 and 12 tokens repeat with); --ablate=L1H0,L1H1,L1H2,L1H3 drops
accuracy to 0.03.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.d_model = 64
  config.data.name = "induction"
  config.data.seq_len = 48
  config.data.min_example_len = 4
  config.data.max_example_len = 16
  config.data.num_symbols = 32
  config.train.steps = 3000
  config.train.warmup_steps = 100
  config.eval.every = 500
  config.eval.sample_tokens = 0
  config.train.checkpoint_every = 1000
  return config
