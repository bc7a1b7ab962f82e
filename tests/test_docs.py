"""The user documents against the code they describe."""

import ast
import csv
import dataclasses
import importlib.util
import json
import pathlib
import re
import tomllib

import flax.linen as nn
import pytest

from tools import findings_significance, results_tables, traced_numbers
from txf import configs, models
from txf.configs import base
from txf.rundir.metrics import METRICS_FILE
from txf.rundir.resume import CONFIG_FILE, FREE_DATA_FIELDS, FREE_MODEL_FIELDS, RESUME_SECTIONS
from txf.sweep import grid, results

ROOT = pathlib.Path(__file__).resolve().parents[1]
# docs/data holds findings' raw outputs (a sweep's own results.md among them), not pages.
RAW_OUTPUTS = ROOT / "docs" / "data"
PAGES = [page for page in sorted((ROOT / "docs").rglob("*.md")) if RAW_OUTPUTS not in page.parents]
USER_DOCS = [ROOT / "README.md", *PAGES]


def load_hooks():
  """docs/hooks.py, the MkDocs hooks that write pages' generated text."""
  spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_resume_rules_name_the_fields_the_code_checks():
  hooks = load_hooks()
  paragraph = hooks.resume_rules()
  for section in RESUME_SECTIONS:  # what a resumed run must keep
    assert f"`{section}`" in paragraph, section
  model = paragraph[paragraph.index("the `model` section except") + len("the `model`") :]
  assert set(re.findall(r"`(\w+)`", model[: model.index(")")])) == set(FREE_MODEL_FIELDS)
  listed = paragraph[paragraph.index("every `data` field except") + len("every `data`") :]
  kept_free, defining = listed[: listed.index(")")].split(":")
  assert set(re.findall(r"`(\w+)`", kept_free)) == set(FREE_DATA_FIELDS)
  assert set(re.findall(r"`(\w+)`", defining)) == set(base.get_config().data) - set(
    FREE_DATA_FIELDS
  )
  may_change = paragraph[paragraph.index("may change") :]
  for section in set(base.get_config()) - set(RESUME_SECTIONS):
    assert f"`{section}`" in may_change, section


def test_the_running_page_gets_the_generated_resume_rules():
  hooks = load_hooks()
  page = (ROOT / "docs" / "running.md").read_text()
  assert page.count(hooks.RESUME_RULES_MARKER) == 1
  built = hooks.on_page_markdown(page)
  assert hooks.RESUME_RULES_MARKER not in built
  assert hooks.resume_rules() in built
  # The README points there instead of keeping a copy that could drift.
  assert "A resumed run must keep" not in (ROOT / "README.md").read_text()


def bash_blocks(text):
  return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_the_readme_test_command_is_what_ci_runs():
  readme = (ROOT / "README.md").read_text()
  start = readme.index("## Quickstart")
  quickstart = readme[start : readme.index("\n## ", start + 1)]
  main_job, tests = (block.strip() for block in bash_blocks(quickstart))
  assert main_job.endswith("txf-run --config=rope")
  ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
  assert tests == ci
  for page in ("getting-started.md", "testing.md"):
    blocks = bash_blocks((ROOT / "docs" / page).read_text())
    assert tests in [block.strip() for block in blocks], page


def test_the_python_the_documents_ask_for_is_the_one_pyproject_requires():
  required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
  assert required.startswith(">=")
  for path in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
    asked = re.findall(r"Python (>= ?[\d.]+)", path.read_text())
    assert asked and {a.replace(" ", "") for a in asked} == {required}, (path.name, asked)


def test_commands_in_the_documents_are_the_installed_ones():
  # `python -m experiments.X` is a checkout's (No module named 'experiments'
  # for a pip user): code blocks show `txf-X --config=NAME`, and the checkout
  # form is prose (python -m benchmarks.run, a checkout's tool, stays).
  for path in USER_DOCS:
    text = path.read_text()
    commands = "".join(re.findall(r"```(?:bash|python)\n(.*?)```", text, re.S))
    assert "python -m experiments." not in commands, path.name
    installed = [line for line in commands.splitlines() if line.lstrip().startswith("txf-")]
    assert not [line for line in installed if "--config=configs/" in line], path.name
  assert "python -m experiments." not in (ROOT / "docs" / "quickstart.ipynb").read_text()


def test_the_run_commands_of_a_block_train_in_their_own_work_directories():
  """Two txf-run lines of one block in one work directory (named by
  --workdir, else by the config: txf-run's default) make the second a
  resume of the first, refused where it changes a setting: extending.md's
  log_distance pair, the second with another log_bias_scale, did."""
  for path in USER_DOCS:
    for block in bash_blocks(path.read_text()):
      runs = [line for line in block.splitlines() if line.startswith("txf-run ")]
      workdirs = [
        (re.search(r"--workdir=\S+", line) or re.search(r"--config=\S+", line)).group(0)
        for line in runs
      ]
      assert len(set(workdirs)) == len(workdirs), (path.name, runs)


def test_every_page_is_in_the_site_navigation():
  nav = (ROOT / "mkdocs.yml").read_text()
  docs = ROOT / "docs"
  for page in [*PAGES, *docs.rglob("*.ipynb")]:
    assert str(page.relative_to(docs)) in nav, page


