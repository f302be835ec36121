"""Distiller: ablation switches, global-batch averaging across replicas and
accumulation steps, learning, mixed precision, phases, checkpoint/resume."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.distill import Distiller, LossTerm, create_optimizer, make_terms, register_term
from tinybert_tf.distill.terms import PHASES, TERMS
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.tasks import Classification, Regression

from numerics import needs_bfloat16_matmuls

L = 16


@pytest.fixture(scope="module")
def configs(tiny_config):
    student = tiny_config.replace(hidden_dropout=0.0, attention_dropout=0.0)
    teacher = student.replace(hidden_size=48, num_layers=4, num_heads=4, intermediate_size=96)
    return student, teacher


def batch(n, seed=0, vocab=100, length=L, labels=None):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (n, length)).astype(np.int32)
    lengths = rng.integers(3, length + 1, n)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    ids = ids * mask
    x = {"input_word_ids": ids, "input_mask": mask,
         "input_type_ids": np.zeros_like(ids)}
    if labels:
        return x, rng.integers(0, labels, n).astype(np.int32)
    return x


def dataset(data, batch_size, drop_remainder=True):
    return tf.data.Dataset.from_tensor_slices(data).batch(batch_size,
                                                          drop_remainder=drop_remainder)


LABELS = ("a", "b", "c")
DISTILLER_OPTIONS = ("clip_norm", "grad_accum_steps", "share_hidden_projection")


def distiller(student, teacher, phase="intermediate", loss_terms=None, head=None, **kwargs):
    """A Distiller for `phase` (or `loss_terms`) with the terms' settings in `kwargs`."""
    options = {k: kwargs.pop(k) for k in DISTILLER_OPTIONS if k in kwargs}
    task = Regression() if head == "regressor" else Classification(LABELS)
    terms = make_terms(loss_terms or PHASES[phase], task=task, **kwargs)
    metrics = task.label_metrics() if head == "classifier" and phase == "prediction" else []
    return Distiller(student=student, teacher=teacher, terms=terms, label_metrics=metrics,
                     **options)


def make(configs, head=None, **kwargs):
    s_cfg, t_cfg = configs
    keras.utils.set_random_seed(1)
    nl = 3 if head == "classifier" else None
    student = BertModel(s_cfg, head=head, num_labels=nl)
    teacher = BertModel(t_cfg, head=head, num_labels=nl)
    return distiller(student, teacher, head=head, **kwargs)


def test_every_ablation_switch_zeroes_exactly_its_term(configs, tiny_vocab):
    x, _ = batch(4, labels=3)
    full = make(configs, head="classifier", loss_terms=("embd", "attn", "hidn", "pred"))
    ref = {k: float(v) for k, v in full.compute_losses(x).items()}
    assert all(ref[t] > 0 for t in ("embd", "attn", "hidn", "pred"))
    np.testing.assert_allclose(ref["loss"], sum(ref[t] for t in ("embd", "attn", "hidn", "pred")),
                               rtol=1e-6)
    for off in ("embd", "attn", "hidn", "pred"):
        on = [t for t in ("embd", "attn", "hidn", "pred") if t != off]
        d = distiller(full.student, full.teacher, loss_terms=on, head="classifier")
        if d.projections is not None:
            for a, b in zip(d.projections.hidden_projections + [d.projections.embedding_projection],
                            full.projections.hidden_projections
                            + [full.projections.embedding_projection]):
                a.set_weights(b.get_weights())
        got = {k: float(v) for k, v in d.compute_losses(x).items()}
        assert off not in got  # a term switched off contributes nothing
        for t in on:
            np.testing.assert_allclose(got[t], ref[t], rtol=1e-6, err_msg=f"{off} off, {t}")
        np.testing.assert_allclose(got["loss"], ref["loss"] - ref[off], rtol=1e-5)
    # "trm" = attn + hidn; lambda_m weights scale the terms.
    assert distiller(full.student, full.teacher,
                     loss_terms="trm").loss_terms == ("attn", "hidn")
    lam = distiller(full.student, full.teacher, loss_terms=("attn", "pred"), head="classifier",
                    layer_weights=[1, 0, 2, 3])
    got = lam.compute_losses(x)
    np.testing.assert_allclose(float(got["pred"]), 3 * ref["pred"], rtol=1e-6)
    # Only the 2nd student layer (weight 2) contributes: between 0 and 2x the total.
    assert 0 < float(got["attn"]) < 2 * ref["attn"]


