"""End to end: every stage in order on tiny models, skipping, the config guard, preflight."""
from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from tinybert_tf.export.serving import replay_warmup
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.pipeline.run.state import OutputDirError

from numerics import NOISE, decided
from pipeline_helpers import load_weights, read_json, run, with_flags

STAGES = ("general", "finetune_teacher", "augment", "task", "evaluate", "export")


@pytest.fixture
def finished(sst2_run):
    """The session's tiny SST-2 run of every stage (read-only: copy it to run again)."""
    return sst2_run.folder, sst2_run.ns, sst2_run.results


def test_all_stages_run_in_order_and_write_their_outputs(finished):
    tmp, ns, results = finished
    out = ns.output_dir
    assert list(results) == list(STAGES)
    for stage in STAGES:
        assert os.path.isfile(os.path.join(out, stage, "stage_done.json")), stage
    for model_dir in ("general/model", "finetune_teacher/model", "task/model"):
        assert os.path.isfile(os.path.join(out, model_dir, "model.safetensors")), model_dir
    assert os.path.isfile(os.path.join(out, "augment", "train_aug.tsv"))
    report = read_json(os.path.join(out, "report.json"))
    assert report["task"] == "sst-2"
    for who in ("teacher", "student"):
        for key in ("params", "flops", "latency_ms"):
            assert report[who][key] > 0
        assert 0.0 <= report[who]["dev"]["accuracy"] <= 1.0
    assert report["latency"]["interleaved"] and report["latency"]["rounds"] >= 1
    assert report["latency"]["batch"] == 1
    r = report["ratios"]
    assert r["params"] > 1 and r["flops"] > 1
    assert r["retained"] == pytest.approx(report["student"]["dev"]["accuracy"]
                                          / report["teacher"]["dev"]["accuracy"])
    assert os.path.getsize(os.path.join(out, "loss_curves.png")) > 1000
    served = os.path.join(out, "export", "serving", "1")  # the first TF Serving version
    assert os.path.isfile(os.path.join(served, "saved_model.pb"))
    assert len(replay_warmup(served)) == 4  # every warm-up record runs on the SavedModel
    assert os.path.isfile(os.path.join(out, "export", "model_float32.tflite"))
    # The general stage's loss is logged per step and falls.
    hist = [line for line in open(os.path.join(out, "general", "distill", "history.jsonl"))]
    assert len(hist) >= 2


def test_rerun_skips_finished_stages(sst2_run, tmp_path, capsys):
    ns = sst2_run.copy(tmp_path / "again")  # copytree keeps the files' times
    before = {s: os.path.getmtime(os.path.join(ns.output_dir, s, "stage_done.json"))
              for s in STAGES}
    weights = load_weights(os.path.join(ns.output_dir, "task", "model"))
    run(ns)
    printed = capsys.readouterr().out
    for stage in STAGES:
        assert f"== {stage}: done already, skipped" in printed
        assert os.path.getmtime(os.path.join(ns.output_dir, stage, "stage_done.json")) \
            == before[stage]
    after = load_weights(os.path.join(ns.output_dir, "task", "model"))
    for k in weights:
        np.testing.assert_array_equal(weights[k], after[k])


def test_a_run_ends_by_naming_where_its_artefacts_are(sst2_run, tmp_path, capsys):
    ns = sst2_run.copy(tmp_path / "again")
    run(ns)
    printed = capsys.readouterr().out
    assert f"== done; the run's artefacts in {ns.output_dir}:" in printed
    tail = printed.split("== done;")[1]
    for path in ("general/model", "finetune_teacher/model", "augment/train_aug.tsv",
                 "task/model", "report.json", "export/serving/1",
                 "export/model_float32.tflite", "export/parity.json", "logs"):
        assert os.path.join(ns.output_dir, path) in tail, path
    assert "TF Serving model, version 1" in tail
    quantized = os.path.join(ns.output_dir, "quantize", "model")
    assert (quantized in tail) == os.path.isdir(quantized)


def test_other_config_in_same_output_dir_is_refused(sst2_run, tmp_path):
    changed = sst2_run.copy(tmp_path / "other", seed=sst2_run.ns.seed + 1)
    with pytest.raises(OutputDirError, match="--seed"):
        run(changed)


def test_stage_can_start_from_explicit_models(finished, tmp_path):
    """Task distillation from an explicit general model and fine-tuned teacher."""
    tmp, ns, _ = finished
    out = tmp_path / "td_only"
    # One prediction-phase step: enough to start from both models and save the student.
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(out), "stages": ["task"],
                      "general_model": os.path.join(ns.output_dir, "general", "model"),
                      "task_teacher": os.path.join(ns.output_dir, "finetune_teacher", "model"),
                      "use_augmented": False, "task_phases": ["prediction"],
                      "task_max_steps": 1})
    results = run(ns2)
    assert list(results) == ["task"]
    assert os.path.isfile(out / "task" / "model" / "model.safetensors")


