"""SQuAD windows and answer selection as TensorFlow ops (the SavedModel's text signature).

A served question answerer takes a question and a context of any length, so
the windows are built inside the graph, by the rules `data.squad` applies in
Python, and the answer is chosen there too:

- `window_inputs`: `[CLS] question [SEP] window [SEP]` for every window of
  every (question, context) pair: the question cut to `max_query_len` pieces,
  windows `doc_stride` pieces apart (the last reaching the context's end), and
  per context piece its UTF-8 byte span in the context and whether this window
  gives it the most context (`squad._max_context_window`, computed in float64
  as NumPy does, so ties fall the same way). The ids equal `make_features`'.
- `select_answers`: per window, spans whose start is among the `n_best_size`
  highest start logits (over all positions, as `postprocess`) and is a context
  piece with its most context, whose end is among the `n_best_size` highest end
  logits and a context piece, end >= start and at most `max_answer_len` pieces
  long; the best such span (start + end logit) over the question's windows is
  the answer, a byte slice of the context. SQuAD 2.0 answers "" when
  min over windows of (start[0] + end[0]) - best score > the null threshold.
  This is `postprocess`'s best answer (its n-best list, deduplicated by text,
  does not change which span ranks first).

Memory: the span scores are a [windows, L, L] tensor per request (W=16 windows
at L=384 is 9 MB); send long documents in small batches.
"""
from __future__ import annotations

import tensorflow as tf

from tinybert_tf.tokenizer import Tokenizer


