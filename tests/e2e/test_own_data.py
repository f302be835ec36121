"""Your own data end to end: CSV / JSON-lines / TSV text tasks and CoNLL NER through every
stage to the exports, bad files refused before anything is written, and tag-preserving
augmentation for token tasks."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tinybert_tf.data.examples import DataError
from tinybert_tf.pipeline.preflight import PreflightError

from numerics import assert_labels_are_argmax, assert_parity_agrees, assert_same_labels
from pipeline_helpers import (
    FAST,
    NER_TAGS,
    REPO,
    SERVER_SCRIPT_HEAD,
    parity_reference,
    read_json,
    run,
    shared_folder,
    shared_run,
    tiny_flags,
    write_conll,
    write_reviews_csv,
)

SERVE = SERVER_SCRIPT_HEAD + r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
out = []
for req in json.load(sys.stdin):
    fn = tf.saved_model.load(req["dir"]).signatures[req["signature"]]
    res = fn(**{k: tf.constant(v) for k, v in req["inputs"].items()})
    out.append({k: np.char.decode(v.numpy().astype(bytes)).tolist() if v.dtype == tf.string
                else v.numpy().tolist() for k, v in res.items()})
print(json.dumps(out))
"""
NER_SENTENCES = ["The actor cat was playing", "plot mat", "",
                 " ".join(["movies"] * 15 + ["actor", "plot"])]  # the last is cut at L=24


# The CSV run is the quickstart's (conftest's quickstart_run: the quickstart flagfile on
# the review CSVs, every stage from general to the SavedModel and float32 exports), which
# tests/e2e/test_quickstart.py reads too: one pipeline run for both modules.

@pytest.fixture(scope="session")
def csv_run(quickstart_run):
    """Classification from CSV with string labels: teacher, augmentation, both task
    phases, evaluation, SavedModel and float32 export (the quickstart's run)."""
    return quickstart_run


# The CoNLL run is conftest's ner_run for the task stage's prediction phase only (no
# assertion here reads the intermediate phase, which the CSV run and
# tests/e2e/test_pipeline.py's runs cover): one phase fewer to trace and train.

@pytest.fixture(scope="session")
def ner_run(tmp_path_factory, tiny_vocab):
    """CoNLL NER: teacher, tag-preserving augmentation, prediction phase, evaluation,
    SavedModel and float32 export."""
    def flags(tmp):
        return tiny_flags(tmp, tiny_vocab, **FAST, task="token_classification",
                          task_phases=["prediction"],
                          train_file=write_conll(tmp / "train.conll", 24, 6),
                          validation_file=write_conll(tmp / "dev.conll", 8, 7))
    return shared_run(tmp_path_factory, "own_ner_prediction", flags)


def saved_model_dir(ns) -> str:
    return os.path.join(ns.output_dir, "export", "serving", "1")


@pytest.fixture(scope="session")
def served(tmp_path_factory, csv_run, pair_run, regression_run, ner_run):
    """Every run's SavedModel called in ONE fresh process (no state shared with the runs),
    once per session (the tests using it run on two workers)."""
    return shared_folder(tmp_path_factory, "own_served",
                         lambda _: _serve(csv_run, pair_run, regression_run, ner_run))[1]


