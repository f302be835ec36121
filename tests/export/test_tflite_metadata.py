"""TFLite metadata for the Task Library: what we write, read back by us, by
tflite-support's own parser and by the real BertNLClassifier/BertQuestionAnswerer
(in an isolated venv, tests/tasklib.py; those tests skip when it cannot be made)."""
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from tensorflow.lite.tools import flatbuffer_utils

from tinybert_tf.config import BertConfig
from tinybert_tf.export import tflite
from tinybert_tf.export import tflite_metadata as tm
from tinybert_tf.export.common import ExportError
from tinybert_tf.models import INPUT_NAMES, BertModel
from tinybert_tf.tokenizer import Tokenizer

import tasklib
from numerics import assert_same_labels

# The Task Library and LiteRT are compared with Keras (make test-isa).
pytestmark = pytest.mark.numerics

SEQ_LEN = 16
LABELS = ["neg", "neu", "pos"]
# ASCII text both tokenisers split alike: unknown words (WordPiece letters or
# [UNK] for "123"), punctuation, upper case, and one text past SEQ_LEN pieces.
TEXTS = ["a great fun film", "The plot was AWFUL, very boring!", "the cat sat on the mat.",
         "hello world 123", "unaffable actor ran", "not a good movie... not a good story",
         "the movie was very good and the story was great fun but the plot ran on and on"]


@pytest.fixture(scope="module")
def classifier(tiny_vocab):
    """A random 3-class model whose probabilities move with the input: weights
    drawn wide (initializer_range 0.5) so every token changes the output."""
    keras.utils.set_random_seed(7)
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64,
                        initializer_range=0.5)
    return BertModel(config, head="classifier", num_labels=3, label_names=LABELS,
                     vocab=tiny_vocab)


@pytest.fixture(scope="module")
def bare_flat(classifier):
    return tflite.convert(classifier, "float32", SEQ_LEN, metadata=False)


@pytest.fixture(scope="module")
def flat(bare_flat, tiny_vocab):
    return tm.add_metadata(bare_flat, kind="bert_nl_classifier", vocab=tiny_vocab,
                           lower_case=True, labels=LABELS)


@pytest.fixture(scope="module")
def task_library():
    reason = tasklib.unavailable_reason()
    if reason:
        pytest.skip(f"TFLite Task Library unavailable: {reason}")


def qa_function(vocab, seq_len=tm.QA_SEQ_LEN):
    """A hand-built QA model: start logit 10 on "cat" in the second segment,
    end logit 10 on "mat" under the mask; if the mask and segment ids were
    swapped (no first-segment tokens seen), the start jumps to "the" instead."""
    cat, the, mat = (vocab.index(w) for w in ("cat", "the", "mat"))
    spec = [tf.TensorSpec([1, seq_len], tf.int32, name=n) for n in INPUT_NAMES]

    @tf.function(input_signature=spec)
    def qa(input_word_ids, input_mask, input_type_ids):
        mask = tf.cast(input_mask, tf.float32)
        seg = tf.cast(input_type_ids, tf.float32)
        first_segment = tf.reduce_sum(mask * (1.0 - seg), axis=1, keepdims=True)
        swapped = tf.cast(tf.equal(first_segment, 0.0), tf.float32)

        def hot(i):
            return tf.cast(tf.equal(input_word_ids, i), tf.float32)

        start = seg * (10.0 * hot(cat) + 20.0 * hot(the) * swapped)
        return {"start_logits": start, "end_logits": 10.0 * hot(mat) * mask}

    return qa.get_concrete_function()


def convert_function(fn) -> bytes:
    """The converter's own output: tensors named serving_default_*:0 and
    PartitionedCall:N, the task names only in the SignatureDef."""
    return tflite.converter(fn).convert()


@pytest.fixture(scope="module")
def qa_flat(tiny_vocab):
    return tm.add_metadata(convert_function(qa_function(tiny_vocab)),
                           kind="bert_question_answerer", vocab=tiny_vocab, lower_case=True)


