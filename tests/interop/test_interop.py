"""Hugging Face checkpoints through txf.interop, against transformers' own outputs.

tests/fixtures/hf holds tiny random checkpoints of each family and the
outputs `transformers` computed for them (made by
tests/fixtures/make_hf_fixtures.py; see its docstring for what each
reference.npz holds). Here txf loads them without torch or transformers and
must reproduce those outputs in float32 to ATOL on every real (not padding)
token, with and without padding; its KV-cache greedy decoding must give the
same tokens; and an export must read back to identical parameters.

The weights are O(1) (logits average 0.1 to 5 in magnitude), so 1e-4 is a
tolerance a wrong formula cannot meet: erf-vs-tanh GELU, a missing
d_model^-0.5 or 1/sqrt(d_k), or a transposed projection each change the
outputs by 1e-2 or more.
"""

import functools
import json
import pathlib
import re
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import FIXTURES
from txf.data import HFTokenizer, parse_data
from txf.interop import CheckpointError, load_pretrained, save_pretrained
from txf.interop.checkpoint import param_shapes
from txf.interop.rules import flatten, unflatten
from txf.interop.text import (
  encode_batch,
  generate_text,
  pool_sentences,
  sentence_transformers_pooling,
)
from txf.layers import Embedder
from txf.models import ModelConfig, build

HF_FIXTURES = FIXTURES / "hf"
ATOL = 1e-4


@functools.cache
def pretrained(name, head=None):
  return load_pretrained(HF_FIXTURES / name, head=head)


@functools.cache
def reference(name):
  return dict(np.load(HF_FIXTURES / name / "reference.npz"))


def valid(name, batch):
  """bool [B, T]: the real tokens of a reference batch."""
  tokens = reference(name)[f"{batch}_tokens"]
  if batch == "full":
    return np.ones(tokens.shape, bool)
  return tokens != pretrained(name).config.pad_id


def assert_close_on(valid_BxT, actual, expected):
  """max |actual - expected| over the real tokens <= ATOL."""
  error = np.abs(np.asarray(actual, np.float64) - expected)[valid_BxT]
  assert error.max() <= ATOL, f"max abs error {error.max():.2e} > {ATOL}"


# ---------------------------------------------------------------------------
# Outputs. One jitted forward per fixture, batch and head (compiling costs
# more than running these models).


@functools.cache
def forward(name, batch, head=None):
  """The model's output on a reference batch (T5: (encoder output, logits))."""
  loaded, ref = pretrained(name, head), reference(name)
  model = loaded.model()
  tokens = ref[f"{batch}_tokens"]
  if loaded.config.family == "encoder_decoder":

    def run(params):
      encoded, mask = model.apply({"params": params}, tokens, method="encode")
      return encoded, model.apply(
        {"params": params}, encoded, mask, ref[f"{batch}_decoder_tokens"], method="decode"
      )
  else:
    types = ref.get(f"{batch}_types")
    kwargs = {} if types is None else dict(token_types_BxS=types)
    run = lambda params: model.apply({"params": params}, tokens, **kwargs)
  return jax.tree.map(np.asarray, jax.jit(run)(loaded.params))


@pytest.mark.parametrize(
  "name,batch",
  [
    ("bert", "full"),
    ("bert", "padded"),
    ("roberta", "padded"),
    ("gpt2", "padded"),
    ("llama", "padded"),
    ("gpt_neox", "padded"),
  ],
)
def test_logits_match_transformers(name, batch):
  """MLM logits (BERT with a second segment in row 0) and the decoders' LM
  logits (Llama: grouped-query attention, SwiGLU, RoPE of base 1000 scaled
  linearly; GPT-NeoX: txf's default decoder's shape). Right padding: BERT
  masks it, and a causal model's real tokens never see it."""
  assert pretrained(name).config.head in ("mlm", "lm") and pretrained(name).unused == ()
  assert_close_on(valid(name, batch), forward(name, batch), reference(name)[f"{batch}_logits"])


@pytest.mark.parametrize(
  "name,batch", [("minilm", "full"), ("minilm", "padded"), ("gpt2", "padded")]
)
def test_hidden_states_match_transformers(name, batch):
  """head='none' returns the final hidden states (after GPT-2's ln_f)."""
  assert_close_on(
    valid(name, batch), forward(name, batch, "none"), reference(name)[f"{batch}_hidden"]
  )


@pytest.mark.parametrize("name,batch", [("minilm", "full"), ("minilm", "padded")])
def test_sentence_embeddings_match_transformers(name, batch):
  """Mean pooling over real tokens (and L2-normalised) and CLS pooling, as
  sentence-transformers computes them from transformers' hidden states."""
  ref = reference(name)
  pooled = functools.partial(pool_sentences, forward(name, batch, "none"), valid(name, batch))
  every_row = np.ones(ref[f"{batch}_tokens"].shape[:1], bool)
  assert_close_on(every_row, pooled(pooling="mean"), ref[f"{batch}_mean"])
  assert_close_on(every_row, pooled(pooling="mean", normalize=True), ref[f"{batch}_mean_l2"])
  assert_close_on(every_row, pooled(pooling="cls"), ref[f"{batch}_cls"])


def test_gpt2_pads_with_its_end_of_text_token():
  assert pretrained("gpt2").config.pad_id == 300  # the last id, as GPT-2's 50256


@pytest.mark.parametrize("name,batch", [("t5", "full"), ("t5_v1_1", "padded")])
def test_t5_encoder_and_logits_match_transformers(name, batch):
  """v1.0: ReLU, tied and scaled output; v1.1: gated GELU, untied unscaled."""
  loaded, ref = pretrained(name), reference(name)
  assert (loaded.config.tie_embeddings, loaded.config.scale_logits) == (
    (True, True) if name == "t5" else (False, False)
  )
  encoded, logits = forward(name, batch)
  assert_close_on(valid(name, batch), encoded, ref[f"{batch}_hidden"])
  assert_close_on(np.ones(logits.shape[:2], bool), logits, ref[f"{batch}_logits"])


