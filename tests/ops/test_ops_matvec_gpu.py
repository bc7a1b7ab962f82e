"""txf.ops.matvec_gpu: one row times a weight matrix as one GPU kernel, run
by Pallas's interpreter on the CPU against a float64 reference (float32
inputs: rtol 1e-5; bfloat16: the result within one bfloat16 rounding of
the float64 sum of the same bfloat16 inputs), and which products take it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops import matvec_gpu, platform


def inputs(k, n, dtype, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal(k), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)), dtype)
  return x, w


def reference(x, w):
  """x @ w in float64, of the inputs as given (bfloat16 values exactly)."""
  as64 = lambda a: np.asarray(a.astype(jnp.float32), np.float64)
  return as64(x) @ as64(w)


# The ends of the blocks: 16 columns an instance, 256 rows a step.
@pytest.mark.parametrize(
  "k,n", [(1, 1), (15, 17), (16, 16), (255, 31), (256, 768), (257, 33), (3072, 768)]
)
def test_float32_equals_the_float64_product(k, n):
  x, w = inputs(k, n, jnp.float32)
  got = matvec_gpu.matvec(x, w, interpret=True)
  assert got.shape == (n,) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, reference(x, w), rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_bfloat16_is_the_float32_sum_rounded_once():
  x, w = inputs(3072, 768, jnp.bfloat16, seed=1)
  got = matvec_gpu.matvec(x, w, interpret=True)
  assert got.dtype == jnp.bfloat16
  expected = reference(x, w)
  # One rounding to bfloat16 (8 bits of mantissa): half a unit in the last place.
  ulp = np.exp2(np.floor(np.log2(np.abs(expected))) - 7)
  assert np.all(np.abs(np.asarray(got, np.float64) - expected) <= 0.5 * ulp + 1e-3)


def test_shapes_it_cannot_take_are_refused():
  with pytest.raises(ValueError, match=r"^matvec takes x \[K\] and W \[K, N\], got \(2, 3\)"):
    matvec_gpu.matvec(jnp.ones((2, 3)), jnp.ones((3, 4)), interpret=True)
  with pytest.raises(ValueError, match=r"got \(3,\) and \(4, 5\)"):
    matvec_gpu.matvec(jnp.ones(3), jnp.ones((4, 5)), interpret=True)


@pytest.fixture
def for_a_gpu(monkeypatch):
  """Traced for a GPU, the kernel run by Pallas's interpreter."""
  monkeypatch.setattr(matvec_gpu, "matvec", functools.partial(matvec_gpu.matvec, interpret=True))
  jax.clear_caches()
  with platform.compiling_for("gpu"):
    yield
  jax.clear_caches()


def traced(fn, *args):
  return str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("dims", [1, 2])
def test_contract_takes_the_kernel_for_one_row_only(for_a_gpu, dims):
  """nn.DenseGeneral's product over the last `dims` axes: the kernel's for
  one row ([1, 1, ...], a decoding step at batch 1), XLA's for two."""
  rng = np.random.default_rng(2)
  kernel = jnp.asarray(rng.standard_normal((8, 24) if dims == 1 else (4, 8, 24)), jnp.float32)
  contracted = kernel.shape[:dims]
  contract = functools.partial(matvec_gpu.contract, dims=dims)
  for rows, kernel_taken in (((1, 1), True), ((2, 1), False), ((1, 3), False)):
    x = jnp.asarray(rng.standard_normal(rows + contracted), jnp.float32)
    assert ("matvec" in traced(contract, x, kernel)) == kernel_taken
    expected = jax.lax.dot_general(
      x, kernel, ((tuple(range(2, 2 + dims)), tuple(range(dims))), ((), ()))
    )
    got = contract(x, kernel)
    assert got.shape == rows + kernel.shape[dims:]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_not_on_the_cpu_path_nor_on_a_mesh():
  x, kernel = jnp.ones((1, 1, 8)), jnp.ones((8, 4))
  assert "matvec" not in traced(functools.partial(matvec_gpu.contract, dims=1), x, kernel)
  with platform.compiling_for("gpu"):
    assert matvec_gpu.applies(1) == matvec_gpu.AVAILABLE
    assert not matvec_gpu.applies(2)
    mesh = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
      assert not matvec_gpu.applies(1)