def packed(model, texts):
    """Our tokenisation: int32 numpy [N, SEQ_LEN] model inputs."""
    out = Tokenizer(model.vocab, lower_case=True, max_seq_len=SEQ_LEN)(texts)
    return {k: v.numpy() for k, v in out.items()}


def keras_probabilities(model, texts):
    logits = model(packed(model, texts), training=False)["logits"]
    return tf.nn.softmax(logits, axis=-1).numpy()


def litert_predict(flat, inputs):
    """Rows of `inputs` through the model's serving_default signature in
    ai-edge-litert (any tensor names), one batch-1 call each."""
    runner = Interpreter(model_content=flat).get_signature_runner("serving_default")
    rows = [runner(**{k: v[i:i + 1] for k, v in inputs.items()})
            for i in range(len(inputs[INPUT_NAMES[0]]))]
    return np.concatenate([next(iter(r.values())) for r in rows], 0)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_classifier_metadata_is_what_bert_nl_classifier_reads(flat, tiny_vocab):
    got = tm.read_metadata(flat)
    sg = got.to_dict()["subgraphMetadata"][0]
    assert [t["name"] for t in sg["inputTensorMetadata"]] == ["ids", "mask", "segment_ids"]
    (unit,) = sg["inputProcessUnits"]
    assert unit["optionsType"] == "BertTokenizerOptions"
    assert [(f["name"], f["type"]) for f in unit["options"]["vocabFile"]] == [
        ("vocab.txt", "VOCABULARY")]
    (out,) = sg["outputTensorMetadata"]
    assert out["name"] == "probability"
    assert [(f["name"], f["type"]) for f in out["associatedFiles"]] == [
        ("labels.txt", "TENSOR_AXIS_LABELS")]
    assert got.metadata.minParserVersion == "1.1.0"
    assert got.files == {"vocab.txt": ("\n".join(tiny_vocab) + "\n").encode(),
                         "labels.txt": b"neg\nneu\npos\n"}


def test_signature_outputs_are_named_as_in_the_saved_model(flat):
    """get_signature_runner() answers {"probabilities": ...}, not {"output_0": ...}."""
    interpreter = Interpreter(model_content=flat)
    assert interpreter.get_signature_list()["serving_default"]["outputs"] == ["probabilities"]
    runner = interpreter.get_signature_runner("serving_default")
    ids = np.zeros((1, SEQ_LEN), np.int32)
    assert set(runner(input_word_ids=ids, input_mask=ids, input_type_ids=ids)) == {
        "probabilities"}


def test_metadata_leaves_the_model_computing_the_same(bare_flat, flat, classifier):
    inputs = packed(classifier, TEXTS)
    np.testing.assert_array_equal(litert_predict(flat, inputs), litert_predict(bare_flat, inputs))


def test_adding_metadata_again_replaces_it(flat, tiny_vocab):
    again = tm.add_metadata(flat, kind="bert_nl_classifier", vocab=tiny_vocab,
                            lower_case=True, labels=LABELS)
    assert again == flat
    relabelled = tm.add_metadata(flat, kind="bert_nl_classifier", vocab=tiny_vocab,
                                 lower_case=True, labels=["a", "b", "c"])
    assert tm.read_metadata(relabelled).files["labels.txt"] == b"a\nb\nc\n"


