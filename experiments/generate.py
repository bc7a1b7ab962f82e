"""`python -m experiments.generate` in a checkout: the `txf-generate` command
(txf.commands.generate); `--help` prints its flags."""

from txf.commands.generate import cli

if __name__ == "__main__":
  cli()
