"""Every benchmark and tool script loads: its imports of the package still resolve; and
every bin/ tool starts TensorFlow through the start-up filter before the package.

These scripts run for minutes to hours and no other test runs them, so a renamed or
moved name in the package would break them unnoticed. Loading a script runs its
imports and definitions, not its `main`.
"""
from __future__ import annotations

import ast
import glob
import json
import os

import numpy as np
import pytest

from pipeline_helpers import REPO, load_script

SCRIPTS = sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.py"))
                 + glob.glob(os.path.join(REPO, "tools", "*.py")))
# Run with a Python that has torch (never in .venv): parsed here, not loaded.
TORCH_SCRIPTS = {"bench_distill_torch.py", "bench_task_distill_torch.py"}


def test_there_are_scripts_to_check():
    names = {os.path.basename(p) for p in SCRIPTS}
    assert {"bench_quantize.py", "bench_task_distill.py", "demo_ab.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_script_loads_without_running_its_main(path):
    name = os.path.basename(path)
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    assert any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body), f"{name}: main() must run only under __main__"
    if name in TORCH_SCRIPTS:
        return
    assert callable(getattr(load_script(path), "main", None)), f"{name} has no main()"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "bin", "*"))),
                         ids=os.path.basename)
def test_a_bin_tool_starts_tensorflow_through_the_filter_before_the_package(path):
    """`start_tensorflow()` drops the CUDA probe's error on a machine without a GPU
    (tests/cli/test_messages.py runs one tool to show it); a tool that imports the
    package first printed `failed call to cuInit` (bin/reproduce did)."""
    body = ast.parse(open(path, encoding="utf-8").read(), path).body
    starts = [i for i, node in enumerate(body) if isinstance(node, ast.Expr)
              and ast.unparse(node.value) == "start_tensorflow()"]
    package = [i for i, node in enumerate(body) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("tinybert_tf")
               and node.module != "tinybert_tf.startup"]
    assert starts and package and starts[0] < package[0], os.path.basename(path)


def test_bench_quantize_counts_disagreements_by_the_float_top2_gap():
    bench = load_script(os.path.join(REPO, "benchmarks", "bench_quantize.py"))
    # Float top-2 gaps of 1, 3, 6, 12 and 40 int8 steps (1/256); the int8 flavour turns
    # the labels of the 3- and the 12-step rows.
    p1 = 0.5 + np.array([1, 3, 6, 12, 40]) / 512.0
    reference = np.stack([1 - p1, p1], 1)
    outputs = reference.copy()
    outputs[[1, 3]] = outputs[[1, 3]][:, ::-1]
    bands = bench.near_tie_bands(reference, outputs)
    assert list(bands) == ["<2", "<4", "<8", "<16"]
    assert [bands[k]["disagreements"] for k in bands] == [0, 1, 1, 2]
    assert [bands[k]["share"] for k in bands] == [0.2, 0.4, 0.6, 0.8]
    assert all(b["of"] == 2 for b in bands.values())


def test_wiki_kinds_splits_people_and_places_by_article(tmp_path):
    """The real-text task of the 4-layer quantize benchmark (docs/deploy.md): the
    documented sizes, both kinds in each split, and no dev sentence in train."""
    import csv
    import io
    kinds = load_script(os.path.join(REPO, "benchmarks", "wiki_kinds.py"))
    assert kinds.build(str(tmp_path)) == {"train": 7300, "dev": 1234}
    rows = {split: list(csv.DictReader(io.StringIO(
                (tmp_path / f"{split}.csv").read_text(encoding="utf-8"), newline="")))
            for split in ("train", "dev")}
    assert {r["label"] for r in rows["dev"]} == {"person", "place"}
    assert sum(r["label"] == "person" for r in rows["dev"]) == 620
    assert sum(r["label"] == "person" for r in rows["train"]) == 2937
    assert not {r["text"] for r in rows["dev"]} & {r["text"] for r in rows["train"]}
    assert set(kinds.DEV) < set(kinds.PEOPLE) | set(kinds.PLACES)