def test_every_shipped_sweep_is_on_the_sweeps_page():
  page = (ROOT / "docs" / "sweeps.md").read_text()
  sweeps = [name for name in configs.names() if name.startswith("sweeps/")]
  assert "sweeps/pe_ln" in sweeps and "sweeps/mqar_linear_steps" in sweeps
  missing = [name for name in sweeps if f"`{name.removeprefix('sweeps/')}.py`" not in page]
  assert not missing, f"docs/sweeps.md does not list {missing}"


def test_no_page_links_to_a_file_left_out_of_the_site():
  # mkdocs.yml's exclude_docs: docs/data/ (raw outputs) and *.py. `mkdocs build
  # --strict` fails on such a link through the hook; this checks the pages without a build.
  hooks = load_hooks()
  excluded = lambda path: path.startswith("data/") or path.endswith(".py")
  page = "See [a](data/x/circuits.json), [b](../README.md), [c](results.md#data), ![f](data/f.png)"
  assert hooks.excluded_links(page, "sub/p.md", excluded) == []
  assert hooks.excluded_links(page, "p.md", excluded) == ["data/x/circuits.json", "data/f.png"]
  docs = ROOT / "docs"
  for path in sorted(docs.rglob("*.md")):
    page = path.relative_to(docs).as_posix()
    if not excluded(page):
      assert hooks.excluded_links(path.read_text(), page, excluded) == [], page


def test_user_documents_link_only_inside_the_repository():
  for path in USER_DOCS:
    for target in re.findall(r"\]\(([^)#]+)", path.read_text()):
      if not target.startswith(("http://", "https://")):
        assert (path.parent / target).resolve().is_relative_to(ROOT), (path.name, target)
        assert (path.parent / target).exists(), (path.name, target)
    assert "../shared" not in path.read_text(), path.name


def test_user_documents_tell_no_development_history():
  history = re.compile(r"\bissue[ -]?\d|\bagents?\b|\bsession\b|consolidation of", re.I)
  for path in [*USER_DOCS, ROOT / "docs" / "quickstart.ipynb"]:
    found = history.findall(path.read_text())
    assert not found, (path.name, found)


def test_the_api_reference_shows_each_models_call_and_every_model_field():
  # Decoder and Encoder showed a one-line docstring and no call (mkdocstrings'
  # filter '!^_' dropped __call__); ModelConfig listed no fields.
  griffe = pytest.importorskip("griffe")  # the docs extra
  spec = importlib.util.spec_from_file_location("griffe_txf", ROOT / "docs" / "griffe_txf.py")
  extension = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(extension)
  filters = re.search(r"filters: (\[.*\])", (ROOT / "mkdocs.yml").read_text()).group(1)

  def shown(name):  # mkdocstrings' rule: the last filter that matches decides
    keep = True
    for rule in ast.literal_eval(filters):
      if re.search(rule.lstrip("!"), name):
        keep = not rule.startswith("!")
    return keep

  assert shown("__call__") and not shown("_OneStackModel") and not shown("__init__")
  package = griffe.load(
    "txf.models",
    search_paths=[str(ROOT)],
    extensions=griffe.load_extensions(extension.IndentedBlocks()),
  )
  modules = [
    name
    for name in models.__all__
    if isinstance(getattr(models, name), type)
    if issubclass(getattr(models, name), nn.Module)
  ]
  assert {"Decoder", "Encoder", "EncoderDecoder", "LSTMLanguageModel"} <= set(modules)
  for name in modules:
    call = package[name].final_target.members["__call__"]  # its own, so the page shows it
    sections = {section.kind.value: section for section in call.docstring.parse("google")}
    documented = [parameter.name for parameter in sections["parameters"].value]
    assert documented == [p.name for p in call.parameters if p.name != "self"], name
  config = package["ModelConfig"].final_target
  for field in dataclasses.fields(models.ModelConfig):
    assert config.members[field.name].docstring is not None, field.name


def test_the_pre_commit_hooks_run_what_ci_runs_pinned_as_the_test_extra():
  yaml = pytest.importorskip("yaml")  # the docs extra's (mkdocs reads yaml)
  (repo,) = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
  hooks = {hook["id"]: hook for hook in repo["hooks"]}
  ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].split(" && ")
  assert [hook["entry"] for hook in hooks.values()] == [
    step for step in ci if step.startswith(("ruff", "mypy"))
  ]
  test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  test_extra = test_extra["optional-dependencies"]["test"]
  ruff = next(requirement for requirement in test_extra if requirement.startswith("ruff"))
  assert hooks["ruff-check"]["additional_dependencies"] == [ruff]
  assert hooks["ruff-format"]["additional_dependencies"] == [ruff]
  assert hooks["mypy"]["language"] == "system"  # the environment's: the test extra's mypy
  assert all(hook["pass_filenames"] is False for hook in hooks.values())  # the whole tree


