"""Shared pieces of the augmentation tests: a tiny vocab, MLM model and word vectors."""
import numpy as np

SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [".", ",", "!", "\"", "'", "the", "a", "movie", "film", "was", "is", "good", "great",
         "bad", "fun", "plot", "story", "actor", "boring", "very", "cat", "dog", "sat", "on",
         "mat", "awful", "dull", "smart", "un", "nice"]
PIECES = ["##aff", "##able", "##ing", "##ed"]
VOCAB = SPECIALS + WORDS + PIECES + list("bcdefghijklmnopqrstuvwxyz") + [
    "##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
assert len(VOCAB) == len(set(VOCAB))

# Word vectors (4-d) with known geometry: "unaffable" (3 pieces) is closest to
# "awful", then "dull", then "boring"; the rest are orthogonal-ish.
VECTOR_WORDS = {
    "unaffable": [1.0, 0.0, 0.0, 0.0],
    "awful": [0.9, 0.1, 0.0, 0.0],
    "dull": [0.8, 0.3, 0.0, 0.0],
    "boring": [0.6, 0.6, 0.1, 0.0],
    "cat": [0.0, 0.0, 1.0, 0.0],
    "dog": [0.0, 0.1, 0.9, 0.1],
    "movie": [0.0, 0.0, 0.1, 1.0],
    "film": [0.0, 0.1, 0.1, 0.9],
    "good": [0.1, 0.0, 0.0, 0.5],
    "Great": [0.2, 0.0, 0.1, 0.4],  # cased key: lower-cased as a neighbour
    "great": [0.2, 0.0, 0.1, 0.41],
    "smart": [0.1, 0.9, 0.0, 0.1],
}


def tiny_mlm(seed: int = 7):
    """A random-weight 2-layer, 32-wide BertModel with an MLM head over VOCAB."""
    import keras

    from tinybert_tf.config import BertConfig
    from tinybert_tf.models import BertModel
    keras.utils.set_random_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    return BertModel(config, head="mlm", vocab=VOCAB)


def tiny_vectors():
    from gensim.models import KeyedVectors
    kv = KeyedVectors(vector_size=4)
    kv.add_vectors(list(VECTOR_WORDS), np.array(list(VECTOR_WORDS.values()), np.float32))
    return kv


def set_bias(model, preferences: dict):
    """Plant a preference: output bias += value for the given tokens (returns the old bias)."""
    bias = model.head.output_bias
    old = bias.numpy().copy()
    new = old.copy()
    for token, value in preferences.items():
        new[VOCAB.index(token)] += value
    bias.assign(new)
    return old
