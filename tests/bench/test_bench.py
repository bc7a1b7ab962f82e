"""Speed accounting and speed paths: FLOP and MFU arithmetic against hand
counts, memory bandwidth and the decoding floor, the fused chunked loss
against the plain path and float64 numpy, the evaluation compiled in the
background, the long-context config, and the benchmark modes (step with the
PyTorch reference, loop, decode, data, replicas, seq2seq decoding) writing
their figures at toy size, and the one command that runs them.

Speed itself is never asserted here: benchmarks print figures
(docs/benchmarks.md), tests check what the figures are made of.
"""

import importlib.util
import json
import math
import os
import pickle
import re
import shlex
import stat
import subprocess
import sys
import threading
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import (
  checkpoint_stall as bench_checkpoint_stall,
  data as bench_data,
  decode as bench_decode,
  embedding_grad as bench_embedding_grad,
  kernels as bench_kernels,
  loop as bench_loop,
  loss_kernel as bench_loss_kernel,
  replicas as bench_replicas,
  run as run_module,
  seq2seq_decode as bench_seq2seq,
  step as bench_step,
  summarize as bench_summarize,
)
from benchmarks.references import hf_gpt2_decode as hf_reference
from conftest import REPO, load_config
from txf import hardware, ops
from txf.analysis import flops_per_token, matmul_params
from txf.data import throughput
from txf.layers.model_config import ModelConfig
from txf.models import build
from txf.runconfig.run_config import parse, replica_seeds, to_json
from txf.rundir.resume import MIGRATIONS, read_run_config
from txf.train import loop
from txf.train.run_setup import setup_run
from txf.train.step import _apply_without_head, make_train_step

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _param_count(config) -> int:
  """Parameters of the model txf builds for run config `config`."""
  params = setup_run(parse(config)).abstract_state.params
  return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def gpt2_tiny(**model):
  """configs/gpt2_small.py at toy size (GPT-2's architecture, float32)."""
  config = load_config("gpt2_small")
  config.model.update(
    {
      **dict(d_model=32, num_heads=2, num_layers=1, vocab_size=260, max_len=64, dtype="float32"),
      **model,
    }
  )
  config.data.update(dict(seq_len=32, batch_size=4, max_corpus_bytes=200_000))
  config.train.update(dict(warmup_steps=2, checkpoint_every=1000))
  config.eval.update(dict(every=1000, num_batches=1, sample_tokens=0))
  return config


# ---------------------------------------------------------------------------
# FLOPs per token and MFU, by hand.


def test_flops_per_token_of_gpt2_small_by_hand():
  cfg = ModelConfig.from_config(load_config("gpt2_small").model)
  # N, the matmul weights: 12 layers x (q, k, v, out: 4 * 768^2; FFN 2 * 768 * 3072)
  #   = 12 * 7,077,888 = 84,934,656, plus the tied head 768 * 50,304 = 38,633,472.
  # Attention, 12 * L * H * Dh * T = 12 * 12 * 768 * 1024 = 113,246,208.
  assert matmul_params(cfg) == 123_568_128
  assert flops_per_token(cfg, 1024) == 6 * 123_568_128 + 113_246_208  # 854,654,976
  # The orientation figure: the PyTorch recipe at 471k tokens/s on an
  # H100 SXM is "40.7% MFU by 6N + 12LHQT over 989 TFLOP/s".
  h100 = types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")
  peak = hardware.peak_flops_per_device(h100, "bfloat16")
  assert peak == 989.5e12
  assert hardware.mfu(flops_per_token(cfg, 1024), 471e3, 1, peak) == pytest.approx(0.407, abs=5e-4)


def test_flops_per_token_of_an_encoder_decoder_by_hand():
  cfg = ModelConfig(
    family="encoder_decoder",
    vocab_size=100,
    d_model=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    d_ff=96,
    activation="swiglu",
    num_layers=2,
    num_decoder_layers=3,
  )
  # One attention's q, k, v, out: 64 * 16 * (4 + 2 + 2 + 4) = 12,288; gated FFN 3 * 64 * 96
  # = 18,432. Encoder 2 * (12,288 + 18,432) = 61,440; decoder (self + cross + FFN)
  # 3 * 43,008 = 129,024; head 64 * 100 = 6,400: N = 196,864.
  # Attention sub-layers: 2 + 3 self + 3 cross = 8; 12 * 8 * (4 * 16) * T=20 = 122,880.
  assert matmul_params(cfg) == 196_864
  assert flops_per_token(cfg, 20) == 6 * 196_864 + 122_880


def test_memory_bandwidth_and_the_decoding_floor():
  kind = lambda name: types.SimpleNamespace(device_kind=name)
  assert hardware.memory_bandwidth_per_device(kind("NVIDIA H100 80GB HBM3")) == 3.35e12
  assert hardware.memory_bandwidth_per_device(kind("NVIDIA H100 PCIe")) == 2.0e12
  assert hardware.memory_bandwidth_per_device(kind("NVIDIA H200")) == 4.8e12
  assert hardware.memory_bandwidth_per_device(kind("NVIDIA A100-SXM4-40GB")) == 1.555e12
  assert hardware.memory_bandwidth_per_device(kind("cpu")) is None
  # The issue: reading 124M bf16 weights once takes about 74 microseconds on an H100.
  floor = hardware.decode_floor_seconds(2 * 124.4e6, 3.35e12)
  assert floor == pytest.approx(74.3e-6, rel=1e-3)
  assert hardware.decode_floor_seconds(1e6, None) is None
  with pytest.raises(ValueError, match="bandwidth"):
    hardware.decode_floor_seconds(1e6, 0.0)


# ---------------------------------------------------------------------------
# The fused, chunked loss.


def numpy_sums(x, kernel, labels, weights, label_smoothing, z_loss):
  """(loss sum, correct count) in float64 numpy."""
  logits = np.einsum("btd,dv->btv", np.asarray(x, np.float64), np.asarray(kernel, np.float64))
  top = logits.max(-1, keepdims=True)
  log_z = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
  nll = log_z - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
  per_token = (
    (1 - label_smoothing) * nll + label_smoothing * (log_z - logits.mean(-1)) + z_loss * log_z**2
  )
  return (weights * per_token).sum(), (weights * (logits.argmax(-1) == labels)).sum()


def loss_inputs(seed, B=2, T=8, D=6, V=13, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(seed), 4)
  return (
    jax.random.normal(keys[0], (B, T, D)).astype(dtype),
    jax.random.normal(keys[1], (D, V)).astype(dtype),
    jax.random.randint(keys[2], (B, T), 0, V),
    (jax.random.uniform(keys[3], (B, T)) > 0.3).astype(jnp.float32),
  )


