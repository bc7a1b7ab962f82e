"""GPT-2 small shape at 8192 tokens of context, for one GPU.

  txf-run --config=gpt2_small_8k
  python -m benchmarks.run step --config=configs/gpt2_small_8k.py

gpt2_small.py with a learned position table of 8192 rows and 4 sequences of
8192 tokens per step (the same 32768 tokens per step). Causal attention
with no mask or bias array reaches jax.nn.dot_product_attention's cuDNN
flash kernel on a GPU, so attention memory grows linearly with the length
(no [T, T] scores are held). --config.train.loss_chunk_len=1024 also keeps
the [B, T, V] logits from being held at once. Longer contexts:
--config.model.max_len=N --config.data.seq_len=N --config.data.batch_size=max(1, 32768 // N).
"""

from txf.configs import gpt2_small


def get_config():
  config = gpt2_small.get_config()
  config.model.max_len = 8192
  config.data.seq_len = 8192
  config.data.batch_size = 4
  config.eval.num_batches = 5  # 20 batches' worth of tokens, as gpt2_small
  return config
