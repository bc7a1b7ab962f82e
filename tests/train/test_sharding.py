"""Tests for txf.train.sharding: meshes, the logical axes layers declare on
their parameters, sharded init and training that matches one device.

Multi-device checks need 8 CPU devices, which must be requested before JAX
starts its backend; in a shared pytest process (other modules, xdist) it has
usually started with one. So the checks live in `TestEightDevices`, which
skips itself with fewer than 8 devices, and `test_eight_device_checks` runs
that class in a fresh `pytest` process with JAX_NUM_CPU_DEVICES=8. Nothing
here changes the JAX config of the process it runs in.

Tolerances: sharded training changes only the order of float32 reductions,
so losses agree to rtol 1e-5 and parameters after 3 AdamW steps to
rtol 1e-4 / atol 1e-5 (measured differences: ~1e-6 absolute).
"""

import collections
import dataclasses
import functools
import math
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, PartitionSpec as P

from conftest import REPO
from txf.layers.partitioning import projection_inits
from txf.models import ModelConfig, build
from txf.runconfig.optim import make_optimizer
from txf.runconfig.run_config import ParallelConfig
from txf.train import sharding
from txf.train.step import TrainState, init_params, init_state, make_train_step

TINY = dict(vocab_size=64, d_model=32, num_heads=4, num_layers=2, max_len=16)
# Every parameter kind: GQA, learned positions, gated FFN with biases, untied
# heads, T5 tables, MLM and classification heads, RMS norms, scanned stacks.
FAMILIES = {
  "decoder_gqa_untied": dict(
    family="decoder",
    num_kv_heads=2,
    position="learned",
    activation="swiglu",
    use_bias=True,
    tie_embeddings=False,
  ),
  "decoder_scan_t5_classify": dict(
    family="decoder",
    position="t5_bias",
    scan_layers=True,
    head="classify",
    pooling="last",
    num_classes=3,
  ),
  "encoder_mlm_untied_t5": dict(
    family="encoder", head="mlm", position="t5_bias", tie_embeddings=False
  ),
  "encoder_classify_rms": dict(family="encoder", head="classify", norm="rms"),
  "encoder_decoder_scan": dict(
    family="encoder_decoder",
    position="t5_bias",
    scan_layers=True,
    share_embeddings=False,
    use_bias=True,
    num_kv_heads=2,
  ),
  "encoder_decoder": dict(family="encoder_decoder", position="sinusoidal", tie_embeddings=False),
}
TRAIN = dict(
  learning_rate=1e-3,
  warmup_steps=0,
  decay="constant",
  steps=3,
  end_lr_fraction=0.1,
  weight_decay=0.1,
  b1=0.9,
  b2=0.95,
  eps=1e-8,
  grad_clip_norm=1.0,
)


def abstract_params(overrides):
  """The boxed (`nn.Partitioned`) parameters of a tiny model, as shapes."""
  model = build(ModelConfig(**{**TINY, **overrides}))
  tokens = jax.ShapeDtypeStruct((2, 8), np.int32)
  inputs = (tokens, tokens) if model.cfg.family == "encoder_decoder" else (tokens,)
  return jax.eval_shape(lambda *xs: model.init(jax.random.key(0), *xs), *inputs)["params"]


def parallel(data=-1, fsdp=1, tensor=1):
  return ParallelConfig(data=data, fsdp=fsdp, tensor=tensor)


def logical_axes(params):
  """Tuples of logical axis names, read from the boxes the layers created."""
  return jax.tree.map(tuple, nn.get_partition_spec(params), is_leaf=lambda x: isinstance(x, P))


def flat(tree):
  """{'stack/block_0/ffn/wi/kernel': leaf}; tuples (logical axes) are leaves."""
  leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: isinstance(x, tuple))
  return {"/".join(k.key for k in path): leaf for path, leaf in leaves}


# ---------------------------------------------------------------------------
# Any device count.


@pytest.mark.parametrize("name", FAMILIES)
def test_every_param_declares_its_logical_axes(name):
  params = abstract_params(FAMILIES[name])
  boxes = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert all(isinstance(box, nn.Partitioned) for box in boxes)
  axes = flat(logical_axes(params))
  shapes = {k: v.shape for k, v in flat(nn.meta.unbox(params)).items()}
  assert axes.keys() == shapes.keys()
  for path, logical in axes.items():
    assert len(logical) == len(shapes[path]), path
    assert (logical[0] == "layers") == ("/blocks/" in path), path