# ---------------------------------------------------------------------------
# KV-cache generation.


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_greedy_generation_matches_transformers(name):
  """Prompts of 3, 5 and 2 tokens in one right-padded batch; transformers
  generated each alone (Llama: the rotary positions of the KV cache)."""
  loaded, ref = pretrained(name), reference(name)
  generated = generate_text(
    loaded, ref["greedy_prompts"], max_new_tokens=ref["greedy_tokens"].shape[1]
  )
  np.testing.assert_array_equal(generated, ref["greedy_tokens"])


def test_t5_greedy_generation_matches_transformers():
  """v1.1 (gated GELU, untied output); encoder inputs of three lengths, padded."""
  loaded, ref = pretrained("t5_v1_1"), reference("t5_v1_1")
  generated = generate_text(
    loaded, ref["padded_tokens"], max_new_tokens=ref["padded_greedy_tokens"].shape[1]
  )
  np.testing.assert_array_equal(generated, ref["padded_greedy_tokens"])


def test_generation_refuses_a_prompt_holding_the_pad_id():
  loaded = pretrained("gpt2")
  prompt = np.array([[5, loaded.config.pad_id, 7]])
  with pytest.raises(ValueError, match="prompt: holds token 300"):
    generate_text(loaded, prompt, max_new_tokens=2)


# ---------------------------------------------------------------------------
# Tokenizers.


@pytest.mark.parametrize("name", ["bert", "roberta", "gpt2", "t5"])
def test_tokenizer_json_encodes_as_transformers(name):
  """HFTokenizer's ids (special tokens added) are the reference batch's, for
  the same texts (tests/fixtures/make_hf_fixtures.TEXTS, rows 1 and 2)."""
  texts = ["a single step begins the journey of tokens", "every model looks at the dog"]
  loaded, ref = pretrained(name), reference(name)
  tokenizer = HFTokenizer(HF_FIXTURES / name)
  expected = ref["padded_tokens"][1:]
  np.testing.assert_array_equal(
    encode_batch(tokenizer, texts, pad_id=loaded.config.pad_id),
    expected[:, : max(np.sum(expected != loaded.config.pad_id, 1))],
  )
  assert tokenizer.decode(tokenizer.encode(texts[1])).strip().lower() == texts[1]


def test_tokenizer_special_ids():
  bert, gpt2, t5 = (HFTokenizer(HF_FIXTURES / name) for name in ("bert", "gpt2", "t5"))
  assert (bert.pad_id, bert.bos_id, bert.eos_id, bert.mask_id) == (0, 2, 3, 4)  # [CLS], [SEP]
  assert gpt2.pad_id == gpt2.eos_id == gpt2.bos_id == 300  # <|endoftext|> for all three
  assert (t5.pad_id, t5.eos_id, t5.bos_id, t5.mask_id) == (0, 1, 0, None)  # starts from pad
  assert {0, 1, 2, 3, 4} <= bert.special_ids


def padding_and_truncating(directory, *, pad_to, cut_at):
  """The fixture BERT tokenizer copied into `directory`, its tokenizer.json
  padding every encoding to `pad_to` tokens and cutting it at `cut_at`, as
  all-MiniLM-L6-v2's does (128 and 128); returns the directory."""
  shutil.copytree(HF_FIXTURES / "bert", directory)
  saved = json.loads((directory / "tokenizer.json").read_text())
  saved["padding"] = {
    "strategy": {"Fixed": pad_to},
    "direction": "Right",
    "pad_to_multiple_of": None,
    "pad_id": 0,
    "pad_type_id": 0,
    "pad_token": "[PAD]",
  }
  saved["truncation"] = {
    "direction": "Right",
    "max_length": cut_at,
    "strategy": "LongestFirst",
    "stride": 0,
  }
  (directory / "tokenizer.json").write_text(json.dumps(saved))
  return directory


def test_tokenizer_ignores_the_files_padding_and_truncation(tmp_path):
  """txf pads batches itself and never cuts text."""
  directory = padding_and_truncating(tmp_path / "bert", pad_to=16, cut_at=3)
  text = "every model looks at the dog"
  np.testing.assert_array_equal(
    HFTokenizer(directory).encode(text), HFTokenizer(HF_FIXTURES / "bert").encode(text)
  )
  assert len(HFTokenizer(directory).encode(text)) == 11  # every m ##o ##d ##e ##l look ##s ...


def test_an_exported_copy_of_a_tokenizer_pads_and_cuts_nothing(tmp_path):
  """The run's HFTokenizer encodes without the file's padding and truncation,
  and so must the export's copy as the tokenizers library reads it (it gave
  128 ids, padded with 0, for a 10-token text, and cut longer ones)."""
  import tokenizers

  from txf.data.tokenizers import hf_tokenizer_files

  run_tokenizer = HFTokenizer(padding_and_truncating(tmp_path / "bert", pad_to=128, cut_at=8))
  copy = tmp_path / "copy"
  copy.mkdir()
  for name, text in hf_tokenizer_files(run_tokenizer).items():
    (copy / name).write_text(text)
  read = tokenizers.Tokenizer.from_file(str(copy / "tokenizer.json"))
  for text in ["hello world", "the quick brown fox jumps over the lazy dog " * 3]:
    ids = run_tokenizer.encode(text).tolist()
    assert 1 < len(ids) and len(ids) != 128
    assert read.encode(text).ids == ids, text


