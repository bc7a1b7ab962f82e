"""txf's benchmarks: every timed comparison, one command (`python -m
benchmarks.run MODE`, see benchmarks/run.py) with one module per mode:

  step.py            the jitted training step (tokens/s, MFU, compiled memory)
  loop.py            the real training loop against the bare step
  decode.py          KV-cache generation against the physical floor
  data.py            the training data path on the host, and to the devices
  replicas.py        seed replicas against one replica and sequential runs
  seq2seq_decode.py  encoder-decoder decoding, cross-attention cached or not
  references/        the frameworks txf is timed against (PyTorch, transformers),
                     scripts run in a subprocess

A new benchmark is a new mode: a module here with `define_flags()` and
`main()` (returning its figures as a dict), and its name in run.MODES.
gpu.sh runs every GPU figure docs/benchmarks.md reports, summarize.py turns
the JSON reports into its table rows.
"""
