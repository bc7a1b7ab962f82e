"""`python -m experiments.extrapolate` in a checkout: the `txf-extrapolate` command
(txf.commands.extrapolate); `--help` prints its flags."""

from txf.commands.extrapolate import cli

if __name__ == "__main__":
  cli()
