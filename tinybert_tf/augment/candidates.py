"""Batched masked-LM candidates for single-piece words (Algorithm 1, line "C <- top-K of BERT").

For every eligible single-piece word of every sentence we build one row

    [CLS] w_1 .. [MASK] .. w_n [SEP] w_1 .. w_n [SEP]      (segment ids 0 .. 0 1 .. 1)

i.e. the sentence with that word masked, followed -- as in the TinyBERT
reference's `_masked_language_model` -- by the unmasked sentence as a second
segment (the paper's text only says "masked"), and read the MLM logits at the
masked position. Rows of many sentences go through one `tf.function` forward
pass; top-K runs in the graph over the whole-word tokens only: no `##` pieces,
no bracketed special tokens ([PAD], [UNK], [CLS], [SEP], [MASK], [unusedN]),
and never the masked word itself. (The reference takes the top K and then
drops `##` pieces, keeping fewer than K, and keeps specials and the word.)

The function is traced once (dynamic [batch, length] signature); rows are
sorted by length and batched with their neighbours, padded to a multiple of 8,
so padding stays small and few distinct shapes reach the kernels.
"""
from __future__ import annotations

import dataclasses
import re
import weakref
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf.tokenizer import Tokenizer

_SPECIAL = re.compile(r"^\[[^\]]+\]$")


class MLMError(ValueError):
    """The MLM model cannot serve Algorithm 1 (no MLM head, no vocab, vocab mismatch)."""


def whole_word_mask(vocab: Sequence[str], size: Optional[int] = None) -> np.ndarray:
    """bool [size]: True for tokens allowed as candidates (not ##, not [SPECIAL], not blank)."""
    size = size or len(vocab)
    out = np.zeros(size, bool)
    for i, t in enumerate(vocab[:size]):
        out[i] = bool(t.strip()) and not t.startswith("##") and not _SPECIAL.match(t)
    return out


_FUNCTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _top_k_function(model, allowed: np.ndarray, k: int):
    """The traced forward + top-K for `model`, shared by every MLMCandidates on it.

    One trace for every shape ([None, None] signature).
    """
    per_model = _FUNCTIONS.setdefault(model, {})
    key = (k, allowed.tobytes())
    if key in per_model:
        return per_model[key]
    allowed_t = tf.constant(allowed)
    model_ref = weakref.ref(model)  # the cache must not keep the model alive
    vocab_ids = tf.range(allowed.shape[0], dtype=tf.int32)
    i32 = tf.int32

    @tf.function(input_signature=[tf.TensorSpec([None, None], i32)] * 3
                 + [tf.TensorSpec([None], i32)] * 2, autograph=False)
    def top_k(ids, type_ids, mask, positions, exclude):
        """int32 [B, L] x3, [B], [B] -> top-K ids [B, K], valid [B, K] (bool)."""
        out = model_ref()({"input_word_ids": ids, "input_mask": mask, "input_type_ids": type_ids,
                     "masked_lm_positions": positions[:, None]}, training=False)
        logits = tf.cast(out["logits"][:, 0, :], tf.float32)  # [B, V]
        ok = allowed_t[None, :] & (vocab_ids[None, :] != exclude[:, None])
        logits = tf.where(ok, logits, tf.constant(-np.inf, tf.float32))
        values, top = tf.math.top_k(logits, k=k)  # ties: lower id first
        return top, tf.math.is_finite(values)

    per_model[key] = top_k
    return top_k


@dataclasses.dataclass
class Row:
    """One masked query: ids/type_ids [length], the masked index, the word's own id."""
    ids: list
    type_ids: list
    position: int
    exclude: int