def test_linear_cross_entropy_equals_float64_numpy_and_the_plain_path():
  x, kernel, labels, weights = loss_inputs(0)
  label_smoothing, z_loss = 0.1, 1e-3
  fused = lambda x, kernel: ops.linear_cross_entropy_sums(
    x,
    kernel,
    labels,
    weights_BxT=weights,
    chunk_len=4,
    label_smoothing=label_smoothing,
    z_loss=z_loss,
  )
  loss, count, correct = jax.jit(fused)(x, kernel)
  expected_loss, expected_correct = numpy_sums(
    x, kernel, np.asarray(labels), np.asarray(weights), label_smoothing, z_loss
  )
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  assert correct == expected_correct and count == weights.sum()

  def plain(x, kernel):
    logits = jnp.einsum("btd,dv->btv", x, kernel, precision="highest")
    mean, tokens = ops.cross_entropy(
      logits, labels, weights=weights, label_smoothing=label_smoothing, z_loss=z_loss
    )
    return mean * tokens

  # An upstream scale (the step divides by the token count) must reach both grads.
  grads = jax.jit(jax.grad(lambda *a: 0.37 * fused(*a)[0], argnums=(0, 1)))(x, kernel)
  expected = jax.jit(jax.grad(lambda *a: 0.37 * plain(*a), argnums=(0, 1)))(x, kernel)
  for got, want in zip(grads, expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_in_bfloat16_is_within_its_rounding():
  x, kernel, labels, weights = loss_inputs(1, T=16, D=32, V=50, dtype=jnp.bfloat16)
  loss, _, _ = jax.jit(
    lambda x: ops.linear_cross_entropy_sums(x, kernel, labels, weights_BxT=weights, chunk_len=8)
  )(x)
  expected, _ = numpy_sums(
    x.astype(jnp.float32),
    kernel.astype(jnp.float32),
    np.asarray(labels),
    np.asarray(weights),
    0.0,
    0.0,
  )
  # bf16 operands, float32 accumulation and loss: rounding of the logits only.
  np.testing.assert_allclose(loss, expected, rtol=1e-2)
  grad_x = jax.jit(
    jax.grad(
      lambda x: ops.linear_cross_entropy_sums(x, kernel, labels, weights_BxT=weights, chunk_len=8)[
        0
      ]
    )
  )(x)
  assert grad_x.dtype == jnp.bfloat16


def test_linear_cross_entropy_rejects_bad_inputs():
  x, kernel, labels, weights = loss_inputs(2)
  with pytest.raises(ValueError, match="chunk_len 3 does not divide the length T = 8"):
    ops.linear_cross_entropy_sums(x, kernel, labels, chunk_len=3)
  with pytest.raises(ValueError, match="same D"):
    ops.linear_cross_entropy_sums(x, kernel[1:], labels, chunk_len=4)
  with pytest.raises(ValueError, match="labels must be integer"):
    ops.linear_cross_entropy_sums(x, kernel, weights, chunk_len=4)
  with pytest.raises(ValueError, match="weights must have the shape"):
    ops.linear_cross_entropy_sums(x, kernel, labels, weights_BxT=weights[:, :4], chunk_len=4)


def test_loss_kernel_bench_times_xla_and_every_kernel_variant(tmp_path, capsys):
  """Without a GPU the kernel variants run in Pallas's interpreter on a few
  rows: the harness, checked by their agreement with the XLA path (within
  one bf16 ulp of the largest gradient entry; the loss to float32's rounding)."""
  config = gpt2_tiny(vocab_size=512, dtype="bfloat16")
  figures = bench_loss_kernel.compare(config, repeats=1, blocks=[128, 512], warps=[4], cpu_rows=3)
  assert (figures["rows"], figures["vocab"], figures["dtype"]) == (3, 512, "bfloat16")
  variants = figures["variants"]
  assert list(variants) == ["xla", "block128_warps4", "block512_warps4"]
  assert variants["xla"]["max_grad_difference"] == 0
  for row in variants.values():
    assert row["ms"] > 0 and row["loss_difference"] < 1e-5
    assert row["max_grad_difference"] <= 2.0**-7 / 3  # the weights are 1 / rows
  # gpu.sh prints every report of a part with benchmarks/summarize.py: a row each.
  report = dict(mode="loss_kernel", **hardware.environment(), **figures)
  (tmp_path / "loss_kernel.json").write_text(json.dumps(report))
  bench_summarize.main([str(tmp_path)])
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| loss_kernel")]
  assert [row.split(" | ")[2] for row in rows] == list(variants)


@pytest.mark.parametrize(
  "values,most,valid",
  [
    (["1", "4096", "65536"], None, True),
    (["1", "32"], 32, True),
    (["64"], 32, False),
    (["0"], None, False),
    (["100"], None, False),
    (["-4"], None, False),
    (["abc"], None, False),
  ],
)
def test_loss_kernel_flags_take_powers_of_two(values, most, valid):
  assert bench_loss_kernel._powers_of_two(values, most) is valid


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_the_fused_loss_gives_the_plain_loss_and_gradients():
  setup = setup_run(parse(gpt2_tiny()))
  batch = next(iter(setup.train_data))
  sgd = optax.sgd(1.0)  # new params = params - gradient: the update is the gradient
  state = setup.init()
  state = state.replace(opt_state=sgd.init(state.params))

  def step(loss_chunk_len):
    train_step = make_train_step(
      setup.model,
      sgd,
      setup.task,
      seed=0,
      label_smoothing=0.1,
      z_loss=1e-4,
      loss_chunk_len=loss_chunk_len,
    )
    new_state, metrics = jax.jit(train_step)(state, batch)
    grads = jax.tree.map(
      lambda old, new: np.asarray(old, np.float64) - np.asarray(new), state.params, new_state.params
    )
    return metrics, np.concatenate([g.ravel() for g in jax.tree.leaves(grads)])

  (plain, plain_grad), (fused, fused_grad) = step(0), step(8)
  # float32: the same function up to summation order (bfloat16: see
  # test_linear_cross_entropy_in_bfloat16_is_within_its_rounding).
  for name in ("loss", "grad_norm", "accuracy"):
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-5)
  assert np.linalg.norm(plain_grad) > 0
  assert np.linalg.norm(fused_grad - plain_grad) <= 1e-5 * np.linalg.norm(plain_grad)


