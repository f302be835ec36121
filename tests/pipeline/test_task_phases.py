"""Task phases (--task_phases), the projections carried from general distillation, the
prediction-phase grid, DistilBERT's pre-classifier head and the dev-evaluation cost."""
from __future__ import annotations

import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.distill.projections import Projections, expected_shapes, mismatch
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import (
    CheckpointError,
    attachment_info,
    load_model,
    load_tokenizer,
    read_attachment,
    save_model,
)
from tinybert_tf.models.hf_io import export_hf
from tinybert_tf.pipeline.main import UsageError, main, run_argv
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.pipeline.training.phases import PHASE_KINDS, PhaseKind, parse_grid, phase_kinds
from tinybert_tf.tasks import Classification, Regression, task_type_of

from pipeline_helpers import (
    argv,
    read_json,
    run,
    tiny_flags,
    write_student_config,
    write_task,
    write_teacher,
)

# --- units ---------------------------------------------------------------------------------


def test_phase_list_is_checked_and_must_end_with_a_phase_that_trains_the_head():
    assert [k.name for k in phase_kinds(["intermediate", "prediction"])] == [
        "intermediate", "prediction"]
    with pytest.raises(ValueError, match=r"--task_phases=intermediate,predict: unknown "
                       r"phase\(s\) predict; .*intermediate, prediction, finetune"):
        phase_kinds(["intermediate", "predict"])
    with pytest.raises(ValueError, match=r"last phase \(intermediate\) does not train the "
                       r"task head"):
        phase_kinds(["prediction", "intermediate"])
    with pytest.raises(ValueError, match="no phase given"):
        phase_kinds([""])


def test_pred_grid_parses_batch_and_rate_cells_and_names_their_folders():
    cells = parse_grid(["16:1e-5", " 32:3e-5 "])
    assert [(c.batch, c.lr) for c in cells] == [(16, 1e-5), (32, 3e-5)]
    assert cells[0].folder("prediction") == "prediction_b16_lr1e-05"
    for bad in (["16"], ["0:1e-5"], ["16:-1"], ["a:1e-5"], ["16:1e-5", "16:1e-5"]):
        with pytest.raises(ValueError, match="--pred_grid"):
            parse_grid(bad)


def test_projections_round_trip_and_say_why_saved_ones_do_not_fit():
    p = Projections(16, 32, 2)
    q = Projections(16, 32, 2)
    q.assign(p.arrays())
    for k, v in p.arrays().items():
        np.testing.assert_array_equal(q.arrays()[k], v)
    assert set(p.arrays()) == {"W_e/kernel", "W_h/kernel"}
    assert mismatch(p.shapes(), expected_shapes(16, 32, 2)) is None
    assert "none were saved" in mismatch(None, p.shapes())
    assert "teacher of another width" in mismatch(expected_shapes(16, 48, 2), p.shapes())
    assert "--share_hidden_projection" in mismatch(expected_shapes(16, 32, 2, False),
                                                   p.shapes())
    with pytest.raises(ValueError, match="another width"):
        Projections(16, 48, 2).assign(p.arrays())


def test_attachments_travel_with_a_model_directory_that_still_loads_with_one_call(
        tmp_path, tiny_vocab, tiny_config):
    keras.utils.set_random_seed(5)
    model = BertModel(tiny_config, vocab=tiny_vocab)
    proj = Projections(32, 48, 2)
    path = save_model(model, str(tmp_path / "m"),
                      attachments={"projections": (proj.arrays(), {"teacher_hidden_size": 48})})
    assert os.path.isfile(tmp_path / "m" / "projections.safetensors")
    info = attachment_info(path, "projections")
    assert info["shapes"] == {"W_e/kernel": [32, 48], "W_h/kernel": [32, 48]}
    assert info["teacher_hidden_size"] == 48
    back = read_attachment(path, "projections")
    for k, v in proj.arrays().items():
        np.testing.assert_array_equal(back[k], v)
    loaded = load_model(path)  # the extra file changes nothing for the model
    assert set(loaded.weight_dict()) == set(model.weight_dict())
    # A model saved from it does not inherit the attachment it did not write.
    save_model(loaded, str(tmp_path / "again"))
    assert read_attachment(str(tmp_path / "again"), "projections") is None


