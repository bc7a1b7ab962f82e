"""Planted-bug check: does the test suite catch realistic one-line bugs?

  python tools/planted_bugs.py            # every bug, 2 at a time
  python tools/planted_bugs.py --list     # names, files and tests
  python tools/planted_bugs.py --only rope_q_only --only last_pool_first

Each bug replaces one exact snippet in one file of a temporary copy of the
repository (txf/, tests/, configs/, experiments/, benchmarks/, pyproject.toml), then runs
the tests named for it there (`pytest -x -q -n 0`). A bug is caught when
those tests fail. The tool stops with an error when a snippet is not found
exactly once, so a refactor that moves the code cannot make a bug silently
vanish: edit that bug's entry. Prints caught / missed with the failing tests
and a final "N/N caught"; exits 1 if any bug is missed.

Runs on demand, not in CI (several minutes; see the README's Tests section).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
COPIED = ("txf", "tests", "configs", "experiments", "benchmarks", "pyproject.toml")
LAYER_REFS = "tests/layers/test_layer_references.py"
ATTENTION_REF = f"{LAYER_REFS}::test_attention_matches_numpy"
BLOCK_REF = f"{LAYER_REFS}::test_block_matches_numpy"
DETERMINISTIC = (
  "tests/train/test_training_behaviour.py::test_deterministic_model_ignores_dropout_rates"
)
RANGES = "tests/data/test_data_ranges.py::test_sampled_parameters_cover_their_documented_range"
REGISTRIES = "tests/test_registries.py"
SETTING_TEST = "test_every_option_setting_changes_the_model_output"
PROVENANCE = "tests/train/test_record_provenance.py"


@dataclasses.dataclass(frozen=True)
class Bug:
  name: str
  file: str  # relative to the repository root
  original: str  # must occur exactly once in `file`
  planted: str
  tests: tuple[str, ...]  # pytest node ids or files


BUGS = (
  # --- ops ------------------------------------------------------------------
  Bug(
    "attention_no_scale",
    "txf/ops/attention.py",
    # _scaled_scores, shared by the xla and chunked paths.
    "scale = 1.0 / math.sqrt(q_BxTxKxGxD.shape[-1])",
    "scale = 1.0",
    ("tests/ops/test_ops_attention.py",),
  ),
  Bug(
    "gqa_tiled_groups",
    "txf/ops/attention.py",
    "return q.reshape(B, T, num_kv_heads, H // num_kv_heads, D)",
    "return q.reshape(B, T, H // num_kv_heads, num_kv_heads, D).swapaxes(2, 3)",
    ("tests/ops/test_ops_attention.py::test_gqa_equals_mha_with_repeated_heads",),
  ),
  Bug(
    "softmax_over_queries",
    "txf/ops/attention.py",
    "denom = jnp.sum(unnorm, axis=-1, keepdims=True)",
    "denom = jnp.sum(unnorm, axis=-2, keepdims=True)",
    ("tests/ops/test_ops_attention.py",),
  ),
  Bug(
    "causal_mask_off_by_one",
    "txf/ops/masks.py",
    "return k_pos <= q_pos",
    "return k_pos < q_pos",
    ("tests/ops/test_ops_masks.py",),
  ),
  Bug(
    "window_off_by_one",
    "txf/ops/masks.py",
    "return jnp.abs(q_pos - k_pos) < window",
    "return jnp.abs(q_pos - k_pos) <= window",
    ("tests/ops/test_ops_masks.py",),
  ),
  Bug(
    "rope_rotation_sign",
    "txf/ops/positional.py",
    "x2_BxTxHxF * cos_BxTx1xF + x1_BxTxHxF * sin_BxTx1xF",
    "x2_BxTxHxF * cos_BxTx1xF - x1_BxTxHxF * sin_BxTx1xF",
    ("tests/ops/test_ops_positional.py",),
  ),
  Bug(
    "alibi_bias_sign",
    "txf/ops/positional.py",
    "return -slopes_H[None, :, None, None] * distance_BxTxS[:, None, :, :]",
    "return slopes_H[None, :, None, None] * distance_BxTxS[:, None, :, :]",
    ("tests/ops/test_ops_positional.py",),
  ),
  Bug(
    "layer_norm_no_centering",
    "txf/ops/norms.py",
    "y = (x32 - mean) * jax.lax.rsqrt(var + eps)",
    "y = x32 * jax.lax.rsqrt(var + eps)",
    ("tests/ops/test_ops_norms.py",),
  ),
  # eps where the tests' inputs make it visible (rows of variance ~eps).
  Bug(
    "rms_norm_eps_outside_sqrt",
    "txf/ops/norms.py",
    "y = x32 * jax.lax.rsqrt(mean_square + eps)",
    "y = x32 / (jnp.sqrt(mean_square) + eps)",
    ("tests/ops/test_ops_norms.py",),
  ),
  Bug(
    "layer_norm_eps_outside_sqrt",
    "txf/ops/norms.py",
    "y = (x32 - mean) * jax.lax.rsqrt(var + eps)",
    "y = (x32 - mean) / (jnp.sqrt(var) + eps)",
    ("tests/ops/test_ops_norms.py",),
  ),
  Bug(
    "loss_over_padding",
    "txf/ops/losses.py",
    "loss = jnp.sum(weights * per_token) / jnp.where(num_tokens == 0, 1.0, num_tokens)",
    "loss = jnp.mean(per_token)",
    ("tests/ops/test_ops_losses.py",),
  ),
  # --- layers ---------------------------------------------------------------
  Bug(
    "rope_q_only",
    "txf/layers/attention.py",
    "k_BxSxKxDh = encoding.rotate(",
    "k_rotated = encoding.rotate(",
    (
      ATTENTION_REF,
      "tests/models/test_models.py::test_encoder_permutation_equivariance_only_without_positions",
    ),
  ),
  Bug(
    "attention_dropout_inverted_flag",
    "txf/layers/attention.py",
    "dropout = self.attention_dropout_rate > 0.0 and not deterministic",
    "dropout = self.attention_dropout_rate > 0.0 and deterministic",
    (DETERMINISTIC,),
  ),
  Bug(
    "cache_write_off_by_one",
    "txf/layers/attention.py",
    "start = (0, cache_index, 0, 0)",
    "start = (0, cache_index + 1, 0, 0)",
    ("tests/decode/test_decode.py::test_cached_decoding_matches_full_pass",),
  ),
  Bug(
    "dropped_residual",
    "txf/layers/block.py",
    "return x_BxTxD + dropout(sublayer(norm(x_BxTxD)), deterministic=self.deterministic)",
    "return dropout(sublayer(norm(x_BxTxD)), deterministic=self.deterministic)",
    (BLOCK_REF, "tests/layers/test_layers.py"),
  ),
  Bug(
    "pre_ln_norm_on_output",
    "txf/layers/block.py",
    "return x_BxTxD + dropout(sublayer(norm(x_BxTxD)), deterministic=self.deterministic)",
    "return x_BxTxD + norm(dropout(sublayer(x_BxTxD), deterministic=self.deterministic))",
    (BLOCK_REF, "tests/layers/test_layers.py"),
  ),
  Bug(
    "no_final_norm",
    "txf/layers/block.py",
    'if cfg.norm_placement == "pre":\n      # Pre-LN leaves',
    'if cfg.norm_placement == "none":\n      # Pre-LN leaves',
    (f"{LAYER_REFS}::test_stack_matches_numpy",),
  ),
  Bug(
    "cross_attention_ignores_padding",
    "txf/layers/block.py",
    "key_mask=cross_mask,",
    "key_mask=None,",
    (BLOCK_REF,),
  ),
  Bug(
    "ffn_gate_on_wrong_branch",
    "txf/layers/feedforward.py",
    'h_BxTxF = act(dense(self.d_ff, into_hidden, "gate")(x_BxTxD)) * h_BxTxF',
    'h_BxTxF = dense(self.d_ff, into_hidden, "gate")(x_BxTxD) * act(h_BxTxF)',
    ("tests/layers/test_layers.py::test_feedforward_matches_numpy",),
  ),
  Bug(
    "ffn_dropout_always_on",
    "txf/layers/feedforward.py",
    "h_BxTxF = nn.Dropout(self.dropout_rate)(h_BxTxF, deterministic=deterministic)",
    "h_BxTxF = nn.Dropout(self.dropout_rate)(h_BxTxF, deterministic=False)",
    (DETERMINISTIC,),
  ),
  Bug(
    "tied_logits_no_scale",
    "txf/layers/embedding.py",
    "logits = logits / jnp.sqrt(self.d_model).astype(jnp.float32)",
    "logits = logits",
    (f"{LAYER_REFS}::test_embedder_and_tied_logits_match_numpy",),
  ),
  Bug(
    "decode_positions_off_by_one",
    "txf/layers/embedding.py",
    "index.value = cache_index + length",
    "index.value = cache_index + length - 1",
    ("tests/decode/test_decode.py::test_prefill_then_single_steps_match_full_pass",),
  ),
  # --- models ---------------------------------------------------------------
  Bug(
    "last_pool_first",
    "txf/models/output_heads.py",
    "last_B = jnp.maximum(jnp.sum(valid_BxT, axis=1) - 1, 0)",
    "last_B = jnp.zeros(valid_BxT.shape[:1], jnp.int32)",
    (f"{LAYER_REFS}::test_classification_head_matches_numpy",),
  ),
  Bug(
    "mean_pool_over_pads",
    "txf/models/output_heads.py",
    "return (total_BxD / jnp.maximum(jnp.sum(valid_BxTx1, axis=1), 1)).astype(x_BxTxD.dtype)",
    "return (total_BxD / x_BxTxD.shape[1]).astype(x_BxTxD.dtype)",
    ("tests/models/test_models.py::test_classification_pooling_ignores_padding",),
  ),
  Bug(
    "encoder_attends_to_pads",
    "txf/models/transformer.py",
    "tokens_BxS,\n      key_mask,\n      positions_BxS,",
    "tokens_BxS,\n      None,\n      positions_BxS,",
    ("tests/models/test_models.py::test_encoder_padding_does_not_change_real_positions",),
  ),
  Bug(
    "embedding_dropout_always_on",
    "txf/models/transformer.py",
    "self.embedder(tokens_BxT, embed_positions, token_types_BxT), deterministic=deterministic\n",
    "self.embedder(tokens_BxT, embed_positions, token_types_BxT), deterministic=False\n",
    (DETERMINISTIC,),
  ),
  # --- train ----------------------------------------------------------------
  Bug(
    "grad_accum_double_average",
    "txf/train/step.py",
    "grads = jax.tree.map(lambda g: g / denom, grads)",
    "grads = jax.tree.map(lambda g: g / denom / grad_accum_steps, grads)",
    ("tests/train/test_training_behaviour.py::test_grad_accumulation_equals_one_big_batch",),
  ),
  Bug(
    "train_loss_ignores_weights",
    "txf/train/step.py",
    'return batch["targets"], batch["weights"].astype(jnp.float32)',
    'return batch["targets"], jnp.ones(batch["targets"].shape, jnp.float32)',
    ("tests/train/test_training_behaviour.py::test_train_step_ignores_padded_targets",),
  ),
  Bug(
    "same_dropout_mask_every_step",
    "txf/train/step.py",
    "rng = jax.random.fold_in(jax.random.key(seed), state.step)",
    "rng = jax.random.key(seed)",
    (
      "tests/train/test_training_behaviour.py::test_train_step_draws_a_new_mask_each_step_and_repeats_a_step"
      "_exactly",
    ),
  ),
  Bug(
    "eval_mean_of_batch_means",
    "txf/train/run_setup.py",
    "          totals[key] = totals[key] + np.asarray(sums[key], np.float64)",
    # Each batch counts 1, whatever its weight (a weight-0 padding batch too).
    "          totals[key] = totals[key] + (1.0 if key == 'count' else np.asarray(\n"
    "              sums[key], np.float64) / max(float(sums['count']), 1.0))",
    ("tests/train/test_train_setup.py::test_evaluate_weights_every_token_alike_across_batches",),
  ),
  # --- data -----------------------------------------------------------------
  Bug(
    "lm_targets_not_shifted",
    "txf/data/lm.py",
    '"targets": windows[:, 1:],',
    '"targets": windows[:, :-1],',
    ("tests/data/test_data_lm.py",),
  ),
  Bug(
    "mlm_masks_specials",
    "txf/data/masking.py",
    "selected = (uniforms[0] < probability) & ~np.isin(tokens, list(special_ids))",
    "selected = uniforms[0] < probability",
    ("tests/data/test_data_mlm.py",),
  ),
  # --- packed sequences, pretrained checkpoints, LSTM, chunked attention ------
  Bug(
    "packed_documents_attend_across",
    "txf/models/transformer.py",
    "      mask = ops.segment_mask(segment_ids_BxT)",
    "      mask = None",
    ("tests/layers/test_packed_attention.py",),
  ),
  Bug(
    "packed_positions_not_restarted",
    "txf/models/transformer.py",
    "embed_positions = positions_1xT if positions_BxT is None else positions_BxT",
    "embed_positions = positions_1xT",
    ("tests/layers/test_packed_attention.py",),
  ),
  Bug(
    "t5_attention_scaled",
    "txf/layers/block.py",
    "scale=None if cfg.scale_attention else 1.0,",
    "scale=None,",
    ("tests/interop/test_interop.py::test_t5_encoder_and_logits_match_transformers",),
  ),
  Bug(
    "lstm_cache_keeps_first_carry",
    "txf/models/lstm.py",
    "      cached.value = new_carry",
    "      cached.value = cached.value",
    ("tests/models/test_lstm.py::test_cached_decoding_matches_full_pass",),
  ),
  Bug(
    "chunked_attention_no_rescale",
    "txf/ops/attention.py",
    "l_new = rescale * l_BxKxGxT + jnp.sum(p_BxKxGxTxC, axis=-1)",
    "l_new = l_BxKxGxT + jnp.sum(p_BxKxGxTxC, axis=-1)",
    ("tests/ops/test_ops_attention_chunked.py",),
  ),
  # --- a sampled parameter that stops reaching an end of its range ----------
  Bug(
    "induction_period_misses_top",
    "txf/data/incontext.py",
    "period = int(rng.integers(min_period, max_period + 1))",
    "period = int(rng.integers(min_period, max_period))",
    (f"{RANGES}[induction]",),
  ),
  Bug(
    "seq2seq_length_misses_top",
    "txf/data/synthetic.py",
    "length = int(rng.integers(min_len, max_len + 1))",
    "length = int(rng.integers(min_len, max_len))",
    (f"{RANGES}[copy]",),
  ),
  Bug(
    "listops_never_ten_arguments",
    "txf/data/listops.py",
    "for _ in range(2 + int(uniform() * (MAX_ARGS - 1))):",
    "for _ in range(2 + int(uniform() * (MAX_ARGS - 2))):",
    (f"{RANGES}[listops]",),
  ),
  Bug(
    "mqar_queries_miss_last_slot",
    "txf/data/incontext.py",
    "slots = (length - 2 * num_pairs) // 2  #",
    "slots = (length - 2 * num_pairs) // 2 - 1  #",
    (f"{RANGES}[mqar]",),
  ),
  Bug(
    "probe_tokens_skip_low",
    "txf/analysis/head_scores.py",
    "pool = np.arange(low, vocab_size)",
    "pool = np.arange(low + 1, vocab_size)",
    (f"{RANGES}[induction_probe]",),
  ),
  # --- a registry entry that behaves like another, or ignores its settings ----
  Bug(
    "rope_ntk_registered_as_rope",
    "txf/layers/positions.py",
    '"rope_ntk": PositionEncoding("rotation", rotate=_ntk_rope, even="head_dim"),',
    '"rope_ntk": PositionEncoding("rotation", rotate=_rope, even="head_dim"),',
    (f"{REGISTRIES}::test_every_option_changes_the_model_output[position]",),
  ),
  Bug(
    "max_pooling_is_mean",
    "txf/models/output_heads.py",
    'if pooling == "mean":',
    'if pooling in ("mean", "max"):',
    (f"{REGISTRIES}::test_every_option_changes_the_model_output[pooling]",),
  ),
  Bug(
    "rope_ignores_base",
    "txf/layers/positions.py",
    "return positional.apply_rope(\n    x_BxTxHxDh, positions_BxT, base=rope.rope_base,",
    "return positional.apply_rope(\n    x_BxTxHxDh, positions_BxT, base=10000.0,",
    (f"{REGISTRIES}::{SETTING_TEST}[position-rope-rope_base]",),
  ),
  Bug(
    "t5_bias_ignores_max_distance",
    "txf/layers/positions.py",
    'max_distance=cfg.settings("position").t5_max_distance,',
    "max_distance=128,",
    (f"{REGISTRIES}::{SETTING_TEST}[position-t5_bias-t5_max_distance]",),
  ),
  Bug(
    "rms_norm_ignores_eps",
    "txf/layers/norm.py",
    "return ops.rms_norm(x_BxTxD, scale, eps=self.eps)",
    "return ops.rms_norm(x_BxTxD, scale, eps=DEFAULTS.norm_eps)",
    (f"{REGISTRIES}::{SETTING_TEST}[norm-rms-norm_eps]",),
  ),
  # --- a provenance field of the run record recorded wrong ---------------------
  Bug(
    "git_dirty_only_when_staged",
    "txf/rundir/record.py",
    'dirty = bool(_git(directory, "status", "--porcelain", "--untracked-files=no"))',
    'dirty = bool(_git(directory, "diff", "--cached", "--name-only"))',
    (f"{PROVENANCE}::test_git_state_follows_a_checkout_made_clean_then_dirty",),
  ),
  Bug(
    "git_commit_is_the_tree",
    "txf/rundir/record.py",
    'commit = _git(directory, "rev-parse", "HEAD")',
    'commit = _git(directory, "rev-parse", "HEAD^{tree}")',
    (f"{PROVENANCE}::test_git_state_follows_a_checkout_made_clean_then_dirty",),
  ),
  Bug(
    "corpus_fingerprint_names_only",
    "txf/data/corpus.py",
    'for part in (path.encode("utf-8"), data):',
    'for part in (path.encode("utf-8"),):',
    (f"{PROVENANCE}::test_pystdlib_fingerprint_follows_the_corpus_contents_and_names",),
  ),
  Bug(
    "files_fingerprint_sizes_only",
    "txf/data/files.py",
    "        update(data)\n",
    "        update(str(len(data)).encode())\n",
    (f"{PROVENANCE}::test_text_files_fingerprint_follows_their_contents_and_names",),
  ),
  Bug(
    "data_sha256_of_the_fields_alone",
    "txf/rundir/record.py",
    "json.dumps(description, sort_keys=True, default=repr)",
    "json.dumps(spec, sort_keys=True, default=repr)",
    (f"{PROVENANCE}::test_pystdlib_fingerprint_follows_the_corpus_contents_and_names",),
  ),
)


def drift(bug: Bug, text: str) -> str | None:
  """Why `bug` cannot be planted in `text` (its file's contents), or None."""
  found = text.count(bug.original)
  if found == 1:
    return None
  return (
    f"bug {bug.name!r}: the original snippet occurs {found} times in {bug.file} "
    "(expected exactly once); update its entry"
  )


def plant(bug: Bug, root: pathlib.Path) -> None:
  """Applies `bug` to the copy at `root`; ValueError if its snippet has drifted."""
  path = root / bug.file
  text = path.read_text()
  problem = drift(bug, text)
  if problem:
    raise ValueError(problem)
  path.write_text(text.replace(bug.original, bug.planted))


def check_snippets(bugs) -> None:
  """Fails loudly, before any test runs, if any snippet has drifted."""
  problems = [p for p in (drift(bug, (REPO / bug.file).read_text()) for bug in bugs) if p]
  if problems:
    raise SystemExit("\n".join(problems))


def test_args(bug: Bug, root: pathlib.Path) -> list[str]:
  """The bug's tests that exist in this checkout (a missing file is dropped)."""
  return [t for t in bug.tests if (root / t.split("::")[0]).exists()]


def run_bug(bug: Bug) -> dict:
  """Copies the repository, plants `bug`, runs its tests; returns the outcome."""
  start = time.monotonic()
  with tempfile.TemporaryDirectory(prefix=f"planted_{bug.name}_") as tmp:
    root = pathlib.Path(tmp)
    for name in COPIED:
      source = REPO / name
      if source.is_symlink():  # configs/ -> txf/configs: the copy links to its own
        (root / name).symlink_to(source.readlink())
      elif source.is_dir():
        shutil.copytree(
          source, root / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
        )
      else:
        shutil.copy2(source, root / name)
    plant(bug, root)
    tests = test_args(bug, root)
    if not tests:
      return dict(
        bug=bug,
        caught=False,
        failed=["(none of its tests exist)"],
        seconds=time.monotonic() - start,
      )
    done = subprocess.run(
      [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-n",
        "0",
        "-rfE",
        "-p",
        "no:cacheprovider",
        *tests,
      ],
      cwd=root,
      capture_output=True,
      text=True,
    )
  failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, flags=re.M)
  if done.returncode not in (0, 1) and not failed:
    failed = [f"(pytest exit {done.returncode}: {done.stdout.strip().splitlines()[-1:]})"]
  return dict(bug=bug, caught=done.returncode != 0, failed=failed, seconds=time.monotonic() - start)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--only", action="append", default=[], metavar="NAME", help="run only this bug (repeatable)"
  )
  parser.add_argument("--list", action="store_true", help="list the bugs and exit")
  parser.add_argument("--jobs", type=int, default=2, help="bugs tested at once (default 2)")
  args = parser.parse_args(argv)

  names = [bug.name for bug in BUGS]
  if len(set(names)) != len(names):
    raise SystemExit("planted_bugs: duplicate bug names")
  unknown = sorted(set(args.only) - set(names))
  if unknown:
    raise SystemExit(f"--only: unknown bug(s) {unknown}; see --list")
  bugs = [bug for bug in BUGS if not args.only or bug.name in args.only]
  if args.list:
    for bug in bugs:
      print(f"{bug.name:34} {bug.file:28} {' '.join(bug.tests)}")
    return 0
  if args.jobs < 1:
    raise SystemExit(f"--jobs: must be >= 1, got {args.jobs}")
  check_snippets(bugs)

  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    results = []
    for result in pool.map(run_bug, bugs):
      verdict = "caught" if result["caught"] else "MISSED"
      print(
        f"{verdict:7} {result['bug'].name:34} {result['seconds']:5.0f}s  "
        f"{', '.join(result['failed'][:3])}",
        flush=True,
      )
      results.append(result)
  caught = sum(r["caught"] for r in results)
  print(f"{caught}/{len(results)} caught in {time.monotonic() - start:.0f}s")
  return 0 if caught == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