def test_hf_tokenizer_needs_its_path():
  data = dict(
    name="pystdlib", task="lm", seq_len=8, batch_size=2, tokenizer="hf", max_corpus_bytes=100
  )
  with pytest.raises(ValueError, match="data.tokenizer_path is required for data.tokenizer='hf'"):
    parse_data(data)
  spec = parse_data(dict(data, tokenizer_path=str(HF_FIXTURES / "bert")))
  assert spec.tokenizer_path == str(HF_FIXTURES / "bert")


def test_sentence_transformers_directory_declares_its_pooling():
  assert sentence_transformers_pooling(HF_FIXTURES / "minilm") == ("mean", True)
  assert sentence_transformers_pooling(HF_FIXTURES / "bert") is None


# ---------------------------------------------------------------------------
# Export.


@pytest.mark.parametrize(
  "name", ["bert", "minilm", "roberta", "gpt2", "llama", "gpt_neox", "t5", "t5_v1_1"]
)
def test_export_then_import_gives_identical_params(name, tmp_path):
  loaded = pretrained(name)
  loaded.save(tmp_path)
  again = load_pretrained(tmp_path)
  assert again.config == loaded.config and again.architecture == loaded.architecture
  flat, flat_again = flatten(loaded.params), flatten(again.params)
  assert flat.keys() == flat_again.keys()
  for path, value in flat.items():
    np.testing.assert_array_equal(flat_again[path], value, err_msg=path)
  # The same tensors, under the same names, as the file transformers wrote
  # (but RoBERTa's position rows before pad_id + 1, which no token reads).
  original, exported = (load_file(d / "model.safetensors") for d in (HF_FIXTURES / name, tmp_path))
  pooler = {key for key in original if "pooler" in key}  # dropped, named in `unused`
  assert exported.keys() == original.keys() - pooler
  for key, value in exported.items():
    skip = 2 if name == "roberta" and "position_embeddings" in key else 0
    np.testing.assert_array_equal(value[skip:], original[key][skip:], err_msg=key)