def test_the_citation_and_changelog_give_the_version_and_licence_txf_has():
  import txf

  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  citation = (ROOT / "CITATION.cff").read_text()
  assert re.search(r"^cff-version: 1\.2\.0$", citation, re.M)
  assert re.search(r"^version: (.+)$", citation, re.M).group(1) == txf.__version__
  assert re.search(r"^license: (.+)$", citation, re.M).group(1) == project["license"]
  changelog = (ROOT / "CHANGELOG.md").read_text()
  assert re.findall(r"^## (\S+)", changelog, re.M)[0] == txf.__version__
  assert "dist/" in (ROOT / ".gitignore").read_text().splitlines()


def assert_same_csv(actual: pathlib.Path, expected: pathlib.Path) -> None:
  """The two CSV files' cells equal:
  numbers within rtol 1e-12, text exactly."""
  read = lambda text: list(csv.reader(text.splitlines()))
  got, want = read(actual.read_text()), read(expected.read_text())
  assert [len(row) for row in got] == [len(row) for row in want], actual.name
  for got_row, want_row in zip(got, want):
    for a, b in zip(got_row, want_row):
      try:
        assert float(a) == pytest.approx(float(b), rel=1e-12, nan_ok=True), (a, b)
      except ValueError:
        assert a == b


# docs/data/<dir> -> the sweep whose raw outputs it holds: configs/sweeps/<sweep>.py[:setting].
SWEEP_DATA = {
  "docs/data/pe_ln": "pe_ln",
  "docs/data/pe_ln_seeds": "pe_ln_seeds",
  "docs/data/pe_ln_confirm": "pe_ln_confirm",
  "docs/data/t5_distance": "t5_distance",
  "docs/data/ln_warmup_long": "ln_warmup:long",
  "docs/data/ln_warmup": "ln_warmup",
  "docs/data/mqar_scale": "mqar_scale",
  "docs/data/mqar_steps": "mqar_steps",
  "docs/data/mqar_linear": "mqar_linear",
  "docs/data/mqar_linear_steps": "mqar_linear_steps",
  "docs/data/mqar_lr": "mqar_lr",
  "docs/data/mqar_lstm_lr": "mqar_lstm_lr",
}


def test_every_results_table_is_written_from_committed_raw_outputs():
  page = (ROOT / "docs" / "results.md").read_text()
  assert re.findall(r"^<!-- results_table: (\S+) -->$", page, re.M) == list(SWEEP_DATA)
  assert results_tables.rewrite(page) == page


@pytest.mark.parametrize("data_dir", SWEEP_DATA)
def test_the_sweep_results_table_is_its_committed_raw_outputs(tmp_path, data_dir):
  """A results table of docs/results.md, as tools/results_tables.py writes it
  from docs/data/<sweep>; that directory's results.csv and results.md are the
  sweep's own summary of the points' metrics.jsonl and extrapolation.json
  beside them; and the tool would notice a changed replica's loss."""
  data = ROOT / data_dir
  sweep, _, setting = SWEEP_DATA[data_dir].partition(":")
  config_file = ROOT / "txf" / "configs" / "sweeps" / f"{sweep}.py"
  points = grid.expand(configs.load(config_file, *[setting] if setting else []))
  rows = [results.summarize_point(point, data / point.name) for point in points]
  assert [row.status for row in rows] == ["done"] * len(points)
  for written in results.write_results(rows, tmp_path):
    if written.suffix == ".csv":  # full precision: numpy's last digit varies by release
      assert_same_csv(written, data / written.name)
    else:
      committed = (data / written.name).read_text()
      assert written.read_text() == committed, written.name
  point = points[0].name
  (tmp_path / point).mkdir()
  for other in points[1:]:
    (tmp_path / other.name).symlink_to(data / other.name)
  if (data / point / results.EXTRAPOLATION_FILE).exists():
    record = json.loads((data / point / results.EXTRAPOLATION_FILE).read_text())
    record["replica_loss"]["sliding"][0][0] += 0.01
    (tmp_path / point / results.EXTRAPOLATION_FILE).write_text(json.dumps(record))
  else:  # a recall table, from results.csv: summarised again from a changed metrics.jsonl
    (tmp_path / point / CONFIG_FILE).symlink_to(data / point / CONFIG_FILE)
    rows = [json.loads(line) for line in (data / point / METRICS_FILE).read_text().splitlines()]
    last_eval = [row for row in rows if "eval_accuracy/0" in row][-1]
    last_eval["eval_accuracy/0"] = 1.0 - last_eval["eval_accuracy/0"]
    lines = [json.dumps(row) for row in rows]
    (tmp_path / point / METRICS_FILE).write_text("\n".join(lines) + "\n")
    changed = [results.summarize_point(p, tmp_path / p.name) for p in points]
    results.write_results(changed, tmp_path)
  assert results_tables.table(tmp_path) != results_tables.table(data)


def test_the_findings_significance_tables_are_the_rule_on_their_raw_outputs():
  """docs/results.md's significance tables, as tools/findings_significance.py
  writes them from the per-replica values in docs/data (section 1 alone, whose
  raw outputs were not kept, from its table's cells); a results table that is
  not its data's is refused."""
  page = (ROOT / "docs" / "results.md").read_text()
  markers = re.findall(r"^<!-- findings_significance: (\w+)=", page, re.M)
  assert markers == ["seeds"] + ["data"] * 3 + ["noise"] + ["data"] * 13
  assert findings_significance.rewrite(page) == page
  changed = page.replace("| RoPE | post | 1.614 ± 0.003 |", "| RoPE | post | 1.700 ± 0.003 |")
  with pytest.raises(ValueError, match="does not round to the table's"):
    findings_significance.rewrite(changed)