def window_inputs(tokenizer: Tokenizer, questions: tf.Tensor, contexts: tf.Tensor,
                  max_seq_len: int, max_query_len: int, doc_stride: int) -> dict[str, tf.Tensor]:
    """Questions and contexts (string [B] each) -> the W windows of all of them.

    Returns input_word_ids, input_mask, input_type_ids (int32 [W, L]),
    example_index (int32 [W]: the pair each window belongs to), byte_spans
    (int64 [W, L, 2]: [start, end) bytes of each context piece in its context,
    -1 elsewhere) and is_max_context (bool [W, L]).
    """
    L, Q = int(max_seq_len), int(max_query_len)
    if L - 3 - Q < 1:
        raise ValueError(f"max_seq_len={L} leaves no room for context after max_query_len={Q} "
                         "question pieces, [CLS] and two [SEP]; lower --max_query_len.")
    q = tokenizer.tokenize(questions)[:, :Q]
    c_ids, c_starts, c_ends = tokenizer.tokenize_with_offsets(contexts)
    n_q = tf.cast(q.row_lengths(), tf.int32)                       # [B]
    n_p = tf.cast(c_ids.row_lengths(), tf.int32)                   # [B]
    max_doc = L - 3 - n_q
    step = tf.minimum(int(doc_stride), max_doc)
    n_win = 1 + tf.maximum(0, (n_p - max_doc + step - 1) // step)  # [B]
    ex = tf.repeat(tf.range(tf.size(n_q)), n_win)                  # [W]
    k = tf.ragged.range(n_win).flat_values                         # window number in its pair
    start = k * tf.gather(step, ex)
    length = tf.minimum(tf.gather(n_p, ex) - start, tf.gather(max_doc, ex))
    offset = tf.gather(n_q, ex) + 2                                 # [CLS] question [SEP]
    num_w = tf.size(ex)
    pos = tf.broadcast_to(tf.range(L)[None, :], [num_w, L])
    off, end = offset[:, None], (offset + length)[:, None]          # end: the last [SEP]

    def per_window(dense: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        """dense [B, N] rows -> [W, L]: row ex[w] at `index` [W, L] (clipped)."""
        dense = tf.pad(dense, [[0, 0], [0, 1]])  # at least one column
        rows = tf.gather(dense, ex)
        return tf.gather(rows, tf.clip_by_value(index, 0, tf.shape(rows)[1] - 1), batch_dims=1)

    piece = start[:, None] + pos - off                              # context piece at pos
    in_ctx = (pos >= off) & (pos < end)
    q_tok = per_window(tf.cast(q, tf.int32).to_tensor(tokenizer.pad_id, shape=[None, Q]),
                       pos - 1)
    c_tok = per_window(tf.cast(c_ids, tf.int32).to_tensor(tokenizer.pad_id), piece)
    ids = tf.where(in_ctx, c_tok, tokenizer.pad_id)
    ids = tf.where((pos >= 1) & (pos < off - 1), q_tok, ids)
    ids = tf.where(pos == 0, tokenizer.cls_id, ids)
    ids = tf.where((pos == off - 1) | (pos == end), tokenizer.sep_id, ids)
    mask = pos <= end
    type_ids = (pos >= off) & mask
    spans = tf.stack([per_window(tf.cast(c_starts, tf.int64).to_tensor(-1), piece),
                      per_window(tf.cast(c_ends, tf.int64).to_tensor(-1), piece)], -1)
    spans = tf.where(in_ctx[..., None], spans, tf.constant(-1, tf.int64))
    return {"input_word_ids": ids, "input_mask": tf.cast(mask, tf.int32),
            "input_type_ids": tf.cast(type_ids, tf.int32), "example_index": ex,
            "byte_spans": spans,
            "is_max_context": _max_context(in_ctx, pos - off, length, ex, piece, c_ids)}


def _max_context(in_ctx, j, length, ex, piece, c_ids: tf.RaggedTensor) -> tf.Tensor:
    """bool [W, L]: this window gives the context piece its most context (earliest on ties).

    Score of piece j (0-based in its window of `length` pieces): min(j, length-1-j)
    + 0.01 * length, as run_squad's `_check_is_max_context`.
    """
    where = tf.where(in_ctx)                                         # [K, 2] (window, pos)
    w_id = tf.cast(where[:, 0], tf.int32)
    jj = tf.gather_nd(j, where)
    n = tf.gather(length, w_id)
    score = tf.cast(tf.minimum(jj, n - 1 - jj), tf.float64) + 0.01 * tf.cast(n, tf.float64)
    key = tf.gather(tf.cast(c_ids.row_starts(), tf.int32), tf.gather(ex, w_id)) \
        + tf.gather_nd(piece, where)                                 # piece id over the batch
    total = tf.cast(tf.shape(c_ids.flat_values)[0], tf.int32)
    best = tf.math.unsorted_segment_max(score, key, total)
    first = tf.math.unsorted_segment_min(
        tf.where(score == tf.gather(best, key), w_id, tf.int32.max), key, total)
    is_max = tf.cast(tf.equal(w_id, tf.gather(first, key)), tf.int32)
    return tf.scatter_nd(where, is_max, tf.shape(in_ctx, out_type=tf.int64)) > 0


def _in_top(x: tf.Tensor, n: int) -> tf.Tensor:
    """bool [W, L]: position among the n highest of its row (lower index first on ties)."""
    L = x.shape[-1] or tf.shape(x)[-1]
    top = tf.math.top_k(x, k=tf.minimum(int(n), L)).indices
    return tf.reduce_any(tf.one_hot(top, L, on_value=True, off_value=False,
                                    dtype=tf.bool), axis=1)


def select_answers(windows: dict[str, tf.Tensor], logits: tf.Tensor, contexts: tf.Tensor,
                   n_best_size: int, max_answer_len: int, with_null: bool,
                   null_threshold: tf.Tensor) -> dict[str, tf.Tensor]:
    """The best answer per pair from the logits [W, L, 2] of `window_inputs`' windows.

    Returns answer (string [B], "" for none), score ([B]: start + end logit of
    the best span; float32 min when no span is valid), start_logits and
    end_logits ([B, L]: those of the window holding the answer), and for SQuAD
    2.0 null_score_diff ([B]: score_null - score, float32 max when no span is
    valid; the answer is "" above `null_threshold`).
    """
    s, e = logits[..., 0], logits[..., 1]
    L = tf.shape(s)[1]
    spans, ex = windows["byte_spans"], windows["example_index"]
    num_b = tf.size(contexts)
    is_ctx = spans[..., 0] >= 0
    start_ok = is_ctx & windows["is_max_context"] & _in_top(s, n_best_size)
    end_ok = is_ctx & _in_top(e, n_best_size)
    ii = tf.range(L)[:, None]
    jj = tf.range(L)[None, :]
    band = (jj >= ii) & (jj - ii < int(max_answer_len))              # [L, L]
    valid = start_ok[:, :, None] & end_ok[:, None, :] & band[None]
    # Invalid spans score float32 min: unsorted_segment_max's own floor, so "no valid span"
    # compares equal across windows (with -inf it would not).
    scores = tf.where(valid, s[:, :, None] + e[:, None, :], tf.float32.min)
    flat = tf.reshape(scores, [tf.shape(s)[0], -1])
    best_w = tf.reduce_max(flat, axis=1)                             # [W]
    arg_w = tf.cast(tf.argmax(flat, axis=1), tf.int32)
    best = tf.math.unsorted_segment_max(best_w, ex, num_b)           # [B]
    w_ids = tf.range(tf.size(ex))
    win = tf.math.unsorted_segment_min(
        tf.where(best_w == tf.gather(best, ex), w_ids, tf.int32.max), ex, num_b)
    has_span = best > tf.float32.min
    arg = tf.gather(arg_w, win)
    i_pos, j_pos = arg // L, arg % L
    b0 = tf.gather_nd(spans, tf.stack([win, i_pos, tf.zeros_like(win)], -1))
    b1 = tf.gather_nd(spans, tf.stack([win, j_pos, tf.ones_like(win)], -1))
    text = tf.strings.substr(contexts, tf.where(has_span, b0, 0),
                             tf.where(has_span, b1 - b0, 0), unit="BYTE")
    out = {"score": best,
           "start_logits": tf.gather(s, win), "end_logits": tf.gather(e, win)}
    if with_null:
        null = tf.math.unsorted_segment_min(s[:, 0] + e[:, 0], ex, num_b)
        diff = tf.where(has_span, null - best, tf.float32.max)  # no span: "" (JSON-safe)
        out["null_score_diff"] = diff
        has_span = has_span & (diff <= tf.cast(null_threshold, diff.dtype))
    out["answer"] = tf.where(has_span, text, "")
    return out
