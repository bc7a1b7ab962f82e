"""Hugging Face transformers GPT-2 `generate()`: the decoding reference timed
beside txf's KV-cache generation (`python -m benchmarks.run decode`
runs it in a subprocess before JAX starts).

  python benchmarks/references/hf_gpt2_decode.py --batch_sizes=1,32 --prompt_len=128 \
      --new_tokens=512 --json=hf.json

The model is GPT2LMHeadModel with random weights built from a GPT2Config of
the given shape, in bfloat16 on a GPU (float32 on the CPU), greedy, with
min_new_tokens = max_new_tokens so every call generates exactly
--new_tokens per row. One untimed call per batch size warms up; the median
of --repeats timed calls (device synchronised) is reported. With
--save_dir the model is saved there (save_pretrained, float32) and the
report holds each batch's prompts and generated tokens, for txf to decode
the same model from the same prompts and compare (benchmarks/decode.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time


def benchmark(
  *,
  layers: int,
  d_model: int,
  heads: int,
  vocab: int,
  max_len: int,
  batch_sizes: list[int],
  prompt_len: int,
  new_tokens: int,
  repeats: int,
  save_dir: str | None = None,
) -> dict:
  # Imported here: the module's line format (format_row) is read without them.
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415

  device = "cuda" if torch.cuda.is_available() else "cpu"
  dtype = torch.bfloat16 if device == "cuda" else torch.float32
  torch.manual_seed(0)
  config = transformers.GPT2Config(
    n_layer=layers, n_embd=d_model, n_head=heads, vocab_size=vocab, n_positions=max_len
  )
  model = transformers.GPT2LMHeadModel(config)
  if save_dir:
    model.save_pretrained(save_dir)
  model = model.to(device=device, dtype=dtype).eval()
  sync = torch.cuda.synchronize if device == "cuda" else lambda: None
  results = []
  for batch_size in batch_sizes:
    prompt = torch.randint(1, vocab, (batch_size, prompt_len), device=device)
    generate = functools.partial(
      model.generate,
      prompt,
      attention_mask=torch.ones_like(prompt),
      max_new_tokens=new_tokens,
      min_new_tokens=new_tokens,
      do_sample=False,
      pad_token_id=0,
    )
    with torch.inference_mode():
      out = generate()
      if out.shape != (batch_size, prompt_len + new_tokens):
        raise RuntimeError(f"generate returned shape {tuple(out.shape)}")
      times = []
      for _ in range(repeats):
        sync()
        start = time.perf_counter()
        generate()
        sync()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    row = dict(
      batch_size=batch_size,
      seconds=seconds,
      tokens_per_sec=batch_size * new_tokens / seconds,
      # Per step, a new token of every row (the name is the reports' since the first).
      us_per_token=1e6 * seconds / new_tokens,
    )
    if save_dir:
      row["tokens"] = out.tolist()  # the prompts, then the generated tokens
    results.append(row)
  return dict(
    model_dir=save_dir,
    framework="transformers",
    transformers_version=transformers.__version__,
    torch_version=torch.__version__,
    device=device,
    device_kind=torch.cuda.get_device_name() if device == "cuda" else "cpu",
    dtype=str(dtype).removeprefix("torch."),
    attention=model.config._attn_implementation,
    params=sum(p.numel() for p in model.parameters()),
    prompt_len=prompt_len,
    new_tokens=new_tokens,
    repeats=repeats,
    results=results,
  )


def format_row(figures: dict, row: dict) -> str:
  """A batch size's figures in a line. A step generates a token for each row
  of the batch: the time per step is per token only at batch 1 (labelled as
  benchmarks/decode.py labels txf's)."""
  batch_size = row["batch_size"]
  unit = "us/token" if batch_size == 1 else f"us/step of {batch_size} tokens"
  return (
    f"transformers {figures['transformers_version']} {figures['device_kind']}: batch "
    f"{batch_size}, {row['tokens_per_sec']:,.0f} new tokens/s, {row['us_per_token']:,.0f} {unit}"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name, default in (
    ("layers", 12),
    ("d_model", 768),
    ("heads", 12),
    ("vocab", 50304),
    ("max_len", 1024),
    ("prompt_len", 128),
    ("new_tokens", 512),
    ("repeats", 3),
  ):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--batch_sizes", default="1,32")
  parser.add_argument("--json", help="write the figures here")
  parser.add_argument("--save_dir", help="save the model here, and report the tokens")
  args = parser.parse_args()
  figures = benchmark(
    layers=args.layers,
    d_model=args.d_model,
    heads=args.heads,
    vocab=args.vocab,
    max_len=args.max_len,
    batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
    prompt_len=args.prompt_len,
    new_tokens=args.new_tokens,
    repeats=args.repeats,
    save_dir=args.save_dir,
  )
  for row in figures["results"]:
    print(format_row(figures, row))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=2)


if __name__ == "__main__":
  main()
