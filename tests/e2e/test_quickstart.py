"""The quickstart flagfile (configs/quickstart_text_classification.cfg): a newcomer's CSV
through every stage to a served model with the embedded teacher; here at toy size."""
from __future__ import annotations

import json
import os

import pytest

from tinybert_tf.pipeline.main import run_argv

from pipeline_helpers import QUICKSTART, read_json, write_reviews_csv


@pytest.fixture(scope="module")
def quickstart(quickstart_run):
    """The flagfile as shipped, with toy models, data and step caps on the command line
    (conftest's session run, which tests/e2e/test_own_data.py reads too)."""
    return quickstart_run.folder / "out", quickstart_run.results


def test_the_quickstart_runs_every_stage_to_a_served_model(quickstart):
    out, results = quickstart
    assert list(results) == ["general", "finetune_teacher", "augment", "task", "evaluate",
                             "export"]
    assert os.path.isfile(out / "export" / "serving" / "1" / "saved_model.pb")
    assert os.path.isfile(out / "export" / "model_float32.tflite")
    report = read_json(str(out / "report.json"))
    assert report["student"]["dev"]["accuracy"] >= 0
    assert read_json(str(out / "task" / "model" / "config.json"))["label_names"] == [
        "negative", "positive"]


def test_the_quickstart_bounds_teacher_fine_tuning_by_steps(quickstart):
    """24 rows x 5 epochs at batch 4 would be 30 steps; --teacher_max_steps stops it."""
    out, _ = quickstart
    done = read_json(str(out / "finetune_teacher" / "train" / "phase_done.json"))
    assert done["steps"] == 3


def test_the_quickstart_as_shipped_plans_the_embedded_teacher(tmp_path, capsys):
    """The newcomer's dry run: the embedded teacher and student, general distillation
    on the shipped Wikipedia sample, every phase capped."""
    train = write_reviews_csv(tmp_path / "train.csv", 40, 0)
    dev = write_reviews_csv(tmp_path / "dev.csv", 10, 1)
    plan = run_argv(["bin/distill", f"--flagfile={QUICKSTART}", f"--train_file={train}",
                     f"--validation_file={dev}", f"--output_dir={tmp_path / 'out'}",
                     "--dry_run"])
    capsys.readouterr()
    assert plan["stages"] == ["general", "finetune_teacher", "augment", "task", "evaluate",
                              "export"]
    assert plan["models"]["teacher"]["layers"] == 6
    assert plan["models"]["student_config"]["num_layers"] == 1
    steps = {(p["stage"], p["phase"]): p["steps"] for p in plan["phases"]}
    assert steps[("general", "distill")] == 60
    assert steps[("finetune_teacher", "train")] <= 400
    assert all(steps[("task", p)] <= 300 for p in ("intermediate", "prediction"))
    assert json.dumps(plan)  # the plan is plain JSON
