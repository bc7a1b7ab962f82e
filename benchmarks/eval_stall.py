"""How long each evaluation stops training: seconds from an eval step's
progress line to its eval line, in a short txf.train.loop.run of
gpt2_small's architecture at a width a CPU runs (d_model 64, 128 tokens,
batch 8, eval and a 64-token sample every 20 steps).

  PYTHONPATH=. python benchmarks/eval_stall.py

The first evaluation also pays for compiling the eval step and the sampler
unless the loop compiled them ahead (it does since 2026-11-24; run this in a
checkout of an older commit to compare).
"""

import tempfile
import time

from benchmarks.loop import PROGRESS
from txf.configs import gpt2_small
from txf.runconfig.run_config import parse
from txf.train import loop


def main() -> None:
  config = gpt2_small.get_config()
  config.model.update(dict(d_model=64, num_heads=4, vocab_size=512, dtype="float32"))
  config.data.update(dict(seq_len=128, batch_size=8, max_corpus_bytes=2_000_000))
  config.train.update(dict(steps=60, log_every=20, checkpoint_every=10**6, warmup_steps=10))
  config.eval.update(dict(every=20, num_batches=4, sample_tokens=64))
  marks = []
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    loop.run(parse(config), workdir, log=lambda line: marks.append((time.perf_counter(), line)))
    wall = time.perf_counter() - start
  progress = {}
  for seconds, line in marks:
    if match := PROGRESS.match(line):
      progress[int(match.group(1))] = seconds
      print(line)
    elif line.startswith("eval @ "):
      step = int(line.split()[2].rstrip(":"))
      print(f"eval + sample at step {step}: {seconds - progress[step]:.2f} s")
  print(f"whole run: {wall:.1f} s")


if __name__ == "__main__":
  main()
