"""The quickstart flagfile (configs/quickstart_text_classification.cfg): a newcomer's CSV
through every stage to a served model with the embedded teacher; here at toy size."""
from __future__ import annotations

import json
import os

import pytest

from tinybert_tf.pipeline.main import run_argv

from pipeline_helpers import REPO, read_json, write_corpus, write_reviews_csv, write_teacher

QUICKSTART = os.path.join(REPO, "configs", "quickstart_text_classification.cfg")


def _student_config(path: str, vocab_size: int) -> str:
    """One layer of the tiny teacher's shape (--init_from_teacher copies into it)."""
    from tinybert_tf.config import BertConfig
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_layers=1, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    with open(path, "w", encoding="utf-8") as f:
        f.write(config.to_json())
    return path


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, tiny_vocab):
    """The flagfile as shipped, with toy models, data and step caps on the command line."""
    tmp = tmp_path_factory.mktemp("quickstart")
    out = tmp / "out"
    argv = ["bin/distill", f"--flagfile={QUICKSTART}",
            f"--train_file={write_reviews_csv(tmp / 'train.csv', 24, 0)}",
            f"--validation_file={write_reviews_csv(tmp / 'dev.csv', 8, 1)}",
            f"--output_dir={out}",
            # Toy sizes: a 2-layer 32-wide teacher, a 1-layer student of its width.
            f"--teacher={write_teacher(str(tmp / 'teacher'), tiny_vocab)}",
            f"--student_config={_student_config(str(tmp / 'student.json'), len(tiny_vocab))}",
            f"--corpus={write_corpus(str(tmp / 'corpus.txt'))}",
            "--general_max_seq_len=32", "--general_batch_size=4", "--general_max_steps=2",
            "--teacher_batch_size=4", "--teacher_max_steps=3", "--max_seq_len=24",
            "--task_batch_size=4", "--task_max_steps=2", "--num_aug=1", "--checkpoint_every=2",
            "--latency_runs=1", "--export_latency_runs=1"]
    return out, run_argv(argv)


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
