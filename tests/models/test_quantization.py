"""The int8 fake-quantised encoder: it computes what TFLite's full-integer
kernels compute, learns its ranges, and converts with exactly those ranges to a file
with no float op, for every task head."""
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema_fb
from tensorflow.lite.tools import flatbuffer_utils

from tinybert_tf.config import BertConfig
from tinybert_tf.distill import Distiller, make_terms
from tinybert_tf.export import ExportError, TFLiteRunner, convert_tflite
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, load_tokenizer, save_model
from tinybert_tf.models.layers import normalize
from tinybert_tf.models.quantization import (
    SOFTMAX_RANGE,
    TANH_RANGE,
    ActivationRanges,
    Quant,
    QuantizationConfig,
    QuantizationError,
    calibrate,
)
from tinybert_tf.pipeline.stages.quantize import identity_projections
from tinybert_tf.tasks import Regression, SpanQA, task_type_of
from tinybert_tf.tasks.token import TokenClassification
from tinybert_tf.tokenizer import pack_texts

import tasklib
from quant_helpers import (
    L,
    activation_params,
    expected_params,
    fit_toy_classifier,
    float_ops,
    toy_task,
    unique,
)


@pytest.fixture(scope="module")
def toy(tiny_vocab):
    """A toy classifier, its int8 copy calibrated on 64 train sentences, the dev set."""
    model, train = fit_toy_classifier(unique(tiny_vocab))
    tok = load_tokenizer(model, L)
    dev, _ = toy_task(80, np.random.default_rng(1))
    quantized = model.quantized()
    calibrate(quantized, [pack_texts(tok, train[:64], None, L)])
    return {"model": model, "quantized": quantized, "dev": pack_texts(tok, dev, None, L),
            "flat": convert_tflite(quantized, "int8", L)}


def _outputs(model, inputs):
    """The model's outputs in its task's export space, computed eagerly (no trace)."""
    logits = tf.cast(model(inputs, training=False)["logits"], tf.float32)
    return task_type_of(model).tflite_output(logits).numpy()


def _random_inputs(n, length, vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, (n, length)).astype(np.int32)
    mask = (np.arange(length)[None, :] < rng.integers(3, length + 1, (n, 1))).astype(np.int32)
    return {"input_word_ids": ids * mask, "input_mask": mask,
            "input_type_ids": np.zeros_like(ids)}


def _assert_same_decisions(got, want, margin: float):
    """Same argmax as `want` on every row whose top two scores differ by more than
    `margin` (a near tie may go either way on another CPU's rounding)."""
    top2 = np.sort(want, axis=-1)[..., -2:]
    decided = top2[..., 1] - top2[..., 0] > margin
    np.testing.assert_array_equal(got.argmax(-1)[decided], want.argmax(-1)[decided])


def test_the_int8_encoder_computes_the_float_one_within_int8_resolution(toy):
    model, quantized, dev = toy["model"], toy["quantized"], toy["dev"]
    float_p, int8_p = _outputs(model, dev), _outputs(quantized, dev)
    assert np.max(np.abs(int8_p - float_p)) < 0.05
    # Same weights, not the same model: the fake quantisation really acts.
    assert np.max(np.abs(int8_p - float_p)) > 0
    assert quantized.quantization == QuantizationConfig()


def test_calibration_gives_every_point_a_range_and_sizes_the_mask(toy):
    ranges = toy["quantized"].quant_ranges
    lo_hi = np.array([v.numpy() for v in ranges.points.values()])
    # 2 layers: embeddings (2 sums + 8 norm points), per layer 7 attention + 2 residual
    # + 16 norm + 3 FFN points, pooler and head.
    assert len(lo_hi) == 10 + 2 * 28 + 2
    assert np.all(lo_hi[:, 0] <= 0) and np.all(lo_hi[:, 1] >= 0)
    assert np.all(lo_hi[:, 1] > lo_hi[:, 0])
    # -(widest spread of real-key scores + margin): finite, far below 0, far above -1e4.
    mask_value = float(ranges.mask_value.numpy()[0])
    assert -1e3 < mask_value < -ranges.config.mask_margin


