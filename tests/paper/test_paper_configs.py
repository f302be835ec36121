"""configs/paper/: the main TinyBERT4 recipe, its Table 2-4 ablations (each one flag away
from it, dry-run here with tiny models given on the command line: the plan shows every
phase's loss terms and layer map), and the TinyBERT6 configs of every GLUE task and SQuAD."""
from __future__ import annotations

import glob
import json
import os

import pytest

from tinybert_tf.cli.flagfiles import expand_flagfiles
from tinybert_tf.distill.projections import Projections
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline.main import main

from pipeline_helpers import REPO, write_student_config, write_task, write_teacher

PAPER = os.path.join(REPO, "configs", "paper")
ABLATIONS = sorted(os.path.basename(p)[:-4]
                   for p in glob.glob(os.path.join(PAPER, "table[234]_*.cfg")))
GRID = [(16, 1e-5), (16, 2e-5), (16, 3e-5), (32, 1e-5), (32, 2e-5), (32, 3e-5)]


def parse(name: str, monkeypatch):
    monkeypatch.chdir("/")  # nested flagfiles resolve against the including file
    values = tb_flags.distill_flags()
    values(expand_flagfiles(["bin/distill",
                                      f"--flagfile={os.path.join(PAPER, name + '.cfg')}"]))
    return values


