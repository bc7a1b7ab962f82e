"""`python -m experiments.sweep` in a checkout: the `txf-sweep` command
(txf.commands.sweep); `--help` prints its flags."""

from txf.commands.sweep import cli

if __name__ == "__main__":
  cli()
