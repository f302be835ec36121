"""Distillation losses of TinyBERT (paper Eq. 7-10) and DistilBERT.

Every loss takes one student/teacher pair and returns a float32 scalar
(inputs of any float dtype are cast to float32 first, so mixed precision never
computes a loss in float16).

`reduction`:
  "mean"  the loss as defined (what the paper and the tests use).
  "sum"   the numerator only: the sum of the per-element terms whose mean is
          the loss. The `Distiller` divides sums by element counts taken over the
          GLOBAL batch (all replicas, all accumulation micro-batches), so any
          split of a batch gives the same loss and gradient. `*_count` functions
          below give the matching denominators.

Masking conventions (one place for them, see docs/distillation.md):
  * attention: entries at padded KEY positions are set to 0 in both score maps
    and the mean runs over B x h x L x L (the reference implementation). With
    `mask_queries=True` padded query rows are zeroed too and the mean runs over
    real (query, key) pairs only (our `mask_padding` option).
  * hidden / embedding: MSE over B x L x d, or over real tokens x d when an
    `input_mask` is given.
"""
from __future__ import annotations

import tensorflow as tf

REDUCTIONS = ("mean", "sum")


def _f32(x) -> tf.Tensor:
    return tf.cast(x, tf.float32)


def _reduce(total: tf.Tensor, count: tf.Tensor, reduction: str) -> tf.Tensor:
    if reduction == "sum":
        return total
    if reduction == "mean":
        return tf.math.divide_no_nan(total, _f32(count))
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")


def _match_heads(student_scores, teacher_scores):
    """Head-average both maps ([B,h,L,L] -> [B,1,L,L]) when head counts differ."""
    s, t = _f32(student_scores), _f32(teacher_scores)
    if s.shape[1] is not None and t.shape[1] is not None and s.shape[1] != t.shape[1]:
        s = tf.reduce_mean(s, axis=1, keepdims=True)
        t = tf.reduce_mean(t, axis=1, keepdims=True)
    return s, t


def attention_loss(student_scores, teacher_scores, input_mask, reduction: str = "mean",
                   mask_queries: bool = False) -> tf.Tensor:
    """Attention-based loss (Eq. 7) on PRE-softmax scores QK^T/sqrt(d_k).

    Args:
      student_scores: [B, h_s, L, L] raw scores of one student layer.
      teacher_scores: [B, h_t, L, L] raw scores of its teacher layer.
      input_mask: [B, L], 1 = real token, 0 = padding.
      reduction: "mean" or "sum" (see module doc).
      mask_queries: also zero padded query rows and average over real pairs.

    When h_s != h_t both maps are averaged over heads first ([B, 1, L, L]); the
    reference implementation cannot compare such models at all.
    """
    s, t = _match_heads(student_scores, teacher_scores)
    mask = _f32(input_mask)
    pair = mask[:, None, None, :]  # keys
    if mask_queries:
        pair = pair * mask[:, None, :, None]
    diff = (s - t) * pair
    total = tf.reduce_sum(tf.square(diff))
    count = attention_count(input_mask, tf.shape(s)[1], mask_queries)
    return _reduce(total, count, reduction)


def attention_count(input_mask, num_heads, mask_queries: bool = False) -> tf.Tensor:
    """Elements averaged by `attention_loss`: B*h*L*L, or h * sum_b n_b^2 with
    `mask_queries` (n_b = real tokens of example b). `num_heads` is the compared
    head count (`attention_heads`)."""
    h = tf.cast(num_heads, tf.int32)
    mask = _f32(input_mask)
    if mask_queries:
        n = tf.reduce_sum(mask, axis=1)
        return _f32(h) * tf.reduce_sum(n * n)
    shape = tf.shape(mask)
    return _f32(shape[0]) * _f32(h) * _f32(shape[1]) * _f32(shape[1])


def attention_heads(student_heads: int, teacher_heads: int) -> int:
    """Heads compared by `attention_loss`: h, or 1 (head-averaged) if they differ."""
    return student_heads if student_heads == teacher_heads else 1


def hidden_loss(student_projected, teacher_hidden, input_mask=None,
                reduction: str = "mean") -> tf.Tensor:
    """Hidden-state / embedding loss (Eq. 8-9): MSE(H_s W_h, H_t).

    Args:
      student_projected: [B, L, d] student states already projected to width d.
      teacher_hidden: [B, L, d].
      input_mask: optional [B, L]; when given only real tokens count.
    """
    s, t = _f32(student_projected), _f32(teacher_hidden)
    sq = tf.square(s - t)
    if input_mask is not None:
        sq = sq * _f32(input_mask)[:, :, None]
    total = tf.reduce_sum(sq)
    if input_mask is None:
        shape = tf.shape(t)
        count = _f32(shape[0]) * _f32(shape[1]) * _f32(shape[2])
    else:
        count = hidden_count(input_mask, tf.shape(t)[2], real_tokens_only=True)
    return _reduce(total, count, reduction)


