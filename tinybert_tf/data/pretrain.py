"""In-graph packing of documents into BERT sequences, and dynamic MLM masking.

Packing (`pack_document`): the WordPiece ids of one document's sentences
[S, (n)] are cut into pieces of at most `budget` tokens (a sentence longer
than a whole sequence is split, not dropped), then consecutive pieces are
grouped greedily: a group is closed when the next sentence would not fit.
Each group becomes one sequence:
  pair mode:   [CLS] A [SEP] B [SEP], A = the group's first k sentences
               (k uniform in 1..n-1, seeded), B = the rest; a one-sentence
               group is [CLS] A [SEP]; budget = max_seq_len - 3.
  single mode: [CLS] A [SEP] with all the group's sentences; budget = max_seq_len - 2.
Segment ids: 0 for [CLS] A [SEP], 1 for B [SEP]. Zero padding to max_seq_len.
B is always A's real continuation (distillation has no next-sentence loss) and
there is no short-sequence sampling. BERT's pre-training pairs (half of them
with a B from another document) are made from packed rows by
`next_sentence_pairs` (the mlm recipe).

We place tokens with one scatter rather than tensorflow-text's
`combine_segments` because a group's B may be empty (combine_segments would
emit an extra [SEP]) and because the scatter traces in milliseconds.

Masking (`mask_batch`, BERT's rule): per sequence, n = min(max_predictions,
max(1, round(num_tokens * mask_prob))) positions (num_tokens counts [CLS] and
[SEP], as BERT does; never more than the maskable tokens) chosen uniformly
among real non-special tokens; of those 80% become [MASK], 10% a random
non-special vocab token, 10% stay. Positions ascending, padded with 0 and
weight 0. We use stateless random ops keyed by (seed, batch index) instead of
tensorflow-text's `mask_language_model`, whose stateful ops give different
masks on every run of a parallel tf.data map; ours are reproducible.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import tensorflow as tf


def split_long(ids: tf.RaggedTensor, budget: int) -> tf.RaggedTensor:
    """[S, (n)] -> [S', (<= budget)]: sentences longer than budget cut into pieces;
    empty sentences dropped.

    Dense ops on the row ids, and no validation of the result (its row ids are
    sorted and in range by construction): the validating ragged constructors put
    twice the ops in every packing graph, which each corpus dataset traces."""
    lengths = ids.row_lengths()
    pieces = (lengths + budget - 1) // budget  # 0 for empty sentences
    piece_start = tf.cumsum(pieces, exclusive=True)
    sentence = ids.value_rowids()  # [T]
    pos = tf.range(tf.size(sentence, out_type=sentence.dtype)) - tf.gather(ids.row_splits,
                                                                           sentence)
    rowids = tf.gather(piece_start, sentence) + pos // budget
    return tf.RaggedTensor.from_value_rowids(ids.flat_values, rowids,
                                             nrows=tf.reduce_sum(pieces), validate=False)


def greedy_groups(lengths: tf.Tensor, budget: int) -> tf.Tensor:
    """Group ids [S] (0, 0, 1, ...) of consecutive items whose lengths (<= budget) fit
    `budget` in total; a new group starts when the next item would overflow."""
    lengths = tf.cast(lengths, tf.int64)

    def step(state, length):
        gid, used = state
        new = used + length > budget
        return (tf.where(new, gid + 1, gid), tf.where(new, length, used + length))

    init = (tf.constant(-1, tf.int64), tf.constant(budget, tf.int64))
    gids, _ = tf.scan(step, lengths, initializer=init)
    return gids


def pack_document(sentence_ids: tf.RaggedTensor, max_seq_len: int, cls_id: int, sep_id: int,
                  pad_id: int, pair: bool, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """One document's WordPiece ids [S, (n)] -> packed sequences, dict of int32 [C, max_seq_len].

    seed: int64 [2] stateless seed choosing the A/B split points (pair mode).
    """
    L = int(max_seq_len)
    budget = L - 3 if pair else L - 2
    if budget < 1:
        raise ValueError(f"max_seq_len={L} leaves no room for text (need >= {L - budget + 1}).")
    pieces = split_long(tf.cast(sentence_ids, tf.int64), budget)
    lengths = pieces.row_lengths()
    gid = greedy_groups(lengths, budget)  # [S']
    n_groups = tf.cast(tf.reduce_max(tf.concat([gid, [-1]], 0)) + 1, tf.int64)
    n_sent = tf.math.unsorted_segment_sum(tf.ones_like(gid), gid, n_groups)  # [C]
    group_start = tf.cumsum(n_sent, exclusive=True)
    if pair:
        u = tf.random.stateless_uniform(tf.reshape(n_groups, [1]), seed=seed, dtype=tf.float32)
        a_end = 1 + tf.cast(u * tf.cast(tf.maximum(n_sent - 1, 0), tf.float32), tf.int64)
        a_end = tf.minimum(a_end, tf.maximum(n_sent - 1, 1))
    else:
        a_end = n_sent
    sent_pos = tf.range(tf.size(gid, out_type=tf.int64)) - tf.gather(group_start, gid)
    sent_in_b = sent_pos >= tf.gather(a_end, gid)  # [S']

    tokens = pieces.flat_values  # [T]
    tok_sent = pieces.value_rowids()
    tok_group = tf.gather(gid, tok_sent)
    tok_in_b = tf.gather(sent_in_b, tok_sent)
    ones = tf.ones_like(tokens)
    n_tok = tf.math.unsorted_segment_sum(ones, tok_group, n_groups)
    len_b = tf.math.unsorted_segment_sum(tf.cast(tok_in_b, tf.int64), tok_group, n_groups)
    len_a = n_tok - len_b
    tok_start = tf.cumsum(n_tok, exclusive=True)
    tok_pos = tf.range(tf.size(tokens, out_type=tf.int64)) - tf.gather(tok_start, tok_group)
    # [CLS] at 0, A at 1.., [SEP] after A, then B and its [SEP].
    tok_out = 1 + tok_pos + tf.cast(tok_in_b, tf.int64)
    rows = tf.range(n_groups)
    has_b = len_b > 0
    sep_a = 1 + len_a
    sep_b = 2 + len_a + len_b
    idx = tf.concat([tf.stack([tok_group, tok_out], 1),
                     tf.stack([rows, tf.zeros_like(rows)], 1),
                     tf.stack([rows, sep_a], 1),
                     tf.boolean_mask(tf.stack([rows, sep_b], 1), has_b)], 0)
    vals = tf.concat([tokens, tf.fill([n_groups], tf.cast(cls_id, tf.int64)),
                      tf.fill([n_groups], tf.cast(sep_id, tf.int64)),
                      tf.fill([tf.reduce_sum(tf.cast(has_b, tf.int64))],
                              tf.cast(sep_id, tf.int64))], 0)
    typ = tf.concat([tf.cast(tok_in_b, tf.int64), tf.zeros([2 * n_groups], tf.int64),
                     tf.ones([tf.reduce_sum(tf.cast(has_b, tf.int64))], tf.int64)], 0)
    shape = tf.stack([n_groups, tf.constant(L, tf.int64)])
    word_ids = tf.tensor_scatter_nd_update(tf.fill(shape, tf.cast(pad_id, tf.int64)), idx, vals)
    type_ids = tf.scatter_nd(idx, typ, shape)
    total = tf.where(has_b, sep_b + 1, sep_a + 1)
    mask = tf.sequence_mask(total, L, dtype=tf.int32)
    return {"input_word_ids": tf.cast(word_ids, tf.int32), "input_mask": mask,
            "input_type_ids": tf.cast(type_ids, tf.int32)}


@functools.lru_cache(maxsize=None)
def document_packer(max_seq_len: int, cls_id: int, sep_id: int, pad_id: int,
                    pair: bool) -> Callable[[tf.RaggedTensor, tf.Tensor], dict]:
    """`pack_document` with these settings as one tf.function, traced once per process:
    (sentence ids int64 [S, (n)], seed int64 [2]) -> packed rows.

    Every corpus dataset maps its documents through the packing graph; called inside
    the map's function, the traced function is one call op there, so building another
    dataset (a phase, an epoch's input, a count of the corpus) no longer traces the
    packing ops again (docs/measurements.md)."""
    spec = [tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1,
                                row_splits_dtype=tf.int64),
            tf.TensorSpec([2], tf.int64)]
    return tf.function(
        lambda ids, seed: pack_document(ids, max_seq_len, cls_id, sep_id, pad_id, pair, seed),
        input_signature=spec, autograph=False)


def random_token_ids(vocab: Sequence[str]) -> list[int]:
    """Ids a masked token may be replaced with: every token but bracketed specials
    ([PAD], [CLS], [SEP], [MASK], [UNK], [unusedN]), so no control token enters text."""
    ids = [i for i, t in enumerate(vocab) if not (t.startswith("[") and t.endswith("]"))]
    if not ids:
        raise ValueError("the vocab has no ordinary tokens to sample random replacements from.")
    return ids


def mask_batch(inputs: dict[str, tf.Tensor], seed: tf.Tensor, mask_id: int,
               special_ids: Sequence[int], random_ids: Sequence[int], mask_prob: float = 0.15,
               max_predictions: int = 20) -> dict[str, tf.Tensor]:
    """Dynamic MLM masking of packed inputs (dict of int32 [B, L]) with BERT's 80/10/10 rule.

    Returns the inputs with masked `input_word_ids` plus `masked_lm_positions`,
    `masked_lm_ids` (int32 [B, P]) and `masked_lm_weights` (float32 [B, P]),
    P = max_predictions. seed: int64 [2] stateless seed (vary it per batch).
    """
    ids = inputs["input_word_ids"]
    real = inputs["input_mask"] > 0
    special = tf.reduce_any(tf.equal(ids[..., None], tf.constant(list(special_ids), ids.dtype)),
                            axis=-1)
    cand = real & ~special  # [B, L]
    B, L = tf.shape(ids)[0], ids.shape[1]
    if L is None:
        raise ValueError("mask_batch needs a static sequence length (pad to max_seq_len).")
    P = int(max_predictions)
    num_real = tf.reduce_sum(tf.cast(real, tf.float32), axis=1)
    n = tf.cast(tf.round(num_real * mask_prob), tf.int32)
    n = tf.minimum(tf.minimum(tf.maximum(n, 1), P), tf.reduce_sum(tf.cast(cand, tf.int32), 1))
    s1, s2, s3 = (tf.random.experimental.stateless_fold_in(seed, i) for i in range(3))
    scores = tf.where(cand, tf.random.stateless_uniform(tf.shape(ids), s1), -1.0)
    k = min(P, int(L))
    _, top = tf.math.top_k(scores, k=k)  # [B, k] candidate positions first, random order
    keep = tf.range(k)[None, :] < n[:, None]
    pos = tf.sort(tf.where(keep, top, L), axis=1)  # chosen positions ascending, L = unused
    chosen = pos < L
    pos = tf.where(chosen, pos, 0)
    if k < P:
        pos = tf.pad(pos, [[0, 0], [0, P - k]])
        chosen = tf.pad(chosen, [[0, 0], [0, P - k]])
    original = tf.gather(ids, pos, batch_dims=1)
    u = tf.random.stateless_uniform([B, P], s2)
    pool = tf.constant(list(random_ids), ids.dtype)
    rand_tok = tf.gather(pool, tf.random.stateless_uniform([B, P], s3, maxval=len(random_ids),
                                                           dtype=tf.int32))
    new = tf.where(u < 0.8, tf.cast(mask_id, ids.dtype), tf.where(u < 0.9, rand_tok, original))
    rows = tf.broadcast_to(tf.range(B)[:, None], [B, P])
    upd_idx = tf.boolean_mask(tf.stack([rows, pos], -1), chosen)
    masked_ids = tf.tensor_scatter_nd_update(ids, upd_idx, tf.boolean_mask(new, chosen))
    out = dict(inputs)
    out["input_word_ids"] = masked_ids
    out["masked_lm_positions"] = tf.cast(pos, tf.int32)
    out["masked_lm_ids"] = tf.cast(tf.where(chosen, original, 0), tf.int32)
    out["masked_lm_weights"] = tf.cast(chosen, tf.float32)
    return out


# Key of the per-row document fingerprint [B] int64 that `next_sentence_pairs` reads
# (added by the corpus pipeline when sentence pairs are asked for, dropped here).
DOCUMENT_KEY = "document_hash"


def truncated_pair_lengths(len_a: tf.Tensor, len_b: tf.Tensor, budget: int
                           ) -> tuple[tf.Tensor, tf.Tensor]:
    """Lengths that BERT's `truncate_seq_pair` leaves: one token at a time is removed
    from the longer segment (from B on a tie) until len_a + len_b <= budget. Closed
    form: unchanged if they fit; else the shorter stays when it is at most half the
    budget (the longer gets the rest); else ceil(budget/2) for A, floor for B."""
    a, b = tf.cast(len_a, tf.int64), tf.cast(len_b, tf.int64)
    m = tf.constant(int(budget), tf.int64)
    fits = a + b <= m
    shorter = tf.minimum(a, b)
    shorter_stays = shorter <= m - shorter
    a_longer = a > b
    a1, b1 = tf.where(a_longer, m - b, a), tf.where(a_longer, b, m - a)
    a2, b2 = (m + 1) // 2, m // 2
    out_a = tf.where(fits, a, tf.where(shorter_stays, a1, a2))
    out_b = tf.where(fits, b, tf.where(shorter_stays, b1, b2))
    return out_a, out_b


def next_sentence_pairs(batch: dict[str, tf.Tensor], seed: tf.Tensor, cls_id: int, sep_id: int,
                        pad_id: int) -> dict[str, tf.Tensor]:
    """BERT's next-sentence pairs from packed pair-mode rows (dict of int32 [B, L] plus
    `document_hash` [B] int64): adds `next_sentence_labels` [B] (0 = B is the real
    continuation, 1 = random) and drops `document_hash`.

    As in BERT's create_pretraining_data: a row keeps its own B with probability
    1/2 and otherwise gets a B from another document; a row with no B (a
    one-segment group) always gets one. The other document is a uniformly chosen
    row of this batch with a different `document_hash` (after shuffling, so a
    random document of the shuffle window); its text from its start, a sentence
    boundary (its A, then its B, without the [SEP] between), is the new B. A and
    B are then cut to L - 3 tokens as BERT's truncate_seq_pair (from the back
    only; BERT picks the front or the back at random). A row whose batch holds no
    other document keeps its own pair (label 0). seed: int64 [2] stateless seed.
    """
    ids = batch["input_word_ids"]
    real = tf.cast(batch["input_mask"] > 0, tf.int64)
    types = tf.cast(batch["input_type_ids"], tf.int64) * real
    doc = batch[DOCUMENT_KEY]
    L = ids.shape[1]
    if L is None:
        raise ValueError("next_sentence_pairs needs a static sequence length.")
    n = tf.shape(ids)[0]
    total = tf.reduce_sum(real, axis=1)
    in_b = tf.reduce_sum(types, axis=1)  # B tokens + its [SEP]
    has_b = in_b > 0
    len_a = total - 2 - in_b
    len_b = tf.maximum(in_b - 1, 0)
    s1, s2 = (tf.random.experimental.stateless_fold_in(seed, i) for i in range(2))
    other = tf.not_equal(doc[:, None], doc[None, :])  # [B, B]
    scores = tf.where(other, tf.random.stateless_uniform([n, n], s1), -1.0)
    partner = tf.argmax(scores, axis=1, output_type=tf.int32)  # [B]
    has_partner = tf.reduce_any(other, axis=1)
    coin = tf.random.stateless_uniform([n], s2) < 0.5
    is_random = (coin | ~has_b) & has_partner

    src_a = tf.gather(len_a, partner)
    src_len = src_a + tf.gather(len_b, partner)
    new_a, new_b = truncated_pair_lengths(len_a, src_len, L - 3)
    p = tf.range(L, dtype=tf.int64)[None, :]
    a_end, b_start = new_a[:, None], new_a[:, None] + 2
    b_end = b_start + new_b[:, None]  # exclusive; the final [SEP] sits here
    k = p - b_start  # position inside the new B
    src_pos = tf.where(k < src_a[:, None], 1 + k, 2 + k)
    partner_ids = tf.gather(ids, partner)
    b_tokens = tf.gather(partner_ids, tf.clip_by_value(src_pos, 0, L - 1), batch_dims=1)
    in_new_a = (p >= 1) & (p <= a_end)
    in_new_b = (p >= b_start) & (p < b_end)
    is_sep = (p == a_end + 1) | (p == b_end)
    cast = lambda v: tf.cast(v, ids.dtype)  # noqa: E731
    new_ids = tf.where(p == 0, cast(cls_id), tf.where(in_new_a, ids, tf.where(
        is_sep, cast(sep_id), tf.where(in_new_b, b_tokens, cast(pad_id)))))
    new_types = tf.cast(in_new_b | (p == b_end), batch["input_type_ids"].dtype)
    new_mask = tf.cast(p <= b_end, batch["input_mask"].dtype)
    pick = is_random[:, None]
    out = {k: v for k, v in batch.items() if k != DOCUMENT_KEY}
    out["input_word_ids"] = tf.where(pick, new_ids, ids)
    out["input_type_ids"] = tf.where(pick, new_types, batch["input_type_ids"])
    out["input_mask"] = tf.where(pick, new_mask, batch["input_mask"])
    out["next_sentence_labels"] = tf.cast(is_random, tf.int32)
    return out