def test_layers_name_the_axes_of_each_kind():
  axes = flat(logical_axes(abstract_params(FAMILIES["decoder_gqa_untied"])))
  layer = "stack/block_0/"
  assert axes[layer + "self_attention/query/kernel"] == ("embed", "heads", "head_dim")
  assert axes[layer + "self_attention/key/kernel"] == ("embed", "kv_heads", "head_dim")
  assert axes[layer + "self_attention/out/kernel"] == ("heads", "head_dim", "embed")
  assert axes[layer + "ffn/gate/kernel"] == ("embed", "mlp")
  assert axes[layer + "ffn/wo/kernel"] == ("mlp", "embed")
  assert axes[layer + "ffn_norm/scale"] == ("embed",)
  assert axes["embedder/token/embedding"] == ("vocab", "embed")
  assert axes["embedder/position_table"] == (None, "embed")
  assert axes["head/logits/kernel"] == ("embed", "vocab")
  scanned = flat(logical_axes(abstract_params(FAMILIES["encoder_decoder_scan"])))
  assert scanned["decoder/blocks/cross_attention/value/kernel"] == (
    "layers",
    "embed",
    "kv_heads",
    "head_dim",
  )
  assert scanned["encoder/relative_position/table"] == (None, "heads")


@pytest.mark.parametrize(
  "path,shape,axes,message",
  [
    (("stack", "block_0", "ffn", "new_scale"), (128,), None, "has no logical axes"),
    (
      ("stack", "block_0", "ffn", "wi", "kernel"),
      (4, 32, 128),
      ("embed", "mlp"),
      "has 3 dimensions",
    ),
  ],
)
def test_param_without_matching_axes_raises_naming_its_path(path, shape, axes, message):
  params = abstract_params({})
  node = params
  for key in path[:-1]:
    node = node.setdefault(key, {})
  leaf = jax.ShapeDtypeStruct(shape, np.float32)
  node[path[-1]] = leaf if axes is None else nn.LogicallyPartitioned(leaf, axes)
  mesh = sharding.make_mesh(parallel(data=1), jax.devices()[:1])
  with pytest.raises(ValueError, match=re.escape("/".join(path)) + ".*" + message):
    sharding.param_shardings(params, mesh)


def test_layer_param_created_without_axes_raises_naming_it():
  class Scaled(nn.Module):
    """A projection that declares its axes, and a scale that does not."""

    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(4, **projection_inits(("embed",), ("mlp",)), name="dense")
      return dense(x) * self.param("scale", nn.initializers.ones, (4,))

  params = jax.eval_shape(Scaled().init, jax.random.key(0), np.ones((1, 3), np.float32))
  mesh = sharding.make_mesh(parallel(data=1), jax.devices()[:1])
  assert sharding.param_shardings(params["params"]["dense"], mesh)["kernel"].spec == P(None, None)
  with pytest.raises(ValueError, match=r"^params/scale: this parameter has no logical axes"):
    sharding.param_shardings(params, mesh)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("name", ["decoder_gqa_untied", "encoder_decoder_scan"])
def test_model_applies_under_activation_sharding(name):
  # Under an active mesh, linen unboxes parameter boxes with sharding
  # constraints, also while checking given parameters against their
  # initializers: every box must fit its value's rank there too.
  model = build(ModelConfig(**{**TINY, **FAMILIES[name]}))
  tokens = np.ones((2, 8), np.int32)
  inputs = (tokens, tokens) if model.cfg.family == "encoder_decoder" else (tokens,)
  params = nn.meta.unbox(model.init(jax.random.key(0), *inputs)["params"])
  expected = model.apply({"params": params}, *inputs)
  with sharding.activation_sharding(sharding.make_mesh(parallel(data=1), jax.devices()[:1])):
    logits = jax.jit(model.apply)({"params": params}, *inputs)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_state_leaf_mirroring_no_param_raises():
  mesh = sharding.make_mesh(parallel(data=1), jax.devices()[:1])
  params = abstract_params({})
  state = TrainState(
    step=jax.ShapeDtypeStruct((), np.int32),
    params=nn.meta.unbox(params),
    opt_state={"stray": jax.ShapeDtypeStruct((3,), np.float32)},
  )
  with pytest.raises(ValueError, match=r"state\.opt_state\['stray'\]"):
    sharding.state_shardings(state, params, mesh)