def test_a_released_general_tinybert_loads_without_its_fit_dense(tmp_path, tiny_vocab,
                                                                 tiny_config):
    """The reference's checkpoints carry `fit_dense` (v2: `fit_denses.i`), one nn.Linear
    with bias: not ours to load; task distillation starts new projections instead."""
    from safetensors.numpy import load_file, save_file
    keras.utils.set_random_seed(7)
    path = export_hf(BertModel(tiny_config, vocab=tiny_vocab), str(tmp_path / "released"))
    weights = load_file(os.path.join(path, "model.safetensors"))
    weights["fit_dense.weight"] = np.ones((48, 32), np.float32)
    weights["fit_dense.bias"] = np.zeros((48,), np.float32)
    weights["fit_denses.0.weight"] = np.ones((48, 32), np.float32)
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    assert load_model(path).bert_config.hidden_size == 32
    assert attachment_info(path, "projections") is None  # not our format: none carried


def _pre_classifier(tiny_vocab, hidden=32, use_pooler=True, head="pre_classifier", labels=3):
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=hidden, num_layers=1,
                        num_heads=4, intermediate_size=2 * hidden, max_position_embeddings=32,
                        use_pooler=use_pooler)
    names = ["a", "b", "c"][:labels] if head == "pre_classifier" else None
    return BertModel(config, head=head, num_labels=labels if names else None,
                     label_names=names, vocab=tiny_vocab)


def test_pre_classifier_head_is_distilberts_and_saves_loads_and_reorders(tmp_path,
                                                                         tiny_vocab):
    keras.utils.set_random_seed(6)
    model = _pre_classifier(tiny_vocab)
    x = {"input_word_ids": np.array([[7, 30, 31, 8, 0]], np.int32),
         "input_mask": np.array([[1, 1, 1, 1, 0]], np.int32),
         "input_type_ids": np.zeros((1, 5), np.int32)}
    out = model(x, training=False)
    w = {k: v.numpy() for k, v in model.weight_dict().items()}
    cls = out["sequence_output"].numpy()[:, 0, :]  # [CLS], not the pooled output
    hidden = np.maximum(cls @ w["pre_classifier_head/pre_classifier/kernel"]
                        + w["pre_classifier_head/pre_classifier/bias"], 0.0)
    want = hidden @ w["pre_classifier_head/classifier/kernel"] + \
        w["pre_classifier_head/classifier/bias"]
    np.testing.assert_allclose(out["logits"].numpy(), want, rtol=1e-5, atol=1e-6)
    assert model.head.dropout.rate == 0.2  # DistilBERT's seq_classif_dropout
    path = save_model(model, str(tmp_path / "pc"))
    back = load_model(path)
    assert back.head_type == "pre_classifier" and back.label_names == ["a", "b", "c"]
    np.testing.assert_allclose(back(x, training=False)["logits"].numpy(),
                               out["logits"].numpy(), rtol=1e-6)
    back.head.permute_outputs([2, 0, 1])
    np.testing.assert_allclose(back(x, training=False)["logits"].numpy(),
                               out["logits"].numpy()[:, [2, 0, 1]], rtol=1e-6)
    task = task_type_of(back)
    assert isinstance(task, Classification) and task.head == "pre_classifier"
    assert task.accepts("classifier") and not task.accepts("span")
    with pytest.raises(CheckpointError, match="pre_classifier head has no Hugging Face"):
        export_hf(back, str(tmp_path / "hf"))
    # A model without a pooler takes the head too; STS-B's is the one-output variant.
    assert _pre_classifier(tiny_vocab, use_pooler=False)(x)["logits"].shape == (1, 3)
    reg = Regression().with_head_style("pre_classifier")
    assert reg.head == "pre_regressor"
    assert _pre_classifier(tiny_vocab, head="pre_regressor", labels=None)(x)["logits"].shape \
        == (1, 1)
    with pytest.raises(ValueError, match="--classifier_head=mlp"):
        reg.with_head_style("mlp")


