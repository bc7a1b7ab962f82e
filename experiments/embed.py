"""`python -m experiments.embed` in a checkout: the `txf-embed` command
(txf.commands.embed); `--help` prints its flags."""

from txf.commands.embed import cli

if __name__ == "__main__":
  cli()
