"""SQuAD as a task: the span task type's losses and in-graph windows, the pipeline end to
end on tiny models (fine-tune, augment, distil, evaluate, export) for v2.0 and v1.1, the
answers the SavedModel gives in a fresh process, and bad input refused before anything
is written."""
from __future__ import annotations

import collections
import json
import math
import os
import re
import string
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import squad, squad_answers
from tinybert_tf.data.squad_source import SquadSource
from tinybert_tf.models.checkpoint import load_model, load_tokenizer
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.tasks import span_graph
from tinybert_tf.tasks.span import SpanQA
from tinybert_tf.tokenizer import Tokenizer

from numerics import MIN_DECIDED, NOISE, span_margins
from pipeline_helpers import (
    REPO,
    SERVER_SCRIPT_HEAD,
    SQUAD_SIZES,
    SQUAD_V1,
    SQUAD_V2,
    read_json,
    run,
    squad_flags,
    squad_vocab,
)

V1, V2, SIZES = SQUAD_V1, SQUAD_V2, SQUAD_SIZES


# --- an independent implementation of the official scripts' EM / F1 ------------------------

def _norm(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _f1(pred: str, gold: str) -> float:
    p, g = _norm(pred).split(), _norm(gold).split()
    if not p or not g:
        return float(p == g)
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))