def test_every_measured_number_of_the_findings_is_traced_or_marked():
  """tools/traced_numbers.py finds no number of docs/results.md that neither
  committed data gives nor a not-recomputable region holds; it flags, with
  its line, a prose number with one digit changed (the T5 distance 64
  model's loss at 128 tokens, 1.535), and one the control's region held
  once the region is gone; a region that does not say so is refused."""
  page = (ROOT / "docs" / "results.md").read_text()
  assert traced_numbers.untraced(page) == []
  prose = "(1.536 / 1.535 / 1.548), where the sweep measured"
  line = page[: page.index(prose)].count("\n") + 1
  changed = page.replace(prose, prose.replace("1.535", "1.525"))
  assert traced_numbers.untraced(changed) == [(line, "1.525")]
  control = page.index("<!-- not recomputable -->\n| encoding (Pre-LN) |")
  unmarked = page[:control] + page[control:].replace("<!-- not recomputable -->", "", 1)
  assert "1.515" in [number for _, number in traced_numbers.untraced(unmarked)]
  silent = page.replace("its table's included, is not recomputable", "its table's included, are")
  with pytest.raises(ValueError, match="a not-recomputable region that does not say so"):
    traced_numbers.untraced(silent)


def test_a_significance_row_is_scipys_test_on_the_committed_replicas():
  """pe_ln_seeds' "T5 bias < sinusoidal (pre-LN)": the paired t-test (same
  seeds, same data seeds) on each replica's final validation loss read here
  from metrics.jsonl, scipy's ttest_rel; its Holm p is 6 x p (the smallest
  of the table's 6). Welch's would differ: the row says which test it is."""
  from scipy import stats

  def final(point):
    rows = [json.loads(line) for line in (point / METRICS_FILE).read_text().splitlines()]
    last = [row for row in rows if "eval_loss/0" in row][-1]
    return [last[f"eval_loss/{r}"] for r in range(3)]

  data = RAW_OUTPUTS / "pe_ln_seeds"
  t5 = final(data / "position=t5_bias,norm_placement=pre")
  sinusoidal = final(data / "position=sinusoidal,norm_placement=pre")
  want = stats.ttest_rel(t5, sinusoidal)
  page = (ROOT / "docs" / "results.md").read_text().splitlines()
  (row,) = [line for line in page if line.startswith("| T5 bias < sinusoidal (pre-LN) | -0.121")]
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert cells[3] == "paired" and float(cells[4]) == pytest.approx(want.statistic, abs=0.005)
  assert float(cells[6]) == pytest.approx(want.pvalue, abs=5e-4)
  assert float(cells[7]) == pytest.approx(6 * want.pvalue, abs=5e-4)
  # Its 95% interval: scipy's for the mean paired difference, printed to 3 decimals.
  interval = want.confidence_interval(0.95)
  low, high = (float(x) for x in cells[2].strip("[]").split(","))
  assert (low, high) == pytest.approx((interval.low, interval.high), abs=5e-4)


def significance_rows(page: list[str]) -> list[list[str]]:
  """The cells of each pair row the marker at the end of `page` writes."""
  table = findings_significance.rewrite("\n".join(page)).splitlines()[len(page) :]
  return [[cell.strip() for cell in row.split("|")[1:-1]] for row in table[2:]]


def test_a_significance_marker_tests_the_column_it_names_over_one_field_rows():
  """A table whose one field is an ordered setting (its cells are numbers)
  compares each setting with its neighbour in the setting's order, whatever
  the ranking; column= picks the tested column by its title. With seeds=N
  (no raw outputs), Welch's t and interval from the table's numbers, against
  scipy's on the same means and stds, and Holm over the table's 2
  comparisons."""
  from scipy import stats

  page = [
    "| max distance | val @128 | sliding @2048 |",
    "|---|---|---|",
    "| 32 | 1.600 ± 0.010 | 2.400 ± 0.020 |",
    "| 128 | 1.610 ± 0.010 | 2.600 ± 0.010 |",
    "| 512 | 1.590 ± 0.020 | 2.500 ± 0.030 |",
    "",
    '<!-- findings_significance: seeds=3 column="sliding @2048" -->',
  ]
  table = findings_significance.rewrite("\n".join(page)).splitlines()[len(page) :]
  # Neighbours 32-128 and 128-512, not the ranking's 32-512 and 512-128.
  assert [row.split("|")[1].strip() for row in table[2:]] == ["32 < 128", "512 < 128"]
  want = stats.ttest_ind_from_stats(2.400, 0.020, 3, 2.600, 0.010, 3, equal_var=False)
  other = stats.ttest_ind_from_stats(2.500, 0.030, 3, 2.600, 0.010, 3, equal_var=False)
  assert want.pvalue < other.pvalue
  df = table[2].split("|")[6].strip()
  holm_p = 2 * want.pvalue  # the smaller of 2 p-values
  # The Welch-Satterthwaite interval of the difference, by hand (float64).
  var = 0.020**2 / 3 + 0.010**2 / 3
  nu = var**2 / ((0.020**2 / 3) ** 2 / 2 + (0.010**2 / 3) ** 2 / 2)
  half = stats.t.ppf(0.975, nu) * var**0.5
  ci = f"[{-0.2 - half:+.3f}, {-0.2 + half:+.3f}]"
  assert table[2] == (
    f"| 32 < 128 | -0.200 | {ci} | Welch, table | {want.statistic:.2f} | {df} "
    f"| {want.pvalue:.1e} | {holm_p:.3f} | yes |"
  )
  assert table[0].endswith("| Holm p (of 2) | resolved |")
  # Without column=, the first m ± s column (validation) is tested.
  by_validation = findings_significance.rewrite(
    "\n".join(page[:-1] + [page[-1].split(" column")[0] + " -->"])
  )
  assert "| 32 < 128 |" in by_validation and "| 512 < 128 |" in by_validation
  # Categories (cells that are not numbers): each against the next in the ranking.
  named = [line.replace("| 32 |", "| a |").replace("| 128 |", "| b |") for line in page]
  named = [line.replace("| 512 |", "| c |") for line in named]
  table = findings_significance.rewrite("\n".join(named)).splitlines()[len(page) :]
  assert [row.split("|")[1].strip() for row in table[2:]] == ["a < c", "c < b"]
  with pytest.raises(ValueError, match="column='sliding @4096' is not a title"):
    findings_significance.rewrite("\n".join(page).replace('@2048" -->', '@4096" -->'))