def _serve(csv_run, pair_run, regression_run, ner_run) -> list:
    ids = {"input_word_ids": [[7, 40, 8, 0]], "input_mask": [[1, 1, 1, 0]],
           "input_type_ids": [[0, 0, 0, 0]]}
    requests = [
        {"dir": saved_model_dir(csv_run), "signature": "serving_default",
         "inputs": {"text": ["a great film", "the plot was awful, \"bad\""]}},
        {"dir": saved_model_dir(csv_run), "signature": "serve_ids", "inputs": ids},
        {"dir": saved_model_dir(pair_run), "signature": "serving_default",
         "inputs": {"text": ["a good film"], "text_b": ["the plot is bad"]}},
        {"dir": saved_model_dir(regression_run), "signature": "serving_default",
         "inputs": {"text": ["a great film", "an awful plot"]}},
        {"dir": saved_model_dir(ner_run), "signature": "serving_default",
         "inputs": {"text": NER_SENTENCES}},
        {"dir": saved_model_dir(ner_run), "signature": "serve_ids", "inputs": ids},
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", SERVE], input=json.dumps(requests),
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def labels_in(ns, *parts) -> list:
    return read_json(os.path.join(ns.output_dir, *parts, "config.json"))["label_names"]


def dev_metrics(ns) -> dict:
    return read_json(os.path.join(ns.output_dir, "report.json"))["student"]["dev"]


# --- text tasks ---------------------------------------------------------------------------

@pytest.mark.numerics
def test_csv_classification_names_its_labels_in_every_model_and_export(csv_run, served):
    names = ["negative", "positive"]
    assert labels_in(csv_run, "finetune_teacher", "model") == names
    assert labels_in(csv_run, "task", "model") == names
    assets = os.path.join(saved_model_dir(csv_run), "assets", "labels.txt")
    assert open(assets, encoding="utf-8").read().split() == names
    parity = read_json(os.path.join(csv_run.output_dir, "export", "parity.json"))
    assert parity["labels"] == names and parity["metric_name"] == "accuracy"
    assert_parity_agrees(parity["formats"]["float32"], parity_reference(csv_run.ns)[0], 1e-4,
                         name="float32")
    text, ids = served[0], served[1]
    assert set(text["label"]) <= set(names) and np.shape(text["probabilities"]) == (2, 2)
    assert set(ids["label"]) <= set(names)


def test_csv_classification_reports_accuracy_macro_and_per_class_f1(csv_run):
    dev = dev_metrics(csv_run)
    for key in ("accuracy", "macro_f1", "f1_negative", "f1_positive"):
        assert 0.0 <= dev[key] <= 1.0, key


def test_csv_augmentation_stays_csv_with_every_column(csv_run):
    with open(csv_run.train_file, encoding="utf-8", newline="") as f:
        original = list(csv.reader(f))
    path = os.path.join(csv_run.output_dir, "augment", "train_aug.csv")
    with open(path, encoding="utf-8", newline="") as f:
        augmented = list(csv.reader(f))
    assert augmented[0] == original[0]  # the header
    by_id = {row[0]: row for row in original[1:]}
    assert len(augmented) > len(original)
    for row in augmented[1:]:
        assert row[0] in by_id and row[2] == by_id[row[0]][2]  # id and label copied
    assert all(row in augmented for row in original[1:])  # originals kept, quoting intact


def test_jsonl_pair_task_serves_pairs_with_named_labels(pair_run, served):
    names = ["contradiction", "entailment", "neutral"]
    assert labels_in(pair_run, "task", "model") == names
    out = served[2]
    assert out["label"][0] in names and np.shape(out["probabilities"]) == (1, 3)
    dev = dev_metrics(pair_run)
    assert {"accuracy", "macro_f1", *(f"f1_{n}" for n in names)} <= set(dev)
    assert read_json(os.path.join(pair_run.output_dir, "export", "parity.json"))["is_pair"]


def test_regression_reports_pearson_and_spearman_and_serves_a_score(regression_run, served):
    dev = dev_metrics(regression_run)
    for key in ("pearson", "spearman", "pearson_spearman_mean"):
        assert -1.0 <= dev[key] <= 1.0, key
    assert np.shape(served[3]["score"]) == (2,)


# --- token classification --------------------------------------------------------------

def test_ner_reports_entity_scores_and_writes_conll_predictions(ner_run):
    dev = dev_metrics(ner_run)
    for key in ("f1", "precision", "recall", "accuracy"):
        assert 0.0 <= dev[key] <= 1.0, key
    assert read_json(os.path.join(ner_run.output_dir, "report.json"))["primary_metric"] == "f1"
    lines = open(os.path.join(ner_run.output_dir, "evaluate", "predictions.conll"),
                 encoding="utf-8").read().split("\n")
    words = [line.split() for line in lines if line]
    assert all(len(w) == 3 and w[1] in NER_TAGS and w[2] in NER_TAGS for w in words)


def test_ner_augmentation_keeps_every_tag_sequence(ner_run):
    from tinybert_tf.data.conll import load_conll
    original = load_conll(ner_run.train_file)
    augmented = load_conll(os.path.join(ner_run.output_dir, "augment", "train_aug.conll"))
    assert len(augmented) > len(original)
    shapes = {(len(s.words), tuple(s.tags)) for s in original}
    assert all((len(s.words), tuple(s.tags)) in shapes for s in augmented)


@pytest.mark.numerics
def test_ner_savedmodel_tags_each_word_as_the_keras_student_does(ner_run, served):
    from tinybert_tf.data.examples import Example
    from tinybert_tf.export.common import keras_outputs
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer
    from tinybert_tf.tasks.token import TokenClassification

    assert labels_in(ner_run, "task", "model") == NER_TAGS
    out = served[4]
    counts = [len(s.split()) for s in NER_SENTENCES]
    assert out["num_words"] == counts
    student = load_model(os.path.join(ner_run.output_dir, "task", "model"))
    task = TokenClassification(NER_TAGS)
    tokenizer = load_tokenizer(student, 24)
    keras_ids = task.predict(student, [Example(str(i), s, None, None) for i, s in
                                       enumerate(NER_SENTENCES)], tokenizer, 24, 8)
    # Keras's probabilities at each word's first piece (zeros for words cut off).
    x = task.export_inputs(tokenizer, NER_SENTENCES, None, 24)
    pieces = keras_outputs(student, task, x)  # [N, L, C]
    keras_probs = np.zeros((len(counts), max(counts), len(NER_TAGS)))
    rows, cols = np.nonzero(x["word_index"] >= 0)
    keras_probs[rows, x["word_index"][rows, cols]] = pieces[rows, cols]
    for i, n in enumerate(counts):
        assert out["words"][i][:n] == NER_SENTENCES[i].split()
        assert all(t == "" for t in out["tags"][i][n:])
        probs = np.array(out["word_probabilities"][i])[:n]  # [n, C]
        placed = probs.sum(-1) > 0
        np.testing.assert_array_equal(placed, keras_probs[i, :n].sum(-1) > 0)
        np.testing.assert_allclose(probs[placed].sum(-1), 1.0, atol=1e-5)
        # Keras's tags: the SavedModel's probabilities within 1e-5, the same tag on every
        # word whose top two tags are further apart than that, "O" on words cut off.
        tags = [NER_TAGS[t] for t in np.array(out["tag_ids"][i])[:n]]
        assert tags == out["tags"][i][:n]
        if placed.any():  # the empty sentence has no word
            assert_same_labels(probs[placed], keras_probs[i, :n][placed], 1e-5,
                               err_msg=NER_SENTENCES[i])
            assert_labels_are_argmax(np.array(out["tag_ids"][i])[:n][placed],
                                     keras_probs[i, :n][placed], err_msg=NER_SENTENCES[i])
        assert [t for t, p in zip(tags, placed) if not p] == \
            [NER_TAGS[t] for t, p in zip(keras_ids[i], placed) if not p]
    # 15 two-piece words + 2 do not fit 22 positions: the last words get "O" and zeros.
    cut = np.array(out["word_probabilities"][3])[: counts[3]].sum(-1) == 0
    assert cut[-1] and not cut[0] and all(out["tags"][3][j] == "O" for j in np.flatnonzero(cut))
    ids = served[5]
    assert np.shape(ids["probabilities"]) == (1, 4, len(NER_TAGS))
    assert set(sum(ids["tags"], [])) <= set(NER_TAGS)


@pytest.mark.numerics
def test_ner_exports_agree_per_word_in_parity(ner_run):
    parity = read_json(os.path.join(ner_run.output_dir, "export", "parity.json"))
    assert parity["labels"] == NER_TAGS and parity["metric_name"] == "f1"
    probs, inputs = parity_reference(ner_run.ns)
    for name in ("saved_model", "float32"):
        # Agreement counts words (their first pieces).
        assert_parity_agrees(parity["formats"][name], probs, 1e-4,
                             where=inputs["word_index"] >= 0, name=name)
        assert 0.0 <= parity["formats"][name]["metric"] <= 1.0
    assert os.path.isfile(os.path.join(ner_run.output_dir, "export", "model_float32.tflite"))


# --- bad input: one error naming file and line, nothing written ---------------------------

def write(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


GOOD_CSV = "text,label\na good film,positive\nan awful plot,negative\n"
GOOD_CONLL = "the O\nactor B-PER\n\nplot B-LOC\nmat I-LOC\n"


@pytest.mark.parametrize("task,train,dev,error,match", [
    ("text_classification", "review,label\na good film,positive\n", GOOD_CSV, DataError,
     r"train\.csv:1: no column 'text' \(--text_column\); the header has the columns "
     r"\['review', 'label'\]"),
    ("text_classification", "", GOOD_CSV, DataError, r"train\.csv: empty file"),
    ("text_classification", GOOD_CSV, GOOD_CSV + "so so,neutral\n", PreflightError,
     r"dev\.csv:4: label 'neutral' in column 'label' does not occur in the training file.*"
     r"--labels=negative,positive,neutral"),
    ("text_regression", "text,label\na good film,4.5\nan awful plot,high\n", GOOD_CSV,
     PreflightError, r"train\.csv:3: regression target 'high' in column 'label' is not a "
                     r"number"),
], ids=["missing-column", "empty-file", "unseen-dev-label", "non-numeric-target"])
def test_bad_text_files_are_refused_before_anything_is_written(tmp_path, tiny_vocab, task,
                                                               train, dev, error, match):
    ns = tiny_flags(tmp_path, tiny_vocab, **{
        **FAST, "stages": ["finetune_teacher"], "task": task,
        "train_file": write(tmp_path / "train.csv", train),
        "validation_file": write(tmp_path / "dev.csv", dev)})
    with pytest.raises(error, match=match):
        run(ns)
    assert not os.path.exists(ns.output_dir)


@pytest.mark.parametrize("name,train,match", [
    ("train.conll", "the DT O\nactor NN B-PER\nplot B-LOC\n",
     r"train\.conll:3: 2 whitespace-separated columns, but the file's first word line \(1\) "
     r"has 3"),
    ("train.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a", "b"], "tags": ["O"]}\n',
     r"train\.jsonl:2: 2 tokens but 1 tags"),
], ids=["conll-columns", "jsonl-lengths"])
def test_bad_token_files_are_refused_before_anything_is_written(tmp_path, tiny_vocab, name,
                                                                train, match):
    ns = tiny_flags(tmp_path, tiny_vocab, **{
        **FAST, "stages": ["finetune_teacher"], "task": "token_classification",
        "train_file": write(tmp_path / name, train),
        "validation_file": write(tmp_path / "dev.conll", GOOD_CONLL)})
    with pytest.raises(DataError, match=match):
        run(ns)
    assert not os.path.exists(ns.output_dir)