@pytest.mark.parametrize("tied", [True, False])
def test_the_fused_loss_sees_the_models_own_head(tied):
  model_cfg = ModelConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, tie_embeddings=tied)
  model = build(model_cfg)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 40)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(1), tokens)["params"])
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
  (hidden, kernel), logits = jax.jit(
    lambda p: (_apply_without_head(model, p, (tokens,)), model.apply({"params": p}, tokens))
  )(params)
  if tied:  # the embedding, transposed, times 1/sqrt(D) (txf.models.LMHead.scaled_kernel)
    expected = params["embedder"]["token"]["embedding"].T / 4.0
  else:
    expected = params["head"]["logits"]["kernel"]
  np.testing.assert_allclose(kernel, expected, rtol=1e-6)
  np.testing.assert_allclose(
    jnp.einsum("btd,dv->btv", hidden, kernel), logits, rtol=1e-5, atol=1e-6
  )


def test_loss_chunk_len_is_checked_against_the_head_and_length():
  config = gpt2_tiny()
  config.train.loss_chunk_len = 5
  with pytest.raises(
    ValueError,
    match=r"^train.loss_chunk_len: 5 does not divide "
    r"data.seq_len=32",
  ):
    parse(config)
  mlm = load_config("encoder_mlm")
  mlm.train.loss_chunk_len = 8
  with pytest.raises(ValueError, match=r"^train.loss_chunk_len: the fused loss needs an 'lm'"):
    parse(mlm)


def test_runs_written_before_loss_chunk_len_read_it_as_0(tmp_path):
  saved = json.loads(load_config("base").to_json_best_effort())
  del saved["train"]["loss_chunk_len"], saved["replicas"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  run = read_run_config(tmp_path)
  assert run.train.loss_chunk_len == 0 and run.replicas == 1
  assert ("added", "train.loss_chunk_len", 0) in MIGRATIONS


# ---------------------------------------------------------------------------
# Long context.


def test_gpt2_small_8k_lowers_with_causal_attention_and_no_mask(monkeypatch):
  config = load_config("gpt2_small_8k")
  assert (config.data.seq_len, config.model.max_len) == (8192, 8192)
  assert config.data.batch_size * config.data.seq_len == 32 * 1024  # as gpt2_small
  config.model.update(dict(d_model=16, num_heads=2, num_layers=1, dtype="float32"))
  config.data.update(dict(batch_size=1, max_corpus_bytes=300_000))
  setup = setup_run(parse(config))
  calls = []
  attend = ops.dot_product_attention
  monkeypatch.setattr(
    ops,
    "dot_product_attention",
    lambda *args, **kwargs: calls.append(kwargs) or attend(*args, **kwargs),
  )
  batch = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), setup.to_device(next(iter(setup.eval_data)))
  )
  with setup.activation_sharding():
    lowered = setup.train_step.lower(setup.abstract_state, batch)
  assert "8192" in lowered.as_text()
  # is_causal without a mask or bias array: what selects cuDNN's flash kernel
  # (memory linear in T) on a GPU, see txf.ops.dot_product_attention.
  assert calls and all(c["is_causal"] and c["mask"] is None and c["bias"] is None for c in calls)


# ---------------------------------------------------------------------------
# Kernel time by category (benchmarks/kernels.py), from profiles' raw tables.


@pytest.mark.parametrize(
  "kernel,expected",
  [
    ("gemm_fusion_dot_12", "gemm"),  # XLA:GPU's Triton GEMM
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),  # cuBLAS
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN", "gemm"),  # cuBLAS on Hopper
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("input_scatter_fusion_3", "scatter/gather"),
    ("triton_poi_fused_embedding_dense_backward_2", "scatter/gather"),
    ("input_reduce_fusion_7", "reduction"),
    ("triton_red_fused__log_softmax_0", "reduction"),
    ("cross_entropy_statistics_and_gradient", "reduction"),
    ("triton_per_fused_native_layer_norm_1", "reduction"),
    ("loop_add_fusion_2", "elementwise"),
    ("triton_poi_fused_add_gelu_3", "elementwise"),
    ("multi_tensor_apply_kernel", "elementwise"),  # PyTorch's fused AdamW
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("wrapped_transpose", "copy"),
    ("some_unnamed_kernel", "other"),
  ],
)
def test_kernels_fall_in_their_category(kernel, expected):
  assert bench_kernels.category(kernel) == expected


def test_busy_time_is_the_union_of_kernel_intervals():
  rng = np.random.default_rng(0)
  starts = rng.integers(0, 1000, 200)
  intervals = [(int(s), int(s + d)) for s, d in zip(starts, rng.integers(1, 40, 200))]
  covered = np.zeros(1100, bool)  # the union by brute force, on the integer grid
  for start, end in intervals:
    covered[start:end] = True
  assert bench_kernels.busy_ns(intervals) == covered.sum()
  assert bench_kernels.busy_ns([(0, 10), (2, 5), (10, 12), (20, 21)]) == 13


def test_profile_summary_figures_per_step():
  kernels = {"gemm_fusion_dot": [4, 8_000_000], "loop_add_fusion": [6, 2_000_000]}
  # Two streams: the add overlaps the GEMM for 1 ms; 1 ms idle in the middle.
  intervals = [(0, 4_000_000), (3_000_000, 4_000_000), (5_000_000, 10_000_000)]
  summary = bench_kernels.profile_summary(kernels, intervals, steps=2)
  assert summary["kernels_per_step"] == 5
  assert summary["device_ms_per_step"] == pytest.approx(5.0)
  assert summary["span_ms_per_step"] == pytest.approx(5.0)
  assert summary["busy_ms_per_step"] == pytest.approx(4.5)
  assert summary["categories"] == {
    "gemm": {"launches": 2, "ms": pytest.approx(4.0)},
    "elementwise": {"launches": 3, "ms": pytest.approx(1.0)},
  }
  text = bench_kernels.format_summary("txf", summary)
  assert text.splitlines()[1].split() == ["gemm", "4.00", "ms/step,", "2", "kernels"]


# ---------------------------------------------------------------------------
# The benchmark modes.


