"""`python -m experiments.export` in a checkout: the `txf-export` command
(txf.commands.export); `--help` prints its flags."""

from txf.commands.export import cli

if __name__ == "__main__":
  cli()
