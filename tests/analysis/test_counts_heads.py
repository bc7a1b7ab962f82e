"""The FLOP count of a model with a registered output head (txf.register.head's
matmul_params): the head's matmul weights per token, checked against the
kernels the head's initialised parameters hold."""

import runpy

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from conftest import REPO
from txf import register
from txf.analysis import flops_per_token, matmul_params
from txf.layers.model_config import HEADS
from txf.models import ModelConfig, build

TINY = dict(vocab_size=40, d_model=16, num_heads=2, num_layers=2, max_len=12)


def test_a_registered_head_adds_the_matmul_weights_it_declares():
  with HEADS.scoped():
    runpy.run_path(str(REPO / "examples" / "extending" / "mlp_head.py"))
    cfg = ModelConfig(**TINY, head="mlp_lm")
    params = nn.meta.unbox(build(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
    hidden = params["params"]["head"]["hidden"]["kernel"].size  # D x D, beside the tied D x V
    baseline = ModelConfig(**TINY, head="lm")  # txf's head: the tied D x V projection alone
    assert matmul_params(cfg) - matmul_params(baseline) == hidden == 16 * 16
    assert flops_per_token(cfg, 12) - flops_per_token(baseline, 12) == 6.0 * hidden


def test_a_registered_head_without_matmul_params_names_the_head():
  """Refused with the config, in one line (a run stopped at its start with
  a traceback, from the FLOP count)."""
  with HEADS.scoped():
    register.head("bare_lm", tasks=("lm",), families=("decoder",))(HEADS["lm"].module)
    with pytest.raises(ValueError, match=r"^model\.head: 'bare_lm' declares no matmul_params"):
      ModelConfig(**TINY, head="bare_lm")
