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
