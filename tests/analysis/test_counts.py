"""Tests for txf.analysis.counts against closed forms written from the architecture.

Parameter counts are exact integers, compared with `==`. Parameter trees come
from `jax.eval_shape(model.init, ...)` (no arrays allocated), except where a
test needs real arrays. FLOP counts are compared with rtol 1e-12 (float sums).
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from txf.analysis import count_params, flops_per_token, matmul_params, summarize
from txf.models import ModelConfig, build

TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=2, max_len=12)


def param_shapes(cfg: ModelConfig, seq_len: int = 6):
  """The model's params as ShapeDtypeStructs (no compute)."""
  tokens = jnp.ones((1, seq_len), jnp.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  return jax.eval_shape(build(cfg).init, jax.random.PRNGKey(0), *inputs)["params"]


def expected_counts(cfg: ModelConfig) -> dict[str, int]:
  """Closed-form parameter counts, written from the architecture (not the tree)."""
  D, H, V = cfg.d_model, cfg.num_heads, cfg.vocab_size
  K = cfg.num_kv_heads or H
  Dh = cfg.head_dim or D // H
  gated = cfg.activation in ("swiglu", "geglu")
  F = cfg.d_ff or (-(-8 * D // 3 // 8) * 8 if gated else 4 * D)
  per_norm = 2 * D if cfg.norm == "layer" else D  # scale (+ bias)
  bias = int(cfg.use_bias)

  # q, out: D x H*Dh; k, v: D x K*Dh; biases on each projection's outputs.
  attention = D * H * Dh * 2 + D * K * Dh * 2 + bias * (H * Dh + 2 * K * Dh + D)
  ffn = D * F * (3 if gated else 2) + bias * (F * (2 if gated else 1) + D)

  # (layers, has cross-attention) per stack.
  if cfg.family == "encoder_decoder":
    stacks = [(cfg.num_layers, False), (cfg.num_decoder_layers or cfg.num_layers, True)]
  else:
    stacks = [(cfg.num_layers, False)]
  final_norm = per_norm if cfg.norm_placement == "pre" else 0

  tables = 2 if cfg.family == "encoder_decoder" and not cfg.share_embeddings else 1
  embedding = tables * (V * D + (cfg.max_len * D if cfg.position == "learned" else 0))
  untied_logits = 0 if cfg.tie_embeddings else D * V
  head = {
    "lm": untied_logits,
    # transform (kernel + bias), norm, output bias, projection
    "mlm": D * D + D + per_norm + V + untied_logits,
    "classify": D * cfg.num_classes + cfg.num_classes,
  }[cfg.head]
  counts = {
    "embedding": embedding,
    "position": len(stacks) * cfg.option("t5_num_buckets") * H if cfg.position == "t5_bias" else 0,
    "attention": sum(n for n, _ in stacks) * attention,
    "cross_attention": sum(n for n, cross in stacks if cross) * attention,
    "ffn": sum(n for n, _ in stacks) * ffn,
    "norm": sum(n * (3 if cross else 2) * per_norm + final_norm for n, cross in stacks),
    "head": head,
  }
  counts["total"] = sum(counts.values())
  return counts


COUNT_CONFIGS = {
  "decoder_default": dict(family="decoder"),
  "decoder_bias_untied_gqa_swiglu_learned_rms": dict(
    family="decoder",
    use_bias=True,
    tie_embeddings=False,
    num_heads=4,
    num_kv_heads=2,
    activation="swiglu",
    position="learned",
    norm="rms",
  ),
  "decoder_mqa_t5_post_geglu_classify_headdim": dict(
    family="decoder",
    num_heads=4,
    num_kv_heads=1,
    head_dim=6,
    position="t5_bias",
    norm_placement="post",
    activation="geglu",
    head="classify",
    pooling="last",
    num_classes=3,
  ),
  "encoder_mlm_untied_learned_bias_post_relu": dict(
    family="encoder",
    head="mlm",
    tie_embeddings=False,
    position="learned",
    use_bias=True,
    norm_placement="post",
    activation="relu",
    d_ff=40,
  ),
  "encoder_mlm_tied_rms": dict(family="encoder", head="mlm", norm="rms", num_layers=1),
  "encoder_classify_t5": dict(
    family="encoder", head="classify", position="t5_bias", pooling="mean", num_classes=5
  ),
  "encdec_shared_t5": dict(family="encoder_decoder", position="t5_bias", num_decoder_layers=3),
  "encdec_separate_untied_learned_bias_swiglu_gqa_post": dict(
    family="encoder_decoder",
    share_embeddings=False,
    tie_embeddings=False,
    position="learned",
    use_bias=True,
    activation="swiglu",
    num_heads=4,
    num_kv_heads=2,
    norm_placement="post",
    num_layers=1,
  ),
}


@pytest.mark.parametrize("name", sorted(COUNT_CONFIGS))
def test_count_params_matches_closed_form_scanned_and_unscanned(name):
  cfg = ModelConfig(**{**TINY, **COUNT_CONFIGS[name]})
  expected = expected_counts(cfg)
  assert count_params(param_shapes(cfg), cfg) == expected
  scanned = cfg.replace(scan_layers=True)
  assert count_params(param_shapes(scanned), scanned) == expected


def test_count_params_takes_real_arrays_and_variables_dict():
  cfg = ModelConfig(**TINY, family="decoder", tie_embeddings=False)
  variables = build(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
  leaves_total = sum(x.size for x in jax.tree_util.tree_leaves(variables["params"]))
  counts = count_params(variables, cfg)
  assert counts == count_params(variables["params"], cfg) == expected_counts(cfg)
  assert counts["total"] == leaves_total


def test_count_params_rejects_param_of_no_known_module():
  cfg = ModelConfig(**TINY, family="decoder")
  params = {**param_shapes(cfg), "mystery": {"kernel": np.zeros((2, 3))}}
  with pytest.raises(ValueError, match="mystery/kernel"):
    count_params(params, cfg)


def test_count_params_rejects_layout_of_another_config():
  # Scanned parameters counted against an unscanned model: no module owns
  # `stack/blocks/...`, so nothing is attributed by name alone.
  cfg = ModelConfig(**TINY, family="decoder")
  with pytest.raises(ValueError, match="stack/blocks/"):
    count_params(param_shapes(cfg.replace(scan_layers=True)), cfg)


def test_summarize_lists_components_and_flops():
  cfg = ModelConfig(**TINY, family="encoder", head="mlm", position="t5_bias")
  params = param_shapes(cfg)
  text = summarize(params, cfg, seq_len=8)
  for name, count in count_params(params, cfg).items():
    if count:
      assert name in text and f"{count:,}" in text
  assert "cross_attention" not in text  # empty components are left out
  assert f"{flops_per_token(cfg, 8):.3g}" in text


# ---------------------------------------------------------------------------
# FLOPs per token.


def test_flops_per_token_by_hand():
  # Decoder, D=16, H=2, Dh=8, K=1 (MQA), F=32 ReLU, L=2, V=32, T=8:
  #   attention weights per layer: q 16*16 + k 16*8 + v 16*8 + out 16*16 = 768
  #   FFN weights per layer:       2 * 16 * 32                            = 1024
  #   N = 2 * (768 + 1024) + LM head 16 * 32 = 3584 + 512                 = 4096
  #   6N = 24576; attention 12 * L * H * Dh * T = 12 * 2 * 16 * 8          = 3072
  #   (PaLM's convention: causal attention counted whole)
  cfg = ModelConfig(
    family="decoder",
    vocab_size=32,
    d_model=16,
    num_heads=2,
    num_kv_heads=1,
    d_ff=32,
    activation="relu",
    num_layers=2,
  )
  assert matmul_params(cfg) == 4096
  assert flops_per_token(cfg, 8) == 24576 + 3072


FLOP_CONFIGS = {
  "decoder_gqa_swiglu_headdim": dict(
    family="decoder",
    num_heads=4,
    num_kv_heads=2,
    head_dim=6,
    activation="swiglu",
    tie_embeddings=False,
  ),
  "encoder_mlm": dict(family="encoder", head="mlm"),
  "encoder_classify": dict(family="encoder", head="classify", num_classes=3),
  "encdec_deeper_decoder": dict(family="encoder_decoder", num_layers=1, num_decoder_layers=3),
}


@pytest.mark.parametrize("name", sorted(FLOP_CONFIGS))
def test_flops_per_token_matches_formula(name):
  cfg = ModelConfig(**{**TINY, **FLOP_CONFIGS[name]})
  T = 10
  D, V, H = cfg.d_model, cfg.vocab_size, cfg.num_heads
  width = H * (cfg.head_dim or D // H)
  # N: the matmul kernels, i.e. the closed-form counts without biases, plus
  # the vocabulary projection whether or not it is tied.
  counts = expected_counts(cfg.replace(use_bias=False))
  N = counts["attention"] + counts["cross_attention"] + counts["ffn"]
  N += {"lm": D * V, "mlm": D * D + D * V, "classify": 0}[cfg.head]
  L_enc = cfg.num_layers if cfg.family != "decoder" else 0
  L_dec = (cfg.num_decoder_layers or cfg.num_layers) if cfg.family != "encoder" else 0
  L_cross = L_dec if cfg.family == "encoder_decoder" else 0
  expected = 6 * N + 12 * (L_enc + L_dec + L_cross) * width * T
  if cfg.head == "classify":
    expected += 6 * D * cfg.num_classes / T  # one classifier matmul per sequence
  assert matmul_params(cfg) == N
  np.testing.assert_allclose(flops_per_token(cfg, T), expected, rtol=1e-12)


def test_causal_attention_counts_as_much_as_bidirectional():
  # The seq_len slope is the attention term alone: 12 * L * H * Dh, causal or
  # not (PaLM's 6N + 12LHQT counts the masked half too).
  common = dict(TINY, d_model=32, num_heads=4)
  decoder = ModelConfig(**common, family="decoder")
  encoder = ModelConfig(**common, family="encoder", head="mlm")
  slope = lambda cfg: flops_per_token(cfg, 200) - flops_per_token(cfg, 100)
  np.testing.assert_allclose(slope(decoder), 12 * 2 * 32 * 100, rtol=1e-12)
  np.testing.assert_allclose(slope(encoder), slope(decoder), rtol=1e-12)


def test_six_n_dominates_for_short_sequences():
  # Untied, bias-free decoder: N is exactly the counted attention + FFN + head
  # parameters, so the T -> 0 intercept must be 6 * count.
  cfg = ModelConfig(
    vocab_size=64, d_model=64, num_heads=4, num_layers=2, family="decoder", tie_embeddings=False
  )
  counts = count_params(param_shapes(cfg), cfg)
  six_n = 6 * (counts["attention"] + counts["ffn"] + counts["head"])
  f8, f16 = flops_per_token(cfg, 8), flops_per_token(cfg, 16)
  np.testing.assert_allclose(2 * f8 - f16, six_n, rtol=1e-12)  # linear in T
  # Attention over the 12 * D^2 weights of a layer: a share of about
  # T / (6 * D), ~2% at T=8, D=64.
  assert 0 < (f8 - six_n) / f8 < 0.02
  assert (flops_per_token(cfg, 4096) - six_n) / six_n > 0.5  # and not for long ones


def test_flops_accepts_config_dict():
  fields = dict(TINY, family="encoder_decoder", position="t5_bias")
  assert flops_per_token(ml_collections.ConfigDict(fields), 12) == flops_per_token(
    ModelConfig(**fields), 12
  )
