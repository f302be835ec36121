"""Export artefacts give the Keras model's answers.

One tiny classifier (hidden 32, 2 layers) is fitted for a few steps on a
separable toy task (sentiment words decide the label), so labels are
meaningful; it is exported once per module in every format at seq 16.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import unicodedata
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from export_helpers import L, fit_toy_classifier, float_ops, small_config, toy_task, unique
from tensorflow.lite.tools import flatbuffer_utils
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tinybert_tf.export import (
    DEFAULT_FORMATS,
    FLAVOURS,
    TEXT_CUSTOM_OPS,
    ExportError,
    ExportRequest,
    TFLiteRunner,
    check_formats,
    convert_tflite,
    custom_ops,
    export_all,
    export_saved_model,
    read_metadata,
)
from tinybert_tf.export.serving import list_versions
from tinybert_tf.export.tflite import converter, model_function, name_io, operators
from tinybert_tf.export.tflite_metadata import fitting_kind
from tinybert_tf.models import INPUT_NAMES, BertModel
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.tasks import Classification, Regression
from tinybert_tf.tokenizer import pack_texts

import tasklib
from numerics import NOISE, assert_parity_agrees, assert_same_labels, decided
from pipeline_helpers import SERVER_SCRIPT_HEAD

# Every test here compares an export with Keras (make test-isa).
pytestmark = pytest.mark.numerics

FORMATS = (*DEFAULT_FORMATS, "text_float32")
IDS_FLAVOURS = [f for f in FORMATS if f in FLAVOURS and not FLAVOURS[f].text_input]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_vocab):
    model, train = fit_toy_classifier(unique(tiny_vocab))
    dev, dev_labels = toy_task(80, np.random.default_rng(1))
    out = str(tmp_path_factory.mktemp("exp") / "export")
    parity = export_all(ExportRequest(model, out, max_seq_len=L, dev_texts=dev,
                                      dev_labels=dev_labels, representative_texts=train[:64],
                                      latency_runs=2, formats=FORMATS))
    return {"model": model, "dir": out, "parity": parity, "dev": dev, "labels": dev_labels,
            "saved_model": os.path.join(out, parity["formats"]["saved_model"]["path"]),
            "keras": keras_probs(model, dev)}


def tree_digest(path):
    """Relative path -> sha256 of every file under `path`."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = \
                    hashlib.sha256(fh.read()).hexdigest()
    return out


def keras_probs(model, texts):
    x = pack_texts(load_tokenizer(model, L), texts, None, L)
    return tf.nn.softmax(model(x, training=False)["logits"]).numpy()


# --- independent reference tokenisation (BERT's BasicTokenizer + greedy WordPiece) ---

def _is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def reference_ids(text, vocab, max_len):
    """Standard BERT uncased: lower-case, NFD strip accents, split on whitespace and
    punctuation, greedy longest-match-first WordPiece, [CLS] a [SEP], pad with 0."""
    index = {t: i for i, t in enumerate(vocab)}
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    words, cur = [], ""
    for ch in text:
        if ch.isspace():
            words, cur = words + ([cur] if cur else []), ""
        elif _is_punct(ch):
            words, cur = words + ([cur] if cur else []) + [ch], ""
        else:
            cur += ch
    words += [cur] if cur else []
    pieces = []
    for w in words:
        start, out = 0, []
        while start < len(w):
            end = len(w)
            while end > start:
                sub = ("##" if start else "") + w[start:end]
                if sub in index:
                    break
                end -= 1
            if end == start:
                out = ["[UNK]"]
                break
            out.append(("##" if start else "") + w[start:end])
            start = end
        pieces += out
    pieces = ["[CLS]"] + pieces[:max_len - 2] + ["[SEP]"]
    ids = [index[p] for p in pieces]
    n = len(ids)
    return ids + [0] * (max_len - n), [1] * n + [0] * (max_len - n)


# --- tests ---------------------------------------------------------------------------

