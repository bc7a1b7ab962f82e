"""txf.ops.matvec_gpu: one row times a weight matrix as one GPU kernel, run
by Pallas's interpreter on the CPU against a float64 reference (float32
inputs: rtol 1e-5; bfloat16: the result within one bfloat16 rounding of
the float64 sum of the same bfloat16 inputs), the bias and the residual it
adds (float32 against float64; bfloat16 bit for bit as jnp's additions of
its own product), and which products take it.
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


# One instance with masked columns; a partial last block of 16.
@pytest.mark.parametrize("k,n", [(1, 1), (257, 33)])
def test_float32_bias_and_residual_added_to_the_float64_product(k, n):
  x, w = inputs(k, n, jnp.float32, seed=3)
  rng = np.random.default_rng(4)
  bias, residual = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
  got = matvec_gpu.matvec(x, w, bias_N=bias, residual_N=residual, interpret=True)
  expected = np.asarray(residual, np.float64) + (reference(x, w) + np.asarray(bias, np.float64))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(k))
  # Each alone: the other term is left out, not added as zeros of another dtype.
  got_bias = matvec_gpu.matvec(x, w, bias_N=bias, interpret=True)
  np.testing.assert_allclose(got_bias, expected - np.asarray(residual), rtol=1e-5, atol=1e-4)
  got_residual = matvec_gpu.matvec(x, w, residual_N=residual, interpret=True)
  np.testing.assert_allclose(got_residual, expected - np.asarray(bias), rtol=1e-5, atol=1e-4)


def test_bfloat16_additions_round_as_jnp_adds_them():
  """The product rounded, then the bias (stored float32, rounded to
  bfloat16) added and rounded, then the residual: bit for bit jnp's
  residual + (product + bias), and not the float32 sum rounded once."""
  x, w = inputs(768, 256, jnp.bfloat16, seed=5)
  rng = np.random.default_rng(6)
  bias = jnp.asarray(rng.standard_normal(256), jnp.float32)
  residual = jnp.asarray(100 * rng.standard_normal(256), jnp.bfloat16)
  product = matvec_gpu.matvec(x, w, interpret=True)
  got = matvec_gpu.matvec(x, w, bias_N=bias, residual_N=residual, interpret=True)
  assert got.dtype == jnp.bfloat16
  expected = residual + (product + bias.astype(jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
  once = (
    residual.astype(jnp.float32)
    + (matvec_gpu.matvec(x.astype(jnp.float32), w.astype(jnp.float32), interpret=True) + bias)
  ).astype(jnp.bfloat16)
  assert np.any(np.asarray(got, np.float32) != np.asarray(once, np.float32))


def test_a_float32_residual_promotes_the_result():
  x, w = inputs(64, 48, jnp.bfloat16, seed=7)
  residual = jnp.asarray(np.random.default_rng(8).standard_normal(48), jnp.float32)
  got = matvec_gpu.matvec(x, w, residual_N=residual, interpret=True)
  assert got.dtype == jnp.float32
  expected = residual + matvec_gpu.matvec(x, w, interpret=True)
  np.testing.assert_array_equal(got, expected)


def test_shapes_it_cannot_take_are_refused():
  with pytest.raises(ValueError, match=r"^matvec takes x \[K\] and W \[K, N\], got \(2, 3\)"):
    matvec_gpu.matvec(jnp.ones((2, 3)), jnp.ones((3, 4)), interpret=True)
  with pytest.raises(ValueError, match=r"got \(3,\) and \(4, 5\)"):
    matvec_gpu.matvec(jnp.ones(3), jnp.ones((4, 5)), interpret=True)
  for name in ("bias_N", "residual_N"):
    with pytest.raises(ValueError, match=rf"^matvec's {name} must be \[N\] = \(5,\), got \(4,\)"):
      matvec_gpu.matvec(jnp.ones(3), jnp.ones((3, 5)), **{name: jnp.ones(4)}, interpret=True)


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


def test_contract_adds_bias_and_residual_alike_on_both_paths(for_a_gpu):
  """The kernel's for one row, XLA's additions for two: residual + (product
  + bias), the bias in x's dtype."""
  rng = np.random.default_rng(9)
  kernel = jnp.asarray(rng.standard_normal((4, 8, 24)), jnp.float32)
  bias = jnp.asarray(rng.standard_normal(24), jnp.float32)
  for rows in ((1, 1), (2, 1)):
    x = jnp.asarray(rng.standard_normal(rows + (4, 8)), jnp.float32)
    residual = jnp.asarray(rng.standard_normal(rows + (24,)), jnp.float32)
    got = matvec_gpu.contract(x, kernel, dims=2, bias=bias, residual=residual)
    product = jnp.einsum("btcd,cdf->btf", x, kernel)
    np.testing.assert_allclose(got, residual + (product + bias), rtol=1e-5, atol=1e-5)
    assert ("matvec" in traced(lambda x: matvec_gpu.contract(x, kernel, 2, bias=bias), x)) == (
      rows == (1, 1)
    )


def test_not_on_the_cpu_path_nor_on_a_mesh():
  x, kernel = jnp.ones((1, 1, 8)), jnp.ones((8, 4))
  assert "matvec" not in traced(functools.partial(matvec_gpu.contract, dims=1), x, kernel)
  with platform.compiling_for("gpu"):
    assert matvec_gpu.applies(1) == matvec_gpu.AVAILABLE
    assert not matvec_gpu.applies(2)
    mesh = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
      assert not matvec_gpu.applies(1)