# Settings no fixture holds away from txf's defaults (every fixture's dropout
# is 0 or T5's 0.1, every T5 eps 1e-6): written under the keys transformers
# reads for them, and read back.
SETTINGS = {
  "gpt2": (
    dict(norm_eps=1e-4, dropout_rate=0.1, attention_dropout_rate=0.2),
    dict(layer_norm_epsilon=1e-4, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.2),
  ),
  "gpt_neox": (
    dict(norm_eps=1e-4, dropout_rate=0.1, attention_dropout_rate=0.2),
    dict(layer_norm_eps=1e-4, hidden_dropout=0.1, attention_dropout=0.2),
  ),
  "llama": (
    dict(norm_eps=1e-4, attention_dropout_rate=0.2),
    dict(rms_norm_eps=1e-4, attention_dropout=0.2),
  ),
  "t5": (
    dict(norm_eps=1e-5, dropout_rate=0.2, attention_dropout_rate=0.2),
    dict(layer_norm_epsilon=1e-5, dropout_rate=0.2),
  ),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_norm_eps_and_dropouts_are_written_as_transformers_reads_them(name, tmp_path):
  changes, keys = SETTINGS[name]
  loaded = pretrained(name)
  cfg = loaded.config.replace(**changes)
  save_pretrained(cfg, loaded.params, tmp_path)
  written = json.loads((tmp_path / "config.json").read_text())
  assert {key: written[key] for key in keys} == keys
  assert load_pretrained(tmp_path).config == cfg


def test_a_t5s_dropout_rate_is_read_as_its_attentions_too():
  # transformers' T5 drops its attention weights at dropout_rate: read as
  # 0, a T5 fine-tuned in txf trained without it.
  cfg = pretrained("t5").config
  assert cfg.attention_dropout_rate == cfg.dropout_rate > 0


def random_params(cfg, seed=0):
  """N(0, 1) parameters of cfg's model, without running its init."""
  rng = np.random.default_rng(seed)
  return unflatten(
    {path: rng.normal(size=shape).astype(np.float32) for path, shape in param_shapes(cfg).items()}
  )


def test_export_of_a_txf_model_writes_the_family_config(tmp_path):
  """A model made in txf (GPT-2-shaped) round-trips through the HF format."""
  cfg = ModelConfig(
    family="decoder",
    vocab_size=50,
    d_model=16,
    num_heads=2,
    num_layers=1,
    position="learned",
    max_len=12,
    use_bias=True,
    scale_logits=False,
    norm_eps=1e-5,
  )
  params = random_params(cfg)
  save_pretrained(cfg, params, tmp_path, token_ids={"eos_token_id": 49})
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["architectures"] == ["GPT2LMHeadModel"] and written["n_positions"] == 12
  assert written["eos_token_id"] == 49 and written["activation_function"] == "gelu_new"
  again = load_pretrained(tmp_path)
  assert again.config == cfg
  for path, value in flatten(params).items():
    np.testing.assert_array_equal(flatten(again.params)[path], value, err_msg=path)
  # Without the run's ids, none: left out, transformers' GPT2Config took its
  # own 50256, outside this vocabulary, as the id generate() stops at.
  save_pretrained(cfg, params, tmp_path / "no_ids")
  written = json.loads((tmp_path / "no_ids" / "config.json").read_text())
  assert written["bos_token_id"] is None and written["eos_token_id"] is None


def o1_params(cfg, seed=0):
  """Parameters of cfg's model with O(1) activations (matrices N(0, 1/fan_in),
  norm scales 1 + N(0, 0.5^2), biases N(0, 0.5^2)), without running its init."""
  rng = np.random.default_rng(seed)
  params = {}
  for path, shape in param_shapes(cfg).items():
    value = rng.normal(size=shape) * (0.5 if len(shape) == 1 else shape[0] ** -0.5)
    params[path] = (value + path.endswith("/scale")).astype(np.float32)
  return unflatten(params)


def decoder_config(**fields):
  """A tiny txf decoder: txf's defaults (configs/rope.py's model) but the
  sizes; d_model 24, so d_model^-0.5 is not a power of two."""
  sizes = dict(vocab_size=40, d_model=24, num_heads=2, num_layers=2, max_len=16)
  return ModelConfig(family="decoder", **{**sizes, **fields})


# A txf decoder of each shape the export maps -> the architecture it is written as.
DECODERS = {
  # txf's default decoder (configs/rope.py): LayerNorm, no biases, tanh GELU,
  # tied logits scaled by d_model^-0.5 (written untied: the output times it).
  "default": ("GPTNeoXForCausalLM", dict()),
  "relu_biases_linear_rope": (
    "GPTNeoXForCausalLM",
    dict(
      activation="relu", use_bias=True, norm_eps=1e-5, options=dict(rope_base=500.0, rope_scale=2.0)
    ),
  ),
  "swiglu_gqa": (
    "LlamaForCausalLM",
    dict(norm="rms", activation="swiglu", num_heads=4, num_kv_heads=2),
  ),
  "geglu_biases_ntk": (
    "LlamaForCausalLM",
    dict(
      norm="rms",
      activation="geglu",
      gelu_approximate=False,
      use_bias=True,
      position="rope_ntk",
      options=dict(rope_scale=3.0),
      head_dim=8,
      num_kv_heads=1,
      tie_embeddings=False,
    ),
  ),
  "learned": ("GPT2LMHeadModel", dict(position="learned", use_bias=True)),
}
# float32: the scaled output is rounded once more than txf's logits are.
DECODER_ATOL = 1e-5


@pytest.mark.parametrize("name", DECODERS)
def test_a_txf_decoder_is_written_as_the_architecture_that_represents_it(name, tmp_path):
  """Read back, it gives txf's logits (and txf's default decoder the same
  final hidden states, bit for bit); scaled logits are written untied, the
  output holding the scale."""
  architecture, fields = DECODERS[name]
  cfg = decoder_config(**fields)
  params = o1_params(cfg)
  save_pretrained(cfg, params, tmp_path)
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["architectures"] == [architecture]
  assert written["tie_word_embeddings"] == (cfg.tie_embeddings and not cfg.scale_logits)
  if "rotary_emb_base" in written:  # transformers 4 reads this key alone (base 500 here once)
    assert written["rotary_emb_base"] == written["rope_parameters"]["rope_theta"]
  again = load_pretrained(tmp_path)
  assert again.architecture == architecture and again.config.scale_logits is False
  tokens = np.array([[3, 9, 27, 4, 11, 5, 7, 8, 1, 2, 3, 39, 0, 6, 5, 4]])
  run = lambda model, params: np.asarray(jax.jit(model.apply)({"params": params}, tokens))
  logits = run(build(cfg), params)
  np.testing.assert_allclose(run(again.model(), again.params), logits, rtol=0, atol=DECODER_ATOL)
  assert np.abs(logits).mean() > 0.1  # O(1) logits: the tolerance means something
  if name != "default":  # one model shows it (two more compiles each)
    return
  body = load_pretrained(tmp_path, head="none")
  hidden = run(build(cfg.replace(head="none")), params)
  np.testing.assert_array_equal(run(body.model(), body.params), hidden)


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_an_export_writes_the_config_transformers_writes(name, tmp_path):
  """Every key transformers wrote for the fixture, as it wrote it (but its
  bookkeeping); beside them only transformers 4's rotary keys, which say the
  same (the tensors: test_export_then_import_gives_identical_params)."""
  pretrained(name).save(tmp_path)
  theirs = json.loads((HF_FIXTURES / name / "config.json").read_text())
  ours = json.loads((tmp_path / "config.json").read_text())
  bookkeeping = {"dtype", "transformers_version", "use_cache", "is_decoder", "classifier_dropout"}
  assert {key: ours.get(key) for key in theirs.keys() - bookkeeping} == {
    key: theirs[key] for key in theirs.keys() - bookkeeping
  }
  rope = theirs["rope_parameters"]
  legacy = {key: ours[key] for key in ours.keys() - theirs.keys()}
  if name == "llama":  # factor 2: linear
    assert legacy == {"rope_theta": 1000.0, "rope_scaling": {"type": "linear", **rope}}
  else:
    assert legacy == {"rotary_emb_base": 10000.0, "rotary_pct": 1.0}


@pytest.mark.parametrize(
  "change,message",
  [
    (
      dict(norm="rms"),
      "model.activation: 'gelu' cannot be written as LlamaForCausalLM (needs 'swiglu' or 'geglu')",
    ),
    (
      dict(activation="swiglu"),
      "model.activation: 'swiglu' cannot be written as GPTNeoXForCausalLM (needs 'gelu' or 'relu')",
    ),
    (
      dict(num_kv_heads=1),
      "model.num_kv_heads: 1 cannot be written as GPTNeoXForCausalLM (needs 2)",
    ),
    (dict(head_dim=8), "model.head_dim: 8 cannot be written as GPTNeoXForCausalLM (needs 12)"),
    (
      dict(position="alibi"),
      "model.position: 'alibi' cannot be written as GPTNeoXForCausalLM "
      "(needs 'rope' or 'rope_ntk')",
    ),
    (
      dict(norm_placement="post"),
      "model.norm_placement: 'post' cannot be written as GPTNeoXForCausalLM (needs 'pre')",
    ),
    (dict(window=4), "model.window: 4 cannot be written as GPTNeoXForCausalLM (needs None)"),
    (
      dict(scale_attention=False),
      "model.scale_attention: False cannot be written as GPTNeoXForCausalLM (needs True)",
    ),
    (
      dict(attention="linear"),
      "model.attention: 'linear' cannot be written as GPTNeoXForCausalLM (needs 'softmax')",
    ),
    (
      dict(position="learned"),
      "model.use_bias: False cannot be written as GPT2LMHeadModel (needs True)",
    ),
    (
      dict(position="learned", use_bias=True, num_kv_heads=1),
      "model.num_kv_heads: 1 cannot be written as GPT2LMHeadModel (needs 2)",
    ),
  ],
)
def test_export_refuses_what_no_architecture_represents(change, message, tmp_path):
  """One line naming the field, before anything is written. The architecture
  named is the one the model's fields choose (learned positions: GPT-2;
  RMSNorm: Llama; else GPT-NeoX)."""
  cfg = decoder_config(**change)
  with pytest.raises(CheckpointError) as raised:
    save_pretrained(cfg, random_params(cfg), tmp_path / "hf")
  assert str(raised.value) == message
  assert not list(tmp_path.iterdir())


REFUSED_IN_ONE_LINE = {
  # family and fields -> the line's first refusal, its last ones
  "bert": (
    dict(family="encoder", head="mlm", num_token_types=0, head_dim=8),
    "model.position: 'rope' cannot be written as BertForMaskedLM (needs 'learned')",
    "; model.num_token_types: 0 (needs 1 or more: its embedding always adds token type 0)"
    "; model.head_dim: 8 (needs head_dim x 2 heads = model.d_model=24)",
  ),
  "t5": (
    dict(family="encoder_decoder", activation="geglu", gelu_approximate=False, position="learned"),
    "model.position: 'learned' cannot be written as T5ForConditionalGeneration (needs 't5_bias')",
    "; model.gelu_approximate: False (needs True with model.activation='geglu': "
    "its gated GELU is the tanh form)",
  ),
}


@pytest.mark.parametrize("name", list(REFUSED_IN_ONE_LINE))
def test_the_bert_and_t5_refusals_name_every_field_in_one_line(tmp_path, name):
  """A field's range (num_token_types >= 1), two fields together (head_dim
  with num_heads and d_model; T5's gated GELU with gelu_approximate) were
  refused after the others, each alone: fixing the named fields met the
  next refusal."""
  fields, first, last = REFUSED_IN_ONE_LINE[name]
  cfg = ModelConfig(vocab_size=40, d_model=24, num_heads=2, num_layers=1, max_len=16, **fields)
  with pytest.raises(CheckpointError) as raised:
    save_pretrained(cfg, random_params(cfg), tmp_path / name)
  assert str(raised.value).startswith(first)
  assert str(raised.value).endswith(last)
  assert not list(tmp_path.iterdir())


def test_export_refuses_a_registered_head(tmp_path):
  from txf import register
  from txf.layers.model_config import HEADS
  from txf.models import LMHead

  with HEADS.scoped():
    register.head(
      "other_lm", tasks=("lm",), families=("decoder",), matmul_params=HEADS["lm"].matmul_params
    )(LMHead)
    cfg = ModelConfig(family="decoder", vocab_size=50, d_model=16, num_heads=2, num_layers=1)
    cfg = cfg.replace(head="other_lm", position="learned", scale_logits=False)
    with pytest.raises(CheckpointError, match=r"^model\.head: 'other_lm' has no Hugging Face"):
      save_pretrained(cfg, random_params(cfg), tmp_path)
  assert not (tmp_path / "model.safetensors").exists()


def test_export_names_every_field_the_architecture_cannot_hold(tmp_path):
  """In one line: a txf model of another shape learns every change it needs."""
  cfg = decoder_config(position="alibi", activation="swiglu", num_kv_heads=1)
  with pytest.raises(CheckpointError) as raised:
    save_pretrained(cfg, random_params(cfg), tmp_path)
  assert str(raised.value) == (
    "model.position: 'alibi' cannot be written as GPTNeoXForCausalLM (needs 'rope' or "
    "'rope_ntk'); model.activation: 'swiglu' (needs 'gelu' or 'relu'); "
    "model.num_kv_heads: 1 (needs 2)"
  )
  cfg = ModelConfig(family="lstm", vocab_size=50, d_model=16, num_layers=1)
  with pytest.raises(CheckpointError, match="^model.family: 'lstm' has no Hugging Face"):
    save_pretrained(cfg, {}, tmp_path)
  assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------
# Errors name what does not fit.


def copy_fixture(name, tmp_path):
  directory = tmp_path / name
  shutil.copytree(HF_FIXTURES / name, directory)
  return directory


def edit_json(path, **changes):
  value = json.loads(path.read_text())
  value.update(changes)
  path.write_text(json.dumps(value))


def edit_tensors(directory, edit):
  tensors = load_file(directory / "model.safetensors")
  edit(tensors)
  save_file(tensors, directory / "model.safetensors")


def test_unsupported_architecture_is_named(tmp_path):
  directory = copy_fixture("gpt2", tmp_path)
  edit_json(directory / "config.json", architectures=["MistralForCausalLM"])
  with pytest.raises(
    CheckpointError,
    match=rf"^{re.escape(str(directory / 'config.json'))}: architecture \['MistralForCausalLM'\] "
    r"is not supported \(supported: BertForMaskedLM",
  ):
    load_pretrained(directory)
  # A txf run's work directory: 'architecture None is not supported'.
  (directory / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}))
  with pytest.raises(
    CheckpointError,
    match=rf"^{re.escape(str(directory / 'config.json'))}: a txf run's \(its work directory\), "
    r"not a Hugging Face checkpoint's: txf\.train\.run_setup\.load_run restores it",
  ):
    load_pretrained(directory)