def test_metadata_follows_the_model_input_order_found_by_signature_names(qa_flat):
    """The converter orders inputs its own way and names outputs PartitionedCall:N;
    metadata entry i must describe input/output i, named for the Task Library."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(qa_flat))
    sg = model.subgraphs[0]
    tensor_names = [sg.tensors[i].name.decode() for i in sg.inputs]
    expected = [tm.INPUT_METADATA[n.split(":")[0][len("serving_default_"):]][0]
                for n in tensor_names]
    meta = tm.read_metadata(qa_flat).to_dict()["subgraphMetadata"][0]
    assert [t["name"] for t in meta["inputTensorMetadata"]] == expected
    keys = {o.tensorIndex: o.name.decode() for o in model.signatureDefs[0].outputs}
    assert [t["name"] for t in meta["outputTensorMetadata"]] == [keys[i] for i in sg.outputs]


def test_min_parser_version_is_the_newest_field_used():
    meta = tm.md.ModelMetadataT()
    meta.name = "m"
    assert tm.min_parser_version(meta) == "1.0.0"
    sg = tm.md.SubGraphMetadataT()
    meta.subgraphMetadata = [sg]
    sg.inputProcessUnits = []
    assert tm.min_parser_version(meta) == "1.1.0"
    f = tm.md.AssociatedFileT()
    f.name, f.version = "x.txt", "2"
    sg.associatedFiles = [f]
    assert tm.min_parser_version(meta) == "1.4.1"
    sg.customMetadata = []
    assert tm.min_parser_version(meta) == "1.5.0"


def test_classifier_kind_takes_the_pair_and_cased_models_the_task_library_cannot(bare_flat,
                                                                                 tiny_vocab):
    out = tm.add_metadata(bare_flat, kind="classifier", vocab=tiny_vocab, lower_case=False,
                          labels=LABELS, pair=True)
    got = tm.read_metadata(out)
    assert got.metadata.name == "BertClassifier"
    assert "pair of texts" in got.metadata.description
    assert "cased (not lower-cased)" in got.metadata.description
    assert sorted(got.files) == ["labels.txt", "vocab.txt"]


def test_regressor_metadata_describes_a_score(tiny_vocab):
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=16, num_layers=1, num_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    model = BertModel(config, head="regressor", vocab=tiny_vocab)
    bare = tflite.convert(model, "float32", SEQ_LEN, metadata=False)
    out = tm.add_metadata(bare, kind="regressor", vocab=tiny_vocab, lower_case=True, pair=True)
    got = tm.read_metadata(out)
    sg = got.to_dict()["subgraphMetadata"][0]
    assert [t["name"] for t in sg["outputTensorMetadata"]] == ["score"]
    assert sg["inputProcessUnits"][0]["optionsType"] == "BertTokenizerOptions"
    assert "pair of texts" in got.metadata.description
    assert sorted(got.files) == ["vocab.txt"]


def test_token_classifier_metadata_labels_the_last_axis(tiny_vocab):
    spec = [tf.TensorSpec([1, SEQ_LEN], tf.int32, name=n) for n in INPUT_NAMES]

    @tf.function(input_signature=spec)
    def tagger(input_word_ids, input_mask, input_type_ids):
        x = tf.cast(input_word_ids + input_mask + input_type_ids, tf.float32)
        return {"probabilities": tf.nn.softmax(tf.stack([x, -x, 0 * x], -1), -1)}

    out = tm.add_metadata(convert_function(tagger.get_concrete_function()),
                          kind="token_classifier", vocab=tiny_vocab, lower_case=False,
                          labels=["O", "B-PER", "I-PER"])
    got = tm.read_metadata(out)
    (tensor,) = got.to_dict()["subgraphMetadata"][0]["outputTensorMetadata"]
    assert tensor["dimensionNames"] == ["batch", "token", "label"]
    assert tensor["associatedFiles"][0]["type"] == "TENSOR_AXIS_LABELS"
    assert got.files["labels.txt"] == b"O\nB-PER\nI-PER\n"
    assert "cased (not lower-cased)" in got.metadata.description


@pytest.mark.parametrize("change, message", [
    ({"kind": "nl_classifier"}, "unknown metadata kind"),
    ({"labels": ["neg", "pos"]}, "2 labels for output"),
    ({"labels": ["neg", "", "pos"]}, "labels[1]"),
    ({"labels": ["neg", "neg", "pos"]}, "repeat a name"),
    ({"lower_case": False}, "lower-cases every input"),
    ({"pair": True}, "feeds ONE text"),
    ({"vocab": ["[PAD]", "a", "b"]}, "vocab lacks [CLS] [SEP] [UNK]: BERT"),
    ({"vocab": ["[CLS]", "[SEP]", "", "[UNK]"]}, "vocab[2]"),
    ({"vocab": ["[CLS]", "[SEP]", "[UNK]", "[SEP]"]}, "repeats vocab[1]"),
    ({"kind": "regressor", "labels": None}, "output score: expected float32 [1, 1]"),
    ({"kind": "token_classifier"}, "expected float32 rank 3"),
    ({"kind": "regressor"}, "whose outputs have none"),
])
def test_bad_requests_raise_clear_errors(bare_flat, tiny_vocab, change, message):
    args = {"kind": "bert_nl_classifier", "vocab": tiny_vocab, "lower_case": True,
            "labels": LABELS, **change}
    with pytest.raises(ExportError, match=re.escape(message)):
        tm.add_metadata(bare_flat, **args)


def test_kind_must_match_the_number_of_outputs(qa_flat, tiny_vocab):
    with pytest.raises(ExportError, match=r"expects 1 output\(s\)"):
        tm.add_metadata(qa_flat, kind="bert_nl_classifier", vocab=tiny_vocab,
                        lower_case=True)


def test_question_answerer_needs_the_task_librarys_384_tokens(tiny_vocab):
    short = convert_function(qa_function(tiny_vocab, seq_len=SEQ_LEN))
    with pytest.raises(ExportError, match="always packs 384 tokens"):
        tm.add_metadata(short, kind="bert_question_answerer", vocab=tiny_vocab,
                        lower_case=True)


def test_reading_a_model_without_metadata_says_so(bare_flat):
    with pytest.raises(ExportError, match="has no TFLITE_METADATA"):
        tm.read_metadata(bare_flat)


def test_task_library_refuses_the_model_without_metadata(task_library, bare_flat, tmp_path):
    """Without metadata, a bare model gives 'No metadata or input process unit found'."""
    with pytest.raises(tasklib.TaskLibError, match="No metadata or input process unit found"):
        tasklib.classify(write(tmp_path, "bare.tflite", bare_flat), ["a film"])


def test_tflite_support_parser_reads_our_metadata(task_library, flat, tmp_path):
    shown = tasklib.show_metadata(write(tmp_path, "model.tflite", flat))
    ours = tm.read_metadata(flat)
    assert sorted(shown["files"]) == sorted(ours.files)
    theirs = shown["metadata"]
    assert theirs["name"] == ours.metadata.name
    assert theirs["min_parser_version"] == "1.1.0"
    sg = theirs["subgraph_metadata"][0]
    assert [t["name"] for t in sg["input_tensor_metadata"]] == ["ids", "mask", "segment_ids"]
    assert sg["input_process_units"][0]["options_type"] == "BertTokenizerOptions"
    assert json.dumps(theirs)  # plain JSON all through


def test_bert_nl_classifier_matches_keras(task_library, flat, classifier, tmp_path):
    """The whole chain: the Task Library tokenises with the packed vocab.txt,
    finds the inputs by metadata name, runs the model and names the classes
    from labels.txt; its probabilities equal Keras's on our tokenisation."""
    got = tasklib.classify(write(tmp_path, "model.tflite", flat), TEXTS)
    want = keras_probabilities(classifier, TEXTS)
    assert want.max(0).min() > 0.5 and np.ptp(want, axis=0).max() > 0.3  # outputs do vary
    assert len(got) == len(TEXTS)
    for text, scores, row in zip(TEXTS, got, want, strict=True):
        assert sorted(scores) == sorted(LABELS), text
        np.testing.assert_allclose([scores[c] for c in LABELS], row, atol=1e-4, err_msg=text)