def hidden_count(input_mask, width, real_tokens_only: bool = False) -> tf.Tensor:
    """Elements averaged by `hidden_loss`: B*L*d, or (real tokens)*d.

    input_mask: [B, L]; width: d (the teacher's width)."""
    mask = _f32(input_mask)
    if real_tokens_only:
        return tf.reduce_sum(mask) * _f32(width)
    shape = tf.shape(mask)
    return _f32(shape[0]) * _f32(shape[1]) * _f32(width)


def soft_cross_entropy(student_logits, teacher_logits, temperature: float = 1.0,
                       reduction: str = "mean") -> tf.Tensor:
    """Prediction-layer loss (Eq. 10): batch mean of
    -sum_c softmax(z_t/T)_c * log_softmax(z_s/T)_c.

    Args:
      student_logits, teacher_logits: [B, C].
      temperature: T (the paper uses 1; no T^2 factor, as in the paper).
    """
    s, t = _f32(student_logits), _f32(teacher_logits)
    temp = float(temperature)
    if temp <= 0:
        raise ValueError(f"temperature must be > 0 (--temperature), got {temperature}.")
    per_example = -tf.reduce_sum(tf.nn.softmax(t / temp, axis=-1)
                                 * tf.nn.log_softmax(s / temp, axis=-1), axis=-1)
    return _reduce(tf.reduce_sum(per_example), tf.shape(s)[0], reduction)


def token_soft_cross_entropy(student_logits, teacher_logits, labels,
                             temperature: float = 1.0, reduction: str = "mean") -> tf.Tensor:
    """Eq. 10 per word (token classification): mean over labelled positions of
    -sum_c softmax(z_t/T)_c * log_softmax(z_s/T)_c.

    Args:
      student_logits, teacher_logits: [B, L, C] tag logits.
      labels: int [B, L]; positions with label < 0 (word-piece continuations,
        [CLS], [SEP], padding) are left out: each word counts once, on its first piece.
      temperature: T.
    """
    s, t = _f32(student_logits), _f32(teacher_logits)
    temp = float(temperature)
    if temp <= 0:
        raise ValueError(f"temperature must be > 0 (--temperature), got {temperature}.")
    keep = tf.cast(tf.cast(labels, tf.int32) >= 0, tf.float32)  # [B, L]
    per_position = -tf.reduce_sum(tf.nn.softmax(t / temp, axis=-1)
                                  * tf.nn.log_softmax(s / temp, axis=-1), axis=-1)
    return _reduce(tf.reduce_sum(per_position * keep), tf.reduce_sum(keep), reduction)


def prediction_mse(student_logits, teacher_logits, reduction: str = "mean") -> tf.Tensor:
    """Prediction loss of regression tasks (STS-B): MSE to the teacher's output,
    averaged over B x outputs. Shapes [B, 1] (or [B, K])."""
    s, t = _f32(student_logits), _f32(teacher_logits)
    total = tf.reduce_sum(tf.square(s - t))
    return _reduce(total, tf.size(s), reduction)


# --- DistilBERT -----------------------------------------------------------------
def _weights(weights, logits):
    if weights is None:
        return tf.ones(tf.shape(logits)[:-1], tf.float32)
    return _f32(weights)


def distilbert_ce(student_logits, teacher_logits, masked_lm_weights=None,
                  temperature: float = 2.0, reduction: str = "mean") -> tf.Tensor:
    """DistilBERT's soft-target loss L_ce over the MLM vocabulary.

    T^2 * mean over masked positions of -sum_v softmax(t/T)_v log_softmax(s/T)_v.
    (The DistilBERT code uses KL divergence, which differs by the teacher's
    entropy, a constant: same gradient.)

    Args:
      student_logits, teacher_logits: [B, P, V] at the masked positions.
      masked_lm_weights: [B, P], 1 for real masked positions, 0 for padding
        slots (None = all count).
    """
    s, t = _f32(student_logits), _f32(teacher_logits)
    temp = float(temperature)
    if temp <= 0:
        raise ValueError(f"temperature must be > 0 (--distil_temperature), got {temperature}.")
    w = _weights(masked_lm_weights, s)
    ce = -tf.reduce_sum(tf.nn.softmax(t / temp, -1) * tf.nn.log_softmax(s / temp, -1), -1)
    total = temp * temp * tf.reduce_sum(ce * w)
    return _reduce(total, tf.reduce_sum(w), reduction)


def mlm_loss(student_logits, masked_lm_ids, masked_lm_weights=None,
             reduction: str = "mean") -> tf.Tensor:
    """L_mlm: cross-entropy of the original tokens at masked positions.

    Args:
      student_logits: [B, P, V]; masked_lm_ids: [B, P] int; weights [B, P].
    """
    s = _f32(student_logits)
    w = _weights(masked_lm_weights, s)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(masked_lm_ids, tf.int32), logits=s)
    return _reduce(tf.reduce_sum(ce * w), tf.reduce_sum(w), reduction)


