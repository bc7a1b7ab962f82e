"""Seed replicas' own batches: one dataset per replica, read side by side.

  data = StackedDatasets([make_dataset(spec, "train", seed=s, ...) for s in (5, 6, 7)], (5, 6, 7))
  batch = next(data)          # every field [R, B, ...]: replica r's rows from seed 5 + r
  state = data.get_state()    # {'replicas': [each dataset's state]}, what a checkpoint saves

A checkpoint of P > 1 processes whose states differ (packed TFDS streams:
each process reads its own shard) holds {'processes': [each process's
{'replicas': [...]}]} (txf.train.distributed.gather_data_states); set_state
takes either.

A run with `replicas` = R > 1 and `data.seed_per_replica` trains replica r on
the batches of data seed + r (txf.train.run_setup), so its replicas differ in
data order as well as in initialisation and dropout, as R separate runs
would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

STATE_KEY = "replicas"
# A multi-process checkpoint's states, one per process (txf.train.distributed).
PROCESSES_KEY = "processes"


class StackedDatasets:
  """R datasets of one split, iterated together: each batch is theirs stacked
  on a leading [R] axis, each data state holds theirs in order.

  Everything else a Dataset has (tokenizer, vocab_size, task, num_classes,
  split, batch_size, global_batch_size) is the first dataset's: the R differ
  only in their seed. `description` names the seeds.
  """

  def __init__(self, datasets: Sequence[Any], seeds: Sequence[int]):
    if len(datasets) != len(seeds) or len(datasets) < 2:
      raise ValueError(
        f"StackedDatasets: needs one dataset per seed, two or more; got {len(datasets)} "
        f"datasets for seeds {tuple(seeds)}"
      )
    self._datasets = tuple(datasets)
    self.seeds = tuple(seeds)
    counts = [d.num_batches for d in self._datasets if d.num_batches is not None]
    self.num_batches = min(counts) if counts else None
    first = self._datasets[0]
    self.description = f"{first.description}; replica r reads data seed {self.seeds[0]} + r"

  def __getattr__(self, name: str) -> Any:
    # Only reached for attributes not set above: the ones the R share.
    return getattr(self.__dict__["_datasets"][0], name)

  def __iter__(self) -> StackedDatasets:
    for dataset in self._datasets:
      iter(dataset)
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batches = [next(dataset) for dataset in self._datasets]
    return {key: np.stack([batch[key] for batch in batches]) for key in batches[0]}

  def get_state(self) -> dict[str, list]:
    """{'replicas': [replica r's data position, ...]}."""
    return {STATE_KEY: [dataset.get_state() for dataset in self._datasets]}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues each replica's data after its position in `state`: get_state's,
    or {'processes': [each process's get_state()]}, where replica r gets
    {'processes': [its position on each process]} (a PackedDataset's form)."""
    processes = state.get(PROCESSES_KEY) if isinstance(state, dict) and len(state) == 1 else None
    if isinstance(processes, list) and processes:
      positions_PxR = [self._positions(process_state) for process_state in processes]
      positions = [
        {PROCESSES_KEY: [replicas[r] for replicas in positions_PxR]}
        for r in range(len(self._datasets))
      ]
    else:
      positions = self._positions(state)
    for dataset, position in zip(self._datasets, positions):
      dataset.set_state(position)

  def _positions(self, state: Any) -> list:
    """The replicas' positions in one process's `state` (get_state's)."""
    if (
      not isinstance(state, dict)
      or set(state) != {STATE_KEY}
      or not (isinstance(state[STATE_KEY], list) and len(state[STATE_KEY]) == len(self._datasets))
    ):
      raise ValueError(
        f"state must be {{'{STATE_KEY}': [one data position per replica, "
        f"{len(self._datasets)} of them]}}, or {{'{PROCESSES_KEY}': [one such per process]}}, "
        f"got {state!r}"
      )
    return state[STATE_KEY]

  def close(self) -> None:
    for dataset in self._datasets:
      dataset.close()
