"""TinyBERT data augmentation (paper Algorithm 1): see `augmenter.augment_task`.

Submodules: `words` (BERT basic tokenisation, eligibility, stopwords),
`candidates` (batched MLM candidates), `vectors` (word vectors, Word2Vec,
neighbours), `augmenter` (the algorithm, streaming/sharding/resume).
"""
from tinybert_tf.augment.augmenter import (
    Augmenter,
    AugmentError,
    augment_task,
    load_mlm_model,
    parse_shard,
    sample_variants,
)
from tinybert_tf.augment.candidates import MLMCandidates, MLMError
from tinybert_tf.augment.vectors import NeighbourIndex, VectorsError, load_vectors, train_word2vec
from tinybert_tf.augment.words import STOPWORDS, WordSplitter, is_eligible

__all__ = ["AugmentError", "Augmenter", "MLMCandidates", "MLMError", "NeighbourIndex",
           "STOPWORDS", "VectorsError", "WordSplitter", "augment_task", "is_eligible",
           "load_mlm_model", "load_vectors", "parse_shard", "sample_variants", "train_word2vec"]