def test_layout_and_parity_json(exported):
    d = exported["dir"]
    expected = {"serving", "parity.json"} | {f"model_{f}.tflite" for f in FORMATS[1:]}
    assert set(os.listdir(d)) == expected  # no temporaries left behind
    assert sorted(os.listdir(os.path.join(d, "serving"))) == ["1", "models.config"]
    with open(os.path.join(d, "parity.json")) as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(exported["parity"]))
    rows = on_disk["formats"]
    assert set(rows) == {"keras", *FORMATS}
    assert rows["saved_model"]["path"] == "serving/1" and rows["saved_model"]["version"] == 1
    assert on_disk["metric_name"] == "accuracy" and on_disk["num_examples"] == 80
    for name, r in rows.items():
        assert r["size_bytes"] > 0 and r["latency_ms_b1"] > 0, name
    assert rows["keras"]["metric"] >= 0.9  # the toy model really learned the task
    # Sizes: float16 and int8 files are smaller than float32.
    assert rows["float16"]["size_bytes"] < rows["float32"]["size_bytes"]
    assert rows["int8"]["size_bytes"] < rows["float32"]["size_bytes"]


def test_float_formats_match_keras(exported):
    """Probabilities within each format's tolerance, and Keras's label on every dev
    example that no difference of that size can flip (numerics.assert_parity_agrees)."""
    rows, want = exported["parity"]["formats"], exported["keras"]
    assert_parity_agrees(rows["saved_model"], want, 1e-5, name="saved_model")
    assert_parity_agrees(rows["float32"], want, 1e-4, name="float32")
    assert_parity_agrees(rows["float16"], want, 1e-2, name="float16")
    # Dynamic-range int8 moves probabilities further: at least 95 % of the labels stay,
    # not counting examples that sit within rounding of a tie in Keras.
    ties = float(np.mean(~decided(want, NOISE)))
    assert rows["dynamic_int8"]["label_agreement"] >= 0.95 - ties


def test_full_integer_flavours_have_no_float_op(exported):
    """What an integer-only delegate needs: every op between the int32 ids and the
    float32 probabilities computes on int8/int16 tensors."""
    for fmt in ("int8", "int16x8"):
        assert float_ops(os.path.join(exported["dir"], f"model_{fmt}.tflite")) == [], fmt
    rows = exported["parity"]["formats"]
    assert_parity_agrees(rows["int16x8"], exported["keras"], 0.01, name="int16x8")


def test_int8_agrees_with_keras_labels(exported):
    model, dev = exported["model"], exported["dev"]
    ref = keras_probs(model, dev)
    runner = TFLiteRunner(os.path.join(exported["dir"], "model_int8.tflite"))
    out = runner.predict(pack_texts(load_tokenizer(model, L), dev, None, L))
    agreement = np.mean(out.argmax(-1) == ref.argmax(-1))
    # Parity computed Keras's probabilities in other batches: an example within rounding
    # of a tie may count either way there.
    ties = float(np.mean(~decided(ref, NOISE)))
    assert agreement >= 0.95 - ties
    assert exported["parity"]["formats"]["int8"]["label_agreement"] == pytest.approx(
        agreement, abs=ties + 1e-12)
    # Weights really are int8: most tensors are INT8, fully connected layers included.
    assert "FULLY_CONNECTED" in operators(os.path.join(exported["dir"], "model_int8.tflite"))


def test_tflite_tensor_names_and_shapes(exported):
    from ai_edge_litert.interpreter import Interpreter
    for fmt in IDS_FLAVOURS:
        it = Interpreter(model_path=os.path.join(exported["dir"], f"model_{fmt}.tflite"))
        ins = it.get_input_details()
        assert [d["name"] for d in ins] == list(INPUT_NAMES), fmt
        for d in ins:
            assert d["dtype"] == np.int32 and list(d["shape"]) == [1, L], fmt
        outs = it.get_output_details()
        assert len(outs) == 1 and outs[0]["name"] == "probabilities", fmt
        assert outs[0]["dtype"] == np.float32 and list(outs[0]["shape"]) == [1, 2], fmt


