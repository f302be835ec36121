"""The quantize stage: planned, run and resumed like every stage; evaluate
reports its int8 student, and export converts int8 from it with its learnt ranges,
next to the float student's post-training int8."""
import json
import os
import shutil

import numpy as np
import pytest

from tinybert_tf.export import FORMATS
from tinybert_tf.files import read_json
from tinybert_tf.models.checkpoint import load_model
from tinybert_tf.pipeline.main import main

from numerics import MIN_DECIDED, NOISE, decided
from pipeline_helpers import (
    FAST,
    argv,
    load_weights,
    parity_reference,
    run,
    tiny_flags,
    write_scores_tsv,
    write_teacher,
)
from quant_helpers import activation_params, expected_params, float_ops

STEPS = 6


@pytest.fixture(scope="module")
def flags(tmp_path_factory, tiny_vocab):
    """task -> quantize -> evaluate -> export on tiny models (prediction phase only)."""
    tmp = tmp_path_factory.mktemp("quantize")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier")
    return tiny_flags(tmp, tiny_vocab, task_teacher=teacher, general_model="none",
                      use_augmented=False, task_phases=["prediction"], pred_epochs=1,
                      export_formats=["int8"], quantize_steps=STEPS, quantize_batch_size=4,
                      quantize_calibration_examples=8, quantize_lr=1e-3, latency_runs=1,
                      export_latency_runs=1,
                      keep_finished_checkpoints=True)  # a resume test starts from them


@pytest.fixture(scope="module")
def finished(flags):
    results = run(flags)
    return flags, results


