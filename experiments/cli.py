"""Flag parsing shared by the commands in experiments/."""

from __future__ import annotations

import re
import sys

from absl import app


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, except that an override of a field the config does
  not have (--config.model.bogus=1) is a config error, not a traceback."""
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError) as error:  # ml_collections: no such field
    cause = error
    while isinstance(cause, BaseException) and cause.args:  # AttributeError(KeyError(msg))
      cause = cause.args[0]
    message = str(cause)
    found = re.search(r"'([^']+)'", message)
    paths = [arg.lstrip("-").split("=", 1)[0] for arg in argv[1:]
             if arg.lstrip("-").startswith("config.")]
    field = next((p.partition(".")[2] for p in paths
                  if found and found.group(1) in p.split(".")[1:]), None)
    if field is None:  # not an override's field: some other bug, keep the traceback
      raise
    hint = message.partition("\n")[2]
    print(f"config error: {field}: unknown field" + (f" ({hint})" if hint else ""),
          file=sys.stderr)
    sys.exit(2)