def test_bin_distill_prints_one_line_for_a_bad_dev_file(tmp_path, tiny_vocab, capsys):
    from tinybert_tf.pipeline.main import main

    from pipeline_helpers import argv
    ns = tiny_flags(tmp_path, tiny_vocab, **{
        **FAST, "stages": ["finetune_teacher"], "task": "token_classification",
        "teacher_batch_size": 2, "train_file": write(tmp_path / "train.conll", GOOD_CONLL),
        "validation_file": write(tmp_path / "dev.conll", "the O\nParis B-GPE\n")})
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "dev.conll:2: tag 'B-GPE' (word 'Paris') does not occur in the training file" in err
    assert not os.path.exists(ns.output_dir)


def test_test_file_may_be_unlabelled_but_its_labels_must_be_known(tmp_path):
    from tinybert_tf.tasks import TaskConfig, resolve_task
    fixtures = os.path.join(REPO, "tests", "fixtures", "own_data")
    config = dict(task="text_classification",
                  train_file=os.path.join(fixtures, "reviews_train.csv"),
                  validation_file=os.path.join(fixtures, "reviews_dev.csv"))
    task = resolve_task(TaskConfig(**config,
                                   test_file=os.path.join(fixtures, "reviews_test.csv")))
    assert [e.label for e in task.examples("test")] == [None, None]
    bad = write(tmp_path / "test.csv", "text,label\nfine,positive\nmeh,mixed\n")
    with pytest.raises(DataError, match=r"test\.csv:3: label 'mixed' .*--labels="):
        resolve_task(TaskConfig(**config, test_file=bad))