def test_int8_file_has_no_float_op_and_every_learnt_range(toy, tmp_path):
    """The converter quantises each activation with the range the model learnt (the
    (scale, zero point) of each point is an operator output's), makes up none of its
    own, and keeps every op integer between the int32 ids and the output DEQUANTIZE."""
    path = str(tmp_path / "model_int8.tflite")
    with open(path, "wb") as f:
        f.write(toy["flat"])
    assert float_ops(path) == []
    got = activation_params(toy["flat"])
    quantized = toy["quantized"]
    ranges = quantized.quant_ranges
    expected = {name: expected_params(*v.numpy()) for name, v in ranges.points.items()}
    fixed = [expected_params(*SOFTMAX_RANGE), expected_params(*TANH_RANGE)]
    # GATHER outputs keep their int8 table's range (the tables' own min/max with 0).
    tables = [quantized.token_embedding.embeddings.numpy(),
              quantized.segment_embedding.embeddings.numpy(),
              np.array([ranges.mask_value.numpy()[0], 0.0])]
    fixed += [expected_params(min(t.min(), 0.0), max(t.max(), 0.0)) for t in tables]

    def known(p, candidates):
        return any(abs(p[0] - s) <= 1e-6 * s and p[1] == z for s, z in candidates)

    # LayerNorm's "sum_squares_eps" equals "sum_squares" (eps 1e-12): only distinct ranges.
    missing = [n for n, p in expected.items() if not known(p, got)]
    assert not missing, missing
    invented = [p for p in got if not known(p, [*expected.values(), *fixed])]
    assert not invented, invented


def test_int8_file_computes_what_the_keras_int8_model_does(toy):
    quantized, dev = toy["quantized"], toy["dev"]
    want = _outputs(quantized, dev)
    got = TFLiteRunner(toy["flat"]).predict(dev)
    # Integer kernels round differently (fixed-point rescaling, LUT GELU / softmax):
    # within a few output steps (1/256) of the simulation, the same labels wherever
    # the simulation's margin is wider than that.
    assert np.max(np.abs(got - want)) < 0.03
    _assert_same_decisions(got, want, margin=0.06)