# ---------------------------------------------------------------------------
# 8 devices.


def spec(tree, path):
  return flat(tree)[path].spec


@functools.cache
def lm_setup():
  """A tiny GQA decoder LM, its optimizer and one fixed batch of 8 rows.

  No attention biases: a key bias gets a gradient that is 0 up to rounding
  (softmax ignores a constant per query), which Adam would blow up to
  learning-rate-sized noise.
  """
  model = build(
    ModelConfig(**{**TINY, "num_layers": 1}, num_kv_heads=2, d_ff=64, position="learned")
  )
  optimizer = make_optimizer(ml_collections.ConfigDict(TRAIN))
  rng = np.random.default_rng(0)
  batch = {
    "inputs": rng.integers(1, 64, (8, 16)).astype(np.int32),
    "targets": rng.integers(1, 64, (8, 16)).astype(np.int32),
    "weights": (rng.random((8, 16)) > 0.2).astype(np.float32),
  }
  return model, optimizer, batch


def sharded_init(mesh):
  """(TrainState created directly in its shardings, the shardings)."""
  model, optimizer, batch = lm_setup()
  init = lambda key: init_state(model, optimizer, batch, "lm", key)
  boxed = jax.eval_shape(lambda key: init_params(model, batch, "lm", key), jax.random.key(0))
  shardings = sharding.state_shardings(jax.eval_shape(init, jax.random.key(0)), boxed, mesh)
  return jax.jit(init, out_shardings=shardings)(jax.random.key(0)), shardings


def train_three_steps(mesh, state, shardings):
  """Losses and final state (on the host) of 3 steps from `state` on `mesh`."""
  model, optimizer, batch = lm_setup()
  step = jax.jit(
    make_train_step(model, optimizer, "lm", seed=0),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )
  device_batch = sharding.shard_batch(batch, mesh)
  losses = []
  for _ in range(3):
    state, metrics = step(state, device_batch)
    losses.append(float(metrics["loss"]))
  return np.array(losses), jax.device_get(state)


@functools.cache
def single_device_run():
  mesh = sharding.make_mesh(parallel(data=1), jax.devices()[:1])
  return train_three_steps(mesh, *sharded_init(mesh))


