"""Your own data end to end: CSV / JSON-lines / TSV text tasks and CoNLL NER through every
stage to the exports, bad files refused before anything is written, and tag-preserving
augmentation for token tasks."""
from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from tinybert_tf.data.examples import DataError
from tinybert_tf.pipeline.preflight import PreflightError

from pipeline_helpers import (
    BAD,
    FILLER,
    GOOD,
    REPO,
    read_json,
    run,
    sentence,
    tiny_flags,
    write_teacher,
)

# Fast settings shared by every run here: a random student (no general stage), one
# teacher epoch, few timing repeats; each test adds what it exercises.
FAST = dict(data_dir="", general_model="none", teacher_epochs=1, latency_runs=1,
            export_latency_runs=1, export_formats=["saved_model", "float32"])
NER_TAGS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]


# --- data ---------------------------------------------------------------------------------

def write_reviews_csv(path, n: int, seed: int) -> str:
    """text,label,id with string labels; commas and quotes force CSV quoting."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\r\n")
        w.writerow(["id", "text", "label"])
        for i in range(n):
            positive = i % 2 == 1
            text = sentence(rng, positive)
            if i % 3 == 0:
                text = f'{text}, "{rng.choice(GOOD if positive else BAD)}"'
            w.writerow([f"r{i}", text, "positive" if positive else "negative"])
    return str(path)


def write_pairs_jsonl(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    names = ["contradiction", "entailment", "neutral"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            a, b = rng.random() < 0.5, rng.random() < 0.5
            label = "neutral" if i % 3 == 0 else names[int(a == b)]
            f.write(json.dumps({"premise": sentence(rng, a), "hypothesis": sentence(rng, b),
                                "label": label, "source": "test"}) + "\n")
    return str(path)


def write_scores_tsv(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence\tscore\n")
        for i in range(n):
            positive = i % 2 == 0
            score = (4.0 if positive else 1.0) + rng.random()
            f.write(f"{sentence(rng, positive)}\t{score:.2f}\n")
    return str(path)


def ner_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """PER = actor [cat], LOC = plot [mat]; other words O, some capitalised, some
    multi-piece (movies, playing)."""
    words, tags = [], []
    for _ in range(rng.randint(3, 7)):
        r = rng.random()
        if r < 0.2:
            words += ["actor", "cat"][: rng.randint(1, 2)]
        elif r < 0.35:
            words += ["plot", "mat"][: rng.randint(1, 2)]
        else:
            words.append(rng.choice(FILLER[:8] + GOOD + ["movies", "playing"]))
            tags.append("O")
            continue
        kind = "PER" if words[len(tags)] == "actor" else "LOC"
        tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - len(tags) - 1)
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    return words, tags


def write_conll(path, n: int, seed: int) -> str:
    """CoNLL-2003 layout: word POS chunk tag, -DOCSTART- lines, blank lines between."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("-DOCSTART- -X- -X- O\n\n")
        for _ in range(n):
            words, tags = ner_sentence(rng)
            f.write("".join(f"{w} NN I-NP {t}\n" for w, t in zip(words, tags)) + "\n")
    return str(path)


# --- runs -------------------------------------------------------------------------------

def _run(tmp, vocab, **flags):
    ns = tiny_flags(tmp, vocab, **{**FAST, **flags})
    return ns, run(ns)


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory, tiny_vocab):
    """Classification from CSV with string labels; augmentation and both TD phases."""
    tmp = tmp_path_factory.mktemp("own_csv")
    ns, _ = _run(tmp, tiny_vocab, task="text_classification",
                 train_file=write_reviews_csv(tmp / "train.csv", 24, 0),
                 validation_file=write_reviews_csv(tmp / "dev.csv", 8, 1))
    return ns


# The pair and regression runs start from a given task teacher (its head and label
# names as fine-tuning would leave them) and export the SavedModel only: the stages they
# skip run in the CSV and NER runs, and the file stays within its time budget.

