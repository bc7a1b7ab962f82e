"""A run's configuration, typed: RunConfig and its sections (run_config,
parsed once from a ConfigDict by `run_config.parse`), the task kinds
data.task names (tasks), and the optimizer and learning-rate schedule
train's fields build (optim). Nothing here runs a model or touches a run
directory; txf.configs holds the config files that parse into it."""