def ids_probe(vocab, seq_len=SEQ_LEN) -> bytes:
    """A BertNLClassifier model whose "probabilities" are its input ids: classify()
    then reports the ids the Task Library's own tokenizer fed it."""
    spec = [tf.TensorSpec([1, seq_len], tf.int32, name=n) for n in INPUT_NAMES]

    @tf.function(input_signature=spec)
    def probe(input_word_ids, input_mask, input_type_ids):
        return {"probabilities": tf.cast(input_word_ids, tf.float32)}

    flat = tflite.name_io(convert_function(probe.get_concrete_function()), ["probabilities"])
    return tm.add_metadata(flat, kind="bert_nl_classifier", vocab=vocab, lower_case=True,
                           labels=[f"p{i:02d}" for i in range(seq_len)])


def test_the_task_library_lower_cases_but_keeps_accents(task_library, tiny_vocab, tmp_path):
    """docs/deploy.md: BertNLClassifier's tokenizer does not strip accents, so an accented
    word of an uncased vocab becomes [UNK]; stripped in the app first, it matches ours."""
    import unicodedata

    vocab = list(dict.fromkeys(tiny_vocab))
    path = write(tmp_path, "probe.tflite", ids_probe(vocab))
    texts = ["Café film", "CAFE film"]
    stripped = ["".join(c for c in unicodedata.normalize("NFD", t)
                        if not unicodedata.combining(c)) for t in texts]
    got = [[round(scores[f"p{i:02d}"]) for i in range(SEQ_LEN)]
           for scores in tasklib.classify(path, texts + stripped)]
    ours = Tokenizer(vocab, lower_case=True, max_seq_len=SEQ_LEN)(texts)["input_word_ids"]
    ours = ours.numpy().tolist()
    unk, caf, e = (vocab.index(t) for t in ("[UNK]", "caf", "##e"))
    assert ours[0][1:3] == [caf, e] and got[0][1] == unk  # accented: [UNK] there, not ours
    assert got[1] == ours[1]  # upper case is lower-cased as ours
    assert got[2:] == ours  # accents stripped in the app: the same ids as ours