def test_float32_tflite_within_1e4(exported):
    model, dev = exported["model"], exported["dev"]
    x = pack_texts(load_tokenizer(model, L), dev[:20], None, L)
    out = TFLiteRunner(os.path.join(exported["dir"], "model_float32.tflite")).predict(x)
    np.testing.assert_allclose(out, keras_probs(model, dev[:20]), atol=1e-4)
    # Rows sum to 1: the output is probabilities, not logits.
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-5)


def test_saved_model_signatures_and_assets(exported):
    sm = exported["saved_model"]
    loaded = tf.saved_model.load(sm)
    assert set(loaded.signatures) == {"serving_default", "serve_ids"}
    text_fn, ids_fn = loaded.signatures["serving_default"], loaded.signatures["serve_ids"]
    args, kwargs = text_fn.structured_input_signature
    assert set(kwargs) == {"text"} and kwargs["text"].dtype == tf.string
    assert kwargs["text"].shape.as_list() == [None]
    _, kwargs = ids_fn.structured_input_signature
    assert set(kwargs) == set(INPUT_NAMES)
    for spec in kwargs.values():
        assert spec.dtype == tf.int32 and spec.shape.rank == 2
    assert set(text_fn.structured_outputs) == {"logits", "probabilities", "label"}
    assert set(ids_fn.structured_outputs) == {"logits", "probabilities", "label"}
    with open(os.path.join(sm, "assets", "vocab.txt"), encoding="utf-8") as f:
        assert f.read().split("\n")[:-1] == exported["model"].vocab
    with open(os.path.join(sm, "assets", "labels.txt"), encoding="utf-8") as f:
        assert f.read() == "neg\npos\n"
    out = text_fn(text=tf.constant(["a good fun film", "an awful boring plot"]))
    assert [s.decode() for s in out["label"].numpy()] == ["pos", "neg"]


def test_text_signature_equals_ids_on_reference_tokenisation(exported):
    model = exported["model"]
    loaded = tf.saved_model.load(exported["saved_model"])
    texts = ["The movie was GREAT!", "Café, un-affable plots?", "xyzzy qwv", "  dog   ran  "]
    ref = [reference_ids(t, model.vocab, L) for t in texts]
    ids = np.array([r[0] for r in ref], np.int32)
    mask = np.array([r[1] for r in ref], np.int32)
    by_ids = loaded.signatures["serve_ids"](input_word_ids=ids, input_mask=mask,
                                            input_type_ids=np.zeros_like(ids))
    by_text = loaded.signatures["serving_default"](text=tf.constant(texts))
    np.testing.assert_allclose(by_text["logits"].numpy(), by_ids["logits"].numpy(), atol=1e-6)
    np.testing.assert_allclose(by_text["probabilities"].numpy(),
                               by_ids["probabilities"].numpy(), atol=1e-6)