def test_an_eager_run_ends_with_the_weights_of_a_traced_run(finished, tmp_path):
    """--run_eagerly changes how each step runs, not what it computes: the task stage
    (intermediate and prediction phases, from the shared run's general model and
    teacher), traced and eager."""
    _, ns, _ = finished
    students = {}
    for eager in (False, True):
        out = tmp_path / f"eager_{eager}"
        run(with_flags(ns, output_dir=str(out), stages=["task"],
                       general_model=os.path.join(ns.output_dir, "general", "model"),
                       task_teacher=os.path.join(ns.output_dir, "finetune_teacher", "model"),
                       use_augmented=False, task_max_steps=2, run_eagerly=eager))
        students[eager] = load_weights(str(out / "task" / "model"))
    assert students[False].keys() == students[True].keys()
    general = load_weights(os.path.join(ns.output_dir, "general", "model"))
    for key, traced in students[False].items():
        np.testing.assert_allclose(students[True][key], traced, atol=1e-5, err_msg=key)
    # The phases trained: the student is not the general model it started from.
    assert any(not np.allclose(students[False][k], general[k]) for k in general
               if k in students[False])


def test_run_eagerly_and_jit_compile_are_refused_together(tmp_path):
    from tinybert_tf.cli.tool import UsageError
    from tinybert_tf.pipeline.main import parse_argv
    with pytest.raises(UsageError, match="--run_eagerly and --jit_compile exclude"):
        parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--run_eagerly",
                    "--jit_compile"])


def test_preflight_rejects_vocab_mismatch(finished, tmp_path, tiny_vocab):
    from pipeline_helpers import write_teacher
    tmp, ns, _ = finished
    other_vocab = list(tiny_vocab[:-1]) + ["zebra"]
    other = write_teacher(str(tmp_path / "other"), other_vocab)
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o"), "stages": ["task"],
                      "general_model": other,
                      "task_teacher": os.path.join(ns.output_dir, "finetune_teacher", "model")})
    with pytest.raises(PreflightError, match="different vocabularies"):
        run(ns2)
    assert not os.path.exists(tmp_path / "o" / "task")


def test_preflight_rejects_label_count_and_bad_stage(finished, tmp_path):
    tmp, ns, _ = finished
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o2"), "stages": ["task"],
                      "task": "mnli", "general_model": "none",
                      "task_teacher": os.path.join(ns.output_dir, "finetune_teacher", "model")})
    with pytest.raises(PreflightError, match="3 labels"):
        run(ns2)
    ns3 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o3"), "stages": ["genral"]})
    with pytest.raises(PreflightError, match="--stages"):
        run(ns3)
    ns4 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o4"), "stages": ["general"],
                      "layer_mapping": "1,2,9"})
    with pytest.raises(PreflightError, match="--layer_mapping"):
        run(ns4)


def test_overwrite_starts_over(finished, tmp_path):
    tmp, ns, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(ns.output_dir, copy)
    # A changed --seed makes the stages evaluate reads stale: refused, naming them.
    reseeded = type(ns)(**{**vars(ns), "output_dir": str(copy), "stages": ["evaluate"],
                           "overwrite": True, "seed": ns.seed + 5})
    with pytest.raises(PreflightError, match=r"reads the output of task, which is stale "
                       r"\(made with other settings: --seed"):
        run(reseeded)
    # With what it reads unchanged, --overwrite redoes evaluate (and nothing else).
    before = {s: read_json(str(copy / s / "stage_done.json")) for s in ("task", "evaluate")}
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(copy), "stages": ["evaluate"],
                      "overwrite": True})
    run(ns2)
    after = {s: read_json(str(copy / s / "stage_done.json")) for s in ("task", "evaluate")}
    assert after["task"] == before["task"]
    assert after["evaluate"]["finished"] != before["evaluate"]["finished"]
    assert os.path.isfile(copy / "report.json")


def test_a_hand_deleted_loss_plot_redoes_the_evaluate_stage_saying_why(finished, tmp_path,
                                                                       capsys):
    tmp, ns, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(ns.output_dir, copy)
    os.remove(copy / "loss_curves.png")
    capsys.readouterr()
    run(type(ns)(**{**vars(ns), "output_dir": str(copy), "stages": ["evaluate"]}))
    assert (f"== evaluate: its output {copy / 'loss_curves.png'} is missing (deleted since "
            "the stage finished); it runs again") in capsys.readouterr().out
    assert os.path.getsize(copy / "loss_curves.png") > 1000
    # Drawn even from a folder with no history, so a run can always make it.
    from tinybert_tf.pipeline.run.report import plot_loss_curves
    empty = tmp_path / "empty"
    empty.mkdir()
    assert os.path.getsize(plot_loss_curves(str(empty), str(empty / "curves.png"))) > 1000