def test_bert_question_answerer_answers_the_span_the_logits_point_at(task_library, qa_flat,
                                                                      tmp_path):
    answers = tasklib.answer(write(tmp_path, "qa.tflite", qa_flat),
                             "The cat sat on the mat .", "where did the cat sit ?")
    assert answers[0]["text"] == "cat sat on the mat"
    assert answers[0]["logit"] == pytest.approx(20.0)


def task_library_flavour(classifier, vocab, tmp_path, fmt):
    """(Task Library probabilities, ai-edge-litert probabilities) of one flavour on TEXTS."""
    inputs = packed(classifier, TEXTS)
    bare = tflite.convert(classifier, fmt, SEQ_LEN, representative=[inputs], metadata=False)
    model = tm.add_metadata(bare, kind="bert_nl_classifier", vocab=vocab, lower_case=True,
                            labels=LABELS)
    got = tasklib.classify(write(tmp_path, f"{fmt}.tflite", model), TEXTS)
    return np.array([[s[c] for c in LABELS] for s in got]), litert_predict(bare, inputs)


def test_float16_flavour_runs_the_same_in_the_task_library(task_library, classifier,
                                                           tiny_vocab, tmp_path):
    got, want = task_library_flavour(classifier, tiny_vocab, tmp_path, "float16")
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_int8_flavour_runs_in_the_task_library_with_the_same_labels(task_library, classifier,
                                                                    tiny_vocab, tmp_path):
    """Its int8 kernels are older than ai-edge-litert's: scores differ by a few
    1/256 steps (up to 0.09 measured), the predicted labels do not where the scores
    leave a margin wider than that difference."""
    got, want = task_library_flavour(classifier, tiny_vocab, tmp_path, "int8")
    assert_same_labels(got, want, 0.15)


def test_dynamic_int8_needs_per_tensor_dense_weights_for_the_task_library(
        task_library, classifier, tiny_vocab, tmp_path):
    """TF 2.20 quantises dense weights per channel (FULLY_CONNECTED version 12),
    which the Task Library's TFLite runtime (tflite-support 0.4.4) cannot load;
    per-tensor weights (version 9) load and agree."""
    inputs = packed(classifier, TEXTS)
    results = {}
    for per_tensor in (False, True):
        converter = tflite.converter(tflite.model_function(classifier, SEQ_LEN))
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter._experimental_disable_per_channel_quantization_for_dense_layers = per_tensor
        bare = converter.convert()
        model = tm.add_metadata(bare, kind="bert_nl_classifier", vocab=tiny_vocab,
                                lower_case=True, labels=LABELS)
        path = write(tmp_path, f"dyn_{per_tensor}.tflite", model)
        try:
            results[per_tensor] = (tasklib.classify(path, TEXTS), bare)
        except tasklib.TaskLibError as e:
            results[per_tensor] = str(e)
    assert "FULLY_CONNECTED' version '12'" in results[False]
    got, bare = results[True]
    np.testing.assert_allclose([[s[c] for c in LABELS] for s in got],
                               litert_predict(bare, inputs), atol=1e-5)