def test_token_ids_of_a_list_or_a_negative_id_read_as_transformers_means_them(tmp_path, caplog):
  """Llama 3 ends at any of several eos ids (txf stops at the first, and
  says so); older configs write -1 for no pad token. Both were refused."""
  directory = copy_fixture("gpt2", tmp_path)
  edit_json(directory / "config.json", eos_token_id=[7, 9], pad_token_id=-1)
  loaded = load_pretrained(directory)
  assert loaded.token_ids["eos_token_id"] == 7 and loaded.token_ids["pad_token_id"] is None
  assert loaded.config.pad_id == 7  # GPT-2 pads with its eos where it names no pad
  assert "eos_token_id lists [7, 9]: txf stops at the first" in caplog.text


def test_a_corrupt_pytorch_model_bin_is_one_error_naming_it(tmp_path):
  pytest.importorskip("torch")
  directory = copy_fixture("gpt2", tmp_path)
  (directory / "model.safetensors").unlink()
  (directory / "pytorch_model.bin").write_bytes(b"not a pickle of tensors" * 3)
  with pytest.raises(
    CheckpointError,
    match=rf"^{re.escape(str(directory / 'pytorch_model.bin'))}: not a readable pytorch_model",
  ):
    load_pretrained(directory)


def test_unsupported_config_value_is_named(tmp_path):
  directory = copy_fixture("gpt2", tmp_path)
  edit_json(directory / "config.json", scale_attn_by_inverse_layer_idx=True)
  with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx=True"):
    load_pretrained(directory)


