"""WordPiece tokenisation and BERT input packing, in graph.

Built on tensorflow-text's `FastBertTokenizer` (lower-casing + NFD accent
stripping when the vocab is uncased); packing uses core TensorFlow ops only.
The same object runs eagerly, inside `tf.data` and inside an exported
SavedModel (it is a `tf.Module`; the vocab becomes a constant model buffer).

Packing: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, segment ids 0 for the
first part (including [CLS] and its [SEP]) and 1 for the second, longest-first
truncation (BERT's `_truncate_seq_pair`) to `max_seq_len`, zero padding.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.core.pybinds import (
    pywrap_fast_bert_normalizer_model_builder as normalizer_builder,
)
from tensorflow_text.core.pybinds import (
    pywrap_fast_wordpiece_tokenizer_model_builder as wordpiece_builder,
)

from tinybert_tf import files

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(ValueError):
    """The vocab file is missing or lacks BERT's special tokens."""


def read_vocab(path: str) -> list[str]:
    """One token per line, line number = id (BERT's vocab.txt); any tf.io.gfile path."""
    if not files.isfile(path):
        raise VocabError(f"{path}: vocab file not found; a model directory needs vocab.txt.")
    data = files.read_bytes(path).removeprefix(b"\xef\xbb\xbf")  # a leading BOM is dropped
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise VocabError(f"{path}:{line}: not UTF-8 ({e.reason}); "
                         f"{files.reencode_hint(data)}.") from None
    tokens = [line.rstrip("\r") for line in text.split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise VocabError(f"{path}: the vocab file is empty.")
    check_vocab(tokens, path)
    return tokens


def check_vocab(tokens: Sequence[str], source: str = "vocab") -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise VocabError(f"{source}: vocab lacks the special token(s) {' '.join(missing)}; "
                         f"a BERT WordPiece vocab needs all of {' '.join(SPECIAL_TOKENS)}.")
    first: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in first:
            # WordPiece ids must be unambiguous; tensorflow-text refuses repeats too.
            raise VocabError(f"{source}: token {t!r} appears twice (lines {first[t] + 1} and "
                             f"{i + 1}); every vocab line must be a distinct token.")
        first[t] = i


def write_vocab(tokens: Sequence[str], path: str) -> None:
    """One token per line (the whole file at once; any tf.io.gfile path)."""
    files.write_text_atomic(path, "".join(t + "\n" for t in tokens))


def longest_first_lengths(lengths: Sequence[tf.Tensor], budget: int) -> list[tf.Tensor]:
    """How many tokens each of 1 or 2 segments keeps within `budget` tokens in total.

    lengths: int [B] per segment. Two segments follow BERT's `_truncate_seq_pair`
    exactly: pop a token from the longer one until they fit, popping from the
    second on ties; in closed form the second keeps
    min(len_b, max(budget - len_a, budget // 2)).
    """
    if len(lengths) == 1:
        return [tf.minimum(lengths[0], budget)]
    la, lb = lengths
    budget_t = tf.cast(budget, la.dtype)
    fits = la + lb <= budget_t
    keep_b = tf.where(fits, lb, tf.minimum(lb, tf.maximum(budget_t - la, budget_t // 2)))
    keep_a = tf.where(fits, la, budget_t - keep_b)
    return [keep_a, keep_b]


@functools.lru_cache(maxsize=8)
def _model_buffers(vocab: tuple[str, ...], lower_case: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (WordPiece, normaliser) flatbuffers of `FastBertTokenizer` for this vocab, as
    uint8 arrays, built once per process.

    A pipeline run builds a tokenizer for the same vocab several times (the data, the
    corpus count, the export), and `FastBertTokenizer(vocab=...)` rebuilds both models
    each time and turns each buffer into a tensor through a Python list of its bytes
    (1.7 MB for a 30k vocab). We call the same builders tensorflow-text calls and hand
    the buffers over as arrays (its documented `*_model_buffer` arguments)."""
    wordpiece = wordpiece_builder.build_fast_wordpiece_model(
        list(vocab), 100, "##", "[UNK]", False, False)  # tensorflow-text's defaults
    return np.frombuffer(wordpiece, np.uint8), _normalizer_buffer(lower_case)


@functools.lru_cache(maxsize=2)
def _normalizer_buffer(lower_case: bool) -> np.ndarray:
    """The normaliser's flatbuffer: it depends on the casing only, not on the vocab, and
    takes 0.1-0.2 s to build, so tokenizers of different vocabs share it."""
    return np.frombuffer(normalizer_builder.build_fast_bert_normalizer_model(lower_case),
                         np.uint8)


class Tokenizer(tf.Module):
    """Text -> packed BERT inputs.

    Args:
      vocab: a vocab.txt path or a list of tokens.
      lower_case: lower-case and strip accents (uncased vocabularies).
      max_seq_len: default packed length.

    Example:
      >>> tok = Tokenizer("vocab.txt", max_seq_len=16)
      >>> tok(["hello world"])["input_word_ids"].shape
      TensorShape([1, 16])
    """

    def __init__(self, vocab: Union[str, Sequence[str]], lower_case: bool = True,
                 max_seq_len: int = 128, name: Optional[str] = None):
        super().__init__(name=name)
        # A plain list, not tracked: tf.Module would wrap it in a ListWrapper and track each
        # token (0.5 s for a 30k vocab), and no token is a variable or resource to save.
        object.__setattr__(self, "vocab",
                           read_vocab(vocab) if isinstance(vocab, str) else list(vocab))
        check_vocab(self.vocab)
        self.lower_case = lower_case
        self.max_seq_len = int(max_seq_len)
        index = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.unk_id = index["[PAD]"], index["[UNK]"]
        self.cls_id, self.sep_id, self.mask_id = index["[CLS]"], index["[SEP]"], index["[MASK]"]
        wordpiece, normalizer = _model_buffers(tuple(self.vocab), bool(lower_case))
        self._wordpiece = tf_text.FastBertTokenizer(
            token_out_type=tf.int32, fast_wordpiece_model_buffer=tf.constant(wordpiece),
            fast_bert_normalizer_model_buffer=tf.constant(normalizer))
        # `encoder`'s functions, untracked (object.__setattr__): a SavedModel that holds
        # this tokenizer saves only the signatures it is given.
        object.__setattr__(self, "_encoders", {})

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def tokenize(self, texts) -> tf.RaggedTensor:
        """texts: string [B] -> int32 ragged [B, (pieces)] WordPiece ids."""
        texts = tf.convert_to_tensor(texts, tf.string)
        return self._wordpiece.tokenize(texts)

    def tokenize_with_offsets(self, texts
                              ) -> tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
        """texts: string [B] -> (ids, starts, ends), each ragged [B, (pieces)].

        ids: int32 WordPiece ids, the same as `tokenize`. starts/ends: int64
        UTF-8 byte offsets of each piece in its ORIGINAL input string (before
        lower-casing and accent stripping), end exclusive. Span QA uses them to
        map predicted pieces back to a slice of the context text.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        return self._wordpiece.tokenize_with_offsets(texts)

    def pack(self, segments: Sequence[tf.RaggedTensor],
             max_seq_len: Optional[int] = None) -> dict[str, tf.Tensor]:
        """Ragged id segments (1 or 2 of [B, (n)]) -> dict of int32 [B, max_seq_len].

        Built from dense core ops (gather/where on a position grid) rather than
        tensorflow-text's trimmer + combine_segments + pad_model_inputs: the
        result is the same, but it traces in milliseconds instead of seconds
        (every tf.data pipeline and the serving signature trace it) and needs
        no op beyond core TensorFlow.
        """
        length = int(max_seq_len or self.max_seq_len)
        n_seg = len(segments)
        if n_seg not in (1, 2):
            raise ValueError(f"pack takes 1 or 2 segments, got {n_seg}.")
        budget = length - 1 - n_seg  # [CLS] + one [SEP] per segment
        if budget < n_seg:
            raise ValueError(f"max_seq_len={length} leaves no room for text; use >= "
                             f"{2 * n_seg + 1}.")
        keep = longest_first_lengths(
            [tf.cast(seg.row_lengths(), tf.int32) for seg in segments], budget)
        # [B, budget] each: rows cut to `budget`, padded; `keep` says how many count.
        dense = [tf.cast(seg, tf.int32).to_tensor(default_value=self.pad_id,
                                                  shape=[None, budget]) for seg in segments]
        batch = tf.shape(dense[0])[0]
        pos = tf.broadcast_to(tf.range(length, dtype=tf.int32)[None, :], [batch, length])
        ka = keep[0][:, None]
        ids = tf.gather(dense[0], tf.clip_by_value(pos - 1, 0, budget - 1), batch_dims=1)
        ids = tf.where(pos == 0, self.cls_id, ids)
        ids = tf.where(pos == ka + 1, self.sep_id, ids)
        end = ka + 2  # one past the first [SEP]
        type_ids = tf.zeros_like(pos)
        if n_seg == 2:
            kb = keep[1][:, None]
            b_ids = tf.gather(dense[1], tf.clip_by_value(pos - end, 0, budget - 1),
                              batch_dims=1)
            in_b = (pos >= end) & (pos < end + kb)
            ids = tf.where(in_b, b_ids, ids)
            ids = tf.where(pos == end + kb, self.sep_id, ids)
            type_ids = tf.cast((pos >= end) & (pos <= end + kb), tf.int32)
            end = end + kb + 1
        mask = pos < end
        ids = tf.where(mask, ids, self.pad_id)
        return {"input_word_ids": ids,
                "input_mask": tf.cast(mask, tf.int32),
                "input_type_ids": type_ids * tf.cast(mask, tf.int32)}

    def __call__(self, text_a, text_b=None, max_seq_len: Optional[int] = None
                 ) -> dict[str, tf.Tensor]:
        """string [B] (and [B]) -> packed inputs, each int32 [B, max_seq_len]."""
        segments = [self.tokenize(text_a)]
        if text_b is not None:
            segments.append(self.tokenize(text_b))
        return self.pack(segments, max_seq_len)

    def encoder(self, max_seq_len: int, pair: bool = False) -> Callable[..., dict]:
        """`self(text_a[, text_b], max_seq_len)` as a tf.function traced once per
        (max_seq_len, pair) for this tokenizer: string [B] (and [B]) -> packed inputs,
        each int32 [B, max_seq_len].

        tf.data traces a map function anew for every dataset it builds (a tiny
        pipeline run built ten over one tokenizer, each tracing the tokenizer); one that
        calls this traces only the call."""
        key = (int(max_seq_len), bool(pair))
        if key not in self._encoders:
            def encode(*texts):  # text_a, or text_a and text_b: the signature's length
                return self(*texts, max_seq_len=key[0])
            self._encoders[key] = tf.function(
                encode, input_signature=[tf.TensorSpec([None], tf.string)] * (1 + key[1]),
                autograph=False)
        return self._encoders[key]

    def ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]


INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")


def pack_texts(tokenizer: Tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[str]],
               max_seq_len: int, batch_size: int = 256) -> dict[str, np.ndarray]:
    """Texts (and second texts, or None) -> dict of int32 numpy [N, max_seq_len] inputs."""
    if not len(texts_a):
        return {k: np.zeros((0, max_seq_len), np.int32) for k in INPUT_NAMES}
    parts: dict[str, list] = {k: [] for k in INPUT_NAMES}
    for s in range(0, len(texts_a), batch_size):
        b = None if texts_b is None else list(texts_b[s:s + batch_size])
        out = tokenizer(list(texts_a[s:s + batch_size]), b, max_seq_len=max_seq_len)
        for k in INPUT_NAMES:
            parts[k].append(out[k].numpy())
    return {k: np.concatenate(v, 0) for k, v in parts.items()}
