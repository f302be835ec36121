"""The shipped flagfiles parse with bin/distill's flags and carry the paper's settings.

TinyBERT (Jiao et al., 2020) Sec. 4.2: general distillation at sequence
length 128 for 3 epochs; task distillation with batch 32, intermediate-layer
lr 5e-5 for 20 epochs (10 on MNLI/QQP/QNLI, 50 on CoLA), prediction layer 3
epochs at lr 3e-5, sequence length 64 for single sentences and 128 for pairs.
DistilBERT (Sanh et al., 2019): L = 5 L_ce + 2 L_mlm + 1 L_cos at temperature 2.
"""
from __future__ import annotations

import glob
import os

import pytest

from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline.configs import PipelineConfig
from tinybert_tf.pipeline.flagfiles import expand_flagfiles
from tinybert_tf.pipeline.preflight import resolve_stages

from pipeline_helpers import REPO

CONFIGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "configs", "*.cfg")))
TD_EPOCHS = {"cola": 50, "mnli": 10, "qqp": 10, "qnli": 10, "sst2": 20, "mrpc": 20,
             "stsb": 20, "rte": 20, "wnli": 20}
SINGLE_SENTENCE = {"cola", "sst2"}
# Included by other flagfiles (or bin/reproduce), not run alone: no --output_dir.
INCLUDED = {"td_common.cfg", "wiki_pairs_sizes.cfg"}


def parse(name: str, monkeypatch, tmp_path=None):
    """The flag values `bin/distill --flagfile=configs/NAME` would run with, parsed from
    outside the repository: nested flagfiles resolve against the including file."""
    monkeypatch.chdir(tmp_path or "/")
    values = tb_flags.distill_flags()  # a fresh FlagValues: the process-wide FLAGS stay as is
    values(expand_flagfiles(
        ["bin/distill", f"--flagfile={os.path.join(REPO, 'configs', name)}"]))
    return values


def test_every_task_has_a_config():
    assert {f"td_{t}.cfg" for t in TD_EPOCHS} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_parses(name, monkeypatch):
    values = parse(name, monkeypatch)
    if name not in INCLUDED:
        assert values.output_dir, name


def test_the_reproduce_sizes_leave_what_bin_reproduce_sets_to_it(monkeypatch):
    """bin/reproduce refuses --task, --stages and --output_dir in its flagfile."""
    sizes = parse("wiki_pairs_sizes.cfg", monkeypatch)
    for name in ("task", "stages", "output_dir"):
        assert not sizes[name].present, name
    run = parse("wiki_pairs.cfg", monkeypatch)
    assert run.task == "wiki_pairs" and run.max_seq_len == sizes.max_seq_len == 96


def test_the_reproduce_sizes_run_one_last_phase_at_one_learning_rate(monkeypatch):
    """On top of a table's cell (configs/paper/tinybert4.cfg has the paper's six-cell
    prediction grid), the 2-core sizes leave one prediction phase, and a cell that
    fine-tunes on the labels instead (w/o TD, w/o Pred) does so at the same rate."""
    monkeypatch.chdir("/")
    values = tb_flags.distill_flags()
    values(expand_flagfiles(["bin/distill", *(
        f"--flagfile={os.path.join(REPO, 'configs', name)}"
        for name in ("paper/table2_no_td.cfg", "wiki_pairs_sizes.cfg"))]))
    assert parse("paper/tinybert4.cfg", monkeypatch).pred_grid  # what the sizes undo
    assert values.pred_grid == [] and values.task_phases == ["finetune"]
    assert values.finetune_lr == values.pred_lr


@pytest.mark.parametrize("task", sorted(TD_EPOCHS))
def test_task_configs_follow_the_paper(task, monkeypatch):
    f = parse(f"td_{task}.cfg", monkeypatch)
    assert f.intermediate_epochs == TD_EPOCHS[task]
    assert f.task_batch_size == 32
    assert f.intermediate_lr == pytest.approx(5e-5)
    assert f.pred_epochs == 3 and f.pred_lr == pytest.approx(3e-5)
    assert f.max_seq_len == (64 if task in SINGLE_SENTENCE else 128)
    assert f.use_augmented and f.num_aug == 20 and f.replace_prob == pytest.approx(0.4)
    assert f.num_candidates == 15
    assert set(f.loss_terms) == {"embd", "attn", "hidn"} and f.layer_mapping == "uniform"
    assert f.student_config == "tinybert_4l_312d" and f.general_model


@pytest.mark.parametrize("name,student", [("general_tinybert4.cfg", "tinybert_4l_312d"),
                                          ("general_tinybert6.cfg", "tinybert_6l_768d")])
def test_general_configs_follow_the_paper(name, student, monkeypatch):
    f = parse(name, monkeypatch)
    assert f.stages == ["general"] and f.recipe == "tinybert"
    assert f.student_config == student
    assert f.general_max_seq_len == 128 and f.general_epochs == 3
    assert set(f.loss_terms) == {"embd", "attn", "hidn"}
    assert f.general_lr == pytest.approx(1e-4) and f.weight_decay == pytest.approx(0.01)


def test_distilbert_config_follows_the_paper(monkeypatch):
    f = parse("distilbert.cfg", monkeypatch)
    assert f.recipe == "distilbert" and f.student_config == "distilbert_6l"
    assert (f.alpha_ce, f.alpha_mlm, f.alpha_cos) == (5.0, 2.0, 1.0)
    assert f.distil_temperature == 2.0


def test_demo_config_runs_everything_on_the_embedded_default(monkeypatch):
    f = parse("demo.cfg", monkeypatch)
    assert f.stages == ["all"] and f.task == "polarity" and f.teacher == "minilm-l6"
    assert f.student_config == "minilm_1l_384d" and f.init_from_teacher
    assert not f.data_dir and not f.corpus  # the data installed with the package
    # The quantize stage runs between task and evaluate, and makes the export's int8.
    stages = resolve_stages(f.stages, PipelineConfig.from_flags(f))
    assert stages[stages.index("task"):] == ["task", "quantize", "evaluate", "export"]
    assert "int8" in f.export_formats and f.quantize_steps > 0