def test_dry_run_plans_the_quantize_phase_after_task(flags, tmp_path, capsys, tiny_vocab):
    ns = type(flags)(**{**vars(flags), "dry_run": True, "output_dir": str(tmp_path / "o")})
    assert main(["bin/distill", *argv(ns)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"] == ["task", "quantize", "evaluate", "export"]
    (phase,) = [p for p in plan["phases"] if p["stage"] == "quantize"]
    assert phase["phase"] == "qat" and phase["steps"] == STEPS
    assert phase["global_batch"] == 4 and phase["learning_rate"]["peak"] == 1e-3
    assert [t["name"] for t in phase["loss_terms"]] == ["pred"]
    assert "teacher: the float task student" in phase["note"]
    # By default it keeps the checkpoint that keeps most answers (one evaluation here, at
    # the end, as 6 steps < 50); the plan shows what the evaluations cost.
    assert "agree most with the float student's (every 50 steps)" in phase["note"]
    assert phase["evaluation"]["every"] == "50 steps"
    assert phase["evaluation"]["evaluations"] == 1
    for every, note, evaluations in ((2, "(every 2 steps)", STEPS // 2),
                                     (0, "keeps the last weights", None)):
        plan = type(ns)(**{**vars(ns), "quantize_eval_every": every})
        assert main(["bin/distill", *argv(plan)]) == 0
        (phase,) = [p for p in json.loads(capsys.readouterr().out)["phases"]
                    if p["stage"] == "quantize"]
        assert note in phase["note"]
        assert (phase.get("evaluation") or {}).get("evaluations") == evaluations
    # A score has no answers to keep: regression keeps the last weights.
    reg = tiny_flags(tmp_path / "reg", tiny_vocab, **{
        **FAST, "task": "text_regression", "text_column": "sentence",
        "label_column": "score", "use_augmented": False, "task_phases": ["prediction"],
        "task_teacher": write_teacher(str(tmp_path / "reg_teacher"), tiny_vocab,
                                      head="regressor"),
        "export_formats": ["int8"], "quantize_batch_size": 4, "dry_run": True,
        "train_file": write_scores_tsv(tmp_path / "train.tsv", 8, 4),
        "validation_file": write_scores_tsv(tmp_path / "dev.tsv", 4, 5)})
    assert main(["bin/distill", *argv(reg)]) == 0
    (phase,) = [p for p in json.loads(capsys.readouterr().out)["phases"]
                if p["stage"] == "quantize"]
    assert "keeps the last weights" in phase["note"] and "evaluation" not in phase
    # A student head with no int8 form: refused before anything runs, naming the fix.
    pre = type(ns)(**{**vars(ns), "classifier_head": "pre_classifier"})
    assert main(["bin/distill", *argv(pre)]) != 0
    assert "pre_classifier head has no int8 form" in capsys.readouterr().err
    # --noquantize: `all` leaves it out and int8 is calibrated after training.
    for off in (ns, pre):
        off = type(off)(**{**vars(off), "quantize": False})
        assert main(["bin/distill", *argv(off)]) == 0
        assert "quantize" not in json.loads(capsys.readouterr().out)["stages"]


def test_the_stage_publishes_its_int8_student_read_by_evaluate_and_export(finished):
    ns, results = finished
    out = ns.output_dir
    assert list(results) == ["task", "quantize", "evaluate", "export"]
    assert results["quantize"]["steps"] == STEPS
    done = read_json(os.path.join(out, "quantize", "stage_done.json"))
    assert set(done["inputs"]) == {"task"}
    # Its record keeps what it read and published (a changed file makes it stale).
    assert set(done["reads"]) == {"data"} and "quantize/model" in done["outputs"]
    exported = read_json(os.path.join(out, "export", "stage_done.json"))["outputs"]
    assert exported[f"export/{FORMATS['int8_ptq'].artefact}"] == "exists"
    for stage in ("evaluate", "export"):
        assert "quantize" in read_json(os.path.join(out, stage, "stage_done.json"))["inputs"]
    quantized = load_model(os.path.join(out, "quantize", "model"))
    assert quantized.quantization is not None
    report = read_json(os.path.join(out, "report.json"))
    assert report["models"]["quantized_student"] == os.path.join(out, "quantize", "model")
    assert report["models"]["student"] == os.path.join(out, "task", "model")
    assert "accuracy" in report["quantized_student"]["dev"]
    assert report["ratios"]["quantized_retained"] is not None
    # Its Keras simulation is not timed (the int8 file's latency is parity.json's).
    assert "latency_ms" not in report["quantized_student"]
    assert report["teacher"]["latency_ms"] > 0 and report["student"]["latency_ms"] > 0
    rows = read_json(os.path.join(out, "export", "parity.json"))["formats"]
    assert set(rows) == {"keras", "keras_quantized", "int8", "int8_ptq"}
    assert rows["int8"]["ranges"] == "learnt" and rows["int8_ptq"]["ranges"] == "calibrated"
    assert rows["int8"]["task_library"] == "BertNLClassifier"  # metadata kept
    for name in ("keras_quantized", "int8", "int8_ptq"):
        assert 0.0 <= rows[name]["label_agreement"] <= 1.0  # against the float student
    # The int8 file is the quantised student's: its every learnt range, no float op.
    path = os.path.join(out, "export", "model_int8.tflite")
    assert float_ops(path) == []
    with open(path, "rb") as f:
        got = activation_params(f.read())
    for name, var in quantized.quant_ranges.points.items():
        scale, zero = expected_params(*var.numpy())
        assert any(abs(s - scale) <= 1e-6 * scale and z == zero for s, z in got), name


def test_the_stage_resumes_from_its_checkpoint_to_the_same_weights(finished, tmp_path,
                                                                   capsys):
    ns, _ = finished
    copy = str(tmp_path / "copy")
    shutil.copytree(ns.output_dir, copy, symlinks=True)
    stage = os.path.join(copy, "quantize")
    for name in ("stage_done.json", "model", os.path.join("qat", "phase_done.json")):
        path = os.path.join(stage, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    ckpt = os.path.join(stage, "qat", "ckpt")
    for name in os.listdir(ckpt):
        if name.startswith(f"ckpt-{STEPS}."):
            os.remove(os.path.join(ckpt, name))
    with open(os.path.join(ckpt, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n')
    again = type(ns)(**{**vars(ns), "output_dir": copy, "stages": ["quantize"]})
    capsys.readouterr()
    assert run(again)["quantize"]["steps"] == STEPS
    assert "ckpt-3 (step 3)" in capsys.readouterr().out  # resumed, not started afresh
    want = load_weights(os.path.join(ns.output_dir, "quantize", "model"))
    got = load_weights(os.path.join(stage, "model"))
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.numerics
def test_with_eval_every_the_stage_keeps_the_checkpoint_that_keeps_most_answers(
        finished, tmp_path, capsys):
    """--quantize_eval_every=2: dev agreement with the float student at steps 2, 4 and
    6; the published int8 student is the first that agrees most, and it answers as
    its record says (counted here from the two models' outputs, computed again in
    another way: only a sentence that either model leaves within NOISE of a tie may
    count differently)."""
    ns, _ = finished
    copy = str(tmp_path / "copy")
    shutil.copytree(ns.output_dir, copy, symlinks=True)
    again = type(ns)(**{**vars(ns), "output_dir": copy, "stages": ["quantize"],
                        "quantize_eval_every": 2, "overwrite": True})
    got = run(again)["quantize"]
    evals = read_json(os.path.join(copy, "quantize", "qat", "phase_state.json"))["evals"]
    assert [e["step"] for e in evals] == [2, 4, 6]
    scores = [e["agreement"] for e in evals]
    assert all(0.0 <= a <= 1.0 for a in scores)
    best = max(scores)
    assert got["kept_step"] == evals[scores.index(best)]["step"]
    assert got["dev"]["agreement"] == best
    assert f"kept step {got['kept_step']}" in capsys.readouterr().out
    # The published model is the kept one: its labels agree with the float student's
    # on that share of the dev sentences.
    reference, inputs = parity_reference(again)  # the float student's probabilities
    int8_student = load_model(os.path.join(copy, "quantize", "model"))
    logits = np.asarray(int8_student(inputs, training=False)["logits"])
    same = np.argmax(reference, -1) == np.argmax(logits, -1)
    undecided = ~(decided(reference, NOISE) & decided(logits, NOISE))
    assert float(np.mean(undecided)) <= 1.0 - MIN_DECIDED  # the count below means something
    assert abs(float(np.mean(same)) - best) <= float(np.mean(undecided)) + 1e-12


def test_a_zero_learning_rate_keeps_the_float_weights_and_moves_only_the_ranges(
        finished, tmp_path, capsys):
    """--quantize_lr=0: the int8 student's weights are the float student's, bit for bit,
    and its steps still move the ranges away from the calibrated ones (--quantize_steps=0
    publishes those); the plan says so."""
    ns, _ = finished
    published = {}
    for name, extra in (("ranges", {"quantize_lr": 0.0}), ("calibrated", {"quantize_steps": 0})):
        copy = str(tmp_path / name)
        shutil.copytree(ns.output_dir, copy, symlinks=True)
        again = type(ns)(**{**vars(ns), "output_dir": copy, "stages": ["quantize"],
                            "quantize_eval_every": 0, "overwrite": True, **extra})
        assert run(again)["quantize"]["steps"] == (STEPS if name == "ranges" else 0)
        published[name] = load_weights(os.path.join(copy, "quantize", "model"))
    float_student = load_weights(os.path.join(ns.output_dir, "task", "model"))
    ranges = published["ranges"]
    shared = sorted(set(float_student) & set(ranges))
    assert len(shared) >= 10
    for key in shared:
        np.testing.assert_array_equal(ranges[key], float_student[key], err_msg=key)
    points = [k for k in ranges if k not in float_student]
    assert points and sorted(points) == sorted(k for k in published["calibrated"]
                                               if k not in float_student)
    assert any(not np.array_equal(ranges[k], published["calibrated"][k]) for k in points)
    plan = type(ns)(**{**vars(ns), "dry_run": True, "quantize_lr": 0.0,
                       "output_dir": str(tmp_path / "plan")})
    capsys.readouterr()  # the runs' progress
    assert main(["bin/distill", *argv(plan)]) == 0
    (phase,) = [p for p in json.loads(capsys.readouterr().out)["phases"]
                if p["stage"] == "quantize"]
    assert "weights kept: the float student's (--quantize_lr=0)" in phase["note"]
    negative = type(plan)(**{**vars(plan), "quantize_lr": -1e-5})
    assert main(["bin/distill", *argv(negative)]) == 2
    assert "--quantize_lr=-1e-05: must be >= 0" in capsys.readouterr().err