def _student_like_teacher(path, vocab_size: int, layers: int) -> str:
    """A student config of the tiny teacher's width (see pipeline_helpers.write_teacher)."""
    from tinybert_tf.config import BertConfig
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_layers=layers, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    with open(path, "w", encoding="utf-8") as f:
        f.write(config.to_json())
    return str(path)


def test_init_from_teacher_starts_from_the_mapped_teacher_layer(finished, tmp_path, tiny_vocab):
    """--init_from_teacher through the pipeline: with a vanishing learning rate the
    general stage saves its starting point, which must be the teacher's embeddings and
    its layer g(1) = 2 (uniform map, 1 student layer, 2 teacher layers)."""
    tmp, ns, _ = finished
    config = _student_like_teacher(tmp_path / "s1.json", len(tiny_vocab), layers=1)
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "init"), "stages": ["general"],
                      "student_config": config, "init_from_teacher": True,
                      "general_lr": 1e-12, "general_max_steps": 2})
    run(ns2)
    student = load_weights(str(tmp_path / "init" / "general" / "model"))
    teacher = load_weights(ns.teacher)
    layer_keys = [k for k in student if k.startswith("transformer_layer_")]
    assert layer_keys and all(k.startswith("transformer_layer_0/") for k in layer_keys)
    for key in layer_keys:
        source = key.replace("transformer_layer_0/", "transformer_layer_1/", 1)
        np.testing.assert_allclose(student[key], teacher[source], atol=1e-9, err_msg=key)
        if key.endswith("kernel"):  # layer 2 was copied, not layer 1
            assert np.abs(teacher[key] - teacher[source]).max() > 1e-3, key
    for key in ("token_embedding/embeddings", "segment_embedding/embeddings",
                "embeddings_layer_norm/gamma"):
        np.testing.assert_allclose(student[key], teacher[key], atol=1e-9, err_msg=key)
    np.testing.assert_allclose(student["position_embedding/embeddings"],
                               teacher["position_embedding/embeddings"]
                               [: student["position_embedding/embeddings"].shape[0]], atol=1e-9)


def test_preflight_rejects_init_from_teacher_of_another_width(finished, tmp_path):
    tmp, ns, _ = finished  # the default tiny student is 16 wide, the teacher 32
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "w"), "stages": ["general"],
                      "init_from_teacher": True})
    with pytest.raises(PreflightError, match="--init_from_teacher.*hidden_size=16"):
        run(ns2)
    assert not os.path.exists(tmp_path / "w" / "general")


def test_preflight_rejects_init_from_teacher_with_a_wider_ffn(finished, tmp_path, tiny_vocab):
    """A student FFN narrower than the teacher's starts from its largest units; a wider
    one cannot start from the teacher, and preflight says which field and the fix."""
    from tinybert_tf.config import BertConfig
    tmp, ns, _ = finished  # the tiny teacher: 32 wide, 4 heads, FFN 64
    config = tmp_path / "wide_ffn.json"
    config.write_text(BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=1,
                                 num_heads=4, intermediate_size=128,
                                 max_position_embeddings=64).to_json())
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "w"), "stages": ["general"],
                      "student_config": str(config), "init_from_teacher": True})
    with pytest.raises(PreflightError, match=r"intermediate_size=128 and the teacher 64; "
                                             r"use a student with an intermediate_size of "
                                             r"at most the teacher's"):
        run(ns2)
    assert not os.path.exists(tmp_path / "w" / "general")


def _event_tags(directory: str) -> set:
    import glob

    import tensorflow as tf
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(v.tag for v in event.summary.value)
    return tags


def test_tensorboard_has_every_loss_term_learning_rate_and_dev_metric(finished):
    """keras.callbacks.TensorBoard's layout: training scalars in train/, dev metrics in
    validation/ (so TensorBoard shows them as two runs of one chart)."""
    tmp, ns, _ = finished
    logs = os.path.join(ns.output_dir, "logs")
    assert {"embd_loss", "attn_loss", "hidn_loss", "loss", "learning_rate"} <= _event_tags(
        os.path.join(logs, "general", "train"))
    assert {"embd_loss", "attn_loss", "hidn_loss", "learning_rate"} <= _event_tags(
        os.path.join(logs, "task", "intermediate", "train"))
    assert {"pred_loss", "learning_rate"} <= _event_tags(
        os.path.join(logs, "task", "prediction", "train"))
    assert "accuracy" in _event_tags(os.path.join(logs, "task", "prediction", "validation"))
    assert sorted(os.listdir(os.path.join(logs, "general"))) == ["train"]


