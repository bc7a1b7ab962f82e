"""`python -m experiments.textbook` in a checkout: the `txf-textbook` command
(txf.commands.textbook); `--help` prints its flags."""

from txf.commands.textbook import cli

if __name__ == "__main__":
  cli()