@pytest.mark.slow  # trains a run
def test_loop_bench_times_each_variant_and_the_loop_compiles_evals_aside(monkeypatch):
  # A known peak, so the loop's and the benchmark's MFU can be checked (CPUs have none).
  monkeypatch.setattr(hardware, "peak_flops_per_device", lambda device=None, dtype=None: 1e12)
  compiled = []

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append((kwargs.get("fun_name"), threading.current_thread().name))

  jax.monitoring.register_event_duration_secs_listener(listener)
  config = gpt2_tiny()
  config.eval.sample_tokens = 4  # each run evaluates and samples after its last step
  try:
    report = bench_loop.compare(config, steps=4, window=2, variants=["random_ids", "host_only"])
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  flops = flops_per_token(dict(config.model), 32)
  step = report["step"]
  assert report["flops_per_token"] == flops and report["tokens_per_step"] == 4 * 32
  runs = {run["variant"]: run for run in report["loop"]}
  assert list(runs) == ["random_ids", "host_only"]
  for run in runs.values():
    assert [w["last_step"] for w in run["windows"]] == [2, 4]
    assert (run["first_step"], run["last_step"]) == (2, 4)
    assert run["ratio_to_step"] == pytest.approx(
      run["amortised_tokens_per_sec"] / step["tokens_per_sec"], rel=1e-9
    )
  # MFU in the loop's metrics and in the benchmark: one FLOP count over the peak.
  for window in step["windows"] + runs["random_ids"]["windows"]:
    assert window["mfu"] == pytest.approx(flops * window["tokens_per_sec"] / 1e12, rel=1e-9)
  # The no-op step replaced the model's (its metrics are ones); the real one
  # starts near ln 260 = 5.56 nats on random ids.
  assert all(w["loss"] == 1.0 for w in runs["host_only"]["windows"])
  assert all(4.0 < w["loss"] < 7.0 for w in runs["random_ids"]["windows"])
  # The eval step and the sampler compiled once, in the loop's background
  # thread, never in the loop's own (which then only retraces them).
  for name in ("jit(eval_step)", "jit(_generate)"):
    assert [thread for fun, thread in compiled if fun == name] == [loop.COMPILE_THREAD]
  assert not any(t.name == loop.COMPILE_THREAD for t in threading.enumerate())


@pytest.mark.slow  # five compiles of a step
def test_replicas_bench_times_each_way_to_train_the_seeds():
  """One replica, R replicas by each strategy, R sequential runs: the
  mode's import and its call of the run setup's step broke unnoticed when
  train/ was split and the step took a sharding argument."""
  figures = bench_replicas.time_steps(gpt2_tiny(), replicas=2, steps=2)
  assert list(figures) == ["1 replica", "2 replicas vmap", "2 replicas map", "2 sequential"]
  assert all(ms > 0 for ms in figures.values())


def test_replicas_whole_runs_are_each_timed_in_a_process_of_their_own(monkeypatch):
  """Timed in one process, the runs after the first reused what it had
  compiled (three identical runs read 1.00x, 0.52x, 0.52x): every run goes
  to a fresh process, its arguments as a spawned process receives them."""
  assert bench_replicas.in_fresh_process(os.getpid) != os.getpid()
  runs = []

  def in_fresh_process(function, *args):
    function, (config, replicas, seed) = pickle.loads(pickle.dumps((function, args)))
    runs.append((function, replicas, seed))
    return 1.0

  monkeypatch.setattr(bench_replicas, "in_fresh_process", in_fresh_process)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # restored after
  config = gpt2_tiny()
  figures = bench_replicas.time_runs(config, replicas=2)
  seeds = replica_seeds(config.seed, 2)
  run = bench_replicas.run_seconds
  assert runs == [(run, 1, config.seed), (run, 2, config.seed)] + [(run, 1, s) for s in seeds]
  assert list(figures.values()) == [1.0, 1.0, 2.0]
  assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # this process holds its share


def test_checkpoint_stall_bench_computes_each_figure_from_its_samples():
  """A tiny state saved twice: each distribution is its samples' (dispatches
  during a save, then as many without one), the blocked time adds the save
  calls and error checks to the dispatches, and every save is a round."""
  figures = bench_checkpoint_stall.measure(
    state_mb=0.2, leaves=4, interval_ms=1.0, saves=2, log_every=3, warmup=2
  )
  assert figures["state_bytes"] == 4 * (4 * int(0.2e6 / 4 / 4) + 1)  # and the step counter
  rounds, samples = figures["saves"], figures["samples_ms"]
  assert len(rounds) == 2 and all(r["dispatches"] >= 1 for r in rounds)
  assert (
    len(samples["during_save"])
    == len(samples["without_save"])
    == sum(r["dispatches"] for r in rounds)
  )
  for name in ("during_save", "without_save"):
    row, values = figures[name], samples[name]
    assert row["dispatches"] == len(values)
    assert row["median_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"] == max(values)
    assert row["p99_ms"] == pytest.approx(np.percentile(values, 99))
    assert row["dispatch_ms"] == pytest.approx(sum(values))
  calls = sum(r["save_call_ms"] + r["check_ms"] for r in rounds)
  assert figures["during_save"]["blocked_ms"] == pytest.approx(
    figures["during_save"]["dispatch_ms"] + calls
  )
  assert figures["without_save"]["blocked_ms"] == pytest.approx(
    figures["without_save"]["dispatch_ms"] + sum(r["quiet_check_ms"] for r in rounds)
  )
  # Each save starts where the previous round's dispatches ended.
  assert rounds[1]["step"] == rounds[0]["step"] + 2 * rounds[0]["dispatches"]
  for r in rounds:
    assert r["longest_block_ms"] >= r["save_call_ms"] > 0
    assert r["save_seconds"] >= r["save_call_ms"] / 1e3
    assert (
      set(r["gc"])
      == set(r["quiet_gc"])
      == {
        "pauses",
        "seconds",
        "longest_ms",
        "full",
        "full_seconds",
      }
    )


def test_each_loop_variant_evaluates_and_checkpoints_where_it_says():
  """full keeps the config's intervals, checkpoint_only its checkpoints
  alone, the others move both to the last step (the RunConfig the loop
  reads and the config.json it records agree)."""
  config = gpt2_tiny()
  config.train.update(dict(steps=40, checkpoint_every=10))
  config.eval.every = 20
  setup = setup_run(parse(config))
  expected = {"full": (20, 10), "checkpoint_only": (40, 10), "no_eval": (40, 40)}
  expected |= {name: (40, 40) for name in bench_loop.VARIANTS if name not in expected}
  for variant, (every, checkpoint_every) in expected.items():
    run = bench_loop.variant_setup(setup, variant, profile=None)[0].run
    assert (run.eval.every, run.train.checkpoint_every) == (every, checkpoint_every), variant
    recorded = to_json(run)  # config.json
    assert (recorded["eval"]["every"], recorded["train"]["checkpoint_every"]) == (
      every,
      checkpoint_every,
    )


