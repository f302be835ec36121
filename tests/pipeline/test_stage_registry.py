"""The stage registry: the built-ins in the pipeline's order, a plugin stage placed where
it says, a taken name refused, and `--stages=all` dropping what each stage skips."""
from __future__ import annotations

import os

import pytest

from tinybert_tf.pipeline.main import parse_argv
from tinybert_tf.pipeline.preflight import PreflightError, resolve_stages
from tinybert_tf.pipeline.stages import (
    Stage,
    get_stage,
    register_stage,
    stage_names,
    stage_seed,
    unregister_stage,
    upstream,
)
from tinybert_tf.plugins import PluginError

STAGES = ("general", "finetune_teacher", "augment", "task", "quantize", "evaluate", "export")


def test_the_built_in_stages_register_in_the_pipelines_order():
    assert stage_names() == STAGES


def test_a_stage_registered_after_another_runs_right_after_it(tmp_path):
    register_stage(Stage("probe", lambda ctx: {}, upstream=lambda config: ["task"],
                         settings=lambda config: {}),
                   after="task")
    try:
        assert stage_names()[3:6] == ("task", "probe", "quantize")
        config = parse_argv(["bin/distill", f"--output_dir={tmp_path}"])
        assert "probe" in resolve_stages(["all"], config)
        assert resolve_stages(["export", "probe"], config) == ["probe", "export"]
        assert upstream("probe", config) == ["task"]
    finally:
        unregister_stage("probe")
    assert stage_names() == STAGES


def test_a_stage_registered_mid_pipeline_leaves_every_other_seed_as_it_was():
    before = {name: stage_seed(42, name) for name in STAGES}
    assert before == {name: 42 + i for i, name in enumerate(STAGES)}
    register_stage(Stage("probe", lambda ctx: {}, settings=lambda config: {}), after="general")
    try:
        assert {name: stage_seed(42, name) for name in STAGES} == before
        assert stage_seed(42, "probe") not in before.values()
        assert stage_seed(2**32 - 1, "export") == 5  # wraps into the seed's range
    finally:
        unregister_stage("probe")


def test_a_replaced_stage_keeps_its_seed():
    task = get_stage("task")
    register_stage(Stage("task", task.run), replace=True)
    try:
        assert stage_seed(42, "task") == 45
    finally:
        register_stage(task, replace=True)


def test_a_taken_stage_name_or_an_unknown_place_is_refused():
    with pytest.raises(PluginError, match="stage 'task' is already registered"):
        register_stage(Stage("task", lambda ctx: {}))
    with pytest.raises(PluginError, match="after='nowhere' is no registered stage"):
        register_stage(Stage("probe", lambda ctx: {}), after="nowhere")
    assert stage_names() == STAGES


def test_all_drops_the_stages_whose_output_a_flag_gives(tmp_path):
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--task_teacher=t",
                         "--general_model=g", "--nouse_augmented", "--noquantize"])
    assert resolve_stages(["all"], config) == ["task", "evaluate", "export"]
    assert upstream("evaluate", config) == ["task"]
    with pytest.raises(PreflightError, match="--noquantize; drop quantize from --stages"):
        resolve_stages(["quantize"], config)


def test_a_handover_flag_names_what_replaces_the_stage():
    assert get_stage("general").replaced_by == "--general_model=DIR"
    assert get_stage("finetune_teacher").replaced_by == "--task_teacher=DIR"
    assert get_stage("augment").replaced_by == "--nouse_augmented"  # its own, kept
    assert Stage("probe", lambda ctx: {}, handover_flag="probe_dir").replaced_by == \
        "--probe_dir=DIR"


def test_a_plugin_stage_is_checked_with_the_models_it_needs_and_planned(tmp_path, tiny_vocab):
    """A stage that declares `needs` gets those models inspected for its `checks`, and
    its `phases` come into the dry run's plan, sized on the task rows preflight read."""
    from tinybert_tf.distill.terms import HardLabelTerm
    from tinybert_tf.pipeline.main import run_argv
    from tinybert_tf.pipeline.stages import TASK_DATA, TASK_ROWS, TEACHER
    from tinybert_tf.pipeline.training.phases import plan_phase

    from pipeline_helpers import argv, tiny_flags
    seen = {}

    def checks(ctx, found):
        seen["teacher_layers"] = found.models.teacher.config.num_layers
        found.warnings.append("probe: checked")

    def phases(ctx, found, inputs):
        seen["rows"] = inputs.n_train
        return [plan_phase(ctx, "probe", "train", "task train split", inputs.n_train, 4,
                           "--task_batch_size", 2, 0, 1e-4, "linear", 0.1,
                           [HardLabelTerm(task=ctx.task.type)])]

    register_stage(Stage("probe", lambda ctx: {}, checks=checks, phases=phases,
                         settings=lambda config: {},
                         needs=frozenset({TEACHER, TASK_DATA, TASK_ROWS})), after="task")
    try:
        ns = tiny_flags(tmp_path, tiny_vocab, stages=["probe"], dry_run=True)
        plan = run_argv(["bin/distill", *argv(ns)])
    finally:
        unregister_stage("probe")
    assert seen["teacher_layers"] > 0 and seen["rows"] > 0
    assert "probe: checked" in plan["warnings"]
    (phase,) = plan["phases"]
    assert phase["stage"] == "probe" and phase["examples"] == seen["rows"]
    assert phase["steps"] == 2 * -(-seen["rows"] // 4)


def test_a_stage_needing_an_unknown_input_or_without_its_settings_is_refused():
    with pytest.raises(PluginError, match=r"stage 'probe': needs=\['vocab'\] are not among"):
        Stage("probe", lambda ctx: {}, needs=frozenset({"vocab"}))
    with pytest.raises(PluginError, match=r"stage 'probe': give settings=lambda config"):
        register_stage(Stage("probe", lambda ctx: {}))
    assert stage_names() == STAGES


@pytest.mark.parametrize("stages, reads", [(["general", "finetune_teacher"], 0),
                                           (["general", "finetune_teacher", "task"], 1)])
def test_the_plan_reads_the_augmented_rows_once_and_only_for_a_stage_that_needs_them(
        tmp_path, tiny_vocab, monkeypatch, stages, reads):
    """`AUGMENTED_ROWS`: the written augmented file (here --augmented_file, three copies
    of the training rows) is read for the task stage, whose phases it sizes, and not
    at all for a run whose stages never train on it."""
    from tinybert_tf.pipeline.main import run_argv
    from tinybert_tf.pipeline.run import context

    from pipeline_helpers import argv, tiny_flags
    ns = tiny_flags(tmp_path, tiny_vocab, stages=stages, dry_run=True)
    with open(os.path.join(ns.data_dir, "train.tsv"), encoding="utf-8") as f:
        header, *rows = f.readlines()
    os.makedirs(tmp_path / "aug")
    ns.augmented_file = str(tmp_path / "aug" / "train_aug.tsv")
    with open(ns.augmented_file, "w", encoding="utf-8") as f:
        f.writelines([header, *rows, *rows, *rows])
    splits, examples = [], context.Context.examples
    monkeypatch.setattr(context.Context, "examples",
                        lambda self, split: splits.append(split) or examples(self, split))
    plan = run_argv(["bin/distill", *argv(ns)])
    assert splits.count("train_aug") == reads
    task_phases = [p for p in plan["phases"] if p["stage"] == "task"]
    assert [p["examples"] for p in task_phases] == [3 * len(rows)] * len(task_phases)
    assert bool(task_phases) == bool(reads)