FRESH_TEXTS_EXTRA = ["Hello World!", "un-affable café"]
# The SavedModel's text signature in a fresh process (the `fresh` fixture runs it first,
# then _TFLITE_SCRIPT in the same process: one TensorFlow import for both).
_SAVED_MODEL_SCRIPT = SERVER_SCRIPT_HEAD + r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tokenizer ops
m = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
out = m.signatures['serving_default'](text=tf.constant(texts))
print('SAVED_MODEL' + json.dumps(out['probabilities'].numpy().tolist()), flush=True)
"""


def test_saved_model_in_fresh_process_matches_keras(exported, fresh):
    texts = exported["dev"][:8] + FRESH_TEXTS_EXTRA
    line = [x for x in fresh.stdout.splitlines() if x.startswith("SAVED_MODEL")]
    assert line, fresh.stderr[-3000:]
    probs = np.array(json.loads(line[-1][len("SAVED_MODEL"):]))
    np.testing.assert_allclose(probs, keras_probs(exported["model"], texts), atol=1e-5)


def test_text_ops_are_tensorflow_text_tokenizer_ops(exported):
    ops = custom_ops(exported["saved_model"])
    assert ops, "the text signature should tokenise in graph"
    # Only the FastBertTokenizer family (normaliser + fast WordPiece), which
    # tensorflow_model_server links in with tensorflow-text's ops library.
    assert set(ops) <= {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets"}, ops


@pytest.fixture(scope="module")
def pair_regressor(tmp_path_factory, tiny_vocab):
    """A random regressor (seed 3) and its SavedModel for pairs of texts."""
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(3)
    model = BertModel(small_config(vocab), head="regressor", vocab=vocab)
    path = export_saved_model(model, str(tmp_path_factory.mktemp("pair") / "sm"),
                              max_seq_len=L, is_pair=True)
    return model, path


def test_pair_regressor_saved_model(pair_regressor):
    model, path = pair_regressor
    loaded = tf.saved_model.load(path)
    fn = loaded.signatures["serving_default"]
    assert set(fn.structured_input_signature[1]) == {"text", "text_b"}
    assert set(fn.structured_outputs) == {"logits", "score"}
    a, b = ["a cat sat on the mat", "the dog"], ["the cat sat", "a dog ran on the mat"]
    out = fn(text=tf.constant(a), text_b=tf.constant(b))
    x = load_tokenizer(model, L)(a, b, max_seq_len=L)
    expected = model(x, training=False)["logits"].numpy()[:, 0]
    np.testing.assert_allclose(out["score"].numpy(), expected, atol=1e-5)
    assert x["input_type_ids"].numpy().max() == 1  # the pair really has two segments


def test_bad_inputs_raise_clear_errors(tmp_path, tiny_vocab):
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(4)
    encoder_only = BertModel(small_config(vocab), vocab=vocab)
    with pytest.raises(ExportError, match="head"):
        export_all(ExportRequest(encoder_only, str(tmp_path / "a"), max_seq_len=L,
                                 dev_texts=["a cat"]))
    assert not os.path.exists(tmp_path / "a" / "parity.json")
    with pytest.raises(ExportError, match="unknown export format 'onnx'"):
        check_formats(["float32", "onnx"])
    clf = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab)
    with pytest.raises(ExportError, match="representative"):
        convert_tflite(clf, "int8", L, representative=[])
    with pytest.raises(ExportError, match="representative"):
        export_all(ExportRequest(clf, str(tmp_path / "b"), max_seq_len=L, formats=["int8"],
                                 dev_texts=["a cat"], representative_texts=[]))
    with pytest.raises(ExportError, match="vocab"):
        export_all(ExportRequest(BertModel(small_config(vocab), head="classifier", num_labels=2),
                                 str(tmp_path / "c"), max_seq_len=L, dev_texts=["a cat"]))
    with pytest.raises(ExportError, match="max_seq_len"):
        export_all(ExportRequest(clf, str(tmp_path / "d"), max_seq_len=1000, dev_texts=["a cat"]))
    with pytest.raises(ExportError, match="pair"):
        export_all(ExportRequest(clf, str(tmp_path / "e"), max_seq_len=L, dev_texts=["a cat"],
                                 is_pair=True))
    with pytest.raises(ExportError, match="regression"):
        export_all(ExportRequest(clf, str(tmp_path / "f"), max_seq_len=L, dev_texts=["a"],
                                 task=Regression()))


def test_failed_saved_model_export_leaves_previous_export_intact(tmp_path, tiny_vocab,
                                                                 monkeypatch):
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(5)
    clf = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab)
    target = tmp_path / "sm"  # a previous, complete export
    target.mkdir()
    (target / "saved_model.pb").write_bytes(b"previous")
    before = sorted(os.listdir(target))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_saved_model(clf, str(target), max_seq_len=L)
    assert sorted(os.listdir(target)) == before
    assert (target / "saved_model.pb").read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["sm"]  # no half-written temporary left


# --- what the clients read ----------------------------------------------------------

TEXT_CASES = ["The movie was GREAT!", "Café, un-affable plots?", "xyzzy qwv", "  dog   ran  ",
              "", " ".join(["a very good film"] * 10)]  # the last one is truncated to L


@pytest.fixture(scope="module")
def task_library():
    reason = tasklib.unavailable_reason()
    if reason:
        pytest.skip(f"TFLite Task Library unavailable: {reason}")


def test_every_tflite_file_carries_metadata_for_its_client(exported):
    model, rows = exported["model"], exported["parity"]["formats"]
    vocab_txt = ("\n".join(model.vocab) + "\n").encode()
    for fmt in IDS_FLAVOURS:
        got = read_metadata(os.path.join(exported["dir"], f"model_{fmt}.tflite"))
        assert got.files == {"vocab.txt": vocab_txt, "labels.txt": b"neg\npos\n"}, fmt
        assert rows[fmt]["custom_ops"] == [], fmt
        if FLAVOURS[fmt].not_in_task_library:  # int16x8: the stated, described fallback
            assert got.metadata.name == rows[fmt]["metadata"] == "BertClassifier", fmt
            assert rows[fmt]["task_library"] is None
            assert "no int16 GELU and RSQRT kernels" in got.metadata.description
        else:
            assert got.metadata.name == "BertNLClassifier", fmt
            assert rows[fmt]["metadata"] == rows[fmt]["task_library"] == "BertNLClassifier"
    text = read_metadata(os.path.join(exported["dir"], "model_text_float32.tflite"))
    assert text.metadata.name == "BertTextClassifier"
    assert sorted(text.files) == ["labels.txt"]  # the vocab lives in the graph
    assert rows["text_float32"]["task_library"] is None
    assert rows["text_float32"]["custom_ops"] == sorted(TEXT_CUSTOM_OPS)


def test_task_library_loads_the_exported_files_and_matches_keras(task_library, exported):
    """BertNLClassifier on the files export_all wrote: same probabilities as the
    interpreter (float flavours: as Keras), and Keras's label wherever the quantised
    flavour's difference from Keras cannot flip it (numerics.assert_same_labels)."""
    model, texts = exported["model"], exported["dev"][:16]
    want = exported["keras"][:16]
    x = pack_texts(load_tokenizer(model, L), texts, None, L)
    for fmt, atol, keras_atol in (("float32", 1e-5, 1e-4), ("dynamic_int8", 1e-4, 0.1),
                                  ("int8", 0.15, 0.25)):
        path = os.path.join(exported["dir"], f"model_{fmt}.tflite")
        got = np.array([[s["neg"], s["pos"]] for s in tasklib.classify(path, texts)])
        np.testing.assert_allclose(got, TFLiteRunner(path).predict(x), atol=atol, err_msg=fmt)
        assert_same_labels(got, want, keras_atol, err_msg=fmt)