def test_random_ids_keep_the_batches_shape_and_weights():
  setup = setup_run(parse(gpt2_tiny()))
  text = next(iter(setup.eval_data))
  batches = bench_loop.RandomIds(iter([text]), vocab_size=50)
  batch = next(batches)
  assert batch["inputs"].shape == text["inputs"].shape and batch["inputs"].dtype == np.int32
  assert 1 <= batch["inputs"].min() and batch["targets"].max() < 50
  np.testing.assert_array_equal(batch["weights"], text["weights"])
  assert not np.array_equal(batch["inputs"], text["inputs"])


def test_the_deviceless_decode_compiles_for_a_gpu_and_refuses_any_other_name():
  """Its token loop's launches are CUDA command buffers: a TPU, or a name
  that is no target, is refused before any compile, saying why."""
  target = bench_decode.gpu_target("h100x2")
  assert (target.platform, target.chips) == ("gpu", 2)
  refused = "target 'h300': not a GPU (h100, h200, a100, times a count: h100x8)"
  with pytest.raises(ValueError, match=f"^{re.escape(refused)}$"):
    bench_decode.gpu_target("h300")
  with pytest.raises(ValueError, match=r"^target 'v5e-8': a TPU; the decode benchmark compiles"):
    bench_decode.gpu_target("v5e-8")
  with pytest.raises(ValueError, match=r"^target 'h100x9': 1 to 8 GPUs"):  # its count, named
    bench_decode.gpu_target("h100x9")


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize(
  "extra, line",
  [
    (
      ["--decode_batch_sizes=1,0"],
      "flag error: decode_batch_sizes: must be an integer >= 1, got 0",
    ),
    (["--new_tokens=0"], "flag error: new_tokens: must be an integer >= 1, got 0"),
    (
      ["--config=configs/encoder_classify.py"],
      "config error: model.family: 'encoder' cannot generate (the benchmark decodes)",
    ),
  ],
)
def test_decode_bench_refuses_bad_sizes_and_models_before_any_compile(extra, line, commands):
  """Each was a traceback from generate, exit 1 (batch sizes 1,0: after batch
  1 had compiled three times)."""
  done = commands.run(
    "benchmarks.run", "decode", "--config=configs/base.py", "--deviceless=h100",
    "--decode_batch_sizes=1", "--prompt_len=4", *extra, timeout=300,
  )  # fmt: skip
  assert (done.returncode, done.stderr.strip().splitlines()[-1:]) == (2, [line]), done.stderr
  assert "deviceless h100" not in done.stdout  # nothing compiled


def test_decode_bench_reports_ratios_and_the_floor(monkeypatch):
  monkeypatch.setattr(hardware, "memory_bandwidth_per_device", lambda device=None: 1e9)
  hf = dict(results=[dict(batch_size=2, tokens_per_sec=20.0)])
  report = bench_decode.compare(
    parse(gpt2_tiny()), batch_sizes=[2], prompt_len=4, new_tokens=3, repeats=1, hf=hf
  )
  # float32 weights: 4 bytes each, read once per generated position.
  params = _param_count(gpt2_tiny())
  assert report["weight_bytes"] == 4 * params
  assert report["floor_us_per_token"] == pytest.approx(1e6 * 4 * params / 1e9)
  (row,) = report["txf"]
  assert row["batch_size"] == 2
  assert row["tokens_per_sec"] == pytest.approx(2 * 3 / row["seconds"])
  assert row["ratio_to_hf"] == pytest.approx(row["tokens_per_sec"] / 20.0)
  assert row["floor_fraction"] == pytest.approx(report["floor_us_per_token"] / row["us_per_token"])
  rope = load_config("rope")
  rope.model.update(dict(d_model=32, num_heads=2, num_layers=1))
  rope.data.update(dict(seq_len=32, batch_size=4, max_corpus_bytes=200_000))
  assert not bench_decode.is_gpt2(rope.model) and bench_decode.is_gpt2(gpt2_tiny().model)


@pytest.mark.skipif(
  importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)