def official_scores(path: str, predictions: dict) -> tuple[float, float]:
    """(EM, F1) of predictions.json against an official v2.0-layout file, 0-100."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    em = f1 = n = 0.0
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                golds = [a["text"] for a in qa["answers"] if _norm(a["text"])] or [""]
                pred = predictions[qa["id"]]
                em += max(float(_norm(pred) == _norm(g)) for g in golds)
                f1 += max(_f1(pred, g) for g in golds)
                n += 1
    return 100 * em / n, 100 * f1 / n


# --- the task type ---------------------------------------------------------------------

def test_soft_loss_is_the_mean_over_windows_of_start_and_end_cross_entropy_on_real_positions():
    rng = np.random.default_rng(0)
    B, L, t = 3, 7, 2.0
    mask = np.ones((B, L), np.int32)
    mask[0, 5:], mask[1, 3:] = 0, 0
    s, te = (rng.normal(size=(B, L, 2)).astype(np.float32) * 3 for _ in range(2))
    expected = 0.0
    for b in range(B):
        n = mask[b].sum()
        for k in range(2):
            zs, zt = s[b, :n, k] / t, te[b, :n, k] / t
            p = np.exp(zt - zt.max()) / np.exp(zt - zt.max()).sum()
            log_q = zs - zs.max() - np.log(np.exp(zs - zs.max()).sum())
            expected += -(p * log_q).sum() / 2
    expected /= B
    task = SpanQA("1.1")
    inputs = {"input_word_ids": tf.zeros((B, L), tf.int32), "input_mask": tf.constant(mask),
              "labels": tf.constant([[1, 2], [0, 0], [6, 6]])}
    got = task.soft_sum(inputs, tf.constant(s), tf.constant(te), t) / task.soft_count(inputs, 2)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # Padding logits change nothing.
    s2 = np.where(mask[..., None] == 1, s, 1e3).astype(np.float32)
    again = task.soft_sum(inputs, tf.constant(s2), tf.constant(te), t) / B
    np.testing.assert_allclose(float(again), expected, rtol=1e-5)
    # The hard loss: BERT's (CE(start) + CE(end)) / 2, mean over windows.
    hard = 0.0
    for b, (i, j) in enumerate([[1, 2], [0, 0], [6, 6]]):
        n = mask[b].sum()
        for k, pos in ((0, i), (1, j)):
            z = s[b, :n, k]
            hard += -(z[pos] - z.max() - np.log(np.exp(z - z.max()).sum())) / 2
    got = task.hard_sum(inputs, tf.constant(s)) / task.hard_count(inputs)
    np.testing.assert_allclose(float(got), hard / B, rtol=1e-5)


@pytest.mark.numerics
@pytest.mark.parametrize("path,version", [(V1, "1.1"), (V2, "2.0")])
def test_graph_windows_and_answers_equal_the_python_ones(path, version):
    tok = Tokenizer(squad_vocab(), lower_case=True)
    examples = squad.read_squad(path, version)
    questions = tf.constant([e.question for e in examples])
    contexts = tf.constant([e.context for e in examples])
    rng = np.random.default_rng(1)
    for L, Q, stride in ((48, 8, 5), (40, 30, 100)):
        feats = squad.make_features(examples, tok, L, stride, Q)
        arrays = squad.feature_arrays(feats)
        win = span_graph.window_inputs(tok, questions, contexts, L, Q, stride)
        for key in ("input_word_ids", "input_mask", "input_type_ids", "example_index"):
            np.testing.assert_array_equal(win[key].numpy(), arrays[key], err_msg=key)
        np.testing.assert_array_equal(win["is_max_context"].numpy(),
                                      np.stack([f.token_is_max_context for f in feats]))
        logits = (rng.normal(size=(len(feats), L, 2)) * 3).astype(np.float32)
        for threshold in (0.0, 1.5):
            want = squad_answers.postprocess(examples, feats, logits[..., 0], logits[..., 1],
                                             5, 4, version, threshold).predictions
            got = span_graph.select_answers(win, tf.constant(logits), contexts, 5, 4,
                                            version == "2.0", tf.constant(threshold))
            assert [a.decode() for a in got["answer"].numpy()] == \
                [want[e.qas_id] for e in examples]


def _scored(cases):
    """Questions and predictions from (id, gold answer or None, best span, null diff)."""
    examples = [squad.SquadExample(q, "", "?", "context", [(g, 0)] if g else [], not g)
                for q, g, _, _ in cases]
    preds = squad_answers.SquadPredictions({}, {q: best for q, _, best, _ in cases},
                                           {q: d for q, _, _, d in cases}, {})
    return examples, preds


THRESHOLD_CASES = {
    # The official search peaks after q1: its threshold is q1's own difference (-3.0).
    "peak_inside": ([("q1", "Paris", "Paris", -3.0), ("q2", None, "Lyon", -1.0),
                     ("q3", "1887", "1900", 0.5), ("q4", None, "Nice", 2.0)], -2.0),
    # Tied differences at the peak: halfway to the next larger one.
    "tied_peak": ([("q1", "Paris", "Paris", 0.5), ("q2", "1887", "1887", 0.5),
                   ("q3", None, "Nice", 0.9), ("q4", None, "", math.inf)], 0.7),
    # The peak is the largest finite difference (q3 has no valid span): 1.0 above it.
    "peak_last": ([("q1", "Paris", "Paris", 0.3), ("q2", "1887", "1887", 1.2),
                   ("q3", None, "", math.inf)], 2.2),
    # Answering nothing is best (official: 0.0, which is q2's score): 1.0 below the lowest.
    "nothing": ([("q1", "Paris", "Lyon", -0.5), ("q2", None, "Nice", 0.0),
                 ("q3", None, "Rome", 1.5)], -1.5),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", sorted(THRESHOLD_CASES))
def test_the_v2_null_threshold_sits_between_two_score_differences(case):
    cases, want = THRESHOLD_CASES[case]
    examples, preds = _scored(cases)
    task = SpanQA("2.0")
    answers, metrics = task.answers(preds, examples)
    diffs = sorted(d for d in preds.null_score_diff.values() if math.isfinite(d))
    # The official search's threshold is one of the questions' differences ...
    assert metrics["best_f1_thresh"] in diffs + [0.0]
    # ... ours is strictly between two of them (or beyond all), at the midpoint.
    threshold = metrics["null_threshold"]
    assert threshold == pytest.approx(want, abs=1e-12) and threshold not in diffs
    below = [d for d in diffs if d < threshold]
    above = [d for d in diffs if d > threshold]
    if below and above:
        assert threshold == pytest.approx((below[-1] + above[0]) / 2, abs=1e-12)
    # The same dev answers as the official search's best F1 ...
    assert metrics["f1"] == pytest.approx(metrics["best_f1"])
    assert task.model_metadata(metrics)["squad"]["null_threshold"] == threshold
    # ... and no 1e-6 rounding of any question's difference changes one of them.
    for eps in (-1e-6, 1e-6):
        shifted = {q: d + eps for q, d in preds.null_score_diff.items()}
        again = {q: "" if shifted[q] > threshold else text
                 for q, text in preds.best_non_null.items()}
        assert again == answers, eps


def test_source_reads_splits_and_refuses_a_missing_file():
    source = SquadSource({"train": V2, "dev": V2}, "2.0")
    assert source.splits() == ("train", "dev") and len(source.load("dev")) == 7
    assert source.load("dev") is source.load("dev")  # read once
    assert source.describe()["files"]["dev"]["size"] == os.path.getsize(V2)
    with pytest.raises(ValueError, match="--validation_file"):
        SquadSource({"train": V2}, "2.0").load("dev")


# --- the pipeline ------------------------------------------------------------------------

def test_every_stage_runs_on_squad2(squad2_run, squad2_export):
    assert list(squad2_run.results) == ["finetune_teacher", "augment", "task", "evaluate"]
    assert list(squad2_export.results) == ["export"]


def test_predictions_json_is_what_the_official_rules_score(squad2_run):
    ns = squad2_run.ns
    out = ns.output_dir
    preds = read_json(os.path.join(out, "evaluate", "predictions.json"))
    ids = [e.qas_id for e in squad.read_squad(V2, "2.0")]
    assert sorted(preds) == sorted(ids) and all(isinstance(v, str) for v in preds.values())
    report = read_json(os.path.join(out, "report.json"))
    dev = report["student"]["dev"]
    em, f1 = official_scores(V2, preds)
    assert dev["exact_match"] == pytest.approx(em) and dev["f1"] == pytest.approx(f1)
    for key in ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_f1",
                "best_f1_thresh", "null_threshold"):
        assert key in dev and key in report["teacher"]["dev"], key
    assert report["primary_metric"] == "f1"
    teacher_preds = read_json(os.path.join(out, "evaluate", "teacher", "predictions.json"))
    t_em, _ = official_scores(V2, teacher_preds)
    assert report["teacher"]["dev"]["exact_match"] == pytest.approx(t_em)
    null_odds = read_json(os.path.join(out, "evaluate", "null_odds.json"))
    assert sorted(null_odds) == sorted(ids)


def test_the_null_threshold_is_stored_with_the_model(squad2_run):
    ns = squad2_run.ns
    config = read_json(os.path.join(ns.output_dir, "task", "model", "config.json"))
    stored = config["metadata"]["squad"]
    assert stored["version"] == "2.0" and stored["doc_stride"] == 32
    assert stored["null_threshold"] == pytest.approx(config["metadata"]["dev"]["null_threshold"])


def test_augmented_questions_keep_their_answer_at_its_recomputed_offset(squad2_run):
    ns = squad2_run.ns
    path = os.path.join(ns.output_dir, "augment", "train_aug.jsonl")
    originals = {e.qas_id: e for e in squad.read_squad(V2, "2.0", is_training=True)}
    variants = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            qa_para = json.loads(line)["paragraphs"][0]
            qa = qa_para["qas"][0]
            source = originals[qa["id"].split("#aug")[0]]
            if "#aug" not in qa["id"]:
                assert qa_para["context"] == source.context
                continue
            variants += 1
            if source.is_impossible:
                assert qa["answers"] == [] and qa["is_impossible"]
                continue
            (answer,) = qa["answers"]
            assert answer["text"] == source.answers[0][0]
            start = answer["answer_start"]
            assert qa_para["context"][start:start + len(answer["text"])] == answer["text"]
    assert variants > 0


@pytest.fixture(scope="module")
def keras_answers(squad2_run):
    """The task stage's student in Keras on the dev questions: (its stored null
    threshold, `SquadPredictions`, margins per question as `numerics.span_margins`)."""
    ns = squad2_run.ns
    model = load_model(os.path.join(ns.output_dir, "task", "model"))
    task = SpanQA.for_model(model)
    L = SIZES["max_seq_len"]
    preds = task.predict(model, squad.read_squad(V2, "2.0"), load_tokenizer(model, L), L, 16)
    threshold = task.threshold_of(model)
    return threshold, preds, span_margins(preds.nbest, preds.null_score_diff, threshold)


@pytest.mark.numerics
def test_exports_agree_with_keras_and_tflite_has_the_task_library_outputs(squad2_export,
                                                                          keras_answers):
    ns = squad2_export.ns
    parity = read_json(os.path.join(ns.output_dir, "export", "parity.json"))
    assert parity["task_type"] == "span_qa" and parity["output"] == "logits"
    margins = np.array(list(keras_answers[2].values()))
    for name in ("saved_model", "float32"):
        row = parity["formats"][name]
        assert row["max_abs_diff"] < 1e-3, name
        # Same answer on every question whose answer no logit change within max |Δ| can
        # move (see numerics.span_margins); those are most of them (the threshold sits
        # between two questions' differences, never on one).
        sure = margins > 4 * (row["max_abs_diff"] + NOISE)
        assert sure.mean() >= MIN_DECIDED, (name, margins)
        assert row["label_agreement"] >= sure.mean() - 1e-12, name
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=os.path.join(ns.output_dir, "export",
                                                 "model_float32.tflite"))
    outs = interp.get_output_details()
    assert [d["name"] for d in outs] == ["end_logits", "start_logits"]
    assert all(list(d["shape"]) == [1, SIZES["max_seq_len"]] for d in outs)


_ANSWER = SERVER_SCRIPT_HEAD + """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer's ops)
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
q, c = json.load(open(sys.argv[2]))
out = fn(question=tf.constant(q), context=tf.constant(c))
print(json.dumps({"answer": [a.decode() for a in out["answer"].numpy()],
                  "null_score_diff": out["null_score_diff"].numpy().tolist(),
                  "keys": sorted(out), "start": list(out["start_logits"].shape)}))
