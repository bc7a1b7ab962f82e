"""The quickstart notebook (docs/quickstart.ipynb) runs, every cell, at a toy size."""

import os
import pathlib

import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"
# Training steps at CI's size (the notebook's own default is 200): one is
# enough for every cell to run (an evaluation, a checkpoint to load).
STEPS = 1


def outputs(cell, kind):
  """The cell's `kind` outputs: 'text' (stream and text/plain) or 'image/png'."""
  found = []
  for output in cell.get("outputs", []):
    if kind == "text":
      found.append(output.get("text", "") + output.get("data", {}).get("text/plain", ""))
    elif kind in output.get("data", {}):
      found.append(output["data"][kind])
  return found


@pytest.mark.slow
def test_the_quickstart_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("TXF_QUICKSTART_STEPS", str(STEPS))
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the run's temporary work directory
  # The kernel imports this checkout's txf and configs, installed or not.
  monkeypatch.setenv(
    "PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
  )
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(
    notebook,
    timeout=600,
    kernel_name="python3",
    resources={"metadata": {"path": str(ROOT / "docs")}},
  ).execute()
  code = [cell for cell in notebook.cells if cell.cell_type == "code"]
  text = "\n".join(text for cell in code for text in outputs(cell, "text"))
  assert f"training steps: {STEPS}" in text
  assert "0.506 0.186 0.307" in text  # the worked example's first row
  assert "final validation loss" in text
  # The loss curve and the attention map are drawn.
  assert sum(len(outputs(cell, "image/png")) for cell in code) == 2