def test_transformers_reference_generates_with_gpt2_of_the_same_size(tmp_path):
  done = subprocess.run(
    [
      sys.executable,
      "benchmarks/references/hf_gpt2_decode.py",
      "--layers=1",
      "--d_model=32",
      "--heads=2",
      "--vocab=260",
      "--max_len=64",
      "--batch_sizes=1,2",
      "--prompt_len=4",
      "--new_tokens=3",
      "--repeats=1",
      f"--json={tmp_path / 'hf.json'}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((tmp_path / "hf.json").read_text())
  assert [row["batch_size"] for row in report["results"]] == [1, 2]
  for row in report["results"]:
    assert row["tokens_per_sec"] == pytest.approx(row["batch_size"] * 3 / row["seconds"])
  txf_params = _param_count(gpt2_tiny())
  assert report["params"] == txf_params


def test_torch_reference_is_gpt2_on_the_configs_batches_or_is_skipped(capsys):
  config = gpt2_tiny(max_len=32)  # torch's position table has T rows
  reference = dict(steps=3, window=2, fresh_batches=True, profile_steps=0, compile_model=False)
  report = bench_step.torch_reference(parse(config), **reference)
  if HAS_TORCH:
    assert (report["batch_size"], report["seq_len"], report["steps"]) == (4, 32, 3)
    assert report["tokens_per_sec"] == pytest.approx(4 * 32 / report["step_time"])
    # Windows of 2 steps and the remainder, back to back in wall time.
    windows = report["windows"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 2), (3, 3)]
    assert windows[0]["start_time"] < windows[0]["end_time"] <= windows[1]["start_time"] + 1e-3
    for w, steps in zip(windows, (2, 1)):
      assert w["tokens_per_sec"] == pytest.approx(4 * 32 / w["step_time"])
      assert abs(steps * w["step_time"] - (w["end_time"] - w["start_time"])) < 0.01
    assert abs(report["loss"] - math.log(260)) < 1.0  # txf's own text batches, ids < 260
    # The same model: as many parameters as txf's GPT-2 of this shape.
    txf_params = _param_count(config)
    assert report["params"] == txf_params
  else:
    assert report is None and "torch is not installed" in capsys.readouterr().out
  # A model that is not GPT-2 has no reference.
  rope = parse(load_config("rope"))
  assert bench_step.torch_reference(rope, **reference) is None


@pytest.mark.parametrize("fresh_batches, count", [(False, 1), (True, 8)])
def test_the_torch_recipe_cycles_through_as_many_batches_as_txfs_step(
  fresh_batches, count, monkeypatch
):
  """Without --fresh_batches txf reuses one batch: the recipe, which cycled
  through 8, now does too."""
  shapes = []

  def run_reference(script, args, needs):
    (tokens,) = (arg.removeprefix("--tokens=") for arg in args if arg.startswith("--tokens="))
    shapes.append(np.load(tokens).shape)
    return {}

  monkeypatch.setattr(bench_step, "run_reference", run_reference)
  reference = dict(steps=3, window=2, profile_steps=0, compile_model=False)
  bench_step.torch_reference(parse(gpt2_tiny()), fresh_batches=fresh_batches, **reference)
  assert shapes == [(count, 4, 33)]  # [n, B, T + 1]
  assert bench_step.batch_count(fresh_batches) == count


def test_a_windows_mfu_divides_by_the_devices_the_step_ran_on():
  """Under --torch the step runs on the first device only (the recipe's one
  GPU): its MFU is over the mesh's devices, not every device of the host
  (on 8 GPUs it read 1/8 of the torch row's, computed over 1)."""
  devices = jax.device_count() + 3  # a mesh unlike the host
  mesh = types.SimpleNamespace(size=devices)
  setup = types.SimpleNamespace(
    tokens_per_step=1000, flops_per_token=6e6, peak_flops=1e12, mesh=mesh
  )
  figures = bench_step.window_figures(setup, 1, 10, 0.5, 2.0, (0.0, 5.0))
  # 1000 tokens in 0.5 s at 6e6 FLOPs each, over `devices` peaks of 1e12.
  assert figures["mfu"] == pytest.approx(2000 * 6e6 / (devices * 1e12))


def test_the_data_modes_reference_is_a_past_gpu_run_of_gpt2_small_data_only():
  """The loader's speed is set against a fixed figure, GPT-2 small training
  on one H100, said to be a past run's, and only for gpt2_small's data."""
  reference = throughput.reference_for(parse(load_config("gpt2_small")).data)
  # The figure is that run's last window, as its raw report has it.
  raw = json.loads((REPO / reference["source"]).read_text())
  assert (raw["config"], raw["mode"], raw["device_count"]) == (reference["config"], "step", 1)
  assert "H100" in raw["device_kind"] and raw["date"].startswith(reference["date"])
  assert raw["tokens_per_step"] == 32 * 1024
  assert reference["tokens_per_sec"] == round(raw["windows"][-1]["tokens_per_sec"], -2)
  # A corpus cap does not change the batches the GPU trained on.
  capped = load_config("gpt2_small")
  capped.data.max_corpus_bytes = 200_000
  assert throughput.reference_for(parse(capped).data) == reference
  figures = dict(
    description="d", tokens_per_sec=2 * reference["tokens_per_sec"], batches=1, seconds=1.0,
    tokens_per_batch=32 * 1024, tokens_per_cpu_sec=1.0, read_workers=None, read_threads=None,
  )  # fmt: skip
  line = throughput.format_throughput(dict(figures, reference=reference)).splitlines()[-1]
  assert line == (
    "2.00x a fixed reference from a past GPU run, not measured in this run: "
    "configs/gpt2_small.py trained at 474,800 tokens/s on one H100 on 2026-11-27 "
    f"(commit 841d1d9, {reference['source']})"
  )
  # Any other data (other lengths, batch sizes, datasets) has none.
  for config in (gpt2_tiny(), load_config("base"), load_config("rope")):
    assert throughput.reference_for(parse(config).data) is None
  line = throughput.format_throughput(dict(figures, reference=None)).splitlines()[-1]
  assert line.startswith("no reference training speed for this data") and "x " not in line


def test_data_bench_times_the_batches_sent_to_the_devices(tmp_path):
  config = gpt2_tiny()
  figures = bench_data.device_throughput(parse(config), batches=3, workdir=str(tmp_path))
  assert (figures["batches"], figures["devices"]) == (3, jax.device_count())
  assert figures["tokens_per_sec"] == pytest.approx(3 * 4 * 32 / figures["seconds"])
  assert figures["ms_per_batch"] == pytest.approx(1e3 * figures["seconds"] / 3)


def test_embedding_grad_bench_checks_every_method_against_float64():
  config = gpt2_tiny(vocab_size=512)
  figures = bench_embedding_grad.compare(config, repeats=1)
  batch = next(iter(setup_run(parse(config)).train_data))["inputs"]
  assert figures["ids"] == batch.size and figures["distinct_ids"] == len(np.unique(batch))
  methods = figures["methods"]
  assert list(methods) == list(bench_embedding_grad.METHODS)
  # float32 sums of bf16 rows against the float64 sum; bf16 sums are far off.
  for name in ("f32_table", "one_hot", "sorted"):
    assert methods[name]["max_abs_error"] < 1e-4, name
  assert methods["bf16_table"]["max_abs_error"] > 1e-2
  assert all(row["ms"] > 0 for row in methods.values())


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("num_beams", [1, 2])
def test_seq2seq_decode_bench_times_cached_and_recomputed_cross_attention(num_beams):
  cfg = ModelConfig(
    family="encoder_decoder", vocab_size=20, d_model=16, num_heads=2, num_layers=1, max_len=8
  )
  model = build(cfg)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), tokens, tokens)["params"]
  sources = jax.random.randint(jax.random.key(1), (2, 6), 4, 20)
  figures = bench_seq2seq.measure(
    model, params, sources, new_tokens=3, num_beams=num_beams, repeats=1
  )
  # Stepping from Python is greedy only.
  assert list(figures) == (["generate", "stepwise"] if num_beams == 1 else ["generate"])
  for variants in figures.values():
    assert list(variants) == ["cached", "recomputed"]
  table = bench_seq2seq.format_table(figures).splitlines()
  generate = figures["generate"]
  speedup = generate["recomputed"]["ms_per_token"] / generate["cached"]["ms_per_token"]
  # On a CPU a token can take less than the timer's noise.
  noisy = any(variant["within_noise"] for variant in generate.values())
  assert table[1].startswith("generate")
  assert table[1].endswith("within noise" if noisy else f"{speedup:.2f}x")


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize(
  "args,message",
  [
    ([], "flag error: missing mode; usage: python -m benchmarks.run {step|loop|"),
    (["nosuch"], "flag error: unknown mode 'nosuch'"),
    # A flag of the step mode is no flag of the loop mode.
    (
      ["loop", "--config=configs/rope.py", "--torch"],
      "flag error: Unknown command line flag 'torch'",
    ),
    # No seed replica to time (was a traceback from inside the timing).
    (
      ["replicas", "--config=configs/base.py", "--replicas=0"],
      "flag error: flag --replicas=0: 0 is not a positive integer",
    ),
    # Triton takes block sizes and warp counts in powers of 2.
    (
      ["loss_kernel", "--config=configs/rope.py", "--blocks=4096,100"],
      "flag error: flag --blocks=['4096', '100']: --blocks: each must be a power of 2",
    ),
    # A config the run rejects, found before the PyTorch reference trains.
    (
      [
        "step",
        "--config=configs/gpt2_small.py",
        "--torch",
        "--config.model.max_len=64",
        "--config.data.seq_len=64",
      ],
      "config error: model.max_len: eval.sample_prompt plus eval.sample_tokens",
    ),
    # The compiled text is written after the timed steps: its path is looked
    # at before them (a missing directory crashed at the end).
    (
      ["step", "--config=configs/rope.py", "--compiled_text=/no/such/dir/step.hlo"],
      "flag error: compiled_text: /no/such/dir/step.hlo: no directory /no/such/dir",
    ),
    # Compiling for a target the decode benchmark cannot study, refused before compiling.
    (
      ["decode", "--config=configs/gpt2_small.py", "--deviceless=h300"],
      "target error: target 'h300': not a GPU (h100, h200, a100, times a count: h100x8)",
    ),
    (
      ["decode", "--config=configs/gpt2_small.py", "--deviceless=v5e-8"],
      "target error: target 'v5e-8': a TPU; the decode benchmark compiles for GPUs",
    ),
    # No batches to time: negative tokens/s (-3), a ZeroDivisionError (0).
    (["data", "--config=configs/rope.py", "--steps=0"], "flag error: flag --steps=0: 0 is not a"),
    (["data", "--config=configs/rope.py", "--steps=-3"], "flag error: flag --steps=-3: -3 is not"),
    # A negative count profiled nothing, then failed (UnboundLocalError).
    (
      ["step", "--config=configs/rope.py", "--profile_steps=-1"],
      "flag error: flag --profile_steps=-1: -1 is not a non-negative integer",
    ),
    # One log per run: its amortised figure divided by zero.
    (
      ["loop", "--config=configs/rope.py", "--steps=2", "--window=2"],
      "flag error: flags steps=2, window=2: --steps must exceed --window",
    ),
    # The trace's steps: a traceback (not two numbers), or no trace at all.
    *(
      (
        ["loop", "--config=configs/rope.py", f"--profile_steps={steps}"],
        f"flag error: flag --profile_steps={steps.split(',')}: --profile_steps must be "
        "FIRST,LAST: two step numbers, 1 <= FIRST <= LAST",
      )
      for steps in ("abc", "1,2,3", "5,3", "0,3")
    ),
    (
      ["loop", "--config=configs/rope.py", "--profile_dir=/tmp/t", "--steps=10", "--window=5"],
      "flag error: flags profile_dir=/tmp/t, profile_steps=['300', '305'], steps=10: "
      "--profile_steps must end at or before --steps",
    ),
    (
      [
        "loop",
        "--config=configs/rope.py",
        "--profile_dir=/tmp/t",
        "--profile_steps=1,2",
        "--loop_variants=no_eval",
      ],  # fmt: skip
      "flag error: flags profile_dir=/tmp/t, loop_variants=['no_eval']: --profile_dir traces "
      "the 'full' run: --loop_variants must include full",
    ),
    # A StatisticsError after every method compiled.
    (
      ["embedding_grad", "--config=configs/rope.py", "--repeats=0"],
      "flag error: flag --repeats=0: 0 is not a positive integer",
    ),
    # The model's own refusal, before it is built (a ValueError traceback).
    (
      ["seq2seq_decode", "--d_model=30", "--num_heads=4"],
      "flag error: flags vocab_size=260, d_model=30, num_heads=4, num_layers=2, dtype=float32, "
      "source_len=512, new_tokens=128: model.num_heads: 4 does not divide model.d_model=30",
    ),
  ],
)
def test_benchmarks_run_reports_a_bad_mode_or_flag_in_one_line_exit_2(args, message, commands):
  done = commands.run("benchmarks.run", *args, timeout=120)
  assert done.returncode == 2
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith(message), line
  # Nothing ran: at most the command line and the devices (benchmarks/run.py
  # prints them before a mode's own checks of its config and target).
  assert all(line.startswith(("command: ", "device: ")) for line in done.stdout.splitlines())


