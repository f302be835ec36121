"""Export artefacts give the Keras model's answers (issue 7, Tests).

One tiny classifier (hidden 32, 2 layers) is fitted for a few steps on a
separable toy task (sentiment words decide the label), so labels are
meaningful; it is exported once per module in every format at seq 16.
"""
import json
import os
import subprocess
import sys
import unicodedata

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.export import (
    DEFAULT_FORMATS,
    FLAVOURS,
    ExportError,
    TFLiteRunner,
    check_formats,
    convert_tflite,
    custom_ops,
    export_all,
    export_saved_model,
)
from tinybert_tf.export.tflite import operators
from tinybert_tf.models import INPUT_NAMES, BertModel
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.tasks import Regression
from tinybert_tf.tokenizer import pack_texts

L = 16
NEUTRAL = "the a movie film is was plot actor story cat dog sat on mat very".split()
POS, NEG = ["good", "great", "fun"], ["bad", "awful", "boring"]


def toy_task(n, rng):
    """Sentences of neutral words plus 1-2 sentiment words of the label's polarity."""
    texts, labels = [], []
    for _ in range(n):
        y = int(rng.integers(2))
        words = list(rng.choice(NEUTRAL, rng.integers(2, 9)))
        for _ in range(rng.integers(1, 3)):
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(POS if y else NEG)))
        texts.append(" ".join(words))
        labels.append(y)
    return texts, labels


def unique(vocab):
    return list(dict.fromkeys(vocab))  # conftest's TINY_VOCAB repeats a few tokens


def small_config(vocab):
    return BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64)


def fit_toy_classifier(vocab, steps=40, seed=0):
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    model = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab,
                      label_names=["neg", "pos"])
    train, y = toy_task(256, rng)
    x = pack_texts(load_tokenizer(model, L), train, None, L)
    opt = keras.optimizers.Adam(3e-3)

    @tf.function
    def step(batch, labels):
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)["logits"]
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(steps):
        idx = rng.integers(0, len(train), 32)
        step({k: v[idx] for k, v in x.items()}, np.asarray(y)[idx])
    return model, train


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_vocab):
    model, train = fit_toy_classifier(unique(tiny_vocab))
    dev, dev_labels = toy_task(80, np.random.default_rng(1))
    out = str(tmp_path_factory.mktemp("exp") / "export")
    parity = export_all(model, out, max_seq_len=L, dev_texts=dev, dev_labels=dev_labels,
                        representative_texts=train[:64], latency_runs=2)
    return {"model": model, "dir": out, "parity": parity, "dev": dev, "labels": dev_labels}


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
    expected = {"saved_model", "parity.json"} | {f"model_{f}.tflite" for f in FLAVOURS}
    assert set(os.listdir(d)) == expected  # no temporaries left behind
    with open(os.path.join(d, "parity.json")) as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(exported["parity"]))
    rows = on_disk["formats"]
    assert set(rows) == {"keras", *DEFAULT_FORMATS}
    assert on_disk["metric_name"] == "accuracy" and on_disk["num_examples"] == 80
    for name, r in rows.items():
        assert r["size_bytes"] > 0 and r["latency_ms_b1"] > 0, name
    assert rows["keras"]["metric"] >= 0.9  # the toy model really learned the task
    # Sizes: float16 and int8 files are smaller than float32.
    assert rows["float16"]["size_bytes"] < rows["float32"]["size_bytes"]
    assert rows["int8"]["size_bytes"] < rows["float32"]["size_bytes"]


def test_float_formats_match_keras(exported):
    rows = exported["parity"]["formats"]
    assert rows["saved_model"]["max_abs_diff"] < 1e-5
    assert rows["float32"]["max_abs_diff"] < 1e-4
    assert rows["float16"]["label_agreement"] >= 0.99
    assert rows["dynamic_int8"]["label_agreement"] >= 0.95