def _flag_values(args):
    """--name=value / --noname / --name -> {name: value}."""
    out = {}
    for a in args:
        name, _, value = a[2:].partition("=")
        out[name] = value
    return out


def test_glue_ablation_cells_each_change_one_thing_from_the_recipe():
    ablations = load_script(os.path.join(REPO, "benchmarks", "glue_ablations.py"))
    # Where a cell's data comes from (its stages, the recipe's augmented file) is
    # plumbing; what is trained and on what differs in the cell's one flag.
    plumbing = {"stages", "augmented_file"}

    def args(cell):
        return _flag_values(ablations.cell_args(cell, "7", "GENERAL", "START", "AUG.tsv"))

    recipe = args("tinybert")
    assert recipe == {"stages": "augment,task", "general_model": "GENERAL", "seed": "7"}
    expected = {"no_gd": {"general_model": "START"}, "no_td": {"task_phases": "finetune"},
                "no_da": {"nouse_augmented": ""}}
    assert set(expected) | {"tinybert"} == set(ablations.CELLS)
    for cell, change in expected.items():
        mine = args(cell)
        changed = {k: v for k, v in mine.items()
                   if k not in plumbing and recipe.get(k) != v}
        dropped = set(recipe) - set(mine) - plumbing
        assert changed == change and not dropped, cell
        assert mine["stages"] == "task"  # the recipe's cell ran the augment stage
        assert mine.get("augmented_file") == (None if cell == "no_da" else "AUG.tsv")


def test_glue_ablation_summary_pairs_each_cell_with_the_recipe_per_seed():
    ablations = load_script(os.path.join(REPO, "benchmarks", "glue_ablations.py"))

    def run(score, diff=None, ci=None):
        r = {"dev": {"f1": score}}
        if diff is not None:
            r["paired_with_recipe"] = {"difference_points": diff, "ci95_points": ci,
                                       "mcnemar_p": 0.01}
        return r

    results = {"primary_metric": "f1", "cells": ["tinybert", "no_da", "no_td"], "runs": {
        "tinybert": {"42": run(0.80), "1": run(0.84)},
        "no_da": {"42": run(0.70, -10.0, [-14.0, -6.0]), "1": run(0.76, -8.0, [-12.0, -4.0])},
        "no_td": {"42": run(0.82, 2.0, [-1.0, 5.0]), "1": run(0.80, -4.0, [-7.0, -1.0])}},
        "pooled": {"no_da": {"difference_points": -9.0, "ci95_points": [-12.5, -5.5]},
                   "no_td": {"difference_points": -1.0, "ci95_points": [-3.0, 1.2]}}}
    ablations.summarise(results)
    s = results["summary"]
    assert s["tinybert"]["mean"] == 82.0 and s["tinybert"]["sd"] == round(
        100 * float(np.std([0.80, 0.84], ddof=1)), 3)
    assert "difference_mean" not in s["tinybert"]
    assert (s["no_da"]["difference_mean"], s["no_da"]["seeds_below_recipe"]) == (-9.0, 2)
    assert s["no_da"]["difference_sd"] == round(float(np.std([-10.0, -8.0], ddof=1)), 2)
    assert s["no_da"]["beyond_noise"] is True  # the pooled interval is below 0
    assert s["no_td"]["beyond_noise"] is False  # it holds 0
    assert s["no_td"]["seeds"] == ["1", "42"]
    md = ablations.markdown({**results, "task": "MRPC", "teacher_dev": 85.0})
    assert "| w/o DA (distilled on the original data) | 1, 42 | 73.0 ± 4.2 | -9.0 ± 1.4 | " \
           "[-12.5, -5.5] | 2 of 2 |" in md, md
    for per_seed in results["runs"].values():
        for r in per_seed.values():
            r["dev"]["accuracy"] = r["dev"]["f1"] - 0.05
    results["pooled_accuracy"] = {"no_da": {"difference_points": -9.0,
                                            "ci95_points": [-13.0, -5.0]}}
    accuracy = ablations.accuracy_markdown(results)
    assert "| w/o DA (distilled on the original data) | 68.0 ± 4.2 | -9.0 | [-13.0, -5.0] |" \
        in accuracy, accuracy
    assert "| w/o TD (fine-tuned on the augmented data) | 76.0 ± 1.4 | – | – |" in accuracy