def test_bad_options_name_their_flag(configs):
    student, teacher = BertModel(configs[0]), BertModel(configs[1])
    with pytest.raises(ValueError, match="--layer_weights"):
        distiller(student, teacher, layer_weights=[1, 1])
    with pytest.raises(ValueError, match="--loss_terms"):
        distiller(student, teacher, loss_terms=("embd", "logits"))
    with pytest.raises(ValueError, match="--layer_mapping"):
        distiller(student, teacher, layer_mapping="1,2,3")
    with pytest.raises(ValueError, match="classifier head"):
        distiller(student, teacher, phase="prediction")
    with pytest.raises(ValueError, match="pass teacher="):
        Distiller(student=student, teacher=None, terms=make_terms("attn"))


def _weights(d):
    return [v.numpy() for v in d.student.weights] + [v.numpy() for v in d.projection_variables]


def _one_step(configs, strategy, data, run_eagerly=True, jit_compile=False, **kwargs):
    """One fit step under `strategy` from the same initial weights (eager by
    default: tracing costs more than a step of these tiny models)."""
    ref = make(configs, **kwargs)
    init_s, init_t = ref.student.get_weights(), ref.teacher.get_weights()
    init_p = [v.numpy() for v in ref.projection_variables]
    with strategy.scope():
        s_cfg, t_cfg = configs
        d = distiller(BertModel(s_cfg), BertModel(t_cfg), **kwargs)
        d.student.set_weights(init_s)
        d.teacher.set_weights(init_t)
        for v, value in zip(d.projection_variables, init_p):
            v.assign(value)
        d.compile(create_optimizer(1e-3, 10, weight_decay=0.01), run_eagerly=run_eagerly,
                  jit_compile=jit_compile)
    history = d.fit(data, epochs=1, verbose=0).history
    return _weights(d), history


def test_two_replicas_match_one_replica(configs):
    """Global-batch averaging: counts (real tokens with mask_padding) and the
    clipped gradient norm are global, so 2 x 4 examples == 1 x 8 examples."""
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest sets 2 CPU devices"
    data = dataset(batch(8), 8)
    kw = dict(mask_padding=True, clip_norm=1.0)
    one, h1 = _one_step(configs, tf.distribute.get_strategy(), data, **kw)
    mirrored = tf.distribute.MirroredStrategy(  # one-device reduction, as the pipeline's
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    two, h2 = _one_step(configs, mirrored, data, **kw)
    moved = max(np.abs(a - b).max() for a, b in zip(one, _weights(make(configs, **kw))))
    assert moved > 1e-4  # the step changed the weights
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for key in ("loss", "embd_loss", "attn_loss", "hidn_loss"):
        np.testing.assert_allclose(h1[key][0], h2[key][0], rtol=1e-5)


def test_gradient_accumulation_matches_full_batch(configs):
    # 7 rows, unknown static batch: micro-batches of 4 and 3 (dynamic slicing).
    data = dataset(batch(7, seed=3), 7, drop_remainder=False)
    strategy = tf.distribute.get_strategy()
    full, h1 = _one_step(configs, strategy, data, mask_padding=True)
    accum, h2 = _one_step(configs, strategy, data, mask_padding=True, grad_accum_steps=2)
    for a, b in zip(full, accum):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(h1["loss"][0], h2["loss"][0], rtol=1e-5)


def test_loss_falls_over_30_steps(configs):
    d = make(configs)
    d.compile(create_optimizer(3e-3, 30, warmup_steps=3, schedule="linear"))
    data = dataset(batch(64, seed=5), 8).repeat()
    loss = d.fit(data, epochs=30, steps_per_epoch=1, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss))
    assert np.mean(loss[-3:]) < 0.5 * np.mean(loss[:3]), loss


@pytest.mark.parametrize("policy", ["mixed_float16",
                                    pytest.param("mixed_bfloat16", marks=needs_bfloat16_matmuls)])
def test_mixed_precision_with_padding_stays_finite(configs, policy):
    s_cfg, t_cfg = configs
    keras.utils.set_random_seed(2)
    d = distiller(BertModel(s_cfg, dtype=policy), BertModel(t_cfg, dtype=policy),
                  loss_terms=("embd", "attn", "hidn"))
    d.compile(create_optimizer(1e-3, 10), run_eagerly=True)
    if policy == "mixed_float16":
        assert isinstance(d.optimizer, keras.optimizers.LossScaleOptimizer)
    x = batch(8, seed=7)
    x["input_mask"][:, 4:] = 0  # heavy padding
    hist = d.fit(dataset(x, 4), epochs=2, verbose=0).history
    for key, values in hist.items():
        assert np.all(np.isfinite(values)), (key, values)
    assert hist["loss"][0] > 0
    for v in d.student.weights + d.projection_variables:
        assert v.dtype == "float32" and np.all(np.isfinite(v.numpy())), v.path