def test_invalid_iob2_is_counted_and_warned_not_refused(tmp_path, tiny_vocab, caplog):
    ns = tiny_flags(tmp_path, tiny_vocab, **{
        **FAST, "stages": ["finetune_teacher"], "task": "token_classification",
        "dry_run": True, "teacher_batch_size": 2,
        "train_file": write(tmp_path / "train.conll", GOOD_CONLL + "\nthe O\nmat I-LOC\n"),
        "validation_file": write(tmp_path / "dev.conll", GOOD_CONLL)})
    plan = run(ns)
    assert plan["task"]["type"]["labels"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert "1 I- tag(s) continue no entity of their type" in caplog.text
    assert "train.conll" in caplog.text


def test_a_dev_file_that_is_the_training_file_is_warned_about(tmp_path, tiny_vocab, capsys):
    """Dev metrics on the training rows, and every choice made on dev, measure nothing
    held out: the plan warns (a smoke test may do it on purpose)."""
    train = write_reviews_csv(tmp_path / "train.csv", 24, 1)
    copy = tmp_path / "copy.csv"
    copy.write_bytes(open(train, "rb").read())

    def warnings(dev):
        ns = tiny_flags(tmp_path / f"run_{os.path.basename(dev)}", tiny_vocab, **{
            **FAST, "stages": ["finetune_teacher"], "task": "text_classification",
            "dry_run": True, "teacher_batch_size": 2, "train_file": train,
            "validation_file": str(dev)})
        return [w for w in run(ns)["warnings"] if "split" in w]

    assert warnings(train) == [
        f"the dev split ({train}) is the same file as the train split ({train}): dev metrics "
        "then score rows the models trained on, and the checkpoints and settings chosen on "
        "dev are the ones that fit them; give held-out rows (e.g. --validation_file) for a "
        "real measure."]
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(said) == 1 and said[0].startswith(  # once, on stderr
        f"distill: warning: the dev split ({train}) is the same file as the train split")
    assert [w.split(":")[0] for w in warnings(copy)] == [
        f"the dev split ({copy}) is a copy of the train split ({train})"]
    assert warnings(write_reviews_csv(tmp_path / "dev.csv", 8, 2)) == []


# --- augmentation of token tasks: one word for one word, tags copied ------------------------

CONLL_2003 = """-DOCSTART- -X- -X- O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
visited VBD B-VP O
Paris NNP B-NP B-LOC
on IN B-PP O
Monday NNP B-NP O
. . O O

The DT B-NP O
U.S. NNP I-NP B-LOC
team NN I-NP O
played VBD B-VP O
in IN B-PP O
LONDON NNP B-NP B-LOC
"""


def word_vectors():
    """Tiny vectors whose neighbours are obvious: cities, days, names, verbs."""
    from gensim.models import KeyedVectors
    groups = [["paris", "rome", "berlin"], ["monday", "tuesday"], ["peter", "john"],
              ["visited", "saw"], ["london", "madrid"], ["team", "side"], ["played", "won"]]
    kv = KeyedVectors(vector_size=len(groups))
    for i, group in enumerate(groups):
        for j, word in enumerate(group):
            vec = np.full(len(groups), 0.01, np.float32)
            vec[i] = 1.0 + 0.01 * j
            kv.add_vector(word, vec)
    return kv


@pytest.mark.parametrize("fmt", ["conll", "jsonl"])
def test_token_augmentation_replaces_words_one_for_one_and_copies_tags(tmp_path, fmt):
    from tinybert_tf.augment.augmenter import augment_source
    from tinybert_tf.data.conll import load_conll, load_sentences
    from tinybert_tf.tasks import TaskConfig, resolve_task

    path = write(tmp_path / "train.conll", CONLL_2003)
    original = load_conll(path)
    if fmt == "jsonl":
        path = write(tmp_path / "train.jsonl", "".join(
            json.dumps({"id": i, "tokens": s.words, "tags": s.tags}) + "\n"
            for i, s in enumerate(original)))
    task = resolve_task(TaskConfig(task="token_classification", train_file=path,
                                   validation_file=path))
    out = str(tmp_path / "augment" / task.source.augmented_name)
    stats = augment_source(task.source, out, word_vectors=word_vectors(), num_aug=6,
                           replace_prob=0.5, num_candidates=2, seed=0, progress=False)
    augmented = load_sentences(out)
    assert stats["written"] == len(augmented) > len(original)
    firsts = {tuple(s.words): s for s in original}
    source_of = None
    for s in augmented:
        if tuple(s.words) in firsts:
            source_of = firsts[tuple(s.words)]
            continue
        assert source_of is not None and s.tags == source_of.tags  # variants follow their row
        assert len(s.words) == len(source_of.words)
        for new, old in zip(s.words, source_of.words):
            if new != old:  # a replaced word: alphabetic, cased as the original
                assert old.isalpha() and new.isalpha()
                assert new[0].isupper() == old[0].isupper() and new.isupper() == old.isupper()
    assert "U.S." in sum((s.words for s in augmented), [])
    if fmt == "jsonl":
        ids = [json.loads(line)["id"] for line in open(out, encoding="utf-8")]
        assert set(ids) == {0, 1}
    examples = task.with_augmented(out).examples("train_aug")
    assert [len(e.label) for e in examples] == [len(s.words) for s in augmented]


def test_tabular_jsonl_augmentation_keeps_other_keys_and_both_texts(tmp_path):
    from tinybert_tf.augment.augmenter import augment_source
    from tinybert_tf.tasks import TaskConfig, resolve_task

    rows = [{"premise": "Peter visited Paris on Monday", "hypothesis": "John saw Rome",
             "label": "entailment", "n": 1},
            {"premise": "The team played in London", "hypothesis": "Nobody won",
             "label": "contradiction", "n": 2}]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    task = resolve_task(TaskConfig(task="text_classification", train_file=path,
                                   validation_file=path, text_column="premise",
                                   text_pair_column="hypothesis"))
    assert task.source.augmented_name == "train_aug.jsonl"
    out = str(tmp_path / "train_aug.jsonl")
    augment_source(task.source, out, word_vectors=word_vectors(), num_aug=4,
                   replace_prob=0.5, num_candidates=2, seed=0, progress=False)
    written = [json.loads(line) for line in open(out, encoding="utf-8")]
    assert written[0] == rows[0] and len(written) > 2
    for obj in written:
        assert set(obj) == {"premise", "hypothesis", "label", "n"}
        src = rows[obj["n"] - 1]
        # A pair varies one side at a time, as for GLUE.
        assert obj["premise"] == src["premise"] or obj["hypothesis"] == src["hypothesis"]
    labels = [e.label for e in task.with_augmented(out).examples("train_aug")]
    assert set(labels) == {0, 1}


# --- the token task type ------------------------------------------------------------------

def test_token_prediction_loss_averages_over_first_pieces_only():
    import tensorflow as tf

    from tinybert_tf.distill import losses
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 3))
    labels = np.array([[-1, 0, -1, 2, -1], [-1, 1, 1, -1, -1]])
    p_t = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
    log_s = s - np.log(np.exp(s).sum(-1, keepdims=True))
    ce = -(p_t * log_s).sum(-1)
    want = ce[labels >= 0].mean()
    got = losses.token_soft_cross_entropy(tf.constant(s), tf.constant(t), labels)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    total = losses.token_soft_cross_entropy(s, t, labels, reduction="sum")
    np.testing.assert_allclose(float(total), ce[labels >= 0].sum(), rtol=1e-5)


