"""Text generation from a pretrained GPT-2-style decoder or T5-style encoder-decoder.

  txf-generate --model=DIR --prompt="..." [--max_new_tokens=32] [--temperature=0] [--top_k=0]
      [--top_p=1.0] [--seed=0]
  python -m experiments.generate --model=DIR --prompt="..." [flags]   # in a checkout

DIR is a Hugging Face model directory (config.json, model.safetensors,
tokenizer.json), or a Hugging Face Hub name
(gpt2, openai-community/gpt2: read from the Hub's cache, or downloaded;
txf.interop.hub), converted by txf.interop, or a txf run directory (its latest
checkpoint and its tokenizer; txf.trained.export). A decoder (or a txf LSTM)
continues the prompt; an encoder-decoder reads the prompt and writes its
answer. Generation runs with
the KV cache (txf.decode), greedy at temperature 0 (the default), and stops at
the checkpoint's end-of-sequence token. Prints the prompt and the generated
text. An unusable directory or argument exits 2 with one line naming it;
a URL (gs://) is looked at once, and one that cannot be reached is that
line within half a minute. The sampling flags are checked before the model
loads (max_new_tokens >= 1, a seed in [0, 2**31 - 1], and txf.decode's
own check: a finite temperature >= 0, top_k >= 0, top_p in (0, 1]).
"""

from __future__ import annotations

from absl import flags, logging

from txf import checks
from txf.commands.cli import fail, run_command

_MODEL = flags.DEFINE_string(
  "model",
  None,
  "Hugging Face model directory or Hub name (gpt2), or a txf run directory.",
  required=True,
)
_PROMPT = flags.DEFINE_string(
  "prompt", None, "Text to continue (decoder) or answer (T5).", required=True
)
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32, "Tokens to generate at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0: greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens; 0: all.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1: all.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


def check_flags() -> None:
  """Exits 2 with one line naming the first sampling flag out of its range
  (NaN, an infinity, a seed jax cannot take), or an empty --prompt, before
  the model loads."""
  from txf.decode.sampling import check_sampling  # loads jax: after flag parsing

  if not _PROMPT.value:  # was 'model error: texts: ...', after the model loaded
    fail("flag", "--prompt: empty; give the text to continue or answer")
  try:
    checks.int_at_least(_MAX_NEW_TOKENS.value, "max_new_tokens", 1)
    check_sampling(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value)
    checks.seed(_SEED.value, "seed")
  except ValueError as error:
    fail("flag", error)


def main(argv) -> None:
  check_flags()
  # After flag parsing: fast --help.
  import jax
  import numpy as np

  from txf.commands.named_model import load_named_model
  from txf.interop.text import generate_text
  from txf.rundir.workdir import WorkdirError

  logging.set_verbosity(logging.WARNING)
  try:
    named = load_named_model(_MODEL.value, generates=True)
    prompt_1xP = named.encode([_PROMPT.value])
    rng = jax.random.key(_SEED.value) if _TEMPERATURE.value > 0 else None
    # One unpadded prompt: its length is given, so a token equal to pad_id
    # (GPT-2 pads with <|endoftext|>) is read as a token.
    generated_1xN = generate_text(
      named.pretrained,
      prompt_1xP,
      max_new_tokens=_MAX_NEW_TOKENS.value,
      prompt_lengths_B=np.array([prompt_1xP.shape[1]]),
      rng=rng,
      temperature=_TEMPERATURE.value,
      top_k=_TOP_K.value,
      top_p=_TOP_P.value,
    )
  except (ValueError, WorkdirError) as error:  # CheckpointError too
    fail("model", error)
  tokens = np.asarray(generated_1xN[0])  # the new tokens alone (generate_text)
  # The row holds pad_id after its EOS: a real token where the checkpoint
  # names no pad (Llama's '!', id 0), which the text must not show.
  eos_id = named.pretrained.token_ids.get("eos_token_id")
  ended = np.flatnonzero(tokens == eos_id) if isinstance(eos_id, int) else np.zeros(0, int)
  if ended.size:
    tokens = tokens[: ended[0]]
  print(f"prompt: {_PROMPT.value}")
  print(f"generated: {named.tokenizer.decode(tokens)}")


def cli() -> None:
  """The `txf-generate` console script and `python -m experiments.generate`."""
  run_command(main)


if __name__ == "__main__":
  cli()
