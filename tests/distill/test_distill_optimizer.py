"""AdamW settings, weight-decay exclusions, warm-up/decay schedules."""
import keras
import numpy as np
import pytest

from tinybert_tf.distill.optimizer import WarmupSchedule, create_optimizer
from tinybert_tf.models.encoder import BertModel


def test_linear_schedule_values():
    sched = WarmupSchedule(1e-3, num_train_steps=100, warmup_steps=10)
    got = [float(sched(s)) for s in (0, 5, 10, 55, 100, 150)]
    np.testing.assert_allclose(got, [0.0, 5e-4, 1e-3, 5e-4, 0.0, 0.0], atol=1e-9)
    no_warm = WarmupSchedule(2e-5, num_train_steps=4)
    np.testing.assert_allclose([float(no_warm(s)) for s in range(5)],
                               [2e-5, 1.5e-5, 1e-5, 5e-6, 0.0], atol=1e-12)


def test_constant_schedule_and_config_roundtrip():
    sched = WarmupSchedule(5e-5, num_train_steps=0, warmup_steps=0, decay="constant")
    np.testing.assert_allclose([float(sched(s)) for s in (0, 10, 10**6)], 5e-5, rtol=1e-6)
    again = WarmupSchedule.from_config(WarmupSchedule(1e-4, 50, 5).get_config())
    assert float(again(30)) == pytest.approx(float(WarmupSchedule(1e-4, 50, 5)(30)))


@pytest.mark.parametrize("kwargs", [dict(decay="cosine"), dict(warmup_steps=200),
                                    dict(peak_learning_rate=0.0)])
def test_schedule_errors(kwargs):
    args = dict(peak_learning_rate=1e-4, num_train_steps=100)
    args.update(kwargs)
    with pytest.raises(ValueError):
        WarmupSchedule(**args)


def test_adamw_excludes_layernorm_and_biases(tiny_config):
    model = BertModel(tiny_config, head="classifier", num_labels=2)
    opt = create_optimizer(1e-2, 10, weight_decay=0.1)
    assert isinstance(opt, keras.optimizers.AdamW)
    assert opt.epsilon == pytest.approx(1e-6)
    variables = model.trainable_variables
    opt.build(variables)
    before = [v.numpy().copy() for v in variables]
    # Zero gradients: Adam moves nothing, so any change is weight decay.
    opt.apply([np.zeros(v.shape, np.float32) for v in variables], variables)
    decayed = {v.path for v, b in zip(variables, before) if not np.allclose(v.numpy(), b)}
    for v in variables:
        excluded = v.name in ("gamma", "beta") or v.name.endswith("bias")
        if np.all(v.numpy() == 0):  # zero-initialised: decay is invisible
            continue
        assert (v.path in decayed) != excluded, v.path
    assert any("token_embedding" in p for p in decayed)


def _numpy_adamw(w, grads, lrs, wd, decayed, b1=0.9, b2=0.999, eps=1e-6):
    """BERT's AdamW in numpy: decay by lr*wd first (decoupled), then Adam with bias
    correction folded into the step size, t = 1, 2, ..."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        if decayed:
            w = w - w * wd * lr
        m = m + (g - m) * (1 - b1)
        v = v + (g * g - v) * (1 - b2)
        w = w - m * (lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)) / (np.sqrt(v) + eps)
    return w


@pytest.mark.parametrize("replicas", [1, 2])
def test_fused_adamw_step_is_bert_adamw(replicas):
    """The fused kernel's update (and keras' own, for a sparse gradient) is the
    numpy formula, step by step under the warm-up schedule, with and without
    decay, on one device and on two mirrored replicas (gradients summed)."""
    import tensorflow as tf

    from tinybert_tf.distill.optimizer import AdamW

    rng = np.random.default_rng(0)
    w0 = {"kernel": rng.normal(size=(3, 4)).astype(np.float32),
          "bias": rng.normal(size=(4,)).astype(np.float32),
          "table": rng.normal(size=(5, 2)).astype(np.float32)}
    steps = 4
    grads = {k: [rng.normal(size=w.shape).astype(np.float32) for _ in range(steps)]
             for k, w in w0.items()}
    rows = [0, 3]  # the table's gradient is sparse: only these rows
    for g in grads["table"]:
        g[[i for i in range(5) if i not in rows]] = 0.0
    schedule_lrs = [float(WarmupSchedule(1e-2, 10, 2)(t)) for t in range(steps)]

    strategy = (tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
        if replicas == 2 else tf.distribute.get_strategy())
    with strategy.scope():
        variables = {k: keras.Variable(w, name=k) for k, w in w0.items()}
        opt = create_optimizer(1e-2, 10, warmup_steps=2, weight_decay=0.1)
        opt.build(list(variables.values()))
    assert isinstance(opt, AdamW)

    @tf.function
    def step(t):
        def replica_fn():
            share = 1.0 / replicas  # the replicas' gradients sum to the full one
            gs = [tf.gather(tf.stack([tf.constant(g) for g in grads[k]]), t) * share
                  for k in ("kernel", "bias")]
            table = tf.gather(tf.stack([tf.constant(g) for g in grads["table"]]), t) * share
            sparse = tf.IndexedSlices(tf.gather(table, rows), tf.constant(rows),
                                      tf.constant([5, 2]))
            opt.apply(gs + [sparse], [variables["kernel"], variables["bias"],
                                      variables["table"]])
        strategy.run(replica_fn)

    for t in range(steps):
        step(tf.constant(t))
    for k, decayed in (("kernel", True), ("bias", False), ("table", True)):
        want = _numpy_adamw(w0[k], grads[k], schedule_lrs, 0.1, decayed)
        np.testing.assert_allclose(variables[k].numpy(), want, rtol=1e-5, atol=1e-6,
                                   err_msg=k)
