"""GPT-2 small (124M parameters; Radford et al. 2019), for one GPU.

  txf-run --config=gpt2_small

12 layers, d_model 768, 12 heads, 1024 context, learned positions, GELU,
biases, LayerNorm eps 1e-5, tied embeddings without logit scaling, vocabulary
50304 (GPT-2's 50257 padded to a multiple of 128), and GPT-2's initialisation
(txf.layers.inits: every projection N(0, 0.02), the residual projections N(0,
0.02 / sqrt(24)), token rows N(0, 0.02), position rows N(0, 0.01)), so it is
the model the PyTorch recipe trains (benchmarks/references/torch_gpt2.py).
bfloat16 compute with float32 parameters; the cuDNN flash-attention kernel is
chosen automatically on GPU. On the built-in corpus the tokens are bytes (ids
< 260); the vocabulary keeps GPT-2's shape so parameter counts and FLOPs
match. Far too big for a CPU.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.update(
    dict(
      vocab_size=50304,
      d_model=768,
      num_heads=12,
      num_layers=12,
      max_len=1024,
      position="learned",
      activation="gelu",
      use_bias=True,
      norm_eps=1e-5,
      scale_logits=False,
      init="gpt2",
      dtype="bfloat16",
    )
  )
  config.data.seq_len = 1024
  config.data.batch_size = 32
  config.data.max_corpus_bytes = 50_000_000
  config.train.update(
    dict(
      steps=5000,
      learning_rate=6e-4,
      warmup_steps=700,
      b2=0.95,
      weight_decay=0.1,
      log_every=50,
      checkpoint_every=1000,
    )
  )
  config.eval.update(dict(every=1000, num_batches=20, sample_tokens=256))
  return config