def test_a_step_marker_tests_an_earlier_evaluation_of_the_committed_replicas():
  """step=960 on ln_warmup_long: Pre-LN with warmup against without at 1e-2,
  scipy's ttest_rel on each replica's validation loss logged at step 960 in
  metrics.jsonl; a step with no evaluation is refused."""
  from scipy import stats

  def at(point, step):
    rows = [json.loads(line) for line in (point / METRICS_FILE).read_text().splitlines()]
    row = [row for row in rows if row.get("step") == step and "eval_loss/0" in row][-1]
    return [row[f"eval_loss/{r}"] for r in range(3)]

  data = RAW_OUTPUTS / "ln_warmup_long"
  with_warmup = at(data / "norm_placement=pre,warmup_steps=120,learning_rate=0.01", 960)
  without = at(data / "norm_placement=pre,warmup_steps=0,learning_rate=0.01", 960)
  want = stats.ttest_rel(with_warmup, without)
  page = (ROOT / "docs" / "results.md").read_text().splitlines()
  start = page.index("<!-- findings_significance: data=docs/data/ln_warmup_long step=960 -->")
  (row,) = [
    line
    for line in page[start : start + 15]
    if line.startswith("| warmup steps 120 < 0 (LN pre, peak lr 0.01) |")
  ]
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert float(cells[4]) == pytest.approx(want.statistic, abs=0.005)
  assert float(cells[6]) == pytest.approx(want.pvalue, abs=5e-4) and cells[-1] == "no"
  bad = "\n".join(page[: start + 1]).replace("step=960", "step=961")
  with pytest.raises(ValueError, match="no evaluation at step 961"):
    findings_significance.rewrite(bad)


def test_a_noise_marker_pools_the_seed_variance_of_the_points_every_sweep_holds():
  """noise=pe_ln_confirm,pe_ln_seeds,pe_ln: the six common points' final
  losses, pooled variance by hand (float64) and scipy's two-sided F p."""
  from scipy import stats

  def final(point):
    rows = [json.loads(line) for line in (point / METRICS_FILE).read_text().splitlines()]
    last = [row for row in rows if "eval_loss/0" in row][-1]
    return [v for k, v in last.items() if re.fullmatch(r"eval_loss/\d+", k)]

  names = sorted(
    p.name for p in (RAW_OUTPUTS / "pe_ln_seeds").glob("*/metrics.jsonl") for p in [p.parent]
  )
  pooled = {}
  for sweep in ("pe_ln_seeds", "pe_ln_confirm"):
    samples = [final(RAW_OUTPUTS / sweep / name) for name in names]
    squares = sum(sum((x - sum(s) / len(s)) ** 2 for x in s) for s in samples)
    df = sum(len(s) - 1 for s in samples)
    pooled[sweep] = (squares / df, df)
  ratio = pooled["pe_ln_confirm"][0] / pooled["pe_ln_seeds"][0]
  p = 2 * min(stats.f.sf(ratio, 12, 12), stats.f.cdf(ratio, 12, 12))
  page = (ROOT / "docs" / "results.md").read_text().splitlines()
  (row,) = [line for line in page if line.startswith("| pe_ln_confirm / pe_ln_seeds |")]
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert len(names) == 6 and pooled["pe_ln_seeds"][1] == 12
  assert cells[1] == f"{pooled['pe_ln_confirm'][0] ** 0.5:.4f} (12)"
  assert cells[2] == f"{pooled['pe_ln_seeds'][0] ** 0.5:.4f} (12)"
  assert float(cells[3]) == pytest.approx(ratio, abs=0.005)
  assert float(cells[5]) == pytest.approx(p, abs=5e-4)