def test_kernels_are_int8_per_output_channel_at_max_abs_over_127(toy):
    """FULLY_CONNECTED weights: symmetric int8, one scale per output channel, max|w|/127
    (what `channel_weights` simulates in training)."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(toy["flat"]))
    sg = model.subgraphs[0]
    head = toy["quantized"].head.classifier.kernel.numpy()  # [H, 2]
    scales = []
    for op in sg.operators:
        if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) != "FULLY_CONNECTED":
            continue
        w = sg.tensors[op.inputs[1]]
        assert w.type == schema_fb.TensorType.INT8
        assert len(w.quantization.scale) == w.shape[0] and not np.any(w.quantization.zeroPoint)
        scales.append(np.asarray(w.quantization.scale))
    assert len(scales) == 2 * 6 + 2  # Q, K, V, output, FFN x2 per layer; pooler; head
    np.testing.assert_allclose(scales[-1], np.abs(head).max(0) / 127, rtol=1e-6)


def test_training_moves_ranges_by_moving_average_and_inference_does_not():
    ranges = ActivationRanges(QuantizationConfig(ema_decay=0.75))
    x = tf.constant([[-1.0, 0.5, 3.0]])
    ranges.activation("p", x)  # creates the point at [0, 0]
    ranges.points["p"].assign([-2.0, 2.0])
    ranges.activation("p", x, training=False)
    np.testing.assert_allclose(ranges.points["p"].numpy(), [-2.0, 2.0])
    ranges.activation("p", x, training=True)
    np.testing.assert_allclose(ranges.points["p"].numpy(),
                               [0.75 * -2 + 0.25 * -1, 0.75 * 2 + 0.25 * 3], rtol=1e-6)
    with ranges.calibrating():  # widens to cover, no fake quantisation
        out = ranges.activation("p", tf.constant([[-4.0, 1.0]]))
    np.testing.assert_allclose(out.numpy(), [[-4.0, 1.0]])
    np.testing.assert_allclose(ranges.points["p"].numpy(), [-4.0, 2.25], rtol=1e-6)


def test_gradients_pass_the_fake_quantisation_straight_through():
    """STE: d out / d x = 1 inside the range, 0 where the value is clipped."""
    ranges = ActivationRanges(QuantizationConfig())
    x = tf.constant([-3.0, -0.4, 0.0, 0.7, 1.6])
    ranges.activation("p", x)
    ranges.points["p"].assign([-1.0, 1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ranges.activation("p", x, training=False)
        total = tf.reduce_sum(y)
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), [0, 1, 1, 1, 0])
    # The forward value is on the int8 grid of [-1, 1] (nudged so that 0 is on it).
    steps = y.numpy() / (2.0 / 255)
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
    assert np.round(steps).max() - np.round(steps).min() == 255  # clipped to 256 levels


def test_int8_layer_norm_keeps_small_squares_beside_an_outlier_dimension():
    """The int8 LayerNorm sums the squares by BATCH_MATMUL (int32 accumulation): with
    one dimension 8x the others, as BERT's outlier dimensions, it stays within a few
    output steps of LayerNorm's formula (an int8 MUL per square, then MEAN, rounds the
    small squares to 0 and is off by 7.6 steps on these numbers)."""
    rng = np.random.default_rng(0)
    width = 32
    x = rng.normal(0, 1, (4, 6, width)).astype(np.float32)
    x[..., 3] *= 8.0
    layer = keras.layers.LayerNormalization(epsilon=1e-12)
    layer.build((None, width))
    layer.gamma.assign(rng.uniform(0.5, 1.5, width).astype(np.float32))
    layer.beta.assign(rng.normal(0, 0.1, width).astype(np.float32))
    ranges = ActivationRanges(QuantizationConfig())
    quant = Quant(ranges, "norm.")
    with ranges.calibrating():
        normalize(layer, tf.constant(x), quant=quant)
    got = normalize(layer, tf.constant(x), quant=quant).numpy()
    centred = x - x.mean(-1, keepdims=True)
    want = (centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-12)
            * layer.gamma.numpy() + layer.beta.numpy())
    lo, hi = ranges.points["norm.output"].numpy()
    step = (hi - lo) / 255
    assert "norm.sum_squares" in ranges.points and "norm.square" not in ranges.points
    assert np.max(np.abs(got - want)) < 4 * step  # measured: 2.2 steps
    assert np.mean(np.abs(got - want)) < step


def test_a_quantised_model_saves_and_loads_with_its_ranges(toy, tmp_path):
    quantized, dev = toy["quantized"], toy["dev"]
    ranges = {p for p in quantized.weight_dict() if "quantization" in p}
    assert ranges == {f"quantization/{n}" for n in quantized.quant_ranges.points} | {
        "quantization/attention_mask_value"}  # one path per point, wherever it is met
    path = save_model(quantized, str(tmp_path / "q"))
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["quantization"] == QuantizationConfig().to_dict()
    loaded = load_model(path)
    for name, var in quantized.quant_ranges.points.items():
        np.testing.assert_array_equal(loaded.quant_ranges.points[name].numpy(), var.numpy())
    np.testing.assert_array_equal(loaded(dev)["logits"].numpy(),
                                  quantized(dev)["logits"].numpy())


def test_a_quantised_model_converts_to_int8_only_and_an_mlm_head_not_at_all(toy, tiny_config):
    with pytest.raises(ExportError, match="converts to int8 only"):
        convert_tflite(toy["quantized"], "float32", L)
    with pytest.raises(QuantizationError, match="mlm head has no int8 form"):
        BertModel(tiny_config, head="mlm", quantization=QuantizationConfig())


@pytest.mark.parametrize("head", ["regressor", "token_classifier", "span"])
def test_every_task_head_converts_to_integer_ops_only(head, tiny_vocab, tmp_path):
    """Regression (score), token classification (per-token softmax) and span QA (start
    and end logits) convert like the classifier: no float op, the Keras int8 answers."""
    keras.utils.set_random_seed(5)
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=16, num_layers=1,
                        num_heads=2, intermediate_size=32, max_position_embeddings=64)
    labels = {"token_classifier": ["O", "B-X", "I-X"]}.get(head)
    model = BertModel(config, head=head, label_names=labels, vocab=tiny_vocab)
    quantized = model.quantized()
    x = _random_inputs(32, L, len(tiny_vocab))
    calibrate(quantized, [x])
    path = str(tmp_path / f"{head}.tflite")
    with open(path, "wb") as f:
        f.write(convert_tflite(quantized, "int8", L))
    assert float_ops(path) == [], head
    want = _outputs(quantized, x)
    got = task_type_of(quantized).from_tflite(TFLiteRunner(path).predict(x))
    scale = max(1.0, float(np.max(np.abs(want))))
    assert np.max(np.abs(got - want)) < 0.05 * scale, head


# Classification: test_quantize_stage.py runs the whole stage on a classifier.
QUANTIZE_TASKS = {"regressor": Regression, "span": SpanQA,
                  "token_classifier": lambda: TokenClassification(["O", "B-X", "I-X"])}


def _labels(head: str, inputs: dict, rng) -> np.ndarray:
    """Labels of `head`'s task for `inputs`: score [B], start/end [B, 2],
    tags on real non-[CLS] pieces [B, L] (-1 elsewhere)."""
    mask = inputs["input_mask"]
    n, length = mask.shape
    if head == "regressor":
        return rng.random(n).astype(np.float32)
    if head == "span":
        return np.stack([np.ones(n), np.full(n, 2)], -1).astype(np.int32)
    tags = rng.integers(0, 3, (n, length))
    return np.where((mask == 1) & (np.arange(length) > 0), tags, -1).astype(np.int32)


@pytest.mark.parametrize("head", sorted(QUANTIZE_TASKS))
def test_the_quantize_stage_distils_every_task_type_into_its_int8_copy(head, tiny_vocab):
    """The stage's Distiller (stages/quantize.py: pred, attn and hidn against the float
    student, identity projections kept fixed) on each task head: the layer terms are 0
    for the float copy itself, the int8 copy's losses are finite and its gradients
    pass the fake quantisation to every weight the loss reaches, all finite."""
    keras.utils.set_random_seed(6)
    config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=16, num_layers=1,
                        num_heads=2, intermediate_size=32, max_position_embeddings=64,
                        hidden_dropout=0.0, attention_dropout=0.0)
    task = QUANTIZE_TASKS[head]()
    teacher = BertModel(config, head=head, vocab=tiny_vocab,
                        label_names=list(task.label_names) if head == "token_classifier"
                        else None)
    x = _random_inputs(8, L, len(tiny_vocab), seed=2)
    data = (x, _labels(head, x, np.random.default_rng(2)))
    terms = make_terms(["pred", "attn", "hidn"], task=task, temperature=1.0)

    def distiller(student):
        d = Distiller(student=student, teacher=teacher, terms=terms)
        identity_projections(d)
        return d

    itself = distiller(teacher).compute_losses(data)
    for name in ("attn", "hidn") + (("pred",) if head == "regressor" else ()):
        assert abs(float(itself[name])) < 1e-6, (head, name)  # W_e, W_h the identity
    quantized = teacher.quantized()
    calibrate(quantized, [x])
    d = distiller(quantized)
    assert d.projection_variables and not any(v.trainable for v in d.projection_variables)
    assert len(d.trainable_variables) == len(quantized.trainable_variables)
    with tf.GradientTape() as tape:
        losses = d.compute_losses(data, training=True)
    grads = tape.gradient(losses["loss"], quantized.trainable_variables)
    assert all(np.isfinite(float(v)) for v in losses.values()), head
    assert float(losses["hidn"]) > 0, head  # the fake quantisation acts
    reached = [tf.convert_to_tensor(g).numpy() for g in grads if g is not None]
    assert len(reached) >= len(grads) - 2, head  # at most the pooler unused (token, span)
    assert all(np.all(np.isfinite(g)) for g in reached), head
    assert sum(float(np.abs(g).sum()) for g in reached) > 0, head


def test_task_library_runs_the_int8_student_as_the_interpreter_does(toy, tmp_path):
    """BertNLClassifier (tflite-support 0.4.4) loads the learnt-range int8 file and gives
    the interpreter's labels."""
    reason = tasklib.unavailable_reason()
    if reason:
        pytest.skip(f"TFLite Task Library unavailable: {reason}")
    model = toy["model"]
    texts, _ = toy_task(16, np.random.default_rng(3))
    path = str(tmp_path / "model_int8.tflite")
    with open(path, "wb") as f:
        f.write(toy["flat"])
    got = np.array([[s["neg"], s["pos"]] for s in tasklib.classify(path, texts)])
    want = TFLiteRunner(path).predict(pack_texts(load_tokenizer(model, L), texts, None, L))
    np.testing.assert_allclose(got, want, atol=0.15)
    _assert_same_decisions(got, want, margin=0.3)


def test_ranges_average_over_replicas_under_a_distribution_strategy():
    """Each replica's moving average of its own batch, averaged into one range (the
    variables aggregate by mean), as one replica with the mean update would hold."""
    devices = tf.config.list_logical_devices("CPU")[:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPU devices of conftest.py")
    # Reduction on one device, as the pipeline does on CPUs (pipeline/training/strategy.py).
    strategy = tf.distribute.MirroredStrategy([d.name for d in devices],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        ranges = ActivationRanges(QuantizationConfig(ema_decay=0.5))
        ranges.activation("p", tf.zeros((1,)))
    batches = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(np.array([[-2.0, 1.0], [-1.0, 3.0]],
                                                    np.float32)).batch(2)))
    strategy.run(lambda x: ranges.activation("p", x, training=True), args=(next(batches),))
    # Replica 0 saw [-2, 1] -> EMA [-1, 0.5]; replica 1 [-1, 3] -> [-0.5, 1.5]; mean.
    np.testing.assert_allclose(ranges.points["p"].numpy(), [-0.75, 1.0], rtol=1e-6)