class MLMCandidates:
    """The K most probable whole-word tokens at masked positions, many rows per forward.

    Args:
      model: a `BertModel` with head="mlm" and a `.vocab`.
      num_candidates: K.
      batch_size: rows per forward pass at lengths <= 64; longer rows get
        proportionally fewer rows (same tokens per pass).
      max_len: longest row; default the model's max_position_embeddings (<= 512).
    """

    def __init__(self, model, num_candidates: int = 15, batch_size: int = 256,
                 max_len: Optional[int] = None):
        if getattr(model, "head_type", None) != "mlm":
            raise MLMError(f"--mlm_model: the model has head {getattr(model, 'head_type', None)!r},"
                           " not an MLM head; give a BertForMaskedLM / BertMaskedLM directory "
                           "(or none: word vectors then serve every word).")
        if not model.vocab:
            raise MLMError("--mlm_model: the model has no vocabulary (vocab.txt); load it from "
                           "a model directory.")
        self.model = model
        config = model.bert_config
        self.vocab = list(model.vocab)
        self.tokenizer = Tokenizer(self.vocab, lower_case=config.lower_case)
        self.lower_case = config.lower_case
        allowed = whole_word_mask(self.vocab, config.vocab_size)
        if allowed.sum() < 2:
            raise MLMError("--mlm_model: the vocabulary has no whole-word tokens.")
        self.k = int(min(num_candidates, allowed.sum() - 1))
        self.batch_size = int(batch_size)
        self.max_len = int(min(max_len or config.max_position_embeddings, 512))
        self.two_segments = config.type_vocab_size >= 2
        self._pieces: dict[str, tuple] = {}
        self._fn = _top_k_function(model, allowed, self.k)
        self.forward_calls = 0

    # -- words -> pieces -------------------------------------------------------------
    def pieces(self, words: Sequence[str]) -> list[tuple]:
        """WordPiece ids of each word (cached per word)."""
        todo = sorted({w for w in words if w not in self._pieces})
        if todo:
            ragged = self.tokenizer.tokenize(tf.constant(todo, tf.string))
            for w, ids in zip(todo, ragged.to_list()):
                self._pieces[w] = tuple(ids)
        return [self._pieces[w] for w in words]

    # -- rows ------------------------------------------------------------------------
    def make_rows(self, word_pieces: Sequence[Sequence[int]], targets: Sequence[int]
                  ) -> list[Optional[Row]]:
        """Rows for the single-piece words `targets` (word indices) of one sentence.

        None for a target that falls beyond max_len (the reference then keeps the word).
        """
        tok = self.tokenizer
        flat, start = [], []
        for p in word_pieces:
            start.append(len(flat))
            flat.extend(p)
        len1 = min(len(flat), self.max_len - 2)
        len2 = min(len(flat), self.max_len - 3 - len1)
        second = (flat[:len2] + [tok.sep_id]) if len2 > 0 else []
        type2 = 1 if self.two_segments else 0
        rows = []
        for t in targets:
            s = start[t]
            if s >= len1:
                rows.append(None)
                continue
            first = flat[:len1]
            word_id = first[s]
            first = first[:s] + [tok.mask_id] + first[s + 1:]
            ids = [tok.cls_id] + first + [tok.sep_id] + second
            type_ids = [0] * (len1 + 2) + [type2] * len(second)
            rows.append(Row(ids, type_ids, s + 1, word_id))
        return rows

    # -- forward ---------------------------------------------------------------------
    def _rows_per_batch(self, length: int) -> int:
        return max(1, self.batch_size * 64 // length) if length > 64 else self.batch_size

    def batches(self, rows: Sequence[Row]) -> list[tuple[int, list[int]]]:
        """(padded length, row indices) per forward pass.

        Rows are sorted by length (ties in row order) and cut greedily into
        batches of similar length, padded to a multiple of 8: little padding,
        and a bounded number of distinct shapes. Depends only on `rows`.
        """
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i].ids), i))
        out, part, part_len = [], [], 0
        for i in order:
            length = -(-len(rows[i].ids) // 8) * 8
            if part and len(part) + 1 > self._rows_per_batch(length):
                out.append((part_len, part))
                part = []
            part.append(i)
            part_len = length
        if part:
            out.append((part_len, part))
        return out

    def candidates(self, rows: Sequence[Row]) -> list[list[str]]:
        """Candidate words (<= K, best first) for each row, in row order.

        The result for a row depends only on the rows given (their batching),
        never on earlier calls.
        """
        out: list[Optional[list[str]]] = [None] * len(rows)
        pad = self.tokenizer.pad_id
        for length, part in self.batches(rows):
            size = len(part)
            ids = np.full((size, length), pad, np.int32)
            types = np.zeros((size, length), np.int32)
            mask = np.zeros((size, length), np.int32)
            pos = np.zeros(size, np.int32)
            excl = np.full(size, -1, np.int32)
            for j, i in enumerate(part):
                r = rows[i]
                n = len(r.ids)
                ids[j, :n], types[j, :n], mask[j, :n] = r.ids, r.type_ids, 1
                pos[j], excl[j] = r.position, r.exclude
            top, valid = self._fn(tf.constant(ids), tf.constant(types), tf.constant(mask),
                                  tf.constant(pos), tf.constant(excl))
            self.forward_calls += 1
            top, valid = top.numpy(), valid.numpy()
            for j, i in enumerate(part):
                out[i] = [self.vocab[t] for t, v in zip(top[j], valid[j]) if v]
        return out