class TestEightDevices:
  """Run in a fresh process by `test_eight_device_checks` (see module docstring)."""

  @pytest.fixture(autouse=True)
  def _needs_eight_devices(self):
    if jax.device_count() < 8:
      pytest.skip("needs 8 devices; test_eight_device_checks runs these in a subprocess")

  @pytest.mark.parametrize(
    "sizes,shape",
    [
      (dict(), (8, 1, 1)),
      (dict(data=2, fsdp=4), (2, 4, 1)),
      (dict(data=4, tensor=2), (4, 1, 2)),
      (dict(fsdp=2, tensor=2), (2, 2, 2)),
    ],
  )
  def test_mesh_from_config(self, sizes, shape):
    mesh = sharding.make_mesh(parallel(**sizes))
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_types == (AxisType.Auto,) * 3
    assert set(mesh.devices.flat) == set(jax.devices())

  @pytest.mark.parametrize(
    "sizes,message",
    [
      (
        dict(data=2, fsdp=2),
        r"parallel.data x parallel.fsdp x parallel.tensor = 2 x 2 x 1 = 4 "
        r"does not match the 8 devices",
      ),
      (dict(data=4, fsdp=4), r"parallel.data x .* = 16 does not match"),
      (dict(fsdp=3), r"parallel.fsdp x parallel.tensor = 3 x 1 does not divide the 8"),
      (dict(tensor=0), r"parallel.tensor: must be a positive integer"),
      (dict(fsdp=True), r"parallel.fsdp: must be a positive integer"),
      (dict(data=-2), r"parallel.data: must be a positive integer or -1"),
    ],
  )
  def test_mesh_errors_name_the_field(self, sizes, message):
    with pytest.raises(ValueError, match=message):
      sharding.make_mesh(parallel(**sizes))

  def test_param_shardings_follow_the_rules(self):
    params = abstract_params(FAMILIES["decoder_gqa_untied"])
    layer = "stack/block_0/"
    fsdp = sharding.param_shardings(params, sharding.make_mesh(parallel(data=2, fsdp=4)))
    assert spec(fsdp, layer + "self_attention/query/kernel") == P("fsdp", None, None)
    assert spec(fsdp, layer + "self_attention/out/kernel") == P(None, None, "fsdp")
    assert spec(fsdp, layer + "ffn/wo/kernel") == P(None, "fsdp")
    assert spec(fsdp, layer + "ffn_norm/scale") == P("fsdp")
    assert spec(fsdp, "embedder/token/embedding") == P(None, "fsdp")
    tensor = sharding.param_shardings(params, sharding.make_mesh(parallel(data=4, tensor=2)))
    assert spec(tensor, layer + "self_attention/query/kernel") == P(None, "tensor", None)
    assert spec(tensor, layer + "self_attention/key/kernel") == P(None, "tensor", None)
    assert spec(tensor, layer + "self_attention/key/bias") == P("tensor", None)
    assert spec(tensor, layer + "self_attention/out/kernel") == P("tensor", None, None)
    assert spec(tensor, layer + "ffn/wi/kernel") == P(None, "tensor")
    assert spec(tensor, layer + "ffn/wo/bias") == P(None)
    assert spec(tensor, layer + "ffn_norm/scale") == P(None)
    assert spec(tensor, "head/logits/kernel") == P(None, "tensor")
    both = sharding.param_shardings(
      abstract_params(FAMILIES["encoder_decoder_scan"]),
      sharding.make_mesh(parallel(fsdp=2, tensor=2)),
    )
    assert spec(both, "encoder/blocks/self_attention/query/kernel") == P(
      None, "fsdp", "tensor", None
    )
    assert spec(both, "decoder/relative_position/table") == P(None, "tensor")

  @pytest.mark.parametrize(
    "sizes,query_shard",
    [
      (dict(data=2, fsdp=4), (8, 4, 8)),  # query kernel [32, 4, 8]: embed / 4
      (dict(data=4, tensor=2), (32, 2, 8)),  # heads / 2
    ],
  )
  def test_training_matches_one_device(self, sizes, query_shard):
    mesh = sharding.make_mesh(parallel(**sizes))
    state, shardings = sharded_init(mesh)
    # Created in place: each param and Adam moment in its sharding, so no
    # device (or host) ever holds the whole model.
    adam = state.opt_state[1][0]  # chain(clip, adamw = chain(scale_by_adam, ...))
    for tree in (state.params, adam.mu, adam.nu):
      for path, array in flat(tree).items():
        assert array.sharding == flat(shardings.params)[path], path
    assert state.step.sharding.spec == P()
    query = state.params["stack"]["block_0"]["self_attention"]["query"]["kernel"]
    assert {s.data.shape for s in query.addressable_shards} == {query_shard}

    want_losses, want_state = single_device_run()
    losses, state = train_three_steps(mesh, state, shardings)
    assert want_losses[-1] < want_losses[0]  # the steps do train
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert int(state.step) == 3
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(want_state)):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

  @pytest.mark.parametrize(
    "overrides,sizes,message",
    [
      (
        dict(),
        dict(data=1, tensor=8),
        r"stack/block_0/self_attention/key/kernel: dimension 1 \('kv_heads', size 4\) is not "
        r"divisible by mesh axis tensor \(size 8\); change model.num_kv_heads \(model.num_heads "
        r"where unset\) or parallel.tensor",
      ),
      (
        dict(vocab_size=65),
        dict(tensor=2),
        r"embedder/token/embedding: dimension 0 \('vocab', size 65\) .* change model.vocab_size",
      ),
      (
        dict(d_model=36, num_heads=2),
        dict(fsdp=8),
        r"embedder/token/embedding: dimension 1 \('embed', size 36\) is not divisible by mesh "
        r"axis fsdp \(size 8\)",
      ),
    ],
  )
  def test_non_divisible_dimension_names_param_and_field(self, overrides, sizes, message):
    with pytest.raises(ValueError, match=message):
      sharding.param_shardings(abstract_params(overrides), sharding.make_mesh(parallel(**sizes)))

  def test_batch_sharding(self):
    mesh = sharding.make_mesh(parallel(data=2, fsdp=2, tensor=2))
    with pytest.raises(
      ValueError,
      match=r"data.batch_size: 6 is not divisible by "
      r"parallel.data x parallel.fsdp = 2 x 2 = 4",
    ):
      sharding.check_batch(6, mesh)
    batch = {"inputs": np.arange(8 * 3).reshape(8, 3), "labels": np.arange(8)}
    arrays = sharding.shard_batch(batch, mesh)
    for key, array in arrays.items():
      assert array.sharding == sharding.batch_sharding(mesh)
      np.testing.assert_array_equal(array, batch[key])
      # 4 ways over data x fsdp, each slice repeated over the 2 tensor devices.
      assert {s.data.shape[0] for s in array.addressable_shards} == {2}
    with pytest.raises(ValueError, match="data.batch_size: 6"):
      sharding.shard_batch({"inputs": np.zeros((6, 3))}, mesh)

  def test_activation_sharding_turns_logical_constraints_on(self):
    mesh = sharding.make_mesh(parallel(data=2, fsdp=4))
    # A fresh jit each time: the flax rules are read while tracing, and are
    # not part of jit's cache key.
    double = lambda: jax.jit(
      lambda x: nn.with_logical_constraint(2 * x, ("batch", "length", "embed"))
    )
    x = jax.device_put(np.ones((8, 4, 16), np.float32), sharding.replicated(mesh))
    assert double()(x).sharding.is_fully_replicated  # outside the context: a no-op
    with sharding.activation_sharding(mesh):
      # 'embed' -> 'fsdp' is skipped: 'batch' already uses that mesh axis.
      assert double()(x).sharding.spec == P(("data", "fsdp"))