def test_glue_ablation_pooled_difference_resamples_dev_once_for_all_seeds(tmp_path):
    ablations = load_script(os.path.join(REPO, "benchmarks", "glue_ablations.py"))
    gold = np.array([0, 1] * 50)
    # Seed 1: the cell gets 10 more rows right than the recipe; seed 2: 4 fewer.
    preds = {"tinybert/seed1": gold.copy(), "no_da/seed1": gold.copy(),
             "tinybert/seed2": gold.copy(), "no_da/seed2": gold.copy()}
    preds["tinybert/seed1"][:10] ^= 1
    preds["no_da/seed2"][20:24] ^= 1

    class Dev:  # glue_paired.DevSet's interface, accuracy as the metric
        def __init__(self):
            self.gold = gold

        def score(self, pred, y):
            return float(np.mean(pred == y))

        def predictions(self, results_dir, model):
            assert results_dir == str(tmp_path)
            return preds[model]

    out = ablations.pooled_difference(Dev(), str(tmp_path), "no_da", ["1", "2"],
                                      resamples=500)
    assert out["difference_points"] == 3.0  # (+10 - 4) / 2 points over 100 rows
    low, high = out["ci95_points"]
    assert low < 3.0 < high and high - low < 12
    same = ablations.pooled_difference(Dev(), str(tmp_path), "tinybert", ["1", "2"],
                                       resamples=50)
    assert same["difference_points"] == 0.0 and same["ci95_points"] == [0.0, 0.0]


def test_glue_scripts_refuse_a_teacher_fine_tuned_for_another_tasks_labels(tmp_path,
                                                                          tiny_vocab):
    from tinybert_tf.config import BertConfig
    from tinybert_tf.models import BertModel
    from tinybert_tf.models.checkpoint import save_model

    meta = load_script(os.path.join(REPO, "benchmarks", "glue_meta.py"))
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=1,
                        num_heads=4, intermediate_size=64, max_position_embeddings=64)
    for name, labels in (("mrpc", ["0", "1"]), ("rte", ["not_entailment", "entailment"])):
        save_model(BertModel(config, vocab=tiny_vocab, head="classifier", num_labels=2,
                             label_names=labels), str(tmp_path / name))
    meta.check_teacher_labels(str(tmp_path / "rte"), "RTE", "--task_teacher", "s.py")
    with pytest.raises(SystemExit) as e:
        meta.check_teacher_labels(str(tmp_path / "mrpc"), "RTE", "--task_teacher", "s.py")
    message = str(e.value)
    assert message.startswith(f"s.py: --task_teacher={tmp_path / 'mrpc'} ")
    assert "['0', '1']" in message and "entailment" in message and "--task=RTE" in message


def test_glue_student_knows_every_model_of_the_table_it_must_not_overwrite():
    """glue_student.py writes the table's model names out (importing glue_results starts
    TensorFlow): they must be the names glue_results writes predictions under."""
    student = load_script(os.path.join(REPO, "benchmarks", "glue_student.py"))
    results = load_script(os.path.join(REPO, "benchmarks", "glue_results.py"))
    assert student.TABLE_MODELS == tuple(name for name, _ in results.MODEL_ROWS)


