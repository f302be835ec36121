"""The toy sentiment classifier the export and quantisation tests share, and a reader
of a .tflite file's float ops."""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema_fb
from tensorflow.lite.tools import flatbuffer_utils

from tinybert_tf.config import BertConfig
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_tokenizer
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


def float_ops(path):
    """Ops (other than the boundary QUANTIZE/DEQUANTIZE) with a float32 output."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(open(path, "rb").read()))
    sg = model.subgraphs[0]
    return sorted({flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                   for op in sg.operators
                   if any(sg.tensors[i].type == schema_fb.TensorType.FLOAT32 for i in op.outputs)}
                  - {"QUANTIZE", "DEQUANTIZE"})
