"""`python -m experiments.compile` in a checkout: the `txf-compile` command
(txf.commands.compile); `--help` prints its flags."""

from txf.commands.compile import cli

if __name__ == "__main__":
  cli()