def test_glue_student_refuses_a_missing_int8_file_or_another_tasks_results(tmp_path,
                                                                          tiny_vocab):
    import subprocess
    import sys

    from tinybert_tf.config import BertConfig
    from tinybert_tf.data import glue
    from tinybert_tf.export.tflite import tflite_file
    from tinybert_tf.models import BertModel
    from tinybert_tf.models.checkpoint import save_model

    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=1,
                        num_heads=4, intermediate_size=64, max_position_embeddings=64)
    labels = [str(n) for n in glue.get_task("SST-2").label_names]
    save_model(BertModel(config, vocab=tiny_vocab, head="classifier", num_labels=2,
                         label_names=labels), str(tmp_path / "teacher"))
    (tmp_path / "run").mkdir()
    script = os.path.join(REPO, "benchmarks", "glue_student.py")
    common = [sys.executable, script, "--task=SST-2", f"--data_dir={tmp_path}",
              f"--teacher={tmp_path / 'teacher'}", f"--student_dir={tmp_path / 'run'}",
              "--name=qat", f"--results_dir={tmp_path / 'results'}"]
    done = subprocess.run(common + ["--int8_name=tinybert_int8_qat_tflite"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("benchmarks/glue_student.py: --int8_name: ")
    # The script names the file before TensorFlow starts: the export stage's name for it.
    assert str(tmp_path / "run" / "export" / tflite_file("int8")) in last
    assert not (tmp_path / "results").exists()
    # A table model's name would overwrite its predictions: refused at the flags.
    done = subprocess.run(common + ["--int8_name=tinybert_int8_tflite"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "--int8_name: the table's models" in done.stderr
    # One results folder holds several tasks: another task's <name>.json is kept.
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "qat.json").write_text('{"task": "MRPC", "models": {}}')
    done = subprocess.run(common, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "qat.json holds --name=qat on MRPC" in last and "--name=qat_sst-2" in last
    assert (tmp_path / "results" / "qat.json").read_text() == '{"task": "MRPC", "models": {}}'


def test_bench_ffn_units_prunes_a_layer_as_zeroing_the_dropped_units_would():
    """The pruned layer computes what the full layer computes with the dropped units'
    output rows set to zero; keeping every unit gives the full layer back."""
    from tinybert_tf.models.layers import TransformerLayer
    bench = load_script(os.path.join(REPO, "benchmarks", "bench_ffn_units.py"))
    rng = np.random.default_rng(0)
    full = TransformerLayer(4, 8, 64, dropout=0.0, attention_dropout=0.0, name="full")
    full.build((None, None, 32))
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")
    reference = full(x, mask)[0].numpy()
    np.testing.assert_allclose(bench.pruned_layer(full, np.arange(64), 32)(x, mask)[0],
                               reference, atol=1e-5)
    kept = np.array([1, 4, 5, 20, 33, 63])
    pruned = bench.pruned_layer(full, kept, 32)(x, mask)[0].numpy()
    w_out = full.feedforward_output_dense.kernel
    zeroed = w_out.numpy().copy()
    zeroed[np.setdiff1d(np.arange(64), kept)] = 0.0
    w_out.assign(zeroed)
    np.testing.assert_allclose(pruned, full(x, mask)[0].numpy(), atol=1e-5)
    assert np.abs(pruned - reference).max() > 1e-2
    # Padded tokens are left out of the error.
    a = np.zeros((1, 3, 2), "float32")
    b = a.copy()
    a[0, 0], a[0, 1] = [1, 0], [-1, 0]
    b[0, 0], b[0, 1], b[0, 2] = [1, 0], [-1, 0.5], [100, 100]
    assert bench.relative_error(b, a, np.array([[1, 1, 0]])) == pytest.approx(0.5 / np.sqrt(2))


def test_glue_results_names_a_shape_with_its_ffn_only_where_it_is_not_4h():
    from tinybert_tf.config import get_config
    bench = load_script(os.path.join(REPO, "benchmarks", "glue_results.py"))
    assert bench.shape_name(get_config("minilm_2l_384d")) == "2x384"
    assert bench.shape_name(get_config("tinybert_4l_312d")) == "4x312, FFN 1200"
    assert bench.shape_name(get_config("minilm_3l_384d_ffn768")) == "3x384, FFN 768"


def test_glue_flavour_names_a_missing_table_or_student_before_tensorflow_starts(tmp_path):
    import subprocess
    import sys

    (tmp_path / "results.json").write_text('{"tasks": {"SST-2": {"primary_metric": "accuracy"}}}')
    script = os.path.join(REPO, "benchmarks", "glue_flavour.py")

    def last_line(task):
        done = subprocess.run([sys.executable, script, f"--task={task}",
                               f"--student_dir={tmp_path / 'run'}", f"--results_dir={tmp_path}"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        return done.stderr.strip().splitlines()[-1]

    assert last_line("MRPC").startswith(f"benchmarks/glue_flavour.py: --results_dir: "
                                        f"{tmp_path / 'results.json'} holds no MRPC table")
    line = last_line("SST-2")
    assert line.startswith("benchmarks/glue_flavour.py: --student_dir: ")
    assert str(tmp_path / "run" / "task" / "model") in line and "SST-2/tinybert" in line
    assert json.loads((tmp_path / "results.json").read_text())["tasks"].keys() == {"SST-2"}


def test_glue_refuses_to_mix_two_recipes_in_one_table_before_anything_runs(tmp_path):
    import subprocess
    import sys

    table = {"config": "configs/glue_minilm.cfg", "extra": ["--seed=1"], "tasks": {}}
    (tmp_path / "results.json").write_text(json.dumps(table))
    script = os.path.join(REPO, "benchmarks", "glue.py")
    done = subprocess.run([sys.executable, script, f"--results_dir={tmp_path}",
                           f"--work_dir={tmp_path / 'work'}", "--extra=--seed=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"benchmarks/glue.py: --results_dir: {tmp_path / 'results.json'} "
                           "holds a table of --config=configs/glue_minilm.cfg --extra=--seed=1")
    # The default --config is the recommended student's.
    assert "this run has --config=configs/glue_minilm_3l.cfg --extra=--seed=1" in line
    assert "another --results_dir" in line and not (tmp_path / "work").exists()
    assert json.loads((tmp_path / "results.json").read_text()) == table


def test_glue_keeps_another_seed_out_of_the_default_table(tmp_path):
    """The default --results_dir is seed 42's table of the default config: a run with
    --extra=--seed=1 and no --results_dir of its own is refused, while the flags the config
    sets already (its seed 42, its float32 teacher) make no other recipe."""
    import subprocess
    import sys

    meta = load_script(os.path.join(REPO, "benchmarks", "glue_meta.py"))
    own = meta.config_lines(os.path.join(REPO, "configs", "glue_minilm_3l.cfg"))
    assert {"--seed=42", "--teacher_precision=float32",
            "--student_config=minilm_3l_384d_ffn768"} <= own  # nested glue_minilm.cfg read
    assert not any(line.startswith(("#", "--flagfile=")) for line in own)
    table = {"config": "configs/glue_minilm_3l.cfg", "extra": [], "tasks": {}}
    (tmp_path / "results.json").write_text(json.dumps(table))
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "glue.py"),
                           f"--results_dir={tmp_path}", f"--work_dir={tmp_path / 'work'}",
                           "--extra=--seed=42,--teacher_precision=float32,--seed=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.endswith("Give another --results_dir (e.g. "
                         "benchmarks/results/glue/<student>/seed<N>).")
    assert "holds a table of --config=configs/glue_minilm_3l.cfg, and this run has " \
        "--config=configs/glue_minilm_3l.cfg --extra=--seed=1:" in line
    assert not (tmp_path / "work").exists()


def test_glue_ablations_keep_one_recipe_per_table(tmp_path):
    """A results folder whose <Task>.json holds another recipe's cells (another --config,
    or another teacher) is refused before TensorFlow starts, and the table is left as it
    was; a table older than a recorded field is compared on the fields it has."""
    import subprocess
    import sys

    ablations = os.path.join(REPO, "benchmarks", "glue_ablations.py")
    teacher, general = tmp_path / "teacher", tmp_path / "general"
    teacher.mkdir()
    general.mkdir()
    table = {"config": "configs/glue_minilm.cfg", "task_teacher": str(teacher),
             "runs": {"tinybert": {"42": {"dev": {"f1": 0.8}}}}}
    (tmp_path / "MRPC.json").write_text(json.dumps(table))

    def refused(*args: str) -> str:
        done = subprocess.run([sys.executable, ablations, "--task=MRPC",
                               f"--results_dir={tmp_path}", f"--work_dir={tmp_path / 'work'}",
                               f"--general_model={general}", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert not (tmp_path / "work").exists()
        assert json.loads((tmp_path / "MRPC.json").read_text()) == table
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(f"benchmarks/glue_ablations.py: --results_dir: "
                               f"{tmp_path / 'MRPC.json'} holds the cells of another recipe")
        assert line.endswith("Give another --results_dir (e.g. benchmarks/results/glue/"
                             "<student>/ablations), or that table's flags to resume it.")
        return line

    line = refused("--config=configs/glue_minilm_3l.cfg", f"--task_teacher={teacher}")
    assert "(--config=configs/glue_minilm.cfg there, --config=configs/glue_minilm_3l.cfg " \
        "here)" in line
    line = refused(f"--task_teacher={general}")
    assert f"(--task_teacher={teacher} there, --task_teacher={general} here)" in line

    module = load_script(ablations)
    module.FLAGS(["glue_ablations.py", "--task=MRPC", f"--task_teacher={teacher}",
                  f"--general_model={general}", "--extra=--seed=3,--teacher_precision=float32"])
    try:
        current = module.recipe()  # the config sets the float32 teacher already
        assert current == {"config": "configs/glue_minilm.cfg", "extra": ["--seed=3"],
                           "task_teacher": str(teacher), "general_model": str(general)}
        module.check_same_recipe(table, "MRPC.json", current)  # no extra/general recorded
        with pytest.raises(SystemExit, match=r"--extra= there, --extra=--seed=3 here"):
            module.check_same_recipe({**table, "extra": []}, "MRPC.json", current)
    finally:
        module.FLAGS.unparse_flags()


def test_glue_refuses_an_unknown_task_or_a_folder_without_its_tsvs_before_anything_runs(
        tmp_path):
    import subprocess
    import sys

    def refusal(*args: str) -> str:
        done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "glue.py"),
                               f"--results_dir={tmp_path / 'results'}",
                               f"--work_dir={tmp_path / 'work'}", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        return done.stderr.strip().splitlines()[-1]

    line = refusal("--tasks=rte,MNLI", f"--glue_dir={tmp_path}")
    assert line == ("benchmarks/glue.py: --tasks=rte,MNLI: MNLI unknown; this benchmark "
                    "scores SST-2, MRPC, RTE (their metrics and the paper's Table 1 figures "
                    "are in benchmarks/glue_meta.py).")
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    line = refusal("--tasks=rte", f"--glue_dir={tmp_path}")
    assert line.startswith(f"benchmarks/glue.py: --glue_dir={tmp_path}: {tmp_path / 'RTE'} "
                           "holds no dev.tsv, test.tsv; give the folder with RTE/ in the GLUE "
                           "TSV layout")
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


def test_a_failed_distill_run_is_reported_with_its_error_line(tmp_path):
    meta = load_script(os.path.join(REPO, "benchmarks", "glue_meta.py"))
    log = tmp_path / "log.txt"
    log.write_text("== finetune_teacher\n[finetune_teacher] step 3/30\n"
                   "distill: error: --teacher_lr=-1.0: must be > 0.\n\n")
    assert meta.last_error(str(log)) == "distill: error: --teacher_lr=-1.0: must be > 0."
    log.write_text("Traceback (most recent call last):\nMemoryError\n")
    assert meta.last_error(str(log)) == "MemoryError"
    assert meta.last_error(str(tmp_path / "absent.txt")) == ""