def test_text_tflite_matches_the_saved_model_text_signature(exported):
    loaded = tf.saved_model.load(exported["saved_model"])
    want = loaded.signatures["serving_default"](text=tf.constant(TEXT_CASES))
    runner = TFLiteRunner(os.path.join(exported["dir"], "model_text_float32.tflite"))
    got = runner.predict({"text": np.array(TEXT_CASES, object)})
    np.testing.assert_allclose(got, want["probabilities"].numpy(), atol=1e-5)
    assert exported["parity"]["formats"]["text_float32"]["max_abs_diff"] < 1e-5


def test_text_tflite_of_a_pair_regressor_reads_text_and_text_b(pair_regressor):
    model, saved_model = pair_regressor
    flat = convert_tflite(model, "text_float32", L, is_pair=True)
    runner = TFLiteRunner(flat)
    assert runner.input_names == ("text", "text_b")
    a, b = ["a cat sat on the mat", "The DOG!"], ["the cat sat", "a dog ran on the mat"]
    got = runner.predict({"text": np.array(a, object), "text_b": np.array(b, object)})
    sm = tf.saved_model.load(saved_model)
    want = sm.signatures["serving_default"](text=tf.constant(a), text_b=tf.constant(b))
    np.testing.assert_allclose(got[:, 0], want["score"].numpy(), atol=1e-5)
    meta = read_metadata(flat)
    assert meta.metadata.name == "BertTextRegressor" and meta.files == {}
    assert "pair of texts" in meta.metadata.description


