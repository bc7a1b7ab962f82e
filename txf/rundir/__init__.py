"""A run's work directory: its checks and lock (workdir), config.json and
what may change on resume (resume), run_record.json (record), orbax
checkpoints (checkpoint), metrics.jsonl, TensorBoard and experiment trackers
(metrics, sinks, trackers, tracking) and the console lines (console)."""
