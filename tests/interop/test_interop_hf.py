"""Cross-checks against `transformers` itself (skipped unless it and torch are
installed: pip install -e '.[hf-check]').

  * tests/fixtures/make_hf_fixtures.py, run again in memory, gives the
    committed weights and reference outputs (so the fixtures are what the
    script says they are, and still what transformers computes);
  * a checkpoint txf writes (converted ones, and a model made in txf) loads
    in transformers and gives the same outputs there as in txf.
"""

import importlib.util
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from test_interop import BERT_MLM  # noqa: E402

from conftest import FIXTURES  # noqa: E402
from txf.interop import load_pretrained, save_pretrained  # noqa: E402
from txf.interop.checkpoint import param_shapes  # noqa: E402
from txf.interop.rules import flatten, unflatten  # noqa: E402
from txf.models import ModelConfig, build  # noqa: E402
from txf.trained.export import export_run  # noqa: E402

NAMES = ["bert", "minilm", "roberta", "gpt2", "llama", "gpt_neox", "t5", "t5_v1_1"]
ATOL = 1e-4


def make_hf_fixtures():
  spec = importlib.util.spec_from_file_location(
    "make_hf_fixtures", FIXTURES / "make_hf_fixtures.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def rebuilt():
  return make_hf_fixtures().fixtures()


@pytest.mark.parametrize("name", NAMES)
def test_fixture_script_reproduces_the_committed_fixtures(rebuilt, name):
  model, _, reference = rebuilt[name]
  committed = np.load(FIXTURES / "hf" / name / "reference.npz")
  assert set(committed) == set(reference)
  for key, value in reference.items():
    np.testing.assert_allclose(committed[key], value, atol=1e-5, err_msg=key)
  weights = load_file(FIXTURES / "hf" / name / "model.safetensors")
  state = {key: tensor.numpy() for key, tensor in model.state_dict().items() if key in weights}
  assert state.keys() == weights.keys()
  for key, value in state.items():
    np.testing.assert_array_equal(weights[key], value, err_msg=key)


def hf_outputs(directory, architecture, reference):
  """transformers' outputs on the unpadded reference batch, for the checkpoint in directory."""
  model = (
    getattr(transformers, architecture)
    .from_pretrained(directory, attn_implementation="eager")
    .eval()
  )
  inputs = dict(input_ids=torch.tensor(reference["full_tokens"]))
  if "full_types" in reference:
    inputs["token_type_ids"] = torch.tensor(reference["full_types"])
  if "full_decoder_tokens" in reference:
    inputs["decoder_input_ids"] = torch.tensor(reference["full_decoder_tokens"])
  with torch.no_grad():
    out = model(**inputs, output_hidden_states=True)
  return (out.logits if hasattr(out, "logits") else out.hidden_states[-1]).numpy()


@pytest.mark.parametrize("name", NAMES)
def test_converted_checkpoints_written_by_txf_load_in_transformers(name, tmp_path):
  """They give the outputs transformers computed for the original files."""
  pretrained = load_pretrained(FIXTURES / "hf" / name)
  pretrained.save(tmp_path)
  reference = dict(np.load(FIXTURES / "hf" / name / "reference.npz"))
  expected = reference.get("full_logits", reference["full_hidden"])
  np.testing.assert_allclose(
    hf_outputs(tmp_path, pretrained.architecture, reference), expected, atol=ATOL
  )


@pytest.mark.parametrize(
  "family,fields",
  [
    ("decoder", dict(position="learned", use_bias=True, scale_logits=False, norm_eps=1e-5)),
    ("encoder", BERT_MLM),
    # Untied: transformers 5 reads the head's bias from decoder.bias then.
    ("encoder", {**BERT_MLM, "tie_embeddings": False}),
    # Tied but unscaled (transformers 5's fresh T5 v1.1): written untied.
    (
      "encoder_decoder",
      dict(
        position="t5_bias",
        norm="rms",
        activation="geglu",
        scale_attention=False,
        scale_logits=False,
        options=dict(t5_num_buckets=8, t5_max_distance=16),
      ),
    ),
  ],
)
def test_a_model_made_in_txf_loads_in_transformers(family, fields, tmp_path):
  cfg = ModelConfig(
    family=family, vocab_size=40, d_model=16, num_heads=2, num_layers=2, max_len=16, **fields
  )
  rng = np.random.default_rng(0)
  params = unflatten(
    {
      path: (rng.normal(size=shape) * (0.5 if len(shape) == 1 else shape[0] ** -0.5)).astype(
        np.float32
      )
      for path, shape in param_shapes(cfg).items()
    }
  )
  save_pretrained(cfg, params, tmp_path)
  tokens = np.array([[3, 9, 27, 4, 11, 5]])
  model = build(cfg)
  architecture = load_pretrained(tmp_path).architecture
  hf = getattr(transformers, architecture).from_pretrained(tmp_path).eval()
  with torch.no_grad():
    if family == "encoder_decoder":
      decoder = np.array([[0, 7, 2]])
      ours = model.apply({"params": params}, tokens, decoder)
      theirs = hf(input_ids=torch.tensor(tokens), decoder_input_ids=torch.tensor(decoder)).logits
    else:
      ours = model.apply({"params": params}, tokens)
      theirs = hf(input_ids=torch.tensor(tokens)).logits
  np.testing.assert_allclose(np.asarray(jax.device_get(ours)), theirs.numpy(), atol=ATOL)


# txf decoders of each shape the export maps (test_interop.py's DECODERS).
DECODERS = {
  "default": ("GPTNeoXForCausalLM", dict()),
  "relu_biases_linear_rope": (
    "GPTNeoXForCausalLM",
    dict(activation="relu", use_bias=True, options=dict(rope_base=500.0, rope_scale=2.0)),
  ),
  "swiglu_gqa": ("LlamaForCausalLM", dict(norm="rms", activation="swiglu", num_kv_heads=2)),
  "geglu_biases_ntk_mqa": (
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


@pytest.mark.parametrize("name", DECODERS)
def test_a_txf_decoder_loads_with_auto_model_for_causal_lm(name, tmp_path):
  """The architecture the export chose, loaded as transformers loads any
  causal LM, gives txf's logits (d_model 24: the scale d_model^-0.5 the
  output holds is not a power of two)."""
  architecture, fields = DECODERS[name]
  cfg = ModelConfig(
    family="decoder", vocab_size=40, d_model=24, num_heads=4, num_layers=2, max_len=24, **fields
  )
  rng = np.random.default_rng(0)
  params = {}
  for path, shape in param_shapes(cfg).items():
    value = rng.normal(size=shape) * (0.5 if len(shape) == 1 else shape[0] ** -0.5)
    params[path] = (value + path.endswith("/scale")).astype(np.float32)
  save_pretrained(cfg, unflatten(params), tmp_path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
  assert type(hf).__name__ == architecture
  tokens = np.array([[3, 9, 27, 4, 11, 5, 7, 8, 1, 2, 3, 39, 0, 6, 5, 4, 21, 22, 23]])
  ours = np.asarray(build(cfg).apply({"params": unflatten(params)}, tokens))
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=ATOL)
  assert np.abs(ours).mean() > 0.1  # O(1) logits: the tolerance means something


@pytest.mark.slow  # restores the run
def test_the_default_decoders_run_loads_with_auto_model_for_causal_lm(tmp_path):
  """txf-export of a run of txf's default decoder (configs/rope.py's model):
  transformers' AutoModelForCausalLM gives the run's logits."""
  from txf.train.run_setup import load_trained

  workdir = FIXTURES / "run_822e561"
  export_run(workdir, tmp_path / "hf")
  trained = load_trained(workdir)
  tokens = trained.tokenizer.encode("def f(x):\n  return x  # é")[None]
  ours = trained.pretrained.model().apply({"params": trained.pretrained.params}, tokens)
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
  assert type(hf).__name__ == "GPTNeoXForCausalLM"
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long)).logits
  np.testing.assert_allclose(theirs.numpy(), np.asarray(ours), atol=ATOL)


@pytest.mark.parametrize("model_type", [None, "bert", "gpt_neox"])
def test_an_exported_byte_tokenizer_reads_special_token_text_as_its_bytes(tmp_path, model_type):
  """transformers adds the tokens tokenizer_config.json names as special ones
  and read '<s>' in a text as id 1; txf reads its bytes (split_special_tokens).
  Beside an export's config.json, AutoTokenizer took its model_type's class,
  rebuilt from the vocabulary alone (BERT's: 'Missing [UNK] token')."""
  from txf.data import ByteTokenizer
  from txf.data.tokenizers import hf_tokenizer_files

  tokenizer = ByteTokenizer()
  for name, text in hf_tokenizer_files(tokenizer).items():
    (tmp_path / name).write_text(text)
  if model_type is not None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
  hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
  text = "a <s> b </s> <pad> <mask> c"
  assert hf(text)["input_ids"] == tokenizer.encode(text).tolist()
  assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (
    tokenizer.pad_id,
    tokenizer.bos_id,
    tokenizer.eos_id,
  )


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_pytorch_model_bin_loads_as_the_safetensors(rebuilt, name, tmp_path):
  """torch's format holds every tied copy (lm_head.weight = the embedding,
  T5's embed_tokens): each is checked equal and read once."""
  model, _, _ = rebuilt[name]
  (tmp_path / "config.json").write_text((FIXTURES / "hf" / name / "config.json").read_text())
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  from_bin, from_safetensors = load_pretrained(tmp_path), load_pretrained(FIXTURES / "hf" / name)
  assert from_bin.config == from_safetensors.config
  flat_bin, flat_safe = (flatten(p.params) for p in (from_bin, from_safetensors))
  assert flat_bin.keys() == flat_safe.keys()
  for path, value in flat_safe.items():
    np.testing.assert_array_equal(flat_bin[path], value, err_msg=path)