def test_re_export_publishes_the_next_version_and_never_touches_served_ones(exported,
                                                                           tmp_path, capsys):
    out = str(tmp_path / "export")
    shutil.copytree(exported["dir"], out)
    first = tree_digest(os.path.join(out, "serving", "1"))
    dev = exported["dev"][:8]
    gone = sorted(f for f in os.listdir(out)
                  if f.endswith(".tflite") and f != "model_float32.tflite")
    capsys.readouterr()
    parity = export_all(ExportRequest(exported["model"], out, max_seq_len=L, dev_texts=dev,
                                      formats=["saved_model", "float32"], latency_runs=1,
                                      task_name="SST-2"))
    row = parity["formats"]["saved_model"]
    assert (row["path"], row["version"], row["versions"]) == ("serving/2", 2, [1, 2])
    assert tree_digest(os.path.join(out, "serving", "1")) == first
    assert sorted(os.listdir(out)) == ["model_float32.tflite", "parity.json", "serving"]
    # The earlier export's other files are gone, and the export says which.
    said = [line for line in capsys.readouterr().out.splitlines() if "removed" in line]
    assert len(gone) >= 2 and len(said) == 1
    assert sorted(said[0].split("export's ")[1].split(" from ")[0].split(", ")) == gone
    config = open(os.path.join(out, "serving", "models.config")).read()
    assert 'name: "sst-2"' in config and 'base_path: "/models/sst-2"' in config
    # An explicit version that exists is refused, naming it; nothing is marked complete.
    with pytest.raises(ExportError, match="version 1 already exists"):
        export_all(ExportRequest(exported["model"], out, max_seq_len=L, dev_texts=dev,
                                 formats=["saved_model"], serving_version=1, latency_runs=1))
    assert not os.path.exists(os.path.join(out, "parity.json"))
    with pytest.raises(ExportError, match="serving_version=0"):
        export_all(ExportRequest(exported["model"], out, max_seq_len=L, dev_texts=dev,
                                 serving_version=0))
    # A run without saved_model leaves the served versions alone (not stale).
    export_all(ExportRequest(exported["model"], out, max_seq_len=L, dev_texts=dev,
                             formats=["float32"], latency_runs=1))
    assert sorted(list_versions(os.path.join(out, "serving"))) == [1, 2]
    assert tree_digest(os.path.join(out, "serving", "1")) == first


class _TaggedClassification(Classification):
    """A classification task whose metadata kind is chosen by the test."""

    metadata_kind = "generic"

    def tflite_metadata_kind(self, is_pair, lower_case):
        return self.metadata_kind


def test_metadata_falls_back_to_a_described_kind_where_the_task_library_cannot_run(
        tiny_vocab):
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(6)
    cased = BertModel(small_config(vocab).replace(lower_case=False), head="classifier",
                      num_labels=2, vocab=vocab, label_names=["neg", "pos"])
    assert read_metadata(convert_tflite(cased, "float32", L)).metadata.name == "BertClassifier"
    clf = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab,
                    label_names=["neg", "pos"])
    pair = read_metadata(convert_tflite(clf, "float32", L, is_pair=True)).metadata
    assert pair.name == "BertClassifier" and "pair of texts" in pair.description
    with pytest.warns(UserWarning, match="batch 1, the model takes batch 2"):
        batch2 = convert_tflite(clf, "float32", L, batch_size=2)
    assert read_metadata(batch2).metadata.name == "BertClassifier"
    reg = BertModel(small_config(vocab), head="regressor", vocab=vocab)
    assert read_metadata(convert_tflite(reg, "dynamic_int8", L)).metadata.name == \
        "BertRegressor"
    generic = read_metadata(convert_tflite(clf, "float32", L, task=_TaggedClassification(
        ["neg", "pos"])))
    assert generic.metadata.name == "BertModel"
    (out,) = generic.to_dict()["subgraphMetadata"][0]["outputTensorMetadata"]
    assert out["name"] == "probabilities" and sorted(generic.files) == ["vocab.txt"]
    kind, note = fitting_kind("bert_question_answerer", batch_size=1, seq_len=128,
                              lower_case=True, pair=True)
    assert kind == "question_answerer" and "exactly 384 tokens" in note