@pytest.mark.parametrize(
  "name,changes,match",
  [
    # Pythia's block: x + attn(ln1 x) + mlp(ln2 x).
    ("gpt_neox", dict(use_parallel_residual=True), r"use_parallel_residual=True is not supported"),
    (
      "gpt_neox",
      dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
      # transformers' default: a quarter of each head
      r"partial_rotary_factor=0.25 is not supported by txf \(supported: 1\.0",
    ),
    (
      "llama",
      dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0}),
      r"rope_type='llama3' is not supported by txf \(supported: 'default', 'linear'\)",
    ),
    ("llama", dict(mlp_bias=True), r"attention_bias=False with mlp_bias=True is not supported"),
    ("llama", dict(hidden_act="relu"), r"hidden_act='relu' is not supported by txf"),
  ],
)
def test_a_decoder_txf_cannot_run_is_named(name, changes, match, tmp_path):
  directory = copy_fixture(name, tmp_path)
  edit_json(directory / "config.json", **changes)
  with pytest.raises(CheckpointError, match=rf"^{directory / 'config.json'}: {match}"):
    load_pretrained(directory)


def test_gpt_neox_feed_forward_biases_must_be_zero_without_attention_biases(tmp_path):
  """txf's model.use_bias is one switch: with attention_bias false, the
  feed-forward biases GPT-NeoX always has are read only as zeros."""
  directory = copy_fixture("gpt_neox", tmp_path)
  bias = "gpt_neox.layers.1.mlp.dense_4h_to_h.bias"
  edit_tensors(directory, lambda t: t.update({bias: t[bias] + 0.5}))
  with pytest.raises(CheckpointError) as raised:
    load_pretrained(directory)
  assert str(raised.value) == (
    f"{directory}: tensor {bias} is not all zeros, and txf has no parameter for it "
    "(txf's model.use_bias puts biases on attention and the feed-forward alike)"
  )


def test_missing_tensor_is_named(tmp_path):
  directory = copy_fixture("bert", tmp_path)
  edit_tensors(directory, lambda t: t.pop("bert.encoder.layer.1.output.dense.bias"))
  with pytest.raises(
    CheckpointError, match=r"missing tensors bert\.encoder\.layer\.1\.output\.dense\.bias"
  ):
    load_pretrained(directory)


def test_unexpected_tensor_is_named(tmp_path):
  directory = copy_fixture("t5", tmp_path)
  edit_tensors(
    directory,
    lambda t: t.update(
      {"encoder.block.0.layer.1.DenseReluDense.wi.bias": np.zeros(48, np.float32)}
    ),
  )
  with pytest.raises(
    CheckpointError,
    match=r"unexpected tensors encoder\.block\.0\.layer\.1\."
    r"DenseReluDense\.wi\.bias",
  ):
    load_pretrained(directory)


def test_shape_mismatch_is_named(tmp_path):
  directory = copy_fixture("gpt2", tmp_path)
  edit_tensors(
    directory,
    lambda t: t.update(
      {"transformer.h.0.mlp.c_fc.weight": t["transformer.h.0.mlp.c_fc.weight"].T.copy()}
    ),
  )
  with pytest.raises(
    CheckpointError,
    match=r"tensor transformer\.h\.0\.mlp\.c_fc\.weight has "
    r"shape \(128, 32\), expected \(32, 128\)",
  ):
    load_pretrained(directory)


def test_differing_tied_copy_is_not_silently_dropped(tmp_path):
  """A decoder bias that differs from the output bias it should repeat has no
  txf parameter: the load stops naming it."""
  directory = copy_fixture("bert", tmp_path)
  edit_tensors(
    directory, lambda t: t.update({"cls.predictions.decoder.bias": t["cls.predictions.bias"] + 1.0})
  )
  with pytest.raises(CheckpointError, match=r"unexpected tensors cls\.predictions\.decoder\.bias"):
    load_pretrained(directory)


