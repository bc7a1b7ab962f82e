"""`python -m experiments.run` in a checkout: the `txf-run` command
(txf.commands.run); `--help` prints its flags."""

from txf.commands.run import cli

if __name__ == "__main__":
  cli()