@dataclasses.dataclass(frozen=True)
class HostDevice:
  """A device of another process, for a mesh that is only read (check_batch)."""

  id: int
  process_index: int
  platform: str = "cpu"


def host_mesh(sizes, devices_per_process):
  """A (data, fsdp, tensor) mesh of stand-in devices in jax.make_mesh's order
  (tensor fastest), process p holding devices p * n .. (p + 1) * n - 1."""
  count = math.prod(sizes)
  devices = [HostDevice(i, i // devices_per_process) for i in range(count)]
  return Mesh(np.array(devices, dtype=object).reshape(sizes), sharding.MESH_AXES)


@pytest.mark.parametrize(
  "sizes,per_process,shared",
  [
    ((4, 1, 1), 2, 0),  # data over 2 processes x 2 devices
    ((2, 1, 2), 2, 0),  # tensor within a process
    ((1, 2, 2), 2, 0),  # fsdp over processes, tensor within
    ((2, 2, 4), 8, 0),  # a process per data row
    ((1, 1, 4), 2, 1),  # tensor spans both processes: the one block is shared
    ((2, 2, 4), 2, 4),  # every block's 4 tensor devices on 2 processes
    ((1, 1, 2), 1, 1),  # one device a process (one process per GPU)
  ],
)
def test_batch_rows_shared_by_processes_are_refused(sizes, per_process, shared):
  """A tensor axis spanning processes gave each process's rows to a block the
  other process's devices also held: the global batch came out half as long,
  and both processes claimed it (a review ran it: other losses, exit 0)."""
  mesh = host_mesh(sizes, per_process)
  # Brute force: the set of processes holding each (data, fsdp) block.
  holders = collections.defaultdict(set)
  for (d, f, _), device in np.ndenumerate(mesh.devices):
    holders[d, f].add(device.process_index)
  assert sum(len(h) > 1 for h in holders.values()) == shared
  assert (
    sharding.shared_batch_blocks(np.vectorize(lambda device: device.process_index)(mesh.devices))
    == shared
  )
  if shared:
    with pytest.raises(ValueError, match=r"^parallel.tensor: \d+ spans processes"):
      sharding.check_batch(16, mesh)
  else:
    sharding.check_batch(16, mesh)


@pytest.mark.slow  # a subprocess
def test_eight_device_checks():
  """Runs TestEightDevices in a fresh process with 8 CPU devices."""
  if jax.device_count() >= 8:
    pytest.skip("TestEightDevices ran in this process")
  # XLA_FLAGS (conftest: LLVM's optimisations off) carries over.
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu")
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      f"{__file__}::TestEightDevices",
      "-q",
      "-x",
      "-p",
      "no:cacheprovider",
      "-n0",  # one process: the addopts' -n auto would start a worker per core beside ours
    ],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-6000:]
  assert re.search(r"\d+ passed", output) and "skipped" not in output, output[-3000:]
