"""Commands run as `python -m MODULE ARGS...` runs them, each in a process of
its own, without each paying Python's and jax's imports again.

A test of a command's error path spends ~2-3 s of CPU importing jax and txf
in a fresh interpreter before the command parses its flags. `CommandServer`
starts one interpreter that imports jax and txf's config modules once (none
of them defines an absl flag, so each command still parses exactly the flags
a fresh process has), and forks a child for each command: the child takes
the command's working directory, environment, stdin (/dev/null) and its own
stdout / stderr files (file descriptors 1 and 2, where native code writes
too), runs the module as `python -m` does (`runpy.run_module(...,
alter_sys=True)`: sys.argv[0] is the module's file, the module runs as
__main__), and exits with the status an interpreter would (SystemExit's
code, 1 and the traceback for an uncaught exception) after the interpreter's
own exit steps (non-daemon threads joined, atexit handlers). The command
module itself, and everything it imports that the server did not, is
imported in the child, after the fork.

Whatever the server's imports printed (nothing, as a fresh process prints
nothing before its command) is put in front of every command's output, so a
test that a command prints nothing still sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# Imported once by the server: no absl flags (orbax's, say, would show in
# --helpfull and be accepted by every command), no threads (forked).
PRELOAD = ("jax", "txf.commands.cli", "txf.runconfig.run_config", "txf.models")

_SERVER = r"""
import atexit, importlib, json, os, runpy, select, signal, sys, tempfile, threading, time, traceback

def captured(action):
  "(action's result, what it wrote to fds 1 and 2)"
  saved = [os.dup(1), os.dup(2)]
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    try:
      action()
    finally:
      sys.stdout.flush(); sys.stderr.flush()
      os.dup2(saved[0], 1); os.dup2(saved[1], 2)
      for fd in saved:
        os.close(fd)
    texts = []
    for f in (out, err):
      f.seek(0)
      texts.append(f.read().decode(errors="replace"))
  return texts

def preload():
  for name in json.loads(sys.argv[1]):
    importlib.import_module(name)

preload_out, preload_err = captured(preload)
assert threading.active_count() == 1, threading.enumerate()
replies = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing the server prints is a reply

def child(request):
  code = 0
  try:
    os.chdir(request["cwd"])
    for name, value in request["env"].items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_TRUNC), 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC), 2)
    sys.argv = [request["module"], *request["args"]]
    try:
      runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit:
      if exit.code is None:
        code = 0
      elif isinstance(exit.code, int):
        code = exit.code
      else:
        print(exit.code, file=sys.stderr)
        code = 1
    except BaseException:
      traceback.print_exc()
      code = 1
    try:
      threading._shutdown()
      atexit._run_exitfuncs()
    except BaseException:
      traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except BaseException:
        pass
  finally:
    os._exit(code & 0xFF)

for line in sys.stdin:
  request = json.loads(line)
  sys.stdout.flush(); sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    child(request)
  deadline = time.monotonic() + request["timeout"]
  status = None
  while status is None:
    done, raw = os.waitpid(pid, os.WNOHANG)
    if done:
      status = os.waitstatus_to_exitcode(raw)
    elif time.monotonic() > deadline:
      os.kill(pid, signal.SIGKILL)
      os.waitpid(pid, 0)
      status = "timeout"
    else:
      time.sleep(0.01)
  replies.write(json.dumps(dict(status=status, out=preload_out, err=preload_err)) + "\n")
  replies.flush()
"""


class CommandServer:
  """`run(module, *args)`: a subprocess.CompletedProcess as
  `subprocess.run([python, '-m', module, *args], capture_output=True,
  text=True)` gives it. The server's environment is `env`; `run`'s
  `env` changes it for one command, but not where jax reads it when it is
  imported (JAX_*: give those to the server)."""

  def __init__(self, env: dict[str, str], cwd: os.PathLike | str):
    self.env, self.cwd = dict(env), cwd
    self.process = subprocess.Popen(
      [sys.executable, "-c", _SERVER, json.dumps(PRELOAD)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=self.env,
      cwd=cwd,
    )

  def run(self, module, *args, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(env or {})
    imported = [k for k in env if k.startswith("JAX_") and env[k] != self.env.get(k)]
    if imported:
      raise ValueError(f"{imported}: jax read these when the server imported it")
    with tempfile.TemporaryDirectory() as directory:
      out, err = (os.path.join(directory, name) for name in ("stdout", "stderr"))
      for path in (out, err):
        open(path, "w").close()
      request = dict(
        module=module,
        args=[str(arg) for arg in args],
        cwd=str(cwd or self.cwd),
        env=env,
        stdout=out,
        stderr=err,
        timeout=timeout,
      )
      self.process.stdin.write(json.dumps(request) + "\n")
      self.process.stdin.flush()
      line = self.process.stdout.readline()
      if not line:
        raise RuntimeError(f"the command server exited ({self.process.wait()})")
      reply = json.loads(line)
      command = [sys.executable, "-m", module, *request["args"]]
      if reply["status"] == "timeout":
        raise subprocess.TimeoutExpired(command, timeout)
      texts = []
      for path in (out, err):
        with open(path, encoding="utf-8", errors="replace") as f:
          texts.append(f.read())
    return subprocess.CompletedProcess(
      command, reply["status"], reply["out"] + texts[0], reply["err"] + texts[1]
    )

  def close(self):
    self.process.stdin.close()
    self.process.wait(timeout=30)
