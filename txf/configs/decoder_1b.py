"""A 1.4B-parameter decoder (1.3B in its matmuls) for a TPU v5e-256 pod: the
config to check before renting one.

  txf-compile --config=decoder_1b --target=v5e-256   # on any machine, no TPU
  txf-run --config=decoder_1b                        # on every host of the pod

LLaMA-style: 24 layers, d_model 2048, 16 heads of 128, RoPE, RMSNorm,
SwiGLU, no biases, untied embeddings, vocabulary 50,304, 2,048 tokens of
context, bfloat16 compute with float32 parameters and AdamW state. The
global batch is 256 x 2048 tokens (524,288), split over the pod as 16-way
data parallelism x 16-way FSDP (parameters, gradients and optimizer state
split 16 ways; each chip holds one sequence). On the built-in corpus the
tokens are bytes (ids < 260): a real run sets data.name to a TFDS dataset
and data.tokenizer to sentencepiece or a Hugging Face tokenizer.

Expected `txf-compile --config=decoder_1b --target=v5e-256` (jax 0.10.2,
libtpu 0.0.42.1; it compiled in 5 minutes on a busy 2-core CPU; the sample
in docs/scaling.md): FITS, the train step 11.46 GiB of the chip's 16 GiB
(arguments 1,011.75 MiB: the state split 16 ways; temporaries 10.07 GiB),
the eval step 1.63 GiB beside the rest of the train state, 1.859e13 model
FLOPs per chip per step (9.08e9 per token; the compiler counts 1.873e13), a
roofline bound of 199.6 ms a step (the compiler's bytes at 819 GB/s), so
MFU <= 47.3%; per step 951 all-gathers (15.51 GiB: FSDP's parameters), 27
all-reduces and 1 all-to-all.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.update(
    dict(
      vocab_size=50304,
      d_model=2048,
      num_heads=16,
      num_layers=24,
      max_len=2048,
      position="rope",
      norm="rms",
      activation="swiglu",
      use_bias=False,
      tie_embeddings=False,
      dtype="bfloat16",
    )
  )
  config.data.seq_len = 2048
  config.data.batch_size = 256
  config.data.max_corpus_bytes = 50_000_000
  config.train.update(
    dict(
      steps=20_000,
      learning_rate=3e-4,
      warmup_steps=2000,
      b2=0.95,
      weight_decay=0.1,
      log_every=50,
      checkpoint_every=1000,
    )
  )
  config.eval.update(dict(every=1000, num_batches=20, sample_tokens=256))
  config.parallel.update(dict(data=-1, fsdp=16))
  return config