def test_masked_token_accuracy_ignores_unlabelled_positions():
    from tinybert_tf.tasks.token import MaskedTokenAccuracy
    metric = MaskedTokenAccuracy()
    logits = np.eye(3, dtype=np.float32)[[[0, 1, 2, 0]]]  # predicts 0, 1, 2, 0
    metric.update_state(np.array([[0, -1, 1, -1]]), logits)
    assert float(metric.result()) == 0.5


def test_entity_scores_match_seqeval_strict_iob2():
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    from tinybert_tf.data.examples import Example
    from tinybert_tf.tasks.token import TokenClassification

    task = TokenClassification(NER_TAGS)
    rng = np.random.default_rng(1)
    examples, predictions = [], []
    for i in range(40):
        n = int(rng.integers(1, 9))
        examples.append(Example(str(i), " ".join(["w"] * n), None,
                                rng.integers(0, 5, n).tolist()))
        predictions.append(rng.integers(0, 5, n))
    got = task.score(predictions, examples)
    gold = [[NER_TAGS[i] for i in ex.label] for ex in examples]
    pred = [[NER_TAGS[i] for i in p] for p in predictions]
    kw = dict(mode="strict", scheme=IOB2)
    assert got["f1"] == pytest.approx(f1_score(gold, pred, **kw))
    assert got["precision"] == pytest.approx(precision_score(gold, pred, **kw))
    assert got["recall"] == pytest.approx(recall_score(gold, pred, **kw))