def test_an_output_config_json_ties_is_tied_whatever_the_file_holds(tmp_path, caplog):
  """config.json's tie_word_embeddings: true with an output matrix of its own
  in the file: transformers ties them on load (the file's lm_head unread);
  txf loaded it untied, its logits hidden @ lm_head.T, with no word."""
  directory = copy_fixture("llama", tmp_path)  # untied: an lm_head of its own
  edit_json(directory / "config.json", tie_word_embeddings=True)
  loaded = load_pretrained(directory)
  assert loaded.config.tie_embeddings
  assert "its lm_head.weight, which differs from the embedding, is not used" in caplog.text
  body = load_pretrained(directory, head="none")
  tokens_1xT = np.arange(3, 23, dtype=np.int32)[None]
  logits = np.asarray(loaded.model().apply({"params": loaded.params}, tokens_1xT), np.float64)
  hidden = np.asarray(body.model().apply({"params": body.params}, tokens_1xT), np.float64)
  embedding = load_file(directory / "model.safetensors")["model.embed_tokens.weight"]
  np.testing.assert_allclose(logits, hidden @ embedding.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_unused_weights_are_named(caplog):
  """BertModel's pooler has no txf layer: dropped, with a warning naming it."""
  loaded = load_pretrained(HF_FIXTURES / "minilm")
  assert loaded.unused == ("bert.pooler.dense.bias", "bert.pooler.dense.weight")
  assert (
    "txf does not use 2 weights of BertModel: bert.pooler.dense.bias, "
    "bert.pooler.dense.weight" in caplog.text
  )


def test_an_encoder_decoder_has_no_hidden_states_head():
  """T5 with head='none' (txf-embed) blamed config.json: 'config.json:
  model.head: 'none' does not fit model.family='encoder_decoder''."""
  with pytest.raises(CheckpointError) as error:
    load_pretrained(HF_FIXTURES / "t5", head="none")
  assert str(error.value) == ("head: T5ForConditionalGeneration has no 'none' head (choose 'lm')")


def test_a_head_dropped_on_request_is_not_warned_about(caplog):
  """head='none' (txf-embed's hidden states) drops the head's weights as
  asked: a warning listing them came before txf-embed's own error line."""
  loaded = load_pretrained(HF_FIXTURES / "llama", head="none")
  assert loaded.unused == ("lm_head.weight",)
  assert "txf does not use" not in caplog.text


@pytest.mark.parametrize(
  "problem,match",
  [
    ("no_weights", "no weights"),
    ("no_config", r"config\.json: no such file"),
    # A directory in config.json's place: IsADirectoryError's traceback before.
    ("config_directory", r"config\.json: cannot be read \(Is a directory\)$"),
    ("corrupt_weights", "not a readable safetensors file"),
    ("wrong_head", r"BertModel has no 'mlm' head"),
  ],
)
def test_unreadable_directory_is_named(problem, match, tmp_path):
  directory = copy_fixture("minilm", tmp_path)
  head = None
  if problem == "no_weights":
    (directory / "model.safetensors").unlink()
  elif problem == "no_config":
    (directory / "config.json").unlink()
  elif problem == "config_directory":
    (directory / "config.json").unlink()
    (directory / "config.json").mkdir()
  elif problem == "corrupt_weights":
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
  else:
    head = "mlm"
  with pytest.raises(CheckpointError, match=match):
    load_pretrained(directory, head=head)


# ---------------------------------------------------------------------------
# Model options (validation; the numerics are in test_layer_references.py).


@pytest.mark.parametrize(
  "fields,match",
  [
    (dict(family="decoder", num_token_types=2), "model.num_token_types: only family='encoder'"),
    (dict(family="encoder", head="mlm", num_token_types=-1), "model.num_token_types"),
    (dict(activation="relu", gelu_approximate=False), "model.gelu_approximate: False changes"),
    (dict(family="encoder_decoder", head="none"), "model.head: 'none' does not fit"),
    (dict(attention="quadratic"), "model.attention: 'quadratic'"),
    *(
      (dict(attention="linear", position=p), "model.attention: 'linear' takes no additive")
      for p in ("alibi", "t5_bias")
    ),
    (dict(attention="linear", attention_impl="cudnn"), "model.attention_impl: 'cudnn' computes"),
    (dict(family="lstm", attention="linear"), "model.attention: does not apply to model.family"),
  ],
)
def test_conflicting_model_options_are_refused(fields, match):
  with pytest.raises(ValueError, match=match):
    ModelConfig(**fields)


def test_token_types_are_checked():
  loaded = pretrained("bert")
  tokens = np.array([[2, 5, 3]])
  apply = functools.partial(loaded.model().apply, {"params": loaded.params}, tokens)
  with pytest.raises(ValueError, match=r"token_types: id 2 outside the token types \[0, 2\)"):
    apply(token_types_BxS=np.array([[0, 2, 0]]))
  with pytest.raises(ValueError, match="token_types: shape"):
    apply(token_types_BxS=np.array([[0, 1]]))
  embedder = Embedder(ModelConfig(vocab_size=8, d_model=4, num_heads=2, position="none", max_len=4))
  with pytest.raises(ValueError, match="model.num_token_types=0"):
    embedder.init(jax.random.key(0), tokens, np.arange(3)[None], tokens)


# ---------------------------------------------------------------------------
# Broken or hostile files: one CheckpointError naming the file and the key.


@pytest.mark.parametrize(
  "name,key,value,match",
  [
    ("gpt2", "layer_norm_epsilon", "small", r"layer_norm_epsilon: must be a finite number >= 0"),
    ("gpt2", "vocab_size", 1e12, r"vocab_size: must be an integer in \[0, 2147483647\]"),
    ("gpt2", "vocab_size", 10**12, r"vocab_size: must be an integer in \[0, 2147483647\]"),
    ("gpt2", "n_layer", "twelve", r"n_layer: must be an integer"),
    ("gpt2", "activation_function", 3, r"activation_function: must be a str, got 3"),
    ("gpt2", "eos_token_id", "end", r"eos_token_id: must be an integer"),
    ("gpt2", "layer_norm_epsilon", 0.0, r"model\.norm_eps: must be a finite number > 0"),
    ("bert", "hidden_dropout_prob", float("nan"), r"hidden_dropout_prob: must be a finite"),
    ("t5", "d_kv", -4, r"d_kv: must be an integer"),
  ],
)
def test_a_config_value_of_the_wrong_kind_names_the_file_and_key(tmp_path, name, key, value, match):
  """They were TypeError / OverflowError tracebacks or a message naming neither."""
  directory = copy_fixture(name, tmp_path)
  edit_json(directory / "config.json", **{key: value})
  with pytest.raises(CheckpointError, match=rf"^{directory / 'config.json'}: {match}"):
    load_pretrained(directory)


def move_weights_to_shard(directory, shard):
  """model.safetensors -> `shard` (relative to directory), named by an index."""
  names = list(load_file(directory / "model.safetensors"))
  target = pathlib.Path(directory / shard)
  target.parent.mkdir(parents=True, exist_ok=True)
  (directory / "model.safetensors").rename(target)
  (directory / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {name: shard for name in names}})
  )


