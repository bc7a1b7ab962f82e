"""A run written by main at commit 822e561 (before the consolidation: logical
axes declared on the parameters, ModelConfig the one source of defaults, the
one run setup) still restores, evaluates to the loss it logged, and resumes.

tests/fixtures/run_822e561 was made by that commit with
  python -m experiments.run --config=configs/rope.py --workdir=DIR \
    --config.model.d_model=16 --config.model.num_heads=2 --config.model.num_layers=1 \
    --config.data.batch_size=4 --config.data.seq_len=16 --config.data.max_corpus_bytes=100000 \
    --config.train.steps=2 --config.train.warmup_steps=1 --config.train.log_every=1 \
    --config.train.checkpoint_every=2 --config.eval.every=2 --config.eval.num_batches=1 \
    --config.eval.sample_tokens=0
(its tb/ left out).
"""

import shutil

import numpy as np
import pytest

from conftest import FIXTURES, load_config
from txf.runconfig.run_config import parse
from txf.rundir.metrics import read_metrics
from txf.train import loop
from txf.train.run_setup import load_run

OLD_RUN = FIXTURES / "run_822e561"


@pytest.mark.slow  # resumes the run: trains
def test_old_run_evaluates_to_its_logged_loss_and_resumes(tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(OLD_RUN, workdir)
  logged = [row for row in read_metrics(workdir) if "eval_loss" in row][-1]

  trained = load_run(workdir)
  assert trained.step == 2
  result = trained.setup.evaluate(trained.params)
  np.testing.assert_allclose(result["eval_loss"], logged["eval_loss"], rtol=1e-5)

  # The same command with 4 steps, under today's field names.
  config = load_config("rope")
  config.model.update(dict(d_model=16, num_heads=2, num_layers=1))
  config.data.update(dict(batch_size=4, seq_len=16, max_corpus_bytes=100_000))
  config.train.update(dict(steps=4, warmup_steps=1, log_every=1, checkpoint_every=2))
  config.eval.update(dict(every=2, num_batches=1, sample_tokens=0))
  lines = []
  loop.run(parse(config), workdir, log=lines.append)
  assert "resumed from step 2" in "\n".join(lines)
  assert [row["step"] for row in read_metrics(workdir) if "loss" in row] == [1, 2, 3, 4]