def test_tflite_support_parser_reads_the_text_in_metadata(task_library, classifier, tmp_path):
    flat = tflite.convert(classifier, "text_float32", SEQ_LEN)
    shown = tasklib.show_metadata(write(tmp_path, "text.tflite", flat))
    assert shown["files"] == ["labels.txt"]
    sg = shown["metadata"]["subgraph_metadata"][0]
    assert [t["name"] for t in sg["input_tensor_metadata"]] == ["text"]
    assert "input_process_units" not in sg  # the tokenizer is in the graph
    assert sg["output_tensor_metadata"][0]["associated_files"][0]["type"] == \
        "TENSOR_AXIS_LABELS"


def test_bert_question_answerer_runs_our_span_export_on_our_packing(task_library, tiny_vocab,
                                                                     tmp_path):
    """A SpanQA model converted by our exporter (metadata attached by the task type) loads
    in the real BertQuestionAnswerer, and the logit of its best answer is a start+end sum
    of OUR packing's logits in the context: both sides fed the model the same 384 ids."""
    from tinybert_tf.export import TFLiteRunner
    from tinybert_tf.tasks.span import SpanQA
    keras.utils.set_random_seed(9)
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=tm.QA_SEQ_LEN,
                        initializer_range=0.1)
    model = BertModel(config, head="span", vocab=tiny_vocab)
    # The Task Library only pairs its top-5 starts with its top-5 ends over all 384
    # positions, so a random head answers nothing. Give the second segment a strong
    # direction u and read start and end along it: context tokens then score highest,
    # and the random word / position parts still make every span's sum different.
    weights = {w.path: w for w in model.weights}
    u = np.random.default_rng(9).normal(size=32)
    u = (u - u.mean()) / u.std()
    segment = weights["bert/segment_embedding/embeddings"]
    segment.assign(np.stack([np.zeros(32), 0.5 * u]).astype("float32"))
    head = weights["bert/span_head/qa_outputs/kernel"]
    head.assign(np.stack([u, u], 1).astype("float32") + head.numpy())
    flat = tflite.convert(model, "float32", tm.QA_SEQ_LEN, task=SpanQA(version="1.1"))
    context, question = "The cat sat on the mat .", "where did the cat sit ?"
    answers = tasklib.answer(write(tmp_path, "span.tflite", flat), context, question)
    assert answers and answers[0]["text"] and answers[0]["text"].lower() in context.lower()
    ids = Tokenizer(tiny_vocab, lower_case=True, max_seq_len=tm.QA_SEQ_LEN)(
        [question], [context])
    out = TFLiteRunner(flat).predict({k: v.numpy() for k, v in ids.items()})
    start, end = out["start_logits"][0], out["end_logits"][0]
    in_context = np.flatnonzero(ids["input_type_ids"].numpy()[0] * ids["input_mask"].numpy()[0])
    in_context = in_context[:-1]  # not the final [SEP]
    sums = start[in_context][:, None] + end[in_context][None, :]
    words = context.lower().split()  # the tiny vocabulary holds each word whole
    assert len(in_context) == len(words)
    for answer in answers:  # each answer's logit is OUR sum for the words it names
        spans = [(i, j) for i in range(len(words)) for j in range(i, len(words))
                 if " ".join(words[i:j + 1]) == answer["text"].lower()]
        assert any(np.isclose(sums[i, j], answer["logit"], atol=1e-4) for i, j in spans), answer