"""


@pytest.mark.numerics
def test_saved_model_text_signature_answers_in_a_fresh_process(squad2_export, keras_answers,
                                                               tmp_path):
    ns = squad2_export.ns
    examples = squad.read_squad(V2, "2.0")
    with open(tmp_path / "in.json", "w", encoding="utf-8") as f:
        json.dump([[e.question for e in examples], [e.context for e in examples]], f)
    export = os.path.join(ns.output_dir, "export")
    saved = os.path.join(export, read_json(os.path.join(export, "parity.json"))
                         ["formats"]["saved_model"]["path"])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", _ANSWER, saved, str(tmp_path / "in.json")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["keys"] == ["answer", "end_logits", "null_score_diff", "score", "start_logits"]
    assert got["start"] == [len(examples), SIZES["max_seq_len"]]
    # The same null-score differences as evaluate's null_odds.json (Keras), and the same
    # answers as predictions.json on every question that a logit change of 1e-4 cannot
    # move: same windows, spans and stored threshold.
    odds = read_json(os.path.join(ns.output_dir, "evaluate", "null_odds.json"))
    want = np.array([odds[e.qas_id] for e in examples])
    diffs, span = np.array(got["null_score_diff"]), want < 1e30  # 1e30: no valid span
    np.testing.assert_allclose(diffs[span], want[span], rtol=0, atol=4e-4)
    assert (diffs[~span] >= 1e30).all()
    preds = read_json(os.path.join(ns.output_dir, "evaluate", "predictions.json"))
    margins = keras_answers[2]
    sure = [margins[e.qas_id] > 4e-4 for e in examples]
    assert np.mean(sure) >= MIN_DECIDED, margins
    assert [a for a, s in zip(got["answer"], sure) if s] == \
        [preds[e.qas_id] for e, s in zip(examples, sure) if s]


def test_squad11_distils_from_a_given_teacher_and_reports_em_f1(squad2_run, tmp_path):
    ns = squad2_run.ns
    ns1 = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "v1"), "task": "squad1.1",
                      "train_file": V1, "validation_file": V1, "use_augmented": False,
                      "stages": ["task", "evaluate"], "task_phases": ["prediction"],
                      "pred_epochs": 1, "task_max_steps": 2,
                      "task_teacher": os.path.join(ns.output_dir, "finetune_teacher", "model")})
    run(ns1)
    dev = read_json(os.path.join(ns1.output_dir, "report.json"))["student"]["dev"]
    assert set(dev) == {"exact_match", "f1"}
    preds = read_json(os.path.join(ns1.output_dir, "evaluate", "predictions.json"))
    em, f1 = official_scores(V1, preds)
    assert dev["exact_match"] == pytest.approx(em) and dev["f1"] == pytest.approx(f1)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _doc(context="The cat sat on the mat.", start=4, text="cat"):
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [{"id": "q-1", "question": "Who sat?",
                                      "answers": [{"text": text, "answer_start": start}]}]}]}]})


BAD = {
    "not_json": ("{data: [", r"bad\.json:1:2: not valid JSON"),
    "no_paragraphs": (json.dumps({"data": [{"title": "t"}]}),
                      r"bad\.json: data\[0\]: missing key 'paragraphs'"),
    "offset_outside": (_doc(start=40), r"bad\.json: question id 'q-1' .*outside"),
    "empty_context": (_doc(context="  "), r"bad\.json: data\[0\]\.paragraphs\[0\]: 'context' "
                                          "is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_squad_file_is_one_error_and_nothing_is_written(squad2_run, tmp_path, case):
    ns = squad2_run.ns
    text, pattern = BAD[case]
    bad = _write(tmp_path, "bad.json", text)
    out = tmp_path / "out"
    ns_bad = type(ns)(**{**vars(ns), "output_dir": str(out), "task": "squad1.1",
                         "validation_file": bad, "train_file": V1, "use_augmented": False,
                         "stages": ["task", "evaluate"],
                         "task_teacher": os.path.join(ns.output_dir, "finetune_teacher",
                                                      "model")})
    with pytest.raises(PreflightError, match=pattern) as info:
        run(ns_bad)
    assert len(info.value.errors) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("name,task", [("td_squad11.cfg", "squad1.1"),
                                       ("td_squad20.cfg", "squad2.0")])
def test_squad_configs_carry_berts_windows_and_the_paper_schedule(name, task, monkeypatch):
    from tinybert_tf.cli.flagfiles import expand_flagfiles
    from tinybert_tf.pipeline import flags as tb_flags
    monkeypatch.chdir(REPO)
    f = tb_flags.distill_flags()
    f(expand_flagfiles(["bin/distill", f"--flagfile=configs/{name}"]))
    assert f.task == task and f.max_seq_len == 384 and f.doc_stride == 128
    assert f.max_query_len == 64 and f.n_best_size == 20 and f.max_answer_len == 30
    assert (f.teacher_lr, f.teacher_batch_size, f.teacher_epochs) == (3e-5, 32, 2)
    assert f.intermediate_epochs == 10 and f.pred_epochs == 3 and f.pred_lr == 3e-5
    assert f.use_augmented and "finetune_teacher" in f.stages and f.output_dir


def test_epochs_are_sized_in_windows_not_questions(tmp_path):
    """Steps come from the windows the dataset yields: at these small sizes most
    questions span several windows."""
    vocab = squad_vocab()
    ns = squad_flags(tmp_path, vocab, stages=["finetune_teacher"], dry_run=True,
                     teacher_batch_size=2)
    plan = run(ns)
    (phase,) = plan["phases"]
    examples = squad.read_squad(V2, "2.0")
    windows = len(squad.make_features(examples, Tokenizer(vocab), SIZES["max_seq_len"],
                                      SIZES["doc_stride"], SIZES["max_query_len"]))
    assert windows > len(examples)
    assert phase["examples"] == windows and phase["steps_per_epoch"] == windows // 2