def test_prediction_phase_reports_pred_loss_and_accuracy(configs):
    d = make(configs, head="classifier", phase="prediction", temperature=2.0)
    assert d.projections is None and d.projection_variables == []
    d.compile(create_optimizer(1e-3, 4), run_eagerly=True)
    data = dataset(batch(8, labels=3), 4)
    hist = d.fit(data, epochs=1, verbose=0, validation_data=data).history
    assert set(hist) == {"loss", "pred_loss", "accuracy", "val_loss", "val_pred_loss",
                         "val_accuracy"}
    np.testing.assert_allclose(hist["loss"], hist["pred_loss"], rtol=1e-6)
    assert 0.0 <= hist["val_accuracy"][0] <= 1.0


def test_regression_prediction_uses_mse(configs):
    s_cfg, t_cfg = configs
    student, teacher = BertModel(s_cfg, head="regressor"), BertModel(t_cfg, head="regressor")
    d = distiller(student, teacher, phase="prediction", head="regressor")
    x = batch(4)
    want = np.mean((student(x)["logits"].numpy() - teacher(x)["logits"].numpy()) ** 2)
    np.testing.assert_allclose(float(d.compute_losses(x)["pred"]), want, rtol=1e-5)


def _mlm_batch(n, vocab, p=3, seed=0):
    x = batch(n, seed=seed, vocab=vocab)
    rng = np.random.default_rng(seed)
    x["masked_lm_positions"] = np.tile(np.arange(1, p + 1, dtype=np.int32), (n, 1))
    x["masked_lm_ids"] = x["input_word_ids"][:, 1:p + 1].copy()
    x["input_word_ids"][:, 1:p + 1] = 8  # [MASK]
    x["masked_lm_weights"] = (rng.random((n, p)) < 0.8).astype(np.float32)
    x["masked_lm_weights"][:, 0] = 1.0
    return x


def test_distilbert_phase_trains_all_three_terms(configs):
    s_cfg, _ = configs
    t_cfg = s_cfg.replace(num_layers=4)
    student, teacher = BertModel(s_cfg, head="mlm"), BertModel(t_cfg, head="mlm")
    d = distiller(student, teacher, phase="distilbert", temperature=2.0,
                  weights={"ce": 5.0, "mlm": 2.0, "cos": 1.0})
    d.compile(create_optimizer(1e-3, 4), run_eagerly=True)
    x = _mlm_batch(8, s_cfg.vocab_size)
    terms = d.compute_losses(x)
    assert all(float(terms[t]) > 0 for t in ("ce", "mlm", "cos"))
    hist = d.fit(dataset(x, 4), epochs=1, verbose=0).history
    assert {"loss", "ce_loss", "mlm_loss", "cos_loss"} == set(hist)
    assert np.isfinite(hist["loss"][0])
    with pytest.raises(ValueError, match="alpha_ce=0"):
        distiller(student, BertModel(t_cfg), phase="distilbert")


def test_checkpoint_resume_reproduces_training(configs, tmp_path):
    data = dataset(batch(12, seed=9), 4)
    d = make(configs)
    d.compile(create_optimizer(1e-3, 10), run_eagerly=True)
    d.fit(data.take(2), epochs=1, verbose=0)
    ckpt = tf.train.Checkpoint(**d.checkpoint_items())
    path = ckpt.write(str(tmp_path / "ckpt"))
    d.fit(data.skip(2), epochs=1, verbose=0)

    s_cfg, t_cfg = configs
    keras.utils.set_random_seed(123)  # different initial student/projections
    r = distiller(BertModel(s_cfg), d.teacher)
    r.compile(create_optimizer(1e-3, 10), run_eagerly=True)
    tf.train.Checkpoint(**r.checkpoint_items()).read(path).assert_consumed()
    assert int(r.optimizer.iterations) == 2
    r.fit(data.skip(2), epochs=1, verbose=0)
    for a, b in zip(_weights(d), _weights(r)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_jit_compiled_accumulation_matches_full_batch(configs):
    """XLA step with 2 static micro-batches == one eager full-batch step
    (1-layer student, 2-layer teacher: XLA compile time grows with depth)."""
    data = dataset(batch(8, seed=11), 8)
    strategy = tf.distribute.get_strategy()
    small = (configs[0].replace(num_layers=1), configs[1].replace(num_layers=2))
    full, h1 = _one_step(small, strategy, data)
    jit, h2 = _one_step(small, strategy, data, run_eagerly=False, jit_compile=True,
                        grad_accum_steps=2)
    for a, b in zip(full, jit):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(h1["loss"][0], h2["loss"][0], rtol=1e-5)


def test_a_term_written_outside_the_package_works_with_the_registry_and_distiller(configs):
    @register_term
    class CLSNormTerm(LossTerm):
        """Squared gap between the [CLS] state norms of student and teacher."""

        name = "clsnorm"

        def __init__(self, scale: float = 1.0, weight: float = 1.0):
            super().__init__(weight)
            self.scale = scale

        def count(self, inputs):
            return tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)

        def sum(self, inputs, student_outputs, teacher_outputs, projections):
            s = tf.norm(tf.cast(student_outputs["sequence_output"][:, 0], tf.float32), axis=-1)
            t = tf.norm(tf.cast(teacher_outputs["sequence_output"][:, 0], tf.float32), axis=-1)
            return self.weight * self.scale * tf.reduce_sum(tf.square(s - t))

    try:
        d = make(configs, loss_terms="attn,clsnorm", scale=2.0)
        assert d.loss_terms == ("attn", "clsnorm") and d.terms[1].scale == 2.0
        x = batch(4)
        out = {k: float(v) for k, v in d.compute_losses(x).items()}
        s_cls = d.student(x)["sequence_output"][:, 0].numpy()
        t_cls = d.teacher(x)["sequence_output"][:, 0].numpy()
        want = 2.0 * np.mean((np.linalg.norm(s_cls, axis=-1) - np.linalg.norm(t_cls, axis=-1)) ** 2)
        np.testing.assert_allclose(out["clsnorm"], want, rtol=1e-5)
        d.compile(create_optimizer(1e-3, 4), run_eagerly=True)
        hist = d.fit(dataset(batch(8), 4), epochs=1, verbose=0).history
        assert {"loss", "attn_loss", "clsnorm_loss"} == set(hist)
    finally:
        TERMS.pop("clsnorm", None)