def test_prediction_phase_keeps_the_best_dev_checkpoint(finished):
    tmp, ns, _ = finished
    done = read_json(os.path.join(ns.output_dir, "task", "prediction", "phase_done.json"))
    evals = done["evals"]
    assert evals, "the prediction phase evaluated nothing"
    best = max(evals, key=lambda e: e["accuracy"])  # max keeps the first of equals
    assert done["best"] == best
    saved = read_json(os.path.join(ns.output_dir, "task", "model", "config.json"))
    assert saved["metadata"]["dev"] == {"accuracy": best["accuracy"]}


@pytest.mark.numerics
def test_mnli_selects_on_matched_and_reports_mismatched(mnli_run):
    """MNLI: the prediction phase selects on dev_matched; evaluate reports both dev sets
    (the session's MNLI run, conftest.mnli_run: task and evaluate, two prediction epochs)."""
    ns = mnli_run.ns
    fixtures = ns.data_dir
    out = pathlib.Path(ns.output_dir)
    done = read_json(str(out / "task" / "prediction" / "phase_done.json"))
    assert len(done["evals"]) == 2 and set(done["best"]) == {"accuracy", "step"}
    report = read_json(str(out / "report.json"))
    assert report["primary_metric"] == "dev_matched_accuracy"
    for who in ("teacher", "student"):
        assert set(report[who]["dev"]) == {"dev_matched_accuracy", "dev_mismatched_accuracy"}
    assert report["ratios"]["retained"] is None or report["ratios"]["retained"] == pytest.approx(
        report["student"]["dev"]["dev_matched_accuracy"]
        / report["teacher"]["dev"]["dev_matched_accuracy"])
    # Selection was on the matched set: the kept student, evaluated afresh, scores the
    # best matched accuracy seen during training.
    saved = read_json(str(out / "task" / "model" / "config.json"))
    assert saved["metadata"]["dev"] == {"accuracy": done["best"]["accuracy"]}
    # The prediction phase evaluated in its own compiled graph: an example within
    # rounding of a tie may go either way.
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer
    from tinybert_tf.tasks import TaskConfig, resolve_task
    student = load_model(str(out / "task" / "model"))
    dev = resolve_task(TaskConfig(task="mnli", data_dir=fixtures)).examples("dev_matched")
    x = load_tokenizer(student, 32)([e.text_a for e in dev], [e.text_b for e in dev],
                                    max_seq_len=32)
    ties = float(np.mean(~decided(student(x, training=False)["logits"].numpy(), NOISE)))
    assert report["student"]["dev"]["dev_matched_accuracy"] == pytest.approx(
        done["best"]["accuracy"], abs=ties + 1e-9)


def test_preflight_rejects_too_little_free_disk(finished, tmp_path, monkeypatch):
    import collections

    from tinybert_tf.pipeline.preflight import folder
    tmp, ns, _ = finished
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(folder.shutil, "disk_usage",
                        lambda path: usage(2**30, 2**30 - 2**20, 2**20))  # 1 MiB free
    ns2 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "full"), "stages": ["general"]})
    with pytest.raises(PreflightError, match="--output_dir=.*GiB free"):
        run(ns2)
    assert not os.path.exists(tmp_path / "full" / "general")


def test_new_export_formats_on_a_finished_run_export_only_those(finished, tmp_path):
    """A finished folder refuses other --export_formats, naming the command that redoes only
    the export; that command exports the new formats and leaves every other stage alone."""
    tmp, ns, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(ns.output_dir, copy)
    before = {s: read_json(str(copy / s / "stage_done.json"))["fingerprint"] for s in STAGES}
    changed = type(ns)(**{**vars(ns), "output_dir": str(copy),
                          "export_formats": ["saved_model", "float32", "float16"]})
    with pytest.raises(OutputDirError, match=r"--export_formats: .*--overwrite --stages=export"
                       r" \("):
        run(changed)
    run(type(changed)(**{**vars(changed), "stages": ["export"], "overwrite": True}))
    assert os.path.isfile(copy / "export" / "model_float16.tflite")
    after = {s: read_json(str(copy / s / "stage_done.json"))["fingerprint"] for s in STAGES}
    assert {s for s in STAGES if after[s] != before[s]} == {"export"}
    results = run(changed)  # the new command now finds everything done
    assert all(info.get("fingerprint") == after[s] for s, info in results.items())
    # Model folders are readable by a serving account.
    for model_dir in ("general/model", "task/model", "export/serving/1"):
        for name in os.listdir(copy / model_dir):
            if os.path.isfile(copy / model_dir / name):
                assert os.stat(copy / model_dir / name).st_mode & 0o044 == 0o044, name