def test_a_significance_marker_compares_the_first_field_at_each_value_of_the_second():
  """(model, width) rows: the models are ranked at each width, never one width
  against another; with two leading cells the (encoding, pre/post) rule holds."""
  page = [
    "| model | width | val loss | val accuracy |",
    "|---|---|---|---|",
    "| decoder | 32 | 1.000 ± 0.100 | 0.500 ± 0.400 |",
    "| decoder | 64 | 0.001 ± 0.001 | 1.000 ± 0.001 |",
    "| LSTM | 32 | 3.000 ± 0.010 | 0.070 ± 0.002 |",
    "| LSTM | 64 | 2.900 ± 0.010 | 0.080 ± 0.002 |",
    "",
    '<!-- findings_significance: seeds=3 column="val accuracy" -->',
  ]
  rows = significance_rows(page)
  assert [row[0] for row in rows] == [
    "LSTM < decoder (width 32)",
    "LSTM < decoder (width 64)",
  ]
  assert [row[-1] for row in rows] == ["no", "yes"]


def test_a_significance_marker_on_three_fields_compares_rows_that_differ_in_one():
  """(LN, warmup, lr) rows: each two rows that differ in one field, lower
  loss first, the others named; rows differing in two fields are not paired."""
  page = [
    "| LN | warmup steps | peak lr | val loss |",
    "|---|---|---|---|",
    "| pre | 0 | 0.01 | 1.800 ± 0.010 |",
    "| post | 0 | 0.01 | 3.200 ± 0.010 |",
    "| post | 60 | 0.01 | 3.100 ± 0.500 |",
    "| pre | 60 | 0.003 | 1.900 ± 0.010 |",
    "",
    "<!-- findings_significance: seeds=3 -->",
  ]
  rows = significance_rows(page)
  assert [row[0] for row in rows] == [
    "LN pre < post (warmup steps 0, peak lr 0.01)",
    "warmup steps 60 < 0 (LN post, peak lr 0.01)",
  ]
  assert [row[-1] for row in rows] == ["yes", "no"]


# (attention, width, learning rate) rows over 3 seeds: tuned= and where= tests.
ATTENTION_WIDTH_RATE = [
  "| attention | width | learning rate | val loss | val accuracy |",
  "|---|---|---|---|---|",
  "| softmax | 32 | 0.001 | 2.000 ± 0.010 | 0.300 ± 0.010 |",
  "| softmax | 32 | 0.01 | 2.100 ± 0.010 | 0.500 ± 0.010 |",
  "| linear | 32 | 0.001 | 2.200 ± 0.010 | 0.400 ± 0.010 |",
  "| linear | 32 | 0.01 | 2.500 ± 0.010 | 0.100 ± 0.010 |",
  "| softmax | 64 | 0.001 | 0.100 ± 0.010 | 0.990 ± 0.010 |",
  "| softmax | 64 | 0.01 | 3.000 ± 0.010 | 0.050 ± 0.010 |",
  "| linear | 64 | 0.001 | 2.300 ± 0.010 | 0.200 ± 0.010 |",
  "| linear | 64 | 0.01 | 2.400 ± 0.010 | 0.250 ± 0.010 |",
  "",
]


def test_a_tuned_column_compares_each_setting_at_its_best_value():
  """tuned="learning rate": each (attention, width) keeps the rate of its
  best accuracy (the highest; the lowest loss where a loss is tested), then
  the attentions are ranked at each width; a tuned column that is not a
  leading one is refused."""
  page = [
    *ATTENTION_WIDTH_RATE,
    '<!-- findings_significance: seeds=3 column="val accuracy" tuned="learning rate" -->',
  ]
  rows = significance_rows(page)
  assert [row[:2] for row in rows] == [
    ["linear (learning rate 0.001) < softmax (learning rate 0.01) (width 32)", "-0.100"],
    ["linear (learning rate 0.01) < softmax (learning rate 0.001) (width 64)", "-0.740"],
  ]
  by_loss = significance_rows(
    page[:-1] + ['<!-- findings_significance: seeds=3 tuned="learning rate" -->']
  )
  assert [row[0] for row in by_loss] == [
    "softmax (learning rate 0.001) < linear (learning rate 0.001) (width 32)",
    "softmax (learning rate 0.001) < linear (learning rate 0.001) (width 64)",
  ]
  with pytest.raises(ValueError, match="tuned='peak lr' is not a leading column"):
    significance_rows(page[:-1] + ['<!-- findings_significance: seeds=3 tuned="peak lr" -->'])