def test_a_sharded_index_inside_the_directory_loads(tmp_path):
  directory = copy_fixture("gpt2", tmp_path)
  move_weights_to_shard(directory, "shards/./model-00001-of-00001.safetensors")
  flat, expected = flatten(load_pretrained(directory).params), flatten(pretrained("gpt2").params)
  assert flat.keys() == expected.keys()
  for path, value in expected.items():
    np.testing.assert_array_equal(flat[path], value, err_msg=path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "shards/../../outside.safetensors"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused_before_reading(tmp_path, shard):
  directory = copy_fixture("gpt2", tmp_path)
  move_weights_to_shard(directory, shard)  # a valid file, outside: it would load
  with pytest.raises(
    CheckpointError,
    match=r"model\.safetensors\.index\.json: weight_map: "
    rf"{re.escape(repr(shard))} is outside the checkpoint directory",
  ):
    load_pretrained(directory)


def test_an_index_naming_an_absolute_path_is_refused(tmp_path):
  directory = copy_fixture("gpt2", tmp_path)
  (directory / "model.safetensors").unlink()
  (directory / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {"a": "/etc/passwd"}})
  )
  with pytest.raises(CheckpointError, match=r"'/etc/passwd' is outside the checkpoint"):
    load_pretrained(directory)


MODULES_POOLING = {
  "idx": 1,
  "name": "1",
  "path": "1_Pooling",
  "type": "sentence_transformers.models.Pooling",
}


@pytest.mark.parametrize(
  "file,text,match",
  [
    ("modules.json", "not json", r"modules\.json: not valid JSON"),
    ("modules.json", '{"a": 1}', r"modules\.json: expected a JSON list, got dict"),
    ("modules.json", "[3]", r"modules\.json: module 0: expected an object with a string 'type'"),
    (
      "modules.json",
      json.dumps([{k: v for k, v in MODULES_POOLING.items() if k != "path"}]),
      r"modules\.json: Pooling module's path: None is not a path",
    ),
    (
      "modules.json",
      json.dumps([{**MODULES_POOLING, "path": "../../../etc"}]),
      r"modules\.json: Pooling module's path: '\.\./\.\./\.\./etc' is outside the checkpoint",
    ),
    ("1_Pooling/config.json", "not json", r"1_Pooling/config\.json: not valid JSON"),
    ("1_Pooling/config.json", "[]", r"1_Pooling/config\.json: expected a JSON object, got list"),
  ],
)
def test_a_broken_sentence_transformers_declaration_names_the_file(tmp_path, file, text, match):
  directory = copy_fixture("minilm", tmp_path)
  (directory / file).write_text(text)
  with pytest.raises(CheckpointError, match=rf"^{re.escape(str(directory))}/{match}"):
    sentence_transformers_pooling(directory)


# An encoder's fields of a BERT masked LM (BertForMaskedLM holds any sizes of it).
BERT_MLM = dict(
  head="mlm",
  position="learned",
  use_bias=True,
  scale_logits=False,
  norm_placement="post",
  embed_norm=True,
  num_token_types=2,
  gelu_approximate=False,
)


def test_an_untied_bert_head_reads_and_writes_its_bias_as_decoder_bias(tmp_path):
  """transformers 5 reads an untied BERT MLM head's bias from
  `cls.predictions.decoder.bias` (a tied head's from `cls.predictions.bias`):
  an export wrote only the latter, so transformers used a zero bias; a file
  whose decoder.bias differs (fine-tuned in transformers 5) was refused."""
  sizes = dict(vocab_size=40, d_model=16, num_heads=2, num_layers=1, max_len=16)
  cfg = ModelConfig(family="encoder", **sizes, **BERT_MLM, tie_embeddings=False)
  params = o1_params(cfg)
  save_pretrained(cfg, params, tmp_path)
  written = load_file(tmp_path / "model.safetensors")
  bias = np.asarray(flatten(params)["head/bias"])
  for name in ("cls.predictions.bias", "cls.predictions.decoder.bias"):
    np.testing.assert_array_equal(written[name], bias, err_msg=name)
  tuned = bias + 1.0
  save_file({**written, "cls.predictions.decoder.bias": tuned}, tmp_path / "model.safetensors")
  np.testing.assert_array_equal(flatten(load_pretrained(tmp_path).params)["head/bias"], tuned)