def test_tflite_bad_inputs_get_one_clear_error_or_a_stated_fallback(tiny_vocab):
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(8)
    unnamed = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab)
    with pytest.warns(UserWarning, match=r"no label names; labels.txt names the classes"):
        flat = convert_tflite(unnamed, "float32", L)
    assert read_metadata(flat).files["labels.txt"] == b"0\n1\n"
    task = _TaggedClassification(["neg", "pos"])
    with pytest.raises(ExportError, match="has no text-in TFLite model"):
        convert_tflite(unnamed, "text_float32", L, task=task)
    task.metadata_kind = "nl_classifier"
    with pytest.raises(ExportError, match="tflite_metadata_kind returned 'nl_classifier'"):
        convert_tflite(unnamed, "float32", L, task=task)
    with pytest.raises(ExportError, match="one text per call"):
        convert_tflite(unnamed, "text_float32", L, batch_size=2)


def test_integer_friendly_trace_is_the_same_maths(exported):
    """The integer-friendly encoder (plain GATHER embeddings, centred LayerNorms)
    gives Keras's outputs in float, traced and converted."""
    model, dev = exported["model"], exported["dev"][:16]
    x = pack_texts(load_tokenizer(model, L), dev, None, L)
    fn = model_function(model, L, integer=True)
    flat = converter(fn).convert()
    got = TFLiteRunner(name_io(flat, ["probabilities"])).predict(x)
    np.testing.assert_allclose(got, keras_probs(model, dev), atol=1e-5)
    plain = converter(model_function(model, L)).convert()
    # The ops it exists to avoid: Keras's negative-id fix-up, its LayerNorm's NEG,
    # SQUARED_DIFFERENCE, and the mask's CAST; the plain trace has them.
    avoided = {"LESS", "SELECT", "SELECT_V2", "NEG", "SQUARED_DIFFERENCE", "CAST"}
    assert avoided & op_names(plain)
    assert not avoided & op_names(flat), op_names(flat)


def test_conversions_and_runners_print_none_of_tflites_native_notices(exported, capfd):
    """TFLite's converter, calibrator and interpreter write notices to file descriptor 2
    from C++ on every success (tflite.TFLITE_NOISE): a calibrated int8 conversion and a
    runner's start leave none of them, nor tf.lite.Interpreter's deprecation warning;
    any other line written to descriptor 2 meanwhile is kept."""
    from tinybert_tf.export.tflite import TFLITE_NOISE, quiet_tflite
    model = exported["model"]
    x = pack_texts(load_tokenizer(model, L), exported["dev"][:8], None, L)
    capfd.readouterr()
    flat = convert_tflite(model, "int8", L, representative=[x])
    TFLiteRunner(flat).predict(x)
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if TFLITE_NOISE.search(line)], err
    assert "Interpreter is deprecated" not in err
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_tflite():
            _write_noise_and_news()
    assert capfd.readouterr().err == "keep: a converter error\n"
    assert [str(w.message) for w in shown] == ["keep: our own warning"]


def _write_noise_and_news():
    """One line of TFLite's noise and the deprecation warning; one line and one warning
    that are news."""
    os.write(2, b"W0000 00:00:1.0 1 tf_tfl_flatbuffer_helpers.cc:364] Ignored "
                b"output_format.\n")
    os.write(2, b"keep: a converter error\n")
    warnings.warn("    Warning: tf.lite.Interpreter is deprecated and is scheduled",
                  UserWarning)
    warnings.warn("keep: our own warning", UserWarning)


def test_converter_with_the_variables_gives_the_frozen_graph(exported):
    """`converter` hands the converter the variables the function reads instead of a
    frozen copy: the same operators in the same order and the same outputs as freezing
    first, no variable ops left, and the serving SignatureDef an app calls."""
    model, dev = exported["model"], exported["dev"][:16]
    x = pack_texts(load_tokenizer(model, L), dev, None, L)
    fn = model_function(model, L)
    held = converter(fn).convert()
    frozen = tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)], tf.Module()).convert()
    assert ops_in_order(held) == ops_in_order(frozen)
    assert not {"READ_VARIABLE", "VAR_HANDLE"} & op_names(held)
    from ai_edge_litert.interpreter import Interpreter
    assert list(Interpreter(model_content=held).get_signature_list()) == ["serving_default"]
    np.testing.assert_array_equal(TFLiteRunner(name_io(held, ["probabilities"])).predict(x),
                                  TFLiteRunner(name_io(frozen, ["probabilities"])).predict(x))


