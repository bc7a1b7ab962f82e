"""Positional encodings x Pre-/Post-LN at GPU scale: the pe_ln sweep's 12
points, a model 28x the CPU sweep's parameters and 4.4x its tokens per seed.

  txf-sweep --config=sweeps/pe_ln_gpu --workdir=runs/pe_ln_gpu
  bash benchmarks/gpu.sh sweep   # in a checkout: 6 points side by side on one GPU

Each point: a byte-level decoder LM on the built-in corpus (the Python
standard library; 20 MB per split where the host's stdlib has it), 4 layers,
d_model 256, 4 heads, sequence 256, batch 64, 2000 steps (33M tokens per
seed; a 2000-step cosine schedule with 200 warmup steps, peak learning rate
2e-3), 2 seeds side by side in one program, evaluated every 200 steps, then
at 1x-16x the training length on 65,537 validation tokens (16 sequences at
4096). The CPU sweep (configs/sweeps/pe_ln.py) is d_model 64, 2 layers,
sequence 128, 1800 steps of 4096 tokens.

Why this size: the whole sweep, extrapolation included, should fit one
10-minute call of a lent H100/H200: about 0.7 TFLOP a step (both seeds),
milliseconds on such a GPU, so compiling (train step, evaluation, five
extrapolation lengths) weighs as much as training; gpu.sh runs six points at
once to overlap the compiles. Measured on an H200 (2026-11-26,
docs/results.md section 1): 571 s of wall time for the 12 points, six at a
time, about 0.7M training tokens/s across the six processes (that run's raw
outputs were not kept, so its figures, these and the losses below, are not
recomputable until a rerun commits them). Expected result: every point
trains without diverging; ALiBi, RoPE and sinusoidal (RoPE with Pre-LN) end
within 0.02 nats of each other near 0.90-0.92 nats/token, NoPE about 0.25
behind (the corpus is the host Python's standard library, so the
numbers move with the Python version); only ALiBi's loss falls from 1x to
16x.
"""

import ml_collections

from txf.configs.sweeps import pe_ln

STEPS = 2000
SEQ_LEN = 256


def get_config() -> ml_collections.ConfigDict:
  config = pe_ln.get_config()
  run = config.base
  run.model.update(dict(num_layers=4, d_model=256, num_heads=4))
  run.data.update(dict(seq_len=SEQ_LEN, batch_size=64, max_corpus_bytes=20_000_000))
  run.train.update(
    dict(
      steps=STEPS,
      learning_rate=2e-3,
      warmup_steps=STEPS // 10,
      log_every=STEPS // 10,
      checkpoint_every=STEPS // 2,
    )
  )
  # Ten evaluations (the flattening criterion's window, the last fifth, starts
  # on one); no samples, whose decoding would add a compile to every point.
  run.eval.update(dict(every=STEPS // 10, sample_tokens=0))
  config.sweep.extrapolate_tokens = 16 * 16 * SEQ_LEN + 1
  return config