def test_int8_agrees_with_keras_labels(exported):
    model, dev = exported["model"], exported["dev"]
    ref = keras_probs(model, dev)
    runner = TFLiteRunner(os.path.join(exported["dir"], "model_int8.tflite"))
    out = runner.predict(pack_texts(load_tokenizer(model, L), dev, None, L))
    agreement = np.mean(out.argmax(-1) == ref.argmax(-1))
    assert agreement >= 0.95
    assert exported["parity"]["formats"]["int8"]["label_agreement"] == pytest.approx(agreement)
    # Weights really are int8: most tensors are INT8, fully connected layers included.
    assert "FULLY_CONNECTED" in operators(os.path.join(exported["dir"], "model_int8.tflite"))


def test_tflite_tensor_names_and_shapes(exported):
    from ai_edge_litert.interpreter import Interpreter
    for fmt in FLAVOURS:
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
    sm = os.path.join(exported["dir"], "saved_model")
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
    loaded = tf.saved_model.load(os.path.join(exported["dir"], "saved_model"))
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


def test_saved_model_in_fresh_process_matches_keras(exported, tmp_path):
    texts = exported["dev"][:8] + ["Hello World!", "un-affable café"]
    script = (
        "import json, sys\n"
        "import tensorflow as tf\n"
        "import tensorflow_text  # registers the tokenizer ops\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "texts = json.loads(sys.argv[2])\n"
        "out = m.signatures['serving_default'](text=tf.constant(texts))\n"
        "print('RESULT' + json.dumps(out['probabilities'].numpy().tolist()))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", script,
                           os.path.join(exported["dir"], "saved_model"), json.dumps(texts)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1]
    probs = np.array(json.loads(line[len("RESULT"):]))
    np.testing.assert_allclose(probs, keras_probs(exported["model"], texts), atol=1e-5)


def test_text_ops_are_tensorflow_text_tokenizer_ops(exported):
    ops = custom_ops(os.path.join(exported["dir"], "saved_model"))
    assert ops, "the text signature should tokenise in graph"
    # Only the FastBertTokenizer family (normaliser + fast WordPiece), which
    # tensorflow_model_server links in with tensorflow-text's ops library.
    assert set(ops) <= {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets"}, ops


def test_pair_regressor_saved_model(tmp_path, tiny_vocab):
    vocab = unique(tiny_vocab)
    keras.utils.set_random_seed(3)
    model = BertModel(small_config(vocab), head="regressor", vocab=vocab)
    path = export_saved_model(model, str(tmp_path / "sm"), max_seq_len=L, is_pair=True)
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
        export_all(encoder_only, str(tmp_path / "a"), max_seq_len=L, dev_texts=["a cat"])
    assert not os.path.exists(tmp_path / "a" / "parity.json")
    with pytest.raises(ExportError, match="unknown export format 'onnx'"):
        check_formats(["float32", "onnx"])
    clf = BertModel(small_config(vocab), head="classifier", num_labels=2, vocab=vocab)
    with pytest.raises(ExportError, match="representative"):
        convert_tflite(clf, "int8", L, representative=[])
    with pytest.raises(ExportError, match="representative"):
        export_all(clf, str(tmp_path / "b"), max_seq_len=L, formats=["int8"],
                   dev_texts=["a cat"], representative_texts=[])
    with pytest.raises(ExportError, match="vocab"):
        export_all(BertModel(small_config(vocab), head="classifier", num_labels=2),
                   str(tmp_path / "c"), max_seq_len=L, dev_texts=["a cat"])
    with pytest.raises(ExportError, match="max_seq_len"):
        export_all(clf, str(tmp_path / "d"), max_seq_len=1000, dev_texts=["a cat"])
    with pytest.raises(ExportError, match="pair"):
        export_all(clf, str(tmp_path / "e"), max_seq_len=L, dev_texts=["a cat"], is_pair=True)
    with pytest.raises(ExportError, match="regression"):
        export_all(clf, str(tmp_path / "f"), max_seq_len=L, dev_texts=["a"], task=Regression())


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
