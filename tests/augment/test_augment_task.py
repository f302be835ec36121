"""augment_task end to end: GLUE layout, pairs, quoting, determinism, resume, shards, errors."""
import json
import logging
import os
import subprocess

import gensim
import pytest

from tinybert_tf.augment import (
    MLMError,
    NeighbourIndex,
    VectorsError,
    WordSplitter,
    augment_task,
    train_word2vec,
)
from tinybert_tf.augment.vectors import load_vectors
from tinybert_tf.data import glue

from augment_helpers import VOCAB, tiny_mlm, tiny_vectors
from pipeline_helpers import load_tool

SENTENCES = [
    "The movie was unaffable, not a fun plot!",
    "a cat sat on the mat",
    'He said "boring" twice; the actor was awful.',
    "good story , great film",
    "the dog was dull",
    "Very smart movie.",
    "a great cat",
]


@pytest.fixture(scope="module")
def model():
    return tiny_mlm()


@pytest.fixture(scope="module")
def kv():
    return tiny_vectors()


@pytest.fixture
def single_dir(tmp_path):
    d = tmp_path / "sst"
    d.mkdir()
    glue.write_rows(str(d / "train.tsv"), ["sentence", "label"],
                    [[s, str(i % 2)] for i, s in enumerate(SENTENCES)])
    return str(d)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _run(data_dir, out, model, kv, **kw):
    args = dict(mlm_model=model, word_vectors=kv, num_aug=4, replace_prob=0.5,
                num_candidates=3, seed=11, progress=False, chunk_size=2)
    task = kw.pop("task", "sst-2")
    args.update(kw)
    return augment_task(task, data_dir, out, **args)


def test_single_sentence_layout_quotes_and_p0(single_dir, tmp_path, model, kv):
    out = str(tmp_path / "aug" / "train_aug.tsv")
    stats = _run(single_dir, out, model, kv)
    assert stats["complete"] and stats["mode"] == "mlm+vectors" and stats["examples"] == 7
    assert stats["mlm_words"] > 0 and stats["vector_words"] > 0
    examples = glue.load_examples("sst-2", os.path.dirname(out), "train_aug")
    assert len(examples) == stats["written"] > 7
    lines = _read(out).decode().splitlines()
    assert lines[0] == "sentence\tlabel"
    # Each original comes first, untouched (the quotes survive), followed by its variants.
    texts = [e.text_a for e in examples]
    starts = [texts.index(s) for s in SENTENCES]
    assert starts == sorted(starts) and starts[0] == 0
    for k, s in enumerate(SENTENCES):
        end = starts[k + 1] if k + 1 < len(SENTENCES) else len(texts)
        block = examples[starts[k]:end]
        assert all(e.label == k % 2 for e in block)
        assert len({e.text_a for e in block}) == len(block)  # no duplicates
    assert 'He said "boring" twice; the actor was awful.' in texts
    # p_t = 0: the file is the input, byte for byte.
    out0 = str(tmp_path / "p0" / "train_aug.tsv")
    _run(single_dir, out0, model, kv, replace_prob=0.0)
    assert _read(out0) == _read(os.path.join(single_dir, "train.tsv"))


def test_pair_task_keeps_the_other_field_original(tmp_path, model, kv):
    d = tmp_path / "mrpc"
    d.mkdir()
    header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    rows = [["1", "10", "20", SENTENCES[0], SENTENCES[3]],
            ["0", "11", "21", SENTENCES[1], SENTENCES[2]]]
    glue.write_rows(str(d / "train.tsv"), header, rows)
    out = str(tmp_path / "aug" / "train_aug.tsv")
    stats = _run(str(d), out, model, kv, task="mrpc", replace_prob=1.0)
    assert stats["complete"]
    lines = [line.split("\t") for line in _read(out).decode().splitlines()]
    assert lines[0] == header
    body = lines[1:]
    changed_a = changed_b = 0
    for original in rows:
        block = [r for r in body if r[1] == original[1]]
        assert block[0] == original
        for r in block[1:]:
            assert r[:3] == original[:3]  # label and ids copied
            assert (r[3] == original[3]) != (r[4] == original[4])  # exactly one field varies
            changed_a += r[3] != original[3]
            changed_b += r[4] != original[4]
    assert changed_a and changed_b
    assert len(glue.load_examples("mrpc", str(tmp_path / "aug"), "train_aug")) == len(body)