@pytest.fixture(scope="module")
def pair_run(tmp_path_factory, tiny_vocab):
    """A JSON-lines pair task with three named classes."""
    tmp = tmp_path_factory.mktemp("own_pair")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier",
                            label_names=["contradiction", "entailment", "neutral"])
    ns, _ = _run(tmp, tiny_vocab, task="text_classification", text_column="premise",
                 text_pair_column="hypothesis", use_augmented=False, task_phases=["prediction"],
                 task_teacher=teacher, export_formats=["saved_model"],
                 train_file=write_pairs_jsonl(tmp / "train.jsonl", 24, 2),
                 validation_file=write_pairs_jsonl(tmp / "dev.jsonl", 8, 3))
    return ns


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory, tiny_vocab):
    """Regression from TSV."""
    tmp = tmp_path_factory.mktemp("own_reg")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="regressor")
    ns, _ = _run(tmp, tiny_vocab, task="text_regression", text_column="sentence",
                 label_column="score", use_augmented=False, task_phases=["prediction"],
                 task_teacher=teacher, export_formats=["saved_model"],
                 train_file=write_scores_tsv(tmp / "train.tsv", 24, 4),
                 validation_file=write_scores_tsv(tmp / "dev.tsv", 8, 5))
    return ns


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory, tiny_vocab):
    """CoNLL NER with tag-preserving augmentation and both TD phases."""
    tmp = tmp_path_factory.mktemp("own_ner")
    ns, _ = _run(tmp, tiny_vocab, task="token_classification",
                 train_file=write_conll(tmp / "train.conll", 24, 6),
                 validation_file=write_conll(tmp / "dev.conll", 8, 7))
    return ns


SERVE = r"""
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


def saved_model_dir(ns) -> str:
    return os.path.join(ns.output_dir, "export", "serving", "1")


@pytest.fixture(scope="module")
def served(csv_run, pair_run, regression_run, ner_run):
    """Every run's SavedModel called in ONE fresh process (no state shared with the runs)."""
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

def test_csv_classification_names_its_labels_in_every_model_and_export(csv_run, served):
    names = ["negative", "positive"]
    assert labels_in(csv_run, "finetune_teacher", "model") == names
    assert labels_in(csv_run, "task", "model") == names
    assets = os.path.join(saved_model_dir(csv_run), "assets", "labels.txt")
    assert open(assets, encoding="utf-8").read().split() == names
    parity = read_json(os.path.join(csv_run.output_dir, "export", "parity.json"))
    assert parity["labels"] == names and parity["metric_name"] == "accuracy"
    assert parity["formats"]["float32"]["label_agreement"] == 1.0
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


def test_ner_savedmodel_tags_each_word_as_the_keras_student_does(ner_run, served):
    from tinybert_tf.data.examples import Example
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer
    from tinybert_tf.tasks.token import TokenClassification

    assert labels_in(ner_run, "task", "model") == NER_TAGS
    out = served[4]
    counts = [len(s.split()) for s in NER_SENTENCES]
    assert out["num_words"] == counts
    student = load_model(os.path.join(ner_run.output_dir, "task", "model"))
    task = TokenClassification(NER_TAGS)
    keras_ids = task.predict(student, [Example(str(i), s, None, None) for i, s in
                                       enumerate(NER_SENTENCES)],
                             load_tokenizer(student, 24), 24, 8)
    for i, n in enumerate(counts):
        assert out["words"][i][:n] == NER_SENTENCES[i].split()
        assert out["tags"][i][:n] == [NER_TAGS[t] for t in keras_ids[i]]
        assert all(t == "" for t in out["tags"][i][n:])
        probs = np.array(out["word_probabilities"][i])[:n]  # [n, C]
        placed = probs.sum(-1) > 0
        np.testing.assert_allclose(probs[placed].sum(-1), 1.0, atol=1e-5)
        assert (probs[placed].argmax(-1) == np.array(keras_ids[i])[placed]).all()
    # 15 two-piece words + 2 do not fit 22 positions: the last words get "O" and zeros.
    cut = np.array(out["word_probabilities"][3])[: counts[3]].sum(-1) == 0
    assert cut[-1] and not cut[0] and all(out["tags"][3][j] == "O" for j in np.flatnonzero(cut))
    ids = served[5]
    assert np.shape(ids["probabilities"]) == (1, 4, len(NER_TAGS))
    assert set(sum(ids["tags"], [])) <= set(NER_TAGS)


def test_ner_exports_agree_per_word_in_parity(ner_run):
    parity = read_json(os.path.join(ner_run.output_dir, "export", "parity.json"))
    assert parity["labels"] == NER_TAGS and parity["metric_name"] == "f1"
    for name in ("saved_model", "float32"):
        assert parity["formats"][name]["label_agreement"] == 1.0, name
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