def test_a_where_marker_tests_one_models_settings_against_their_neighbours():
  """where="model=LSTM" on (model, width) rows: the LSTM's widths, each
  against its neighbour (Holm over those 2), named with the condition; a
  condition on no leading column, one that is not TITLE=CELL and one that
  leaves a single row are refused."""
  from scipy import stats

  page = [
    "| model | width | val loss | val accuracy |",
    "|---|---|---|---|",
    "| decoder | 32 | 1.000 ± 0.100 | 0.500 ± 0.400 |",
    "| LSTM | 32 | 3.000 ± 0.010 | 0.070 ± 0.002 |",
    "| LSTM | 64 | 2.900 ± 0.010 | 0.080 ± 0.002 |",
    "| LSTM | 128 | 2.800 ± 0.050 | 0.200 ± 0.100 |",
    "",
    '<!-- findings_significance: seeds=3 column="val accuracy" where="model=LSTM" -->',
  ]
  rows = significance_rows(page)
  assert [row[0] for row in rows] == ["32 < 64 (model LSTM)", "64 < 128 (model LSTM)"]
  first = stats.ttest_ind_from_stats(0.070, 0.002, 3, 0.080, 0.002, 3, equal_var=False)
  second = stats.ttest_ind_from_stats(0.080, 0.002, 3, 0.200, 0.100, 3, equal_var=False)
  assert first.pvalue < second.pvalue
  assert float(rows[0][7]) == pytest.approx(2 * first.pvalue, abs=5e-4)
  assert float(rows[1][7]) == pytest.approx(second.pvalue, abs=5e-4)
  for where, match in [
    ("size=64", "'size' is not a leading column"),
    ("model", "'model' is not TITLE=CELL"),
    ("model=decoder", "leaves 1 row"),
    ("model=LSTM; width=64", "leaves 1 row"),
  ]:
    with pytest.raises(ValueError, match=match):
      significance_rows(page[:-1] + [page[-1].replace('"model=LSTM"', f'"{where}"')])


def test_a_marker_of_two_sweeps_tests_each_sweeps_table_wherever_it_stands():
  """The 4500-step controls of docs/results.md (mqar_steps' LSTM, mqar_linear_
  steps' linear attention, with another sweep's table between them): the
  row is scipy's ttest_rel on the two points' final accuracies read from
  metrics.jsonl; a directory whose results table is not above is refused."""
  from scipy import stats

  def final(point):
    rows = [json.loads(line) for line in (point / METRICS_FILE).read_text().splitlines()]
    last = [row for row in rows if "eval_accuracy/0" in row][-1]
    return [last[f"eval_accuracy/{r}"] for r in range(3)]

  lstm = final(RAW_OUTPUTS / "mqar_steps" / "family=lstm,d_model=128")
  linear = final(RAW_OUTPUTS / "mqar_linear_steps" / "attention=linear,d_model=128")
  want = stats.ttest_rel(lstm, linear)
  page = (ROOT / "docs" / "results.md").read_text().splitlines()
  (row,) = [line for line in page if line.startswith("| LSTM < linear attention (width 128) |")]
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert cells[3] == "paired" and float(cells[4]) == pytest.approx(want.statistic, abs=0.005)
  assert float(cells[6]) == pytest.approx(want.pvalue, abs=5e-4) and cells[-1] == "no"
  two = "data=docs/data/mqar_steps+docs/data/mqar_linear_steps"
  marker = page.index(f'<!-- findings_significance: {two} column="val accuracy" -->')
  above = page[: page.index("<!-- results_table: docs/data/mqar_linear_steps -->")]
  with pytest.raises(ValueError, match="no results table of docs/data/mqar_linear_steps"):
    findings_significance.rewrite("\n".join(above + [page[marker]]))


def test_a_where_marker_keeps_the_other_columns_titles_for_the_pairs_and_tuned():
  """where= drops its columns' titles with its cells: on (attention, width,
  learning rate) rows, where="attention=linear" ranks the widths at each
  learning rate, named by that title ('(learning rate 0.001)', not the
  dropped column's neighbour's), and tuned= then finds its column among the
  titles left (with where's title kept it read past the rows' cells)."""
  page = ATTENTION_WIDTH_RATE
  marker = '<!-- findings_significance: seeds=3 column="val accuracy" {} -->'
  rows = significance_rows(page + [marker.format('where="attention=linear"')])
  # Linear attention's accuracies: at 0.001, 64 (0.200) < 32 (0.400);
  # at 0.01, 32 (0.100) < 64 (0.250): the difference is the first mean less the second.
  assert [row[:2] for row in rows] == [
    ["64 < 32 (learning rate 0.001) (attention linear)", "-0.200"],
    ["32 < 64 (learning rate 0.01) (attention linear)", "-0.150"],
  ]
  tuned = marker.format('tuned="learning rate" where="attention=softmax"')
  # Softmax's best accuracy at 32 is 0.500 (at 0.01), at 64 0.990 (at 0.001).
  assert [row[:2] for row in significance_rows(page + [tuned])] == [
    ["32 (learning rate 0.01) < 64 (learning rate 0.001) (attention softmax)", "-0.490"],
  ]


def test_a_data_marker_reads_the_table_its_own_directorys_last_line_heads():
  """data=DIR's table is the one under the last `results_table: DIR` line,
  exactly DIR (not a directory whose name begins with it, such as DIR_steps
  below it), and two tables of other leading columns are refused, not
  paired by position."""

  def table(first, width, loss):
    return ["| model | width | val loss |", "|---|---|---|", f"| {first} | {width} | {loss} |"]

  def head(name):
    return [findings_significance.TABLE_MARKER.format(f"docs/data/{name}")]

  page = (
    head("a") + table("old", "32", "9.000 ± 0.100") + [""]
    + head("a") + table("new", "32", "1.000 ± 0.100") + [""]
    + head("a_steps") + table("steps", "32", "5.000 ± 0.100") + [""]
    + head("b") + ["| model | val loss |", "|---|---|", "| other | 2.000 ± 0.100 |", ""]
  )  # fmt: skip
  titles, title, (rows,) = findings_significance._results_rows(page, None, ["docs/data/a"])
  assert (titles, title, rows) == (["model", "width"], "val loss", {("new", "32"): (1.0, 0.1)})
  with pytest.raises(ValueError, match="differ in their columns"):
    findings_significance._results_rows(page, None, ["docs/data/a", "docs/data/b"])