@pytest.mark.slow  # subprocesses
def test_each_modes_help_is_its_own_docstring(commands):
  """--help printed functools.partial's docstring for every mode."""
  for mode in run_module.MODES:
    done = commands.run("benchmarks.run", mode, "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    module = importlib.import_module(f"benchmarks.{mode}")
    assert done.stdout.startswith(module.__doc__.splitlines()[0]), (mode, done.stdout[:200])


def test_environment_names_the_device_and_versions():
  environment = hardware.environment()
  assert environment["versions"]["jax"] == jax.__version__
  assert environment["device_kind"] == jax.devices()[0].device_kind
  assert environment["backend"] == jax.default_backend() and environment["date"]


def test_summarize_skips_a_mode_without_rows_in_one_line_and_goes_on(tmp_path, capsys):
  """Every report of a directory is read; one whose mode has no table (the
  replicas, data, seq2seq_decode and checkpoint_stall modes) is a line."""
  environment = hardware.environment()
  command = "python -m benchmarks.run embedding_grad --repeats=1"
  without_rows = sorted(set(run_module.MODES) - set(bench_summarize.ROWS))
  assert "replicas" in without_rows
  for mode in without_rows:
    (tmp_path / f"a_{mode}.json").write_text(json.dumps(dict(mode=mode, **environment)))
  methods = {"gather": dict(ms=1.0, max_abs_error=0.0)}
  report = dict(command=command, mode="embedding_grad", **environment, methods=methods)
  (tmp_path / "z_embedding_grad.json").write_text(json.dumps(report))
  bench_summarize.main([str(tmp_path)])
  lines = capsys.readouterr().out.splitlines()
  assert lines[: len(without_rows)] == [
    f"{tmp_path / f'a_{mode}.json'}: skipped: no table rows for mode {mode!r}"
    for mode in without_rows
  ]
  assert lines[-2].endswith(f", command: {command}")  # the figure names its command
  assert lines[-1].startswith("| z_embedding_grad | gather |")


def test_summarize_reads_a_deviceless_decode_report_and_goes_on(tmp_path, capsys):
  """A deviceless decode report (programs compiled for a GPU, not run) was a
  KeyError that dropped every report after it."""
  environment = hardware.environment()
  launch = dict(default="a graph per kernel", with_loops="one graph")
  program = dict(
    family="decoder", batch_size=1, new_tokens=8, prompt_len=4, compile_seconds=1.0,
    kernels_per_token=85.0, bytes_per_token=272e6, layer_kernels_per_token=74.0,
    layer_bytes_per_token=200e6, weight_bytes=248e6, floor_seconds=74.3e-6,
    predicted_seconds=311e-6, loop_launch=launch,
  )  # fmt: skip
  deviceless = dict(mode="decode", **environment, target="h100", dtype="bfloat16")
  (tmp_path / "a_decode.json").write_text(json.dumps(dict(deviceless, deviceless=[program])))
  methods = {"gather": dict(ms=1.0, max_abs_error=0.0)}
  report = dict(mode="embedding_grad", **environment, methods=methods)
  (tmp_path / "z_embedding_grad.json").write_text(json.dumps(report))
  bench_summarize.main([str(tmp_path)])
  lines = capsys.readouterr().out.splitlines()
  assert lines[1] == (
    "| a_decode | h100 decoder, batch 1 | 85 kernels | 272 MB | predicted 311 µs | "
    "floor 74 µs | a graph per kernel / one graph |"
  )
  assert lines[-1].startswith("| z_embedding_grad | gather |")


def test_the_transformers_reference_labels_a_batchs_time_per_step():
  """At batch > 1 its time per step was printed as 'us/token'; labelled as
  txf's own line is (benchmarks/decode.py), without torch imported."""
  figures = dict(transformers_version="5.0", device_kind="cpu")
  rows = [dict(batch_size=b, tokens_per_sec=100.0 * b, us_per_token=10_000.0) for b in (1, 8)]
  assert [hf_reference.format_row(figures, row) for row in rows] == [
    "transformers 5.0 cpu: batch 1, 100 new tokens/s, 10,000 us/token",
    "transformers 5.0 cpu: batch 8, 800 new tokens/s, 10,000 us/step of 8 tokens",
  ]


def test_benchmark_reports_record_their_command_line(tmp_path):
  # Every mode records it the same way (benchmarks/run.py): the quickest mode.
  args = ["data", "--config=configs/base.py", "--config.data.max_corpus_bytes=200000"]
  args += ["--steps=1", f"--json={tmp_path / 'r.json'}"]
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks.run", *args],
    cwd=REPO, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((tmp_path / "r.json").read_text())
  assert shlex.split(report["command"]) == ["python", "-m", "benchmarks.run", *args]
  # Printed first too (it was only in the report), with the devices it ran on.
  devices = f"{report['device_kind']} x{report['device_count']} ({report['backend']})"
  assert done.stdout.splitlines()[:2] == [f"command: {report['command']}", f"device: {devices}"]


@pytest.mark.slow  # subprocesses
def test_a_json_path_that_cannot_be_written_is_refused_before_measuring(tmp_path, commands):
  """A --json file the report cannot replace is one line, exit 2, before the
  mode measures (it was a traceback after it); a good one is replaced whole."""
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  data = ["data", "--config=configs/base.py", "--config.data.max_corpus_bytes=200000", "--steps=1"]
  for path, reason in [
    (tmp_path / "no" / "r.json", f"no directory {tmp_path / 'no'}"),
    (tmp_path, "is a directory"),
    (fifo, "not a regular file; name a file to write"),  # the old write waited for a reader
    ("/dev/null", "not a regular file; name a file to write"),  # a rename would replace it
  ]:
    done = commands.run("benchmarks.run", *data, f"--json={path}", timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [f"flag error: json: {path}: {reason}"]
    assert not done.stdout  # nothing measured
  assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
  assert not (tmp_path / "no").exists()
  report = tmp_path / "r.json"
  report.write_text("an earlier report")
  done = commands.run("benchmarks.run", *data, f"--json={report}", timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(report.read_text())["mode"] == "data"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "r.json"]  # no temporary left


def test_a_difference_within_noise_is_said_so_not_given_as_a_speedup():
  figures = {
    "generate": {
      "cached": dict(ms_per_token=-0.8, total_ms=1.0, within_noise=True),
      "recomputed": dict(ms_per_token=0.02, total_ms=0.7, within_noise=False),
    },
    "stepwise": {"cached": dict(ms_per_token=0.4), "recomputed": dict(ms_per_token=0.3)},
  }
  lines = bench_seq2seq.format_table(figures).splitlines()
  assert lines[1].endswith("within noise") and "x" not in lines[1].split()[-1]
  assert lines[2].endswith(f"{0.3 / 0.4:.2f}x")
  assert lines[-1] == bench_seq2seq.NOISE_NOTE


TORCH_ON_TWO_DEVICES = """
import json, sys
from absl import flags
from benchmarks import step

step.define_flags()
flags.FLAGS(["step", "--config=gpt2_small", *sys.argv[1:]])
step.torch_reference = lambda run, **options: {"tokens_per_sec": 1000.0}
report = step.main()
print(json.dumps({"torch_mfu_devices": report["torch"]["mfu"], "windows": report["windows"]}))
"""


@pytest.mark.slow  # a subprocess
def test_the_torch_comparison_runs_txf_on_one_device_as_the_recipe(tmp_path):
  """On a host of two devices, txf's side of --torch is one device, as the
  PyTorch recipe's (the comparison once set N devices against one)."""
  overrides = [
    "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.num_layers=1",
    "--config.model.vocab_size=260", "--config.model.max_len=64", "--config.model.dtype=float32",
    "--config.data.seq_len=32", "--config.data.batch_size=4",
    "--config.data.max_corpus_bytes=200000", "--config.eval.sample_tokens=0",
  ]  # fmt: skip
  xla_flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
  done = subprocess.run(
    [sys.executable, "-c", TORCH_ON_TWO_DEVICES, *overrides, "--torch", "--steps=2",
     "--window=1"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=xla_flags), capture_output=True, text=True,
    timeout=300,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert any(line.startswith("step on 1 device(s),") for line in lines), lines
  assert any(line.startswith("txf / torch tokens/s, one cpu each: ") for line in lines), lines
