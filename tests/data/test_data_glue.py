"""GLUE loaders on hand-written fixtures in the real GLUE layouts, TFDS via mock_data,
bad-input errors, the demo task and the task tf.data pipeline."""
import logging
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.data import glue, polarity, sentences, sources
from tinybert_tf.data.glue import DataError
from tinybert_tf.tokenizer import Tokenizer

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "glue")
DIRS = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B", "qqp": "QQP",
        "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def fixture_dir(task):
    return os.path.join(FIX, DIRS[glue.get_task(task).name])


def test_task_names_case_insensitive():
    for name in ["SST-2", "sst-2", "sst2", "Sst_2"]:
        assert glue.get_task(name).name == "sst-2"
    assert glue.get_task("STS-B").name == glue.get_task("stsb").name == "sts-b"
    assert glue.get_task("CoLA").name == "cola"
    with pytest.raises(DataError, match="unknown task 'sst3'.*known tasks"):
        glue.get_task("sst3")


def test_task_table_conventions():
    assert glue.label_names("mnli") == ("contradiction", "entailment", "neutral")
    assert glue.label_names("cola") == ("0", "1")
    assert glue.label_names("qnli") == glue.label_names("rte") == ("entailment", "not_entailment")
    assert glue.label_names("sts-b") == ()
    assert glue.get_task("sts-b").is_regression and glue.get_task("sts-b").num_labels == 1
    assert glue.get_task("sst-2").default_max_seq_len == 64
    assert glue.get_task("mrpc").default_max_seq_len == 128
    mnli = glue.get_task("mnli")
    assert mnli.dev_splits == ("dev_matched", "dev_mismatched")
    assert mnli.layout("train").num_columns == 12 and mnli.layout("dev_matched").num_columns == 16
    assert mnli.layout("dev").file == "dev_matched.tsv"
    cola = glue.get_task("cola")
    assert not cola.has_header and cola.layout("test").has_header
    assert glue.get_task("mrpc").label_col == 0 and glue.get_task("sts-b").label_col == 9


