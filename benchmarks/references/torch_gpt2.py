"""The PyTorch GPT-2 training recipe, as a reference timed beside txf.

GPT-2 (Radford et al. 2019) written the way the widely used PyTorch recipe
(nanoGPT / llm.c's train_gpt2.py) writes it: pre-LN blocks, GELU (tanh),
biases, tied embeddings, F.scaled_dot_product_attention(is_causal=True),
bf16 autocast, fused AdamW (decay on matrices only), gradient clipping at 1,
torch.compile. `python -m benchmarks.run step --torch` runs it in a subprocess
before JAX starts (each framework then has the GPU to itself) on the very
token batches txf trains on, and reports both in one JSON.

  python benchmarks/references/torch_gpt2.py --tokens=batches.npy --layers=12 --d_model=768 \
      --heads=12 --vocab=50304 --steps=100 --json=torch.json

--tokens is an int [n, B, T + 1] array of windows (inputs are [:, :, :-1],
targets [:, :, 1:]), cycled through. Timing: --warmup steps (compilation
included) are left out; then the wall time of --steps steps, the device
synchronised before and after, gives tokens/s, and every --window steps a
window's figures with its start and end (Unix time, to line up with clock
and power samples). --profile_steps then records that many more steps with
torch.profiler: each GPU kernel's launches and device time, and the
kernels' intervals (benchmarks/kernels.py turns them into categories).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
  def __init__(self, d_model: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
    self.attn, self.attn_proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
    self.fc, self.fc_proj = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

  def forward(self, x):
    B, T, D = x.shape
    q, k, v = self.attn(self.ln_1(x)).split(D, dim=2)
    q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, D))
    return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
  def __init__(self, layers: int, d_model: int, heads: int, vocab: int, max_len: int):
    super().__init__()
    self.wte, self.wpe = nn.Embedding(vocab, d_model), nn.Embedding(max_len, d_model)
    self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
    self.ln_f = nn.LayerNorm(d_model)
    self.lm_head = nn.Linear(d_model, vocab, bias=False)
    self.lm_head.weight = self.wte.weight  # tied
    for name, p in self.named_parameters():
      if p.dim() == 2:  # GPT-2's init: N(0, 0.02), residual projections scaled down
        std = 0.02 / math.sqrt(2 * layers) if name.endswith("_proj.weight") else 0.02
        nn.init.normal_(p, std=std)
      elif name.endswith("bias"):
        nn.init.zeros_(p)

  def forward(self, idx, targets):
    positions = torch.arange(idx.shape[1], device=idx.device)
    x = self.wte(idx) + self.wpe(positions)
    for block in self.blocks:
      x = block(x)
    logits = self.lm_head(self.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_optimizer(model: nn.Module, device: str) -> torch.optim.Optimizer:
  params = [p for p in model.parameters() if p.requires_grad]
  groups = [
    {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
    {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
  ]
  return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")


def benchmark(
  tokens_NxBxT1: np.ndarray,
  *,
  layers: int,
  d_model: int,
  heads: int,
  vocab: int,
  steps: int,
  warmup: int,
  window: int,
  profile_steps: int,
  compile_model: bool,
  device: str,
) -> dict:
  """Trains on the windows in turn; the timed steps' figures."""
  torch.manual_seed(0)
  seq_len = tokens_NxBxT1.shape[2] - 1
  model = GPT(layers, d_model, heads, vocab, seq_len).to(device)
  optimizer = make_optimizer(model, device)
  step_model = torch.compile(model) if compile_model else model
  batches = torch.as_tensor(tokens_NxBxT1.astype(np.int64), device=device)
  autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)

  def train_step(i: int) -> torch.Tensor:
    window = batches[i % len(batches)]
    with autocast:
      loss = step_model(window[:, :-1], window[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  sync = torch.cuda.synchronize if device == "cuda" else lambda: None
  for i in range(warmup):
    train_step(i)
  sync()
  batch_size = tokens_NxBxT1.shape[1]
  windows, start = [], time.perf_counter()
  window_start, window_wall = start, time.time()
  for i in range(steps):
    loss = train_step(warmup + i)
    if (i + 1) % window == 0 or i + 1 == steps:
      sync()
      now, count = time.perf_counter(), i + 1 - (windows[-1]["last_step"] if windows else 0)
      windows.append(
        dict(
          first_step=i + 2 - count,
          last_step=i + 1,
          start_time=window_wall,
          end_time=time.time(),
          step_time=(now - window_start) / count,
          tokens_per_sec=batch_size * seq_len * count / (now - window_start),
        )
      )
      w = windows[-1]
      print(
        f"torch steps {w['first_step']}-{w['last_step']}: {1e3 * w['step_time']:.1f} ms/step, "
        f"{w['tokens_per_sec']:,.0f} tokens/s"
      )
      window_start, window_wall = now, time.time()
  seconds = time.perf_counter() - start
  profile = profile_kernels(train_step, warmup + steps, profile_steps) if profile_steps else None
  return dict(
    framework="torch",
    torch_version=torch.__version__,
    device=device,
    device_kind=(
      torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    ),
    compiled=compile_model,
    batch_size=batch_size,
    seq_len=seq_len,
    params=sum(p.numel() for p in model.parameters()),
    steps=steps,
    step_time=seconds / steps,
    tokens_per_sec=batch_size * seq_len * steps / seconds,
    loss=float(loss.detach()),
    windows=windows,
    profile=profile,
  )


def profile_kernels(train_step, first: int, steps: int) -> dict:
  """Steps first..first+steps-1 under torch.profiler: {"steps", "kernels":
  {name: [launches, total ns]}, "intervals": [[start, end] ns]} of the GPU
  kernels (memory copies and sets included)."""
  activities = [torch.profiler.ProfilerActivity.CUDA]
  with torch.profiler.profile(activities=activities) as profiler:
    for i in range(first, first + steps):
      train_step(i)
    torch.cuda.synchronize()
  kernels: dict[str, list[int]] = {}
  intervals = []
  for event in profiler.events():
    if event.device_type != torch.autograd.DeviceType.CUDA:
      continue
    start, end = int(1e3 * event.time_range.start), int(1e3 * event.time_range.end)
    row = kernels.setdefault(event.name, [0, 0])
    row[0] += 1
    row[1] += end - start
    intervals.append([start, end])
  return dict(steps=steps, kernels=kernels, intervals=intervals)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", required=True, help="int [n, B, T + 1] .npy windows")
  for name, default in (
    ("layers", 12),
    ("d_model", 768),
    ("heads", 12),
    ("vocab", 50304),
    ("steps", 50),
    ("warmup", 10),
    ("window", 50),
    ("profile_steps", 0),
  ):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--no_compile", action="store_true", help="eager, no torch.compile")
  parser.add_argument("--json", help="write the figures here")
  args = parser.parse_args()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  if device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  figures = benchmark(
    np.load(args.tokens),
    layers=args.layers,
    d_model=args.d_model,
    heads=args.heads,
    vocab=args.vocab,
    steps=args.steps,
    warmup=args.warmup,
    window=args.window,
    profile_steps=args.profile_steps if device == "cuda" else 0,
    compile_model=not args.no_compile,
    device=device,
  )
  print(
    f"torch {figures['torch_version']} {figures['device_kind']}: batch "
    f"{figures['batch_size']} x {figures['seq_len']}, {1e3 * figures['step_time']:.1f} "
    f"ms/step, {figures['tokens_per_sec']:,.0f} tokens/s, loss {figures['loss']:.3f}"
  )
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=2)


if __name__ == "__main__":
  main()