def ops_in_order(flat: bytes) -> list[str]:
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    return [flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            for sg in model.subgraphs for op in sg.operators]


def op_names(flat: bytes) -> set[str]:
    return set(ops_in_order(flat))


# What an app can hand the text-in model, fed as the TFLite interpreter takes it (resized
# to the input's shape), each answered or refused with an error, none crashing: the
# tensorflow-text kernels check their input's rank when the graph is prepared.
TFLITE_TEXT_INPUTS = {
    "one string, not a batch": ("scalar", "refused"),
    "a rank-2 batch": ("rank2", "refused"),
    "an empty batch": ("empty", "answers"),
    "two texts": ("two", "answers"),
    "invalid UTF-8": ("bad_utf8", "answers"),
    "a 1 MB text": ("big", "answers"),
    "an empty string": ("empty_string", "answers"),
}
_TFLITE_SCRIPT = r'''
import json, sys
import numpy as np
sys.argv[1:] = sys.argv[3:]  # after _SAVED_MODEL_SCRIPT's two: the model, then the cases
import tensorflow_text as tf_text
from ai_edge_litert.interpreter import InterpreterWithCustomOps
values = {"scalar": np.array("some text", object), "rank2": np.array([["a"], ["b"]], object),
          "empty": np.array([], object), "two": np.array(["a good film", "awful"], object),
          "bad_utf8": np.array([b"\xff\xfe good \xc3"], object),
          "big": np.array(["good " * 200_000], object), "empty_string": np.array([""], object)}
for name in sys.argv[2:]:
    print("CASE", name, flush=True)
    it = InterpreterWithCustomOps(
        custom_op_registerers=list(tf_text.tflite_registrar.SELECT_TFTEXT_OPS),
        model_path=sys.argv[1])
    index = it.get_input_details()[0]["index"]
    value = values[name]
    try:
        if value.shape != (1,):
            it.resize_tensor_input(index, list(value.shape))
        it.allocate_tensors()
        it.set_tensor(index, value)
        it.invoke()
        shape = list(it.get_tensor(it.get_output_details()[0]["index"]).shape)
        print("RESULT", json.dumps([name, "answers", shape]), flush=True)
    except (RuntimeError, ValueError) as e:
        print("RESULT", json.dumps([name, "refused", str(e)[:200]]), flush=True)
'''


@pytest.fixture(scope="module")
def fresh(exported):
    """The module's one fresh process: _SAVED_MODEL_SCRIPT on the SavedModel, then
    _TFLITE_SCRIPT on the text-in TFLite model, every case of TFLITE_TEXT_INPUTS."""
    texts = exported["dev"][:8] + FRESH_TEXTS_EXTRA
    path = os.path.join(exported["dir"], "model_text_float32.tflite")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", _SAVED_MODEL_SCRIPT + _TFLITE_SCRIPT,
                           exported["saved_model"], json.dumps(texts), path,
                           *[case for case, _ in TFLITE_TEXT_INPUTS.values()]],
                          capture_output=True, text=True, timeout=300, env=env)


def test_no_input_crashes_the_text_tflite_model(fresh):
    proc = fresh
    started = [line for line in proc.stdout.splitlines() if line.startswith("CASE")]
    assert proc.returncode == 0, f"died in {started[-1:]}: {proc.stderr[-2000:]}"
    results = {r[0]: r[1:] for r in (json.loads(line[len("RESULT "):]) for line in
                                    proc.stdout.splitlines() if line.startswith("RESULT"))}
    for name, (case, outcome) in TFLITE_TEXT_INPUTS.items():
        assert results[case][0] == outcome, (name, results[case])
    assert results["empty"][1][0] == 0 and results["two"][1][0] == 2
    assert "rank 1" in results["scalar"][1]