def test_text_signature_aligns_words_as_training_does(tiny_vocab):
    """serve_text (in graph) and align_words (training, evaluation) put each word on the
    same first piece: words without pieces, punctuation inside words, truncation."""
    import tensorflow as tf

    from tinybert_tf.data.conll import align_words, split_words, word_predictions
    from tinybert_tf.tasks.token import TokenClassification
    from tinybert_tf.tokenizer import Tokenizer

    class Module:  # what export.saved_model.ServingModule offers serve_text
        tokenizer, max_seq_len = Tokenizer(tiny_vocab), 12
        label_names = tf.constant(NER_TAGS)

        def logits(self, inputs):  # depends on the piece and its position
            ids = inputs["input_word_ids"] + tf.range(12)[None, :]
            return tf.one_hot(ids % 5, 5) * 3.0

    texts = ["U.S. actor \u0301 played", "the cafe\u0301s was boring", "", "a " * 20,
             "hello\tworld  run"]
    task = TokenClassification(NER_TAGS)
    out = tf.function(lambda x: task.serve_text(Module(), x))(tf.constant(texts))
    words = [split_words(t) for t in texts]
    aligned = align_words(Module.tokenizer, words, None, 12)
    want = word_predictions(Module().logits(aligned.inputs).numpy(), aligned.word_index,
                            aligned.num_words, fill=0)
    assert out["num_words"].numpy().tolist() == [len(w) for w in words]
    for i, w in enumerate(words):
        assert [x.decode() for x in out["words"].numpy()[i][: len(w)]] == w
        assert out["tag_ids"].numpy()[i][: len(w)].tolist() == want[i].tolist()
        assert [x.decode() for x in out["tags"].numpy()[i][: len(w)]] == \
            [NER_TAGS[j] for j in want[i]]
    probs = out["word_probabilities"].numpy()[3]  # 20 words, 10 positions
    assert (probs[:10].sum(-1) > 0.99).all() and (probs[10:].sum(-1) == 0).all()