def test_same_seed_same_bytes_and_resume_and_shards(single_dir, tmp_path, model, kv):
    full = str(tmp_path / "a" / "train_aug.tsv")
    _run(single_dir, full, model, kv)
    again = str(tmp_path / "b" / "train_aug.tsv")
    _run(single_dir, again, model, kv)
    assert _read(full) == _read(again)
    other = str(tmp_path / "c" / "train_aug.tsv")
    _run(single_dir, other, model, kv, seed=12)
    assert _read(other) != _read(full)

    # Interrupted after 2 of 4 chunks, then a crash mid-append: resume gives the same file.
    out = str(tmp_path / "r" / "train_aug.tsv")
    stats = _run(single_dir, out, model, kv, stop_after_chunks=2)
    assert not stats["complete"] and not os.path.exists(out)
    assert os.path.exists(out + ".partial") and os.path.exists(out + ".progress.json")
    with open(out + ".partial", "ab") as f:
        f.write(b"half a chunk that was never recorded\tx\n")
    stats = _run(single_dir, out, model, kv)
    assert stats["complete"] and stats["resumed_chunks"] == 2
    assert _read(out) == _read(full)
    assert not os.path.exists(out + ".partial") and not os.path.exists(out + ".progress.json")

    # Changed settings: the partial output is not reused.
    out2 = str(tmp_path / "s" / "train_aug.tsv")
    _run(single_dir, out2, model, kv, stop_after_chunks=1, seed=99)
    stats = _run(single_dir, out2, model, kv)
    assert stats["resumed_chunks"] == 0 and _read(out2) == _read(full)

    # Shards: contiguous chunk ranges; shard 0 has the header; cat == the full file.
    parts = []
    for i in range(3):
        p = str(tmp_path / "sh" / f"part{i}.tsv")
        _run(single_dir, p, model, kv, shard=f"{i}/3")
        parts.append(_read(p))
    assert b"".join(parts) == _read(full)
    assert parts[0].startswith(b"sentence\tlabel\n") and not parts[1].startswith(b"sentence")