def test_variables_without_gradient_are_not_decayed(configs):
    """The intermediate phase gives the pooler and classifier no gradient: AdamW
    must leave them untouched (no decay), while the encoder moves."""
    d = make(configs, head="classifier")
    d.compile(create_optimizer(1e-2, 4, weight_decay=0.5), run_eagerly=True)
    before = {p: v.numpy().copy() for p, v in d.student.weight_dict().items()}
    d.fit(dataset(batch(8), 4), epochs=1, verbose=0)
    after = {p: v.numpy() for p, v in d.student.weight_dict().items()}
    for path in before:
        if path.startswith(("pooled_dense/", "classifier_head/")):
            np.testing.assert_array_equal(before[path], after[path], err_msg=path)
    moved = [p for p in before if p.startswith("transformer_layer_0/")
             and np.abs(before[p] - after[p]).max() > 1e-4]
    assert moved


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("restrict", [False, True])
def test_distilbert_soft_targets_cover_every_real_token_unless_restricted(configs, restrict):
    """L_ce over every non-padding token (the DistilBERT code's default) or only at
    the masked positions; L_mlm at the masked positions either way."""
    s_cfg, _ = configs
    t_cfg = s_cfg.replace(num_layers=4)
    keras.utils.set_random_seed(3)
    student, teacher = BertModel(s_cfg, head="mlm"), BertModel(t_cfg, head="mlm")
    d = distiller(student, teacher, phase="distilbert", temperature=2.0,
                  restrict_ce_to_mask=restrict, weights={"ce": 1.0, "mlm": 1.0, "cos": 1.0})
    x = _mlm_batch(4, s_cfg.vocab_size, seed=4)
    x["input_mask"][0, 10:] = 0  # some padding
    got = {k: float(v) for k, v in d.compute_losses(x).items()}
    plain = {k: x[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
    s_all = student(plain)["logits"].numpy().astype(np.float64)  # [B, L, V]
    t_all = teacher(plain)["logits"].numpy().astype(np.float64)
    pos, w = x["masked_lm_positions"], x["masked_lm_weights"].astype(np.float64)
    take = lambda a: np.take_along_axis(a, pos[:, :, None], axis=1)  # noqa: E731
    T = 2.0
    if restrict:
        s_ce, t_ce, w_ce = take(s_all), take(t_all), w
    else:
        s_ce, t_ce, w_ce = s_all, t_all, x["input_mask"].astype(np.float64)
    log_s = np.log(_softmax(s_ce / T))
    ce = -(_softmax(t_ce / T) * log_s).sum(-1)
    np.testing.assert_allclose(got["ce"], T * T * (ce * w_ce).sum() / w_ce.sum(), rtol=1e-4)
    log_p = np.log(_softmax(take(s_all)))
    nll = -np.take_along_axis(log_p, x["masked_lm_ids"][:, :, None], axis=-1)[..., 0]
    np.testing.assert_allclose(got["mlm"], (nll * w).sum() / w.sum(), rtol=1e-4)
    with pytest.raises(ValueError, match="restrict_ce_to_mask"):
        Distiller(student=student, teacher=teacher,
                  terms=make_terms("ce", restrict_ce_to_mask=False)
                  + make_terms("mlm", restrict_ce_to_mask=True))