# Per task: (split, count, first example (text_a, text_b, label)).
EXPECTED = {
    "cola": [("train", 5, ("The cat sat on the mat.", None, 1)),
             ("dev", 3, ("The actor played a bad role.", None, 1)),
             ("test", 2, ("The plot was fun.", None, None))],
    "sst-2": [("train", 5, ("a boring , awful movie ", None, 0)),
              ("dev", 2, ("a very good movie . ", None, 1)),
              ("test", 2, ("the story was fun .", None, None))],
    "mrpc": [("train", 3, ("The company said profits rose 5 percent in the third quarter .",
                           "Profits at the company climbed 5 percent in the third quarter , it "
                           "said .", 1)),
             ("test", 1, ("The bridge will reopen next week .",
                          "Next week the bridge opens again .", None))],
    "sts-b": [("train", 4, ("A dog is running in a field.", "A dog runs across a field.", 4.8)),
              ("dev", 3, ("A child is riding a bike.", "A kid rides a bicycle.", 4.75)),
              ("test", 1, ("A girl is brushing her hair.", "A girl is combing her hair.", None))],
    "qqp": [("train", 3, ("How do I learn to play the guitar?",
                          "What is the best way to learn guitar?", 1)),
            ("dev", 3, ("How can I sleep better at night?", "What helps you fall asleep faster?", 1)),  # noqa: E501
            ("test", 1, ("How do magnets work?", "Why do magnets attract iron?", None))],
    "mnli": [("train", 6, ("The office opens at nine every weekday.",
                           "The office is open on weekdays.", 1)),
             ("dev_matched", 3, ("The new rules start next year.",
                                 "The rules are already in force.", 0)),
             ("dev_mismatched", 2, ("Your gift helped us buy new books.",
                                    "The gift was of no use.", 0)),
             ("test_matched", 1, ("The park closes at dusk.", "The park is open at night.", None)),
             ("test_mismatched", 1, ("What did you decide?", "So what is your decision?", None))],
    "qnli": [("train", 3, ("When was the bridge built?",
                           "The bridge was built in 1890 and rebuilt after the flood.", 0)),
             ("test", 1, ("What year did the war end?", "The war ended in 1918.", None))],
    "rte": [("dev", 2, ("The author, who lives in Paris, wrote three books.",
                        "The author lives in Rome.", 1))],
    "wnli": [("train", 4, ("I put the cake in the box because it was small.",
                           "The cake was small.", 1)),
             ("dev", 2, ("The man lifted the boy because he was strong.", "The boy was strong.", 0))],  # noqa: E501
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_every_task_layout_loads(task):
    for split, count, (a, b, label) in EXPECTED[task]:
        ex = glue.load_examples(task.upper(), fixture_dir(task), split)
        assert len(ex) == count and ex.skipped == 0
        assert (ex[0].text_a, ex[0].text_b, ex[0].label) == (a, b, label)
        assert ex.source.endswith(glue.get_task(task).layout(split).file)


def test_labels_and_quotes_kept_exactly():
    mnli = glue.load_examples("mnli", fixture_dir("mnli"), "train")
    names = glue.label_names("mnli")
    assert [names[e.label] for e in mnli] == ["entailment", "contradiction", "neutral",
                                               "contradiction", "entailment", "neutral"]
    assert mnli[4].text_a == 'Critics called the play "bold".'
    cola = glue.load_examples("cola", fixture_dir("cola"), "train")
    assert [e.label for e in cola] == [1, 0, 1, 0, 1]
    assert cola[2].text_a == 'She said "hello" to the dog.'
    rte = glue.load_examples("rte", fixture_dir("rte"), "train")
    assert [e.label for e in rte] == [0, 1, 0]
    stsb = glue.load_examples("sts-b", fixture_dir("sts-b"), "train")
    assert all(isinstance(e.label, float) for e in stsb)
    assert [e.label for e in stsb] == [4.8, 3.2, 0.0, 2.5]


def test_read_write_rows_round_trip_and_train_aug(tmp_path):
    for task in ["sst-2", "cola", "mnli"]:
        d = tmp_path / task
        shutil.copytree(fixture_dir(task), d)
        header, rows = glue.read_rows(task, str(d), "train")
        rows = [fields for _, fields in rows]
        n = glue.write_rows(str(d / "train_aug.tsv"), header, rows + rows)
        assert n == 2 * len(rows)
        aug = glue.load_examples(task, str(d), "train_aug")
        orig = glue.load_examples(task, str(d), "train")
        assert [(e.text_a, e.text_b, e.label) for e in aug] == \
            [(e.text_a, e.text_b, e.label) for e in orig] * 2
    assert glue.read_rows("cola", fixture_dir("cola"), "train")[0] is None
    with pytest.raises(ValueError, match="tab or newline"):
        glue.write_rows(str(tmp_path / "x.tsv"), ["sentence", "label"], [["a\tb", "1"]])
    assert not (tmp_path / "x.tsv").exists()


def test_an_augmented_file_is_read_by_its_own_name_not_as_train_aug_beside_it(tmp_path):
    """bin/augment --output may name any .tsv; --augmented_file=aug/small.tsv read
    aug/train_aug.tsv when both were there (another augmentation), without a word."""
    d = tmp_path / "aug"
    shutil.copytree(fixture_dir("sst-2"), d)
    header, rows = glue.read_rows("sst-2", str(d), "train")
    rows = [fields for _, fields in rows]
    glue.write_rows(str(d / "train_aug.tsv"), header, rows * 3)
    glue.write_rows(str(d / "small.tsv"), header, rows[:1])
    read = sources.glue_source("sst-2", str(d)).augmented(str(d / "small.tsv")).load(
        "train_aug")
    assert [(e.text_a, e.label) for e in read] == [(rows[0][0], int(rows[0][1]))]
    with pytest.raises(DataError, match=r"none\.tsv: no such file"):
        sources.glue_source("sst-2", str(d)).augmented(str(d / "none.tsv")).load("train_aug")


def _write(path, text: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    return str(path.parent)


def test_bad_input_errors_name_file_and_line(tmp_path):
    d = _write(tmp_path / "a" / "train.tsv", b"sentence\tlabel\ngood film\t1\nno label here\n")
    with pytest.raises(DataError, match=r"train\.tsv:3: 1 tab-separated column\(s\), expected 2"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "b" / "train.tsv", b"good film\t1\nbad film\t0\n")
    with pytest.raises(DataError, match=r"train\.tsv:1: missing or unexpected header"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "c" / "train.tsv", b"sentence\tlabel\ngood film\tpositive\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: unknown label 'positive'.*\['0', '1'\]"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "d" / "train.tsv", b"")
    with pytest.raises(DataError, match=r"train\.tsv: empty file"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "e" / "train.tsv", b"sentence\tlabel\ncaf\xe9 film\t1\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: invalid UTF-8.*iconv -f LATIN1"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "e16" / "train.tsv", "sentence\tlabel\nfilm\t1\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"train\.tsv:1: invalid UTF-8.*the file is UTF-16 "
                       r"\(its byte-order mark says so\): re-encode it, e\.g\. iconv -f UTF-16"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "f" / "train.tsv", b"sentence\tlabel\n")
    with pytest.raises(DataError, match=r"train\.tsv: no examples"):
        glue.load_examples("sst-2", d, "train")
    d = _write(tmp_path / "g" / "train.tsv", b"tb\t1\t\tfine sentence\ntb\t7\t\tbad label\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: unknown label '7'"):
        glue.load_examples("cola", d, "train")
    with pytest.raises(DataError, match=r"nope: task directory not found"):
        glue.load_examples("sst-2", str(tmp_path / "nope"), "train")
    with pytest.raises(DataError, match=r"dev\.tsv: file not found for split 'dev'"):
        glue.load_examples("sst-2", d, "dev")
    with pytest.raises(DataError, match=r"train_aug\.tsv: file not found.*augment stage"):
        glue.load_examples("sst-2", d, "train_aug")
    # The root of a GLUE download given as --data_dir: the task's folder in it is named.
    _write(tmp_path / "glue" / "CoLA" / "train.tsv", b"tb\t1\t\tfine sentence\n")
    _write(tmp_path / "glue" / "SST-2" / "train.tsv", b"sentence\tlabel\nfine\t1\n")
    root = str(tmp_path / "glue")
    with pytest.raises(DataError, match=r"glue/train\.tsv: file not found for split 'train' of "
                       r"task sst-2; the directory holds no \.tsv files; --data_dir="
                       rf"{re.escape(os.path.join(root, 'SST-2'))} holds it \(the GLUE "):
        glue.load_examples("sst-2", root, "train")
    # Own-data flags on a GLUE task were ignored without a word.
    from tinybert_tf.tasks import TaskConfig, resolve_task
    for flag, value in (("labels", ("neg", "pos")), ("text_column", "sentence"),
                        ("tag_column", 2), ("data_format", "csv")):
        with pytest.raises(DataError, match=rf"^--{flag}=.*: describes your own files .*"
                           r"--task=sst-2 has its own columns and labels, so it would be "
                           r"ignored: drop it\.$"):
            resolve_task(TaskConfig(task="sst-2", data_dir=fixture_dir("sst-2"),
                                    **{flag: value}))
    assert resolve_task(TaskConfig(task="sst-2", data_dir=fixture_dir("sst-2"))).name == "sst-2"
    # A flag only another task type reads (TaskType.own_flags): SQuAD's windows here.
    with pytest.raises(DataError, match=r"^--doc_stride=64: only tasks of type span_qa read "
                       r"it, and --task=sst-2 is classification, so it would be ignored"):
        resolve_task(TaskConfig(task="sst-2", data_dir=fixture_dir("sst-2"), doc_stride=64))
    # Another task's folder: its header names that task.
    with pytest.raises(DataError, match=r"RTE/train\.tsv:1: missing or unexpected header; "
                       r".*\(the GLUE sst-2 layout\).* The header is the GLUE rte / wnli "
                       r"layout: is --data_dir another task's folder\? Give --task=rte or "
                       r"the sst-2 folder\.$"):
        glue.load_examples("sst-2", fixture_dir("rte"), "train")
    with pytest.raises(DataError, match="no split 'validation'"):
        glue.load_examples("sst-2", d, "validation")
    with pytest.raises(DataError, match="finite float"):
        glue.load_examples("sts-b", _write(tmp_path / "h" / "train.tsv",
                                           open(os.path.join(fixture_dir("sts-b"), "train.tsv"),
                                                "rb").read().replace(b"4.800", b"high")), "train")


def test_skip_bad_rows_counts_and_logs(tmp_path, caplog):
    d = _write(tmp_path / "train.tsv", b"sentence\tlabel\ngood film\t1\nno label\n"
               b"bad film\t0\nweird\t9\nfine\t1\n")
    with caplog.at_level(logging.WARNING, logger="tinybert_tf.data.glue"):
        ex = glue.load_examples("sst-2", d, "train", skip_bad_rows=True)
    assert [e.text_a for e in ex] == ["good film", "bad film", "fine"]
    assert ex.skipped == 2
    assert "skipped 2 malformed row(s)" in caplog.text and "train.tsv:3" in caplog.text


def test_polarity_split_is_fixed_balanced_and_round_trips(tmp_path):
    train, dev = polarity.load_examples("train"), polarity.load_examples("dev")
    assert (len(train), len(dev)) == (160, 40)
    assert sum(e.label for e in train) == 80 and sum(e.label for e in dev) == 20
    assert not {e.text_a for e in train} & {e.text_a for e in dev}
    # Every 5th sentence per label, in file order: dev's first neg is the file's 5th line.
    assert dev[0].guid == "dev-5" and dev[0].label == 0
    assert dev[0].text_a.startswith("a visually flashy but narratively opaque")
    assert any("clichés" in e.text_a for e in train + dev)  # Windows-1252 line decoded
    assert sources.glue_source("polarity", "").load("dev")[0].text_a == dev[0].text_a
    d = polarity.write_task_dir(str(tmp_path / "polarity"))
    assert open(os.path.join(d, "train.tsv"), encoding="utf-8").readline() == "sentence\tlabel\n"
    for split, direct in (("train", train), ("dev", dev)):
        via_tsv = glue.load_examples("polarity", d, split)
        assert [(e.text_a, e.label) for e in via_tsv] == [(e.text_a, e.label) for e in direct]
    spec = glue.get_task("polarity")
    assert spec.label_names == ("neg", "pos") and not spec.is_pair
    assert spec.primary_metric == "accuracy"


def test_tfds_label_order_matches_tsv():
    """TFDS glue/mnli is [entailment, neutral, contradiction]; ours is the reference's
    [contradiction, entailment, neutral]: ids must be mapped by name, not copied."""
    mnli = glue.get_task("mnli")
    assert mnli.tfds_label_map == {0: 1, 1: 2, 2: 0}
    assert glue.get_task("wnli").tfds_label_map == {0: 0, 1: 1}  # not_entailment = "0"
    assert glue.get_task("cola").tfds_label_map == {0: 0, 1: 1}
    import tensorflow_datasets as tfds
    for spec in (glue.get_task(n) for n in glue.task_names()):
        if spec.tfds_name and not spec.is_regression:
            # The names we expect are TFDS's own (from the builder's code, no download).
            assert tuple(tfds.builder(spec.tfds_name).info.features["label"].names) == \
                spec.tfds_label_names
            for tfds_id, ours in spec.tfds_label_map.items():
                tfds_name = spec.tfds_label_names[tfds_id]
                assert spec.label_names[ours] == spec.tfds_to_ours[tfds_name]
    # The TSV fixture's gold labels land on the same ids as TFDS's names for them.
    tsv = glue.load_examples("mnli", fixture_dir("mnli"), "train")
    tfds_names = mnli.tfds_label_names
    inverse = {v: k for k, v in mnli.tfds_label_map.items()}
    assert [tfds_names[inverse[e.label]] for e in tsv] == \
        ["entailment", "contradiction", "neutral", "contradiction", "entailment", "neutral"]


def test_tfds_source_with_mock_data(tmp_path):
    import tensorflow_datasets as tfds
    with tfds.testing.mock_data(num_examples=8):
        raw = list(tfds.as_numpy(tfds.load("glue/mnli", split="validation_mismatched",
                                           download=False)))
        ex = glue.load_examples("MNLI", "tfds", "dev_mismatched", tfds_data_dir=str(tmp_path))
        names = glue.label_names("mnli")
        tfds_names = ("entailment", "neutral", "contradiction")
        assert len(ex) == 8 and ex.source == "tfds:glue/mnli/validation_mismatched"
        assert [names[e.label] for e in ex] == [tfds_names[int(r["label"])] for r in raw]
        assert [e.text_a for e in ex] == [r["premise"].decode() for r in raw]
        assert [e.text_b for e in ex] == [r["hypothesis"].decode() for r in raw]
        sst = glue.load_examples("sst2", "tfds", "dev")
        assert sst[0].text_b is None and all(e.label in (0, 1) for e in sst)
        stsb = glue.load_examples("sts-b", "tfds", "train")
        assert all(isinstance(e.label, float) for e in stsb)
        with pytest.raises(DataError, match="train_aug exists only in a TSV"):
            glue.load_examples("sst2", "tfds", "train_aug")


def test_tfds_offline_unprepared_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"glue/rte split validation is not prepared under "
                                         r"--tfds_data_dir=.*tfds build glue/rte"):
        glue.load_examples("rte", "tfds", "dev", tfds_data_dir=str(tmp_path))


@pytest.fixture(scope="module")
def tok(tiny_vocab):
    return Tokenizer(tiny_vocab, max_seq_len=32)


def test_make_dataset_single_pair_regression_unlabelled(tok):
    ex = glue.load_examples("sst-2", fixture_dir("sst-2"), "train")
    ds = sentences.make_dataset(ex, tok, max_seq_len=16, batch_size=2)
    batches = list(ds)
    assert len(batches) == 3
    inputs, labels = batches[0]
    assert set(inputs) == {"input_word_ids", "input_mask", "input_type_ids"}
    for v in inputs.values():
        assert v.dtype == tf.int32 and v.shape == (2, 16)
    assert labels.dtype == tf.int32 and labels.numpy().tolist() == [0, 0]
    want = tok(["a boring , awful movie "], max_seq_len=16)["input_word_ids"].numpy()[0]
    np.testing.assert_array_equal(inputs["input_word_ids"].numpy()[0], want)
    pair = glue.load_examples("mnli", fixture_dir("mnli"), "dev_matched")
    inputs, labels = next(iter(sentences.make_dataset(pair, tok, 32, 8)))
    assert labels.numpy().tolist() == [0, 1, 2]
    assert inputs["input_type_ids"].numpy().max() == 1  # the second segment is there
    stsb = glue.load_examples("sts-b", fixture_dir("sts-b"), "train")
    _, labels = next(iter(sentences.make_dataset(stsb, tok, 32, 8)))
    assert labels.dtype == tf.float32
    np.testing.assert_allclose(labels.numpy(), [4.8, 3.2, 0.0, 2.5], rtol=1e-6)
    test = glue.load_examples("sts-b", fixture_dir("sts-b"), "test")
    _, labels = next(iter(sentences.make_dataset(test, tok, 32, 8, is_regression=True)))
    assert labels.dtype == tf.float32 and labels.numpy().tolist() == [-1.0]


def test_make_dataset_shuffle_is_seeded_and_shards_are_disjoint(tok):
    ex = polarity.load_examples("dev")

    def order(ds):
        return [tuple(x) for b, _ in ds for x in b["input_word_ids"].numpy().tolist()]

    a = order(sentences.make_dataset(ex, tok, 24, 8, shuffle=True, seed=3))
    b = order(sentences.make_dataset(ex, tok, 24, 8, shuffle=True, seed=3))
    c = order(sentences.make_dataset(ex, tok, 24, 8, shuffle=True, seed=4))
    assert a == b and a != c and sorted(a) == sorted(c) and len(a) == 40
    shards = []
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        ds = sentences.make_dataset(ex, tok, 24, 8, input_context=ctx, drop_remainder=True)
        assert ds.element_spec[0]["input_word_ids"].shape == (4, 24)  # per-replica, static
        shards.append(order(ds))
    assert len(shards[0]) == len(shards[1]) == 20
    assert not set(shards[0]) & set(shards[1])  # (the 40 dev sentences are distinct)
    assert sorted(shards[0] + shards[1]) == sorted(a)