def test_vectors_that_hold_none_of_the_tasks_words_are_warned_about(single_dir, tmp_path, kv,
                                                                     caplog):
    """A vectors file of another language or casing replaces no word: the augmented file
    is the original rows, which task distillation would take for augmented data."""
    from gensim.models import KeyedVectors
    foreign = KeyedVectors(vector_size=4)
    foreign.add_vectors(["katze", "hund", "baum"], [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
    out = str(tmp_path / "none" / "train_aug.tsv")
    with caplog.at_level(logging.WARNING):
        stats = _run(single_dir, out, None, foreign)
    assert stats["skipped_words"] == stats["eligible_words"] > 0
    assert stats["written"] == len(SENTENCES)
    said = [r.getMessage() for r in caplog.records if "found a replacement" in r.getMessage()]
    assert len(said) == 1 and f"no word of {stats['eligible_words']} found" in said[0]
    assert out in said[0] and "original rows only" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _run(single_dir, str(tmp_path / "some" / "train_aug.tsv"), None, kv)
    assert not [r for r in caplog.records if "found a replacement" in r.getMessage()]


def test_vectors_only_mode_says_so(single_dir, tmp_path, kv, caplog):
    out = str(tmp_path / "v" / "train_aug.tsv")
    with caplog.at_level(logging.WARNING):
        stats = _run(single_dir, out, None, kv)
    assert stats["mode"] == "vectors-only" and stats["mlm_words"] == 0
    assert any("word-vector neighbours serve every word" in r.getMessage() for r in caplog.records)
    # Every changed word is one of the K=3 vector neighbours of the word it replaced.
    index = NeighbourIndex(kv, 3, 0)
    texts = [e.text_a for e in glue.load_examples("sst-2", os.path.dirname(out), "train_aug")]
    splitter = WordSplitter()
    current, changed = None, 0
    for text in texts:
        if text in SENTENCES:
            current = splitter.split([text])[0]
            continue
        new = text.split(" ")
        assert len(new) == len(current)
        for old, w in zip(current, new):
            if w != old:
                assert w in index.neighbours([old])[old]
                changed += 1
    assert changed > 0


def test_errors_leave_no_output(single_dir, tmp_path, model, kv):
    out = str(tmp_path / "e" / "train_aug.tsv")
    with pytest.raises(glue.DataError, match="task directory not found"):
        _run(str(tmp_path / "missing"), out, model, kv)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not vectors\n1 2 3\n")
    with pytest.raises(VectorsError, match="bad.txt: cannot read word vectors"):
        _run(single_dir, out, model, str(bad))
    with pytest.raises(VectorsError, match="not found"):
        _run(single_dir, out, model, str(tmp_path / "nope.txt"))
    with pytest.raises(MLMError, match="differs from .* at line 2"):
        _run(single_dir, out, model, kv, vocab=["[PAD]", "x"] + VOCAB[2:])
    with pytest.raises(ValueError, match="--shard=3/3"):
        _run(single_dir, out, model, kv, shard="3/3")
    assert not os.path.exists(out) and not os.path.exists(out + ".partial")
    no_mlm = tiny_mlm(seed=1)
    no_mlm.head_type = "classifier"
    with pytest.raises(MLMError, match="not an MLM head"):
        _run(single_dir, out, no_mlm, kv)


def test_vector_formats_and_word2vec_cache(tmp_path):
    glove = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", "test_glove.txt")
    kv = load_vectors(glove)  # GloVe: no header line
    assert "the" in kv.key_to_index and kv.vector_size == 50
    small = tiny_vectors()
    for name, binary in (("w2v.txt", False), ("w2v.bin", True)):
        small.save_word2vec_format(str(tmp_path / name), binary=binary)
        assert load_vectors(str(tmp_path / name)).index_to_key == small.index_to_key
    small.save(str(tmp_path / "v.kv"))
    assert load_vectors(str(tmp_path / "v.kv")).index_to_key == small.index_to_key
    docs = [["The cat sat on the mat.", "A dog sat on the mat too."],
            ["The cat and the dog ran.", "The mat was red, the cat was black."]] * 5
    cache = str(tmp_path / "cache")
    # A killed training's sentences file (as large as the tokenised corpus) is removed by
    # the next training there; a live one's is not.
    dead, live = subprocess.Popen(["true"]), subprocess.Popen(["sleep", "300"])
    dead.wait()
    os.makedirs(cache)
    left = {f"word2vec-0123abcd.sentences.tmp-{dead.pid}": False,
            f"word2vec-0123abcd.sentences.tmp-{live.pid}": True,
            f"mine.sentences.tmp-{dead.pid}": True}
    for name in left:
        open(os.path.join(cache, name), "w").close()
    try:
        first = train_word2vec(docs, cache)
        assert {n: os.path.exists(os.path.join(cache, n)) for n in left} == left
    finally:
        live.kill()
        live.wait()
    for name in left:
        if left[name]:
            os.remove(os.path.join(cache, name))
    files = os.listdir(cache)
    assert len(files) == 1 and files[0].endswith(".bin")
    second = train_word2vec(docs, cache)
    assert first.index_to_key == second.index_to_key and "cat" in first.key_to_index
    assert (first.vectors == second.vectors).all()
    assert "." not in first.key_to_index  # words only


def _bin_augment(argv, capsys):
    """Run bin/augment's main in-process (a subprocess would re-import TensorFlow)."""
    module = load_tool("augment")
    flags = module.FLAGS
    try:
        flags(["augment"] + argv)
        rc = module.main(["augment"])
    finally:
        flags.unparse_flags()
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bin_augment(single_dir, tmp_path, kv, capsys, caplog):
    vec = str(tmp_path / "vec.txt")
    kv.save_word2vec_format(vec, binary=False)
    out = str(tmp_path / "cli" / "train_aug.tsv")
    argv = ["--task=sst-2", f"--data_dir={single_dir}", f"--output={out}",
            f"--word_vectors={vec}", "--num_aug=2", "--vector_vocab_limit=0"]
    # Without an MLM model Algorithm 1 is incomplete: refused unless the fallback is asked.
    rc, stdout, stderr = _bin_augment(argv, capsys)
    assert rc == 2 and "--mlm_model" in stderr and "--augment_fallback" in stderr
    assert not os.path.exists(out)
    argv.append("--augment_fallback")
    rc, stdout, stderr = _bin_augment(argv, capsys)
    assert rc == 0
    # Said once, by the augmenter's log as it starts (the summary's mode says it again).
    said = stderr + "".join(r.getMessage() for r in caplog.records)
    assert said.count("word-vector neighbours serve") == 1, said
    assert '"mode": "vectors-only"' in stdout and os.path.isfile(out)
    # Its own finished output: the same command keeps it (the work is not done again);
    # other settings, or an output changed since, augment it again. A file no bin/augment
    # run wrote (the user's) is refused, not replaced.
    first, made = open(out, "rb").read(), os.stat(out).st_mtime_ns
    rc, stdout, stderr = _bin_augment(argv, capsys)
    assert rc == 0 and os.stat(out).st_mtime_ns == made
    assert f"bin/augment: {out} is already augmented from this input with these settings " \
           f"(recorded in {tmp_path / 'cli' / '.train_aug.tsv.shard'}); kept." in stderr
    assert json.loads(stdout)["reused"] and json.loads(stdout)["written"] > 7
    rc, stdout, stderr = _bin_augment([*argv, "--num_aug=3"], capsys)
    assert rc == 0 and "already augmented" not in stderr
    assert not json.loads(stdout)["reused"] and open(out, "rb").read() != first
    with open(out, "ab") as f:
        f.write(b"an edited row\t1\n")
    rc, stdout, stderr = _bin_augment([*argv, "--num_aug=3"], capsys)
    assert rc == 0 and not json.loads(stdout)["reused"]
    assert b"an edited row" not in open(out, "rb").read()
    theirs = tmp_path / "cli" / "mine.tsv"
    theirs.write_text("my rows\n")
    rc, stdout, stderr = _bin_augment([*argv, f"--output={theirs}"], capsys)
    assert rc == 2 and stderr.strip().splitlines()[-1] == (
        f"bin/augment: error: --output={theirs}: the file exists and no bin/augment run "
        "wrote it (it has no .mine.tsv.shard record beside it): the augmented rows would "
        "replace it. Give a new file, or delete this one to write there.")
    assert theirs.read_text() == "my rows\n"
    rc, stdout, stderr = _bin_augment(argv[:1] + [f"--data_dir={tmp_path / 'missing'}"]
                                      + argv[2:], capsys)
    assert rc == 2
    errors = [line for line in stderr.splitlines() if line.startswith("bin/augment: error:")]
    assert len(errors) == 1 and "task directory not found" in errors[0]


def test_bin_augment_takes_the_vocab_of_a_model_directory(single_dir, tmp_path, model, kv,
                                                          capsys):
    """--vocab=MODEL_DIR, as bin/pretokenize takes it ("file not found" before); a model
    of another vocab is named as the task tokenizer's."""
    from tinybert_tf.models.checkpoint import save_model
    mlm = save_model(model, str(tmp_path / "mlm"))
    vec = str(tmp_path / "vec.txt")
    kv.save_word2vec_format(vec, binary=False)
    argv = ["--task=sst-2", f"--data_dir={single_dir}", f"--word_vectors={vec}",
            f"--mlm_model={mlm}", "--num_aug=1", "--vector_vocab_limit=0",
            f"--output={tmp_path / 'out' / 'train_aug.tsv'}"]
    rc, stdout, stderr = _bin_augment([*argv, f"--vocab={mlm}"], capsys)
    assert rc == 0, stderr
    rc, stdout, stderr = _bin_augment([*argv, "--vocab=minilm-l6"], capsys)
    assert rc == 2 and "its vocab (" in stderr and "differs from the task tokenizer" in stderr


def test_bin_augment_warns_of_a_shard_that_holds_no_example(single_dir, tmp_path, kv, capsys):
    """Seven examples make one chunk: of two shards the first holds none (its output is
    the header, and still concatenates before the second's to the whole)."""
    vec = str(tmp_path / "vec.txt")
    kv.save_word2vec_format(vec, binary=False)
    base = ["--task=sst-2", f"--data_dir={single_dir}", f"--word_vectors={vec}",
            "--num_aug=2", "--vector_vocab_limit=0", "--augment_fallback"]
    said = {}
    for i in (0, 1):
        rc, stdout, stderr = _bin_augment(
            [*base, f"--output={tmp_path / 'sh' / f'part{i}.tsv'}", f"--shard={i}/2"], capsys)
        assert rc == 0, stderr
        said[i] = [ln for ln in stderr.splitlines() if ln.startswith("bin/augment: warning:")]
    assert said[1] == [] and len(said[0]) == 1, said
    assert said[0][0].startswith("bin/augment: warning: --shard=0/2 holds no example: "
                                 "the task's training set makes fewer chunks of 128")
    assert (tmp_path / "sh" / "part0.tsv").read_text() == "sentence\tlabel\n"  # the header


def test_a_pair_tasks_plan_counts_up_to_one_plus_two_n_a_rows_per_example(
        tmp_path, model, kv, tiny_vocab):
    """Algorithm 1 varies each sentence of a pair in turn, so a pair gives up to 1 + 2 N_a
    rows: the dry-run plan sizes the augmented phases on that bound (not N_a + 1), and the
    augmenter writes more than N_a + 1 rows per pair and no more than the bound."""
    from pipeline_helpers import run, tiny_flags, write_teacher

    d = tmp_path / "mrpc"
    d.mkdir()
    header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    rows = [["1", "10", "20", SENTENCES[0], SENTENCES[3]],
            ["0", "11", "21", SENTENCES[2], SENTENCES[6]]]
    glue.write_rows(str(d / "train.tsv"), header, rows)
    glue.write_rows(str(d / "dev.tsv"), header, rows)
    num_aug, bound = 4, len(rows) * (1 + 2 * 4)
    plan = run(tiny_flags(tmp_path, tiny_vocab, task="mrpc", data_dir=str(d), dry_run=True,
                          stages=["augment", "task"], general_model="none", num_aug=num_aug,
                          task_batch_size=2, task_teacher=write_teacher(
                              str(tmp_path / "tt"), tiny_vocab, head="classifier")))
    inter = next(p for p in plan["phases"] if p["phase"] == "intermediate")
    assert inter["data"] == "augmented train split" and inter["examples"] == bound
    assert (f"at most {bound} rows (the 2 original rows with up to {2 * num_aug} variants "
            "each") in inter["note"]
    out = str(tmp_path / "aug" / "train_aug.tsv")
    stats = _run(str(d), out, model, kv, task="mrpc", num_aug=num_aug, replace_prob=1.0)
    assert len(rows) * (num_aug + 1) < stats["written"] <= bound