def test_a_sweep_without_extrapolation_gets_the_recall_table(tmp_path):
  """No extrapolation.json: the table holds the grid's fields, the validation
  loss and accuracy (mean ± std from results.csv) and the flatness."""
  header = ["point", "model.family", "model.d_model", "status", "replicas", "eval_loss"]
  header += ["eval_loss_std", "eval_accuracy", "eval_accuracy_std", "late_improvement", "flat"]
  with open(tmp_path / results.RESULTS_CSV, "w", newline="") as file:
    writer = csv.writer(file)
    writer.writerow(header)
    writer.writerow(
      [
        "family=decoder,d_model=32",
        "decoder",
        32,
        "done",
        2,
        1.5,
        0.01,
        0.9012,
        0.0123,
        0.004,
        "yes",
      ]
    )
    writer.writerow(
      ["family=lstm,d_model=32", "lstm", 32, "done", 2, 4.4, 0.02, 0.0459, 0.0062, 0.031, "no"]
    )
  assert results_tables.table(tmp_path) == [
    "| model | width | val loss | val accuracy | last fifth | flat |",
    "|---|---|---|---|---|---|",
    "| Transformer decoder | 32 | 1.500 ± 0.010 | 0.901 ± 0.012 | -0.4% | yes |",
    "| LSTM | 32 | 4.400 ± 0.020 | 0.046 ± 0.006 | -3.1% | no |",
  ]


def test_the_mqar_sizing_table_is_its_committed_runs():
  """docs/results.md section 4's sizing runs, row by row, from each run's
  committed config.json and the last evaluation of its metrics.jsonl."""
  page = (ROOT / "docs" / "results.md").read_text()
  runs = sorted((RAW_OUTPUTS / "mqar_sizing").iterdir())
  assert len(runs) == 8
  for run in runs:
    config = json.loads((run / CONFIG_FILE).read_text())
    evals = [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines()]
    last = [row for row in evals if "eval_accuracy" in row][-1]
    data, model, train = config["data"], config["model"], config["train"]
    family = "LSTM" if model["family"] == "lstm" else "decoder"
    row = (
      f"| `{run.name}` | {data['num_kv_pairs']} | {data['num_symbols']} | {data['seq_len']} "
      f"| {data['batch_size']} | {train['learning_rate']:g} | {family} {model['d_model']} "
      f"| {last['step']} | {last['eval_accuracy']:.3f} | 1/{data['num_symbols'] // 2} |"
    )
    assert row in page.splitlines(), row


SAMPLE_MARKER = re.compile(
  r"<!-- (sample: .*?(?:at|as of) ([0-9a-f]{7,40})\b.*?|not a sample: .+?) -->"
)


def test_every_output_sample_in_the_documents_names_the_commit_it_was_taken_at():
  """A command's output shown in a ```text block drifts from what the command
  prints: each carries a marker naming the commit it was taken at (or says
  it is no output), and that commit is in the repository's history."""
  import subprocess

  has_git = (ROOT / ".git").exists()
  for path in PAGES:
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
      if line.strip() != "```text":
        continue
      marker = SAMPLE_MARKER.fullmatch(lines[number - 1].strip())
      assert marker, f"{path.name}:{number + 1}: a ```text block without a sample marker"
      if marker[2] and has_git:
        found = subprocess.run(
          ["git", "cat-file", "-e", f"{marker[2]}^{{commit}}"], cwd=ROOT, capture_output=True
        )
        assert found.returncode == 0, f"{path.name}:{number + 1}: no commit {marker[2]}"


def test_the_running_page_names_the_text_tag_tensorboard_files_hold():
  from tensorboardX import summary

  from txf.rundir.metrics import SAMPLE_TAG

  (value,) = summary.text(SAMPLE_TAG, "a sample").value
  page = (ROOT / "docs" / "running.md").read_text()
  assert f"text summary (`{value.tag}`)" in page


def test_the_findings_tools_read_a_single_runs_unnumbered_metrics(tmp_path):
  """A point of one replica logs eval_loss, not eval_loss/0: the tools gave
  an IndexError and 'no evaluation at step' on such a sweep's outputs."""
  point = tmp_path / "point"
  point.mkdir()
  (point / CONFIG_FILE).write_text(json.dumps({"replicas": 1}))
  rows = [{"step": 5, "eval_loss": 2.5, "eval_accuracy": 0.25}, {"step": 9, "eval_loss": 2.0}]
  (point / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
  assert results_tables.replica_values(point, "val loss") == [2.0]
  assert findings_significance.values_at(point, "val accuracy", 5) == [0.25]
  assert findings_significance.values_at(point, "val loss", 9) == [2.0]
