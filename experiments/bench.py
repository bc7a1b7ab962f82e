"""Times the jitted train step of a config on random tokens: no data loading,
checkpoints or logging, so it isolates the compiled step.

  python -m experiments.bench --config=configs/gpt2_small.py --steps=400 --window=50

Prints, per window of steps, the step time, tokens/s and MFU (6N + attention
FLOPs per token over the device's peak, where the peak is known).

--fresh_batches sends a new host batch to the devices every step (as training
does) instead of reusing one; --sync=false dispatches steps asynchronously
and times whole windows (as the training loop runs) instead of timing each
step to completion and taking the median.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from txf import models
from txf.analysis import flops_per_token
from txf.data import make_tokenizer
from txf.train import hardware, sharding
from txf.train.config import check_run_config
from txf.train.optim import make_optimizer
from txf.train.step import init_params, init_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 200, "Timed steps.")
_WINDOW = flags.DEFINE_integer("window", 50, "Steps per reported window.")
_FRESH = flags.DEFINE_bool("fresh_batches", False, "A new host batch every step.")
_SYNC = flags.DEFINE_bool("sync", True, "Wait for every step (median) or only per window.")
flags.mark_flag_as_required("config")


def random_batch(task: str, batch_size: int, seq_len: int, vocab_size: int, rng) -> dict:
  """A batch of the task's layout with uniformly random tokens."""
  tokens = lambda: rng.integers(3, vocab_size, (batch_size, seq_len), dtype=np.int32)
  weights = np.ones((batch_size, seq_len), np.float32)
  if task == "seq2seq":
    return dict(encoder_inputs=tokens(), decoder_inputs=tokens(), targets=tokens(),
                weights=weights)
  if task == "classify":
    return dict(inputs=tokens(), labels=rng.integers(0, 2, (batch_size,), dtype=np.int32))
  return dict(inputs=tokens(), targets=tokens(), weights=weights)


def main(argv) -> None:
  del argv
  config = _CONFIG.value
  tokenizer = make_tokenizer(config.data)
  model_cfg = check_run_config(config, vocab_size=tokenizer.vocab_size, num_classes=None)
  model, optimizer = models.build(model_cfg), make_optimizer(config.train)
  mesh = sharding.make_mesh(config.parallel)
  task = config.data.task
  rng = np.random.default_rng(0)
  batch = random_batch(task, config.data.batch_size, config.data.seq_len,
                       tokenizer.vocab_size, rng)
  init_fn = lambda key: init_state(model, optimizer, batch, task, key)
  state_sharding = sharding.state_shardings(
      jax.eval_shape(init_fn, jax.random.key(0)),
      jax.eval_shape(lambda key: init_params(model, batch, task, key), jax.random.key(0)), mesh)
  state = jax.jit(init_fn, out_shardings=state_sharding)(jax.random.key(0))
  step = jax.jit(make_train_step(model, optimizer, task, seed=0,
                                 grad_accum_steps=config.train.grad_accum_steps),
                 out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=0)
  device_batch = sharding.shard_batch(batch, mesh)
  state, metrics = step(state, device_batch)  # compile
  jax.block_until_ready(metrics)
  tokens = config.data.batch_size * config.data.seq_len
  flops = flops_per_token(model_cfg, config.data.seq_len)
  peak = hardware.peak_flops_per_device(dtype=model_cfg.dtype)
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"{tokens} tokens/step, {flops:.3g} FLOPs/token")
  batches = [random_batch(task, config.data.batch_size, config.data.seq_len,
                          tokenizer.vocab_size, rng) for _ in range(8)] if _FRESH.value else None
  times, window_start = [], time.perf_counter()
  for i in range(_STEPS.value):
    start = time.perf_counter()
    if batches is not None:
      device_batch = sharding.shard_batch(batches[i % len(batches)], mesh)
    state, metrics = step(state, device_batch)
    if _SYNC.value:
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
    if (i + 1) % _WINDOW.value == 0:
      if _SYNC.value:
        step_time = statistics.median(times[-_WINDOW.value:])
      else:
        jax.block_until_ready(metrics)
        step_time = (time.perf_counter() - window_start) / _WINDOW.value
        window_start = time.perf_counter()
      utilisation = hardware.mfu(flops, tokens / step_time, jax.device_count(), peak)
      mfu_text = f", MFU {100 * utilisation:.1f}%" if utilisation is not None else ""
      print(f"steps {i + 2 - _WINDOW.value}-{i + 1}: {1e3 * step_time:.1f} ms/step, "
            f"{tokens / step_time:,.0f} tokens/s{mfu_text}, loss {float(metrics['loss']):.3f}")

if __name__ == "__main__":
  app.run(main)
