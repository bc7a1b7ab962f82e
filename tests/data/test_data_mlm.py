"""BERT masking: rates, the 80/10/10 split, specials, dataset integration."""

import numpy as np
import pytest

from tfds_builders import zero_is_a_word_tokenizer
from txf.data import make_dataset
from txf.data.lm import LanguageModelSource, token_stream
from txf.data.masking import BertMasker, bert_mask
from txf.data.spec import parse_data

VOCAB = 260
SPECIALS = (0, 1, 2, 3)
MASK_ID = 3


def all_real(tokens):
  """Every position real (no padding)."""
  return np.ones(tokens.shape, bool)


def _five_sigma(p, n):
  return 5 * np.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def masked():
  """Masks 200k tokens, a fifth of them special."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, VOCAB, size=(400, 500)).astype(np.int32)
  special = rng.random(tokens.shape) < 0.2
  tokens[special] = rng.choice(SPECIALS, size=special.sum())
  masker = BertMasker(
    probability=0.15, mask_id=MASK_ID, vocab_size=VOCAB, special_ids=SPECIALS, seed=0
  )
  return tokens, masker(tokens, all_real(tokens), step=7, rows=range(400), batch_size=400)


def test_masking_rate_and_specials(masked):
  tokens, batch = masked
  special = np.isin(tokens, SPECIALS)
  selected = batch["weights"] == 1
  np.testing.assert_array_equal(np.unique(batch["weights"]), [0.0, 1.0])
  assert not selected[special].any()
  np.testing.assert_array_equal(batch["inputs"][special], tokens[special])
  rate = selected[~special].mean()
  assert abs(rate - 0.15) < _five_sigma(0.15, (~special).sum())
  np.testing.assert_array_equal(batch["targets"], tokens)
  np.testing.assert_array_equal(batch["inputs"][~selected], tokens[~selected])
  assert batch["inputs"].dtype == np.int32
  assert batch["weights"].dtype == np.float32


def test_80_10_10_split(masked):
  tokens, batch = masked
  selected = batch["weights"] == 1
  n = selected.sum()
  inputs, originals = batch["inputs"][selected], tokens[selected]
  to_mask = inputs == MASK_ID
  # A random replacement equals the original with chance 1 / 256.
  to_random = ~to_mask & (inputs != originals)
  unchanged = inputs == originals
  assert abs(to_mask.mean() - 0.8) < _five_sigma(0.8, n)
  random_share = 0.1 * (1 - 1 / 256)
  assert abs(to_random.mean() - random_share) < _five_sigma(random_share, n)
  assert abs(unchanged.mean() - (1 - 0.8 - random_share)) < _five_sigma(0.1, n)
  assert not np.isin(inputs[to_random], SPECIALS).any()


def test_bert_mask_follows_its_draws():
  tokens = np.array([[5, 6, 7, 8, 2]], dtype=np.int32)
  uniforms = np.array(
    [
      [[0.1, 0.1, 0.1, 0.9, 0.1]],  # select all but 8
      [[0.5, 0.85, 0.95, 0.5, 0.5]],
    ]
  )  # mask, random, keep
  random_tokens = np.full_like(tokens, 42)
  out = bert_mask(
    tokens,
    all_real(tokens),
    uniforms,
    random_tokens,
    probability=0.15,
    mask_id=MASK_ID,
    special_ids=SPECIALS,
  )
  np.testing.assert_array_equal(out["inputs"], [[MASK_ID, 42, 7, 8, 2]])
  np.testing.assert_array_equal(out["weights"], [[1, 1, 1, 0, 0]])


def test_masks_depend_on_step_and_seed(masked):
  tokens, batch = masked
  make = lambda seed: BertMasker(
    probability=0.15, mask_id=MASK_ID, vocab_size=VOCAB, special_ids=SPECIALS, seed=seed
  )
  again = make(0)(tokens, all_real(tokens), step=7, rows=range(400), batch_size=400)
  np.testing.assert_array_equal(again["inputs"], batch["inputs"])
  for other in (
    make(0)(tokens, all_real(tokens), step=8, rows=range(400), batch_size=400),
    make(1)(tokens, all_real(tokens), step=7, rows=range(400), batch_size=400),
  ):
    assert not np.array_equal(other["weights"], batch["weights"])


def test_mlm_dataset_batches():
  config = parse_data(
    dict(
      name="pystdlib",
      task="mlm",
      tokenizer="bytes",
      seq_len=64,
      batch_size=8,
      max_corpus_bytes=20_000,
      mlm_probability=0.3,
    )
  )
  ds = make_dataset(config, "train", seed=0)
  assert ds.task == "mlm"
  batches = [next(ds) for _ in range(20)]
  for batch in batches:
    assert all(batch[k].shape == (8, 64) for k in batch)
    # Unmasked positions show the original token: targets are the window.
    keep = batch["weights"] == 0
    np.testing.assert_array_equal(batch["inputs"][keep], batch["targets"][keep])
  weights = np.concatenate([b["weights"] for b in batches])
  targets = np.concatenate([b["targets"] for b in batches])
  eos = targets == ds.tokenizer.eos_id
  assert eos.any() and not weights[eos].any()
  assert abs(weights[~eos].mean() - 0.3) < _five_sigma(0.3, (~eos).sum())


def test_evaluation_never_masks_padding_rows(tmp_path):
  # A Hugging Face vocabulary's id 0 is a real token (GPT-2's '!'), not a
  # special one, and padding rows are written as 0: only the real ones are masked.
  tokenizer = zero_is_a_word_tokenizer(tmp_path)
  tokens = token_stream(["a ! b ! !", "c ! a"] * 3, tokenizer)  # 3 windows of 8 (6 + 4 tokens)
  masker = BertMasker(
    probability=0.9,
    mask_id=tokenizer.mask_id,
    vocab_size=tokenizer.vocab_size,
    special_ids=tokenizer.special_ids,
    seed=0,
  )
  source = LanguageModelSource(
    tokens, example_len=8, batch_size=4, seed=0, split="validation", masker=masker
  )
  batch = source.batch(0, range(4))  # the 3 windows and a padding row
  np.testing.assert_array_equal(batch["targets"][:3].ravel(), tokens[:24])
  np.testing.assert_array_equal(batch["weights"][3], 0)
  assert batch["weights"][:3][batch["targets"][:3] == 0].any()  # real 0s are masked