# --- the plan ------------------------------------------------------------------------------

def _dry(ns, capsys) -> dict:
    assert main(["bin/distill", *argv(ns)]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_plan_shows_each_phase_and_the_cost_of_selecting_on_dev(tmp_path, tiny_vocab,
                                                                capsys):
    teacher = write_teacher(str(tmp_path / "tt"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], dry_run=True, task_teacher=teacher,
                    student_config=write_student_config(str(tmp_path / "s2.json"),
                                                        len(tiny_vocab), layers=2),
                    student_init="random", use_augmented=False, eval_every=2,
                    layer_weights=["1", "1", "1", "0.5"], layer_mapping="bottom",
                    task_phases=["intermediate", "finetune"], pred_grid=["4:1e-3", "8:2e-3"])
    plan = _dry(ns, capsys)
    task = [p for p in plan["phases"] if p["stage"] == "task"]
    assert [(p["phase"], p.get("grid_cell")) for p in task] == [
        ("intermediate", None), ("finetune_b4_lr0.001", {"batch": 4, "lr": 0.001}),
        ("finetune_b8_lr0.002", {"batch": 8, "lr": 0.002})]
    first, cell4, cell8 = task
    assert [t["name"] for t in first["loss_terms"]] == ["embd", "attn", "hidn"]
    assert first["layer_mapping"] == [1, 2] and first["projections"] == "new"
    assert [t["name"] for t in cell4["loss_terms"]] == ["hard"]
    assert cell4["projections"] is None and cell4["layer_mapping"] is None
    assert cell4["data"] == "task train split" and cell4["global_batch"] == 4
    assert cell8["learning_rate"]["peak"] == 0.002
    assert "evaluation" not in first
    ev = cell4["evaluation"]
    steps = cell4["steps"]
    assert ev["every"] == "2 steps" and ev["evaluations"] == -(-steps // 2)
    assert ev["dev_examples"] == 8  # write_task's dev set
    assert ev["share_of_training_examples"] == pytest.approx(
        ev["evaluations"] * 8 / (steps * 4), abs=1e-4)
    # The prediction term's lambda is the last --layer_weights entry, before any build.
    ns2 = type(ns)(**{**vars(ns), "task_phases": ["prediction"], "pred_grid": []})
    (pred,) = [p for p in _dry(ns2, capsys)["phases"] if p["stage"] == "task"]
    assert pred["loss_terms"][0]["lambda"] == 0.5
    assert pred["steps"] == 24 // 4  # write_task's 24 rows, batch 4, one epoch
    assert pred["evaluation"]["evaluations"] == 3  # steps 2, 4, 6


def test_a_phase_registered_by_user_code_plugs_in_without_editing_the_stage(
        tmp_path, tiny_vocab, capsys, monkeypatch):
    from tinybert_tf.distill.terms import HardLabelTerm, PredictionTerm

    class SoftAndHard(PhaseKind):
        """Soft and hard cross-entropy in one phase on the original set (PKD's outer terms)."""

        name = "soft_and_hard"
        reads_augmented = False

        def terms(self, config, task):
            return [PredictionTerm(task=task, weight=0.5), HardLabelTerm(task=task, weight=0.5)]

        def epochs(self, config):
            return 1.0

        def lr(self, config):
            return 2e-3

    monkeypatch.setitem(PHASE_KINDS, "soft_and_hard", SoftAndHard())
    teacher = write_teacher(str(tmp_path / "tt"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], task_teacher=teacher,
                    general_model="none", task_phases=["soft_and_hard"], task_max_steps=2)
    plan = _dry(type(ns)(**{**vars(ns), "dry_run": True}), capsys)
    assert "augment" not in plan["stages"]  # no listed phase reads the augmented set
    (spec,) = [p for p in plan["phases"] if p["stage"] == "task"]
    assert [(t["name"], t["weight"]) for t in spec["loss_terms"]] == [("pred", 0.5),
                                                                      ("hard", 0.5)]
    assert spec["learning_rate"]["peak"] == 2e-3 and spec["data"] == "task train split"
    info = run(ns)["task"]
    assert info["phases"] == {"soft_and_hard": 2} and info["best"] is not None
    hist = open(os.path.join(ns.output_dir, "task", "soft_and_hard", "history.jsonl"))
    row = json.loads(hist.readline())
    assert row["pred_loss"] > 0 and row["hard_loss"] > 0


def test_a_phase_list_that_leaves_the_head_untrained_is_refused(tmp_path, tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, task_phases=["intermediate"])
    with pytest.raises(PreflightError, match=r"--task_phases=intermediate: the last phase"):
        run(ns)
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, finetune_epochs=0,
                    task_phases=["intermediate", "finetune"])
    with pytest.raises(PreflightError, match=r"--finetune_epochs=0: the finetune phase .* "
                       r"leave the task head untrained"):
        run(ns)
    with pytest.raises(UsageError, match=r"--nointermediate: --task_phases.*"
                       r"--task_phases=prediction"):
        run_argv(["bin/distill", f"--output_dir={tmp_path}", "--nointermediate"])


# --- projections from general distillation ---------------------------------------------------

def _checkpoint_projections(phase_dir: str) -> list[np.ndarray]:
    reader = tf.train.load_checkpoint(os.path.join(phase_dir, "ckpt"))
    keys = sorted(k for k in reader.get_variable_to_shape_map()
                  if k.startswith("projections/") and k.endswith("VARIABLE_VALUE"))
    return [reader.get_tensor(k) for k in keys]


@pytest.fixture(scope="module")
def general_run(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("general")
    ns = tiny_flags(tmp, tiny_vocab, stages=["general"], general_max_steps=2,
                    keep_finished_checkpoints=True)  # the projections are read from them
    run(ns)
    return tmp, ns


def test_general_stage_saves_its_projections_with_the_general_model(general_run):
    tmp, ns = general_run
    model_dir = os.path.join(ns.output_dir, "general", "model")
    saved = read_attachment(model_dir, "projections")
    assert attachment_info(model_dir, "projections")["teacher_hidden_size"] == 32
    final = _checkpoint_projections(os.path.join(ns.output_dir, "general", "distill"))
    np.testing.assert_array_equal(saved["W_e/kernel"], final[0])
    np.testing.assert_array_equal(saved["W_h/kernel"], final[1])
    assert load_model(model_dir).bert_config.hidden_size == 16


def _without_projections(general: str, where: str) -> str:
    """A copy of a general model as one imported without W_e/W_h would be."""
    shutil.copytree(general, where)
    os.remove(os.path.join(where, "projections.safetensors"))
    config = read_json(os.path.join(where, "config.json"))
    del config["attachments"]
    with open(os.path.join(where, "config.json"), "w") as f:
        json.dump(config, f)
    return where


def test_task_distillation_starts_from_the_general_models_projections(
        general_run, tiny_vocab, tmp_path, capsys):
    tmp, ns = general_run
    general = os.path.join(ns.output_dir, "general", "model")
    teacher = write_teacher(str(tmp_path / "tt"), tiny_vocab, head="classifier")
    td = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "td"), "stages": ["task"],
                     "general_model": general, "task_teacher": teacher,
                     "use_augmented": False, "task_max_steps": 1, "intermediate_lr": 1e-12})
    plan = _dry(type(td)(**{**vars(td), "dry_run": True}), capsys)
    first, pred = [p for p in plan["phases"] if p["stage"] == "task"]
    assert (first["projections"], pred["projections"]) == ("general model", None)
    assert not any("projections" in w for w in plan["warnings"])
    # Imported without them: new ones, and a one-line warning.
    bare = _without_projections(general, str(tmp_path / "imported"))
    plan = _dry(type(td)(**{**vars(td), "dry_run": True, "general_model": bare}), capsys)
    assert [p["projections"] for p in plan["phases"] if p["stage"] == "task"] == ["new", None]
    (warning,) = [w for w in plan["warnings"] if "projections" in w]
    assert "none were saved" in warning and bare in warning and "\n" not in warning
    run(td)
    assert "no usable projections" not in capsys.readouterr().out
    start = read_attachment(general, "projections")
    after = _checkpoint_projections(os.path.join(td.output_dir, "task", "intermediate"))
    # One step at lr 1e-12 leaves W_e and W_h where they started: the general model's.
    for got, key in zip(after, ["W_e/kernel", "W_h/kernel"]):
        np.testing.assert_allclose(got, start[key], atol=1e-7)