def cosine_loss(student_hidden, teacher_hidden, input_mask=None,
                reduction: str = "mean") -> tf.Tensor:
    """L_cos: mean over real tokens of 1 - cos(h_s, h_t) (PyTorch's
    CosineEmbeddingLoss with target 1) on last hidden states [B, L, d]."""
    s, t = _f32(student_hidden), _f32(teacher_hidden)
    s = tf.math.l2_normalize(s, axis=-1, epsilon=1e-16)
    t = tf.math.l2_normalize(t, axis=-1, epsilon=1e-16)
    per_token = 1.0 - tf.reduce_sum(s * t, axis=-1)
    mask = (tf.ones(tf.shape(per_token), tf.float32) if input_mask is None
            else _f32(input_mask))
    return _reduce(tf.reduce_sum(per_token * mask), tf.reduce_sum(mask), reduction)


# --- Supervised (ground-truth) losses ---------------------------------------------
def label_cross_entropy(logits, labels, reduction: str = "mean") -> tf.Tensor:
    """Cross-entropy of gold class ids: mean over labelled positions of
    -log_softmax(z)[y]; positions with label < 0 (unlabelled, or word-piece
    continuations in token classification) are ignored.

    Args:
      logits: [..., C] (e.g. [B, C] sentences, [B, L, C] tokens).
      labels: int [...] class ids, < 0 = ignore.
    """
    z = _f32(logits)
    y = tf.cast(labels, tf.int32)
    keep = tf.cast(y >= 0, tf.float32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.maximum(y, 0), logits=z)
    return _reduce(tf.reduce_sum(ce * keep), tf.reduce_sum(keep), reduction)


def label_mse(predictions, targets, reduction: str = "mean") -> tf.Tensor:
    """MSE to gold scores (regression fine-tuning): [B, 1] or [B] vs [B]."""
    p = tf.reshape(_f32(predictions), [-1])
    y = tf.reshape(_f32(targets), [-1])
    return _reduce(tf.reduce_sum(tf.square(p - y)), tf.size(p), reduction)


# ---------------------------------------------------------------------------
# MiniLM (Wang et al. 2020, arXiv 2002.10957; MiniLMv2, arXiv 2012.15828).

# Logit given to padded keys before a relation's softmax: exp() of it underflows to
# exactly 0 in float32, and it stays finite, so 0 * log p is 0, never nan.
_RELATION_MASK = -1e9


def relation_logits(x, num_heads: int) -> tf.Tensor:
    """Scaled dot-product relation of a sequence of vectors with itself.

    x: [B, L, heads, d] per-head vectors (Q, K or V) or [B, L, D]. The heads are
    concatenated ([B, L, heads*d]) and split into `num_heads` relation heads of
    size d_r = heads*d / num_heads (MiniLMv2 Sec. 3.1; with num_heads = the model's
    head count this is the model's own heads, MiniLM v1's value relation).
    Returns [B, num_heads, L, L] = X_a X_a^T / sqrt(d_r), before the softmax.
    """
    x = _f32(x)
    if x.shape.rank == 4:
        x = tf.reshape(x, tf.concat([tf.shape(x)[:2], [-1]], 0))
    width = x.shape[-1]
    if width % num_heads:
        raise ValueError(f"a width of {width} does not split into {num_heads} relation heads.")
    d_r = width // num_heads
    x = tf.reshape(x, tf.concat([tf.shape(x)[:2], [num_heads, d_r]], 0))
    return tf.einsum("bqhd,bkhd->bhqk", x, x) / tf.sqrt(tf.cast(d_r, tf.float32))


def relation_kl(student_logits, teacher_logits, input_mask,
                reduction: str = "mean") -> tf.Tensor:
    """MiniLM's loss: KL(softmax(teacher row) || softmax(student row)) per head and
    real query position, padded keys left out of both softmaxes.

    Args:
      student_logits, teacher_logits: [B, h, L, L] relation logits (attention scores
        QK^T/sqrt(d_k), or `relation_logits`), the same h for both.
      input_mask: [B, L], 1 = real token.
    mean: (1 / (h * real tokens)) sum over heads, real queries t of
    D_KL(T_t || S_t) (MiniLM's and MiniLMv2's 1/(h|x|) sum, |x| the real tokens).
    """
    s, t = _f32(student_logits), _f32(teacher_logits)
    mask = _f32(input_mask)
    key_pad = (1.0 - mask)[:, None, None, :] * _RELATION_MASK
    log_s = tf.nn.log_softmax(s + key_pad, axis=-1)
    log_t = tf.nn.log_softmax(t + key_pad, axis=-1)
    kl_rows = tf.reduce_sum(tf.exp(log_t) * (log_t - log_s), axis=-1)   # [B, h, L]
    total = tf.reduce_sum(kl_rows * mask[:, None, :])
    return _reduce(total, relation_count(input_mask, t.shape[1]), reduction)


def relation_count(input_mask, num_heads: int) -> tf.Tensor:
    """Denominator of `relation_kl`: heads x real tokens."""
    return tf.reduce_sum(_f32(input_mask)) * float(num_heads)
