"""`python -m experiments.analyze` in a checkout: the `txf-analyze` command
(txf.commands.analyze); `--help` prints its flags."""

from txf.commands.analyze import cli

if __name__ == "__main__":
  cli()