# --- finetune phase, grid, DistilBERT head, GLUE test files ----------------------------------

def test_grid_of_finetune_cells_keeps_the_best_on_dev_with_distilberts_head(tmp_path,
                                                                            tiny_vocab):
    """One run: --student_init=random, the finetune phase over a two-cell grid, the
    pre_classifier head, and the GLUE test file of the selected student."""
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task", "evaluate"],
                    glue_test_predictions=True, data_dir=write_task(str(tmp_path / "t"), test=6),
                    task_teacher=write_teacher(str(tmp_path / "tt"), tiny_vocab,
                                               head="classifier"),
                    student_init="random", general_model="runs/ignored", use_augmented=False,
                    task_phases=["finetune"], pred_grid=["4:1e-3", "8:3e-3"],
                    classifier_head="pre_classifier", task_max_steps=3)
    run(ns)
    out = ns.output_dir
    report = read_json(os.path.join(out, "report.json"))
    cells = report["pred_grid"]
    assert [(c["batch"], c["lr"]) for c in cells] == [(4, 1e-3), (8, 3e-3)]
    best = max(c["best"]["accuracy"] for c in cells)
    (chosen,) = [c for c in cells if c["selected"]]
    assert chosen["best"]["accuracy"] == best
    assert report["student"]["dev"]["accuracy"] == pytest.approx(best)
    model = load_model(os.path.join(out, "task", "model"))
    assert model.head_type == "pre_classifier"
    cell_model = load_model(os.path.join(out, "task", chosen["phase"], "model"))
    for k, v in cell_model.weight_dict().items():
        np.testing.assert_array_equal(model.weight_dict()[k].numpy(), v.numpy())
    row = json.loads(open(os.path.join(out, "task", chosen["phase"],
                                       "history.jsonl")).readline())
    assert "hard_loss" in row and "pred_loss" not in row  # ground truth, no teacher
    # SST-2.tsv: the server's header, the test file's index column, the student's labels.
    test = [line.rstrip("\n").split("\t") for line in open(os.path.join(ns.data_dir,
                                                                      "test.tsv"))][1:]
    got = [line.rstrip("\n").split("\t")
           for line in open(os.path.join(out, "evaluate", "glue_submission", "SST-2.tsv"))]
    assert got[0] == ["index", "prediction"] and [g[0] for g in got[1:]] == [t[0] for t in test]
    x = load_tokenizer(model, ns.max_seq_len)([t[1] for t in test])
    logits = model(x, training=False)["logits"].numpy()
    clear = np.abs(logits[:, 1] - logits[:, 0]) > 1e-4  # no near-tie decides the check
    want = logits.argmax(-1).astype(str)
    assert clear.any()
    assert [g[1] for g, c in zip(got[1:], clear) if c] == list(want[clear])
    assert report["glue_submission"] == {"SST-2.tsv": len(test)}