def test_every_ablation_of_tables_2_to_4_is_one_flag_away_from_the_main_recipe(monkeypatch):
    assert ABLATIONS == ["table2_no_da", "table2_no_gd", "table2_no_td", "table3_no_attn",
                         "table3_no_embd", "table3_no_hidn", "table3_no_pred",
                         "table3_no_trm", "table4_bottom", "table4_top", "table4_uniform"]
    main_values = parse("tinybert4", monkeypatch).flag_values_dict()
    for name in ABLATIONS:
        values = parse(name, monkeypatch).flag_values_dict()
        changed = {k for k in values if values[k] != main_values[k]}
        assert len(changed) <= 1, (name, changed)  # table4_uniform restates the default
        with open(os.path.join(PAPER, name + ".cfg"), encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        assert lines[0] == "--flagfile=tinybert4.cfg" and len(lines) == 2, name


def test_main_recipe_has_the_papers_task_distillation(monkeypatch):
    f = parse("tinybert4", monkeypatch)
    assert f.task_phases == ["intermediate", "prediction"] and f.student_init == "general"
    assert f.student_config == "tinybert_4l_312d" and f.layer_mapping == "uniform"
    assert f.loss_terms == ["embd", "attn", "hidn"] and f.temperature == 1.0
    assert (f.num_aug, f.replace_prob, f.num_candidates) == (20, 0.4, 15)
    assert f.task_batch_size == 32 and f.intermediate_epochs == 20
    assert f.intermediate_lr == pytest.approx(5e-5) and f.pred_epochs == 3
    assert [(int(b), float(lr)) for b, lr in (c.split(":") for c in f.pred_grid)] == GRID
    assert f.eval_every == 100 and f.max_seq_len == 0  # 64 single sentences, 128 pairs


@pytest.mark.parametrize("task,epochs", [("cola", 50), ("sst2", 20), ("mrpc", 20),
                                         ("stsb", 20), ("qqp", 10), ("mnli", 10),
                                         ("qnli", 10), ("rte", 20), ("wnli", 20)])
def test_tinybert6_config_of_every_glue_task(task, epochs, monkeypatch):
    f = parse(f"tinybert6_{task}", monkeypatch)
    assert f.student_config == "tinybert_6l_768d" and f.layer_mapping == "uniform"
    assert f.intermediate_epochs == epochs and f.data_dir.endswith(f.task)
    assert "general_tinybert6" in f.general_model and f.task_teacher and f.output_dir
    assert len(f.pred_grid) == 6 and f.task_phases == ["intermediate", "prediction"]


@pytest.mark.parametrize("version", ["11", "20"])
def test_tinybert6_squad_configs(version, monkeypatch):
    f = parse(f"tinybert6_squad{version}", monkeypatch)
    assert f.task == ("squad1.1" if version == "11" else "squad2.0")
    assert f.student_config == "tinybert_6l_768d" and f.max_seq_len == 384
    assert f.pred_grid == [] and f.pred_lr == pytest.approx(3e-5) and f.num_aug == 10


# --- dry runs with tiny models -----------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory, tiny_vocab):
    """The command line the recipes take: task, data, teacher, MLM model, word vectors and
    a General TinyBERT (with its projections), all tiny; a 4-layer teacher, so the three
    mappings differ for the 2-layer student."""
    tmp = tmp_path_factory.mktemp("paper")
    teacher = write_teacher(str(tmp / "teacher"), tiny_vocab, layers=4)
    general = str(tmp / "general")
    student = load_model(write_teacher(general, tiny_vocab, hidden=16, layers=2))
    save_model(student, general, attachments={
        "projections": (Projections(16, 32, 2).arrays(), {"teacher_hidden_size": 32})})
    vectors = tmp / "vectors.txt"
    vectors.write_text("".join(f"{w} {i % 3 * 0.5} 0.25 {i * 0.1:.1f}\n"
                               for i, w in enumerate(["good", "great", "bad", "movie"])))
    mlm = write_teacher(str(tmp / "mlm"), tiny_vocab, head="mlm")
    return ["--task=sst-2", f"--data_dir={write_task(str(tmp / 'task'), train=64)}",
            f"--teacher={teacher}", f"--mlm_model={mlm}",
            f"--word_vectors={vectors}", f"--general_model={general}",
            "--student_config=" + write_student_config(str(tmp / "s.json"), len(tiny_vocab),
                                                       layers=2),
            f"--output_dir={tmp / 'out'}", "--dry_run"]


def _plan(name, tiny_inputs, capsys):
    code = main(["bin/distill", f"--flagfile={os.path.join(PAPER, name + '.cfg')}",
                 *tiny_inputs])
    assert code == 0, capsys.readouterr().err
    plan = json.loads(capsys.readouterr().out)
    return plan, [p for p in plan["phases"] if p["stage"] == "task"]


def _terms(phase):
    return [t["name"] for t in phase["loss_terms"]]


@pytest.mark.parametrize("name", ["tinybert4", *ABLATIONS])
def test_recipe_dry_runs_and_its_plan_shows_each_phases_terms_and_layer_map(
        name, tiny_inputs, capsys):
    plan, task = _plan(name, tiny_inputs, capsys)
    shared = [p for p in task if "grid_cell" not in p]
    cells = [p for p in task if "grid_cell" in p]
    assert [(c["grid_cell"]["batch"], c["grid_cell"]["lr"]) for c in cells] == GRID
    for phase in task:
        assert "loss_terms" in phase and "layer_mapping" in phase and "projections" in phase
    for cell in cells:
        assert cell["evaluation"]["every"] == "100 steps"
    last = _terms(cells[0])
    mapping = {"table4_top": [3, 4], "table4_bottom": [1, 2]}.get(name, [2, 4])
    intermediate = {"table3_no_embd": ["attn", "hidn"], "table3_no_attn": ["embd", "hidn"],
                    "table3_no_hidn": ["embd", "attn"],
                    "table3_no_trm": ["embd"]}.get(name, ["embd", "attn", "hidn"])
    if name == "table2_no_td":  # the General TinyBERT fine-tuned on the augmented set
        assert shared == [] and last == ["hard"]
        assert "augment" in plan["stages"]
        assert all(c["data"] == "augmented train split" for c in cells)
        return
    (first,) = shared
    assert _terms(first) == intermediate and first["layer_mapping"] == mapping
    assert last == (["hard"] if name == "table3_no_pred" else ["pred"])
    assert cells[0]["layer_mapping"] is None
    assert first["projections"] == ("new" if name == "table2_no_gd" else "general model")
    assert not any("projections" in w for w in plan["warnings"])
    if name == "table2_no_gd":
        assert "general_model" not in plan["models"]
    if name == "table2_no_da":
        assert "augment" not in plan["stages"]
        assert {p["data"] for p in task} == {"task train split"}
    else:
        assert "augment" in plan["stages"] and first["data"] == "augmented train split"


def test_without_td_differs_from_the_main_recipe_in_its_task_phases_only(tiny_inputs, capsys):
    """w/o TD is the main recipe with task distillation replaced by fine-tuning on the same
    (augmented) data: every other part of the plan (stages, models, teacher fine-tuning,
    quantize) is the main recipe's. Table 7's TinyBERT (GD) is that on the original data."""
    main_plan, main_task = _plan("tinybert4", tiny_inputs, capsys)
    no_td, no_td_task = _plan("table2_no_td", tiny_inputs, capsys)
    gd, gd_task = _plan("table7_tinybert_gd", tiny_inputs, capsys)
    assert {k: v for k, v in no_td.items() if k != "phases"} == \
        {k: v for k, v in main_plan.items() if k != "phases"}
    assert [p for p in no_td["phases"] if p["stage"] != "task"] == \
        [p for p in main_plan["phases"] if p["stage"] != "task"]
    assert [_terms(p) for p in main_task] != [_terms(p) for p in no_td_task]
    assert {p["data"] for p in no_td_task} == {p["data"] for p in main_task} \
        == {"augmented train split"}
    # TinyBERT (GD): the same phases on the original training set, no augment stage.
    assert [p["phase"] for p in gd_task] == [p["phase"] for p in no_td_task]
    assert {p["data"] for p in gd_task} == {"task train split"}
    assert "augment" in no_td["stages"] and "augment" not in gd["stages"]
    assert gd["stages"] != no_td["stages"]


def test_bert_small_runs_only_from_the_pretrained_checkpoint_it_is_given(tiny_inputs, capsys):
    """table1_bert_small.cfg trains nothing before the task: without --general_model (the
    released BERT-Small) it stops at its placeholder, naming the flag, instead of
    general-distilling a TinyBERT and calling it BERT-Small; given one, it fine-tunes it."""
    flagfile = f"--flagfile={os.path.join(PAPER, 'table1_bert_small.cfg')}"
    without = [a for a in tiny_inputs if not a.startswith("--general_model=")]
    assert main(["bin/distill", flagfile, *without]) == 2
    err = capsys.readouterr().err
    assert "--general_model=models/bert_uncased_L-4_H-512_A-8: no such folder" in err
    plan, task = _plan("table1_bert_small", tiny_inputs, capsys)
    assert "general" not in plan["stages"] and "augment" not in plan["stages"]
    assert {tuple(_terms(p)) for p in task} == {("hard",)}
