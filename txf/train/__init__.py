"""Training: optimizer, train/eval steps, loop, checkpoints, metrics."""
