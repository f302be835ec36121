"""Token classification (NER and other per-word tags): one tag per word, on its first piece.

Data: examples are sentences of words (`words`, else `text_a` split at
whitespace) with one tag id per word as the label. `conll.align_words` packs
them as `[CLS] pieces [SEP]`; a word's FIRST word piece carries its tag, every
other position carries -1 and counts in no loss and no metric.

Losses: the prediction layer is distilled per word, soft cross-entropy over
the tags at the labelled positions (Eq. 10 applied to each word); the ground
truth is cross-entropy on the gold tags at the same positions. The
intermediate layers (embd, attn, hidn) are distilled as for any task.

Metrics: with IOB2 tags, entity-level precision / recall / F1 (strict IOB2
spans, seqeval's mode="strict"; primary "f1") and token accuracy; with other
tags (e.g. part of speech) token accuracy alone. Words cut off by max_seq_len
are predicted "O" (the first tag for a tag set without "O"). The evaluate
stage writes each model's predictions as `predictions.conll` (word, gold tag,
predicted tag: conlleval's input).

Serving (SavedModel `serving_default`): `text` string [B], each sentence split
at ASCII whitespace (`tf.strings.split`, the same as `conll.split_words`), ->
  words               string [B, W]  the words, "" past num_words
  tags                string [B, W]  one tag name per word, "" past num_words
  tag_ids             int32 [B, W]   tag ids, -1 past num_words
  word_probabilities  float32 [B, W, C]  per word, 0 past num_words
  num_words           int32 [B]
with W the batch's longest sentence (padded outputs: signatures cannot return
ragged tensors). A word cut off by max_seq_len gets tag "O" and all-zero
probabilities. `serve_ids` returns per word piece: logits and probabilities
[B, L, C] and `tags` string [B, L]. TFLite: `probabilities` [1, L, C].
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf.data import buckets, entities
from tinybert_tf.data.conll import align_words, split_words, word_predictions
from tinybert_tf.distill import losses
from tinybert_tf.files import write_bytes_atomic
from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.tasks.base import TaskType, forward_fn, register_task_type

TOKEN_METRICS = ("f1", "precision", "recall", "accuracy")
PREDICTIONS_FILE = "predictions.conll"
_ALIGNMENTS_KEPT = 8


class MaskedTokenAccuracy(keras.metrics.Metric):
    """Share of labelled positions (label >= 0) whose arg-max logit is the label.

    update_state(labels int [B, L], logits [B, L, C]).
    """

    def __init__(self, name: str = "accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y = tf.cast(y_true, tf.int32)
        keep = y >= 0
        hit = keep & (tf.argmax(y_pred, axis=-1, output_type=tf.int32) == y)
        self.correct.assign_add(tf.reduce_sum(tf.cast(hit, tf.float32)))
        self.total.assign_add(tf.reduce_sum(tf.cast(keep, tf.float32)))

    def result(self):
        return tf.math.divide_no_nan(self.correct, self.total)


def _pad_to(ids: np.ndarray, length: int) -> np.ndarray:
    """Per-piece ids [b, bucket] -> [b, length] (zeros past the bucket: padding)."""
    return np.pad(ids, [(0, 0), (0, length - ids.shape[1])])


def words_of(example: Any) -> list[str]:
    """An example's words: its `words`, else its `text_a` split at whitespace."""
    words = getattr(example, "words", None)
    return list(words) if words else split_words(example.text_a)


@register_task_type
class TokenClassification(TaskType):
    """One tag per word from `label_names` (see the module docstring).

    metric_names: any of f1, precision, recall (entity level; IOB2 tags only)
    and accuracy (token level).
    """

    kind = "token_classification"
    head = "token_classifier"
    own_flags = ("tag_column",)
    output_name = "probabilities"
    # The text signature answers per word, the Keras reference per piece: parity
    # compares the ids signature, and `agreement` maps both to words.
    parity_through_text = False

    def __init__(self, label_names: Sequence[str], metric_names: Sequence[str] = (),
                 primary_metric: Optional[str] = None):
        if len(label_names) < 2:
            raise ValueError(f"a token classification task needs >= 2 tags, got "
                             f"{list(label_names)}.")
        super().__init__(label_names, metric_names, primary_metric)
        allowed = TOKEN_METRICS if self.is_iob2 else ("accuracy",)
        unknown = [m for m in self.metric_names if m not in allowed]
        if unknown:
            raise ValueError(f"unknown token classification metric(s) {unknown} for tags "
                             f"{list(self.label_names)}; use any of {list(allowed)}.")
        # Export alignments by word counts (see `export_inputs` / `score_labels`).
        self._alignments: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def is_iob2(self) -> bool:
        """Whether every tag is O / B-X / I-X (then entity metrics apply)."""
        return all(entities.is_iob2_tag(t) for t in self.label_names)

    @property
    def outside_id(self) -> int:
        """The tag id words without a prediction get: "O", else 0."""
        names = list(self.label_names)
        return names.index(entities.OUTSIDE) if entities.OUTSIDE in names else 0

    def default_metrics(self) -> tuple[str, ...]:
        return TOKEN_METRICS if self.is_iob2 else ("accuracy",)

    def tflite_metadata_kind(self, is_pair: bool, lower_case: bool) -> str:
        """The TFLite metadata layout of this task's models."""
        return "token_classifier"

    # --- data -------------------------------------------------------------------
    def align(self, examples: Sequence[Any], tokenizer, max_seq_len: int):
        """Examples -> `conll.AlignedWords` (labels -1 off first pieces and when unlabelled)."""
        tags = [None if ex.label is None else list(ex.label) for ex in examples]
        return align_words(tokenizer, [words_of(ex) for ex in examples], tags, max_seq_len)

    supports_length_buckets = True

    def dataset(self, examples, tokenizer, max_seq_len, batch_size, *, drop_remainder=False,
                input_context=None, length_buckets=()):
        """(inputs int32 [B, L] each, labels int32 [B, L]: tag ids on first pieces, -1
        elsewhere); `batch_size` is global (per-replica batches with an input context).
        With `length_buckets` L is the batch's bucket, not max_seq_len."""
        aligned = self.align(examples, tokenizer, max_seq_len)
        ds = tf.data.Dataset.from_tensor_slices((aligned.inputs, aligned.labels))
        if input_context is not None:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        if length_buckets:
            ds = ds.map(lambda x, y: buckets.trim((x, y), length_buckets, max_seq_len))
        return ds.prefetch(tf.data.AUTOTUNE)

    def row_lengths(self, examples, tokenizer, max_seq_len) -> np.ndarray:
        aligned = self.align(examples, tokenizer, max_seq_len)
        return aligned.inputs["input_mask"].sum(axis=1).astype(np.int64)

    # --- losses -------------------------------------------------------------------
    @staticmethod
    def _labels(inputs: dict) -> tf.Tensor:
        if "labels" not in inputs:
            raise ValueError("token classification losses need the tag labels [B, L] (they "
                             "mark each word's first piece): (inputs, labels) batches.")
        return tf.cast(inputs["labels"], tf.int32)

    def soft_count(self, inputs, num_outputs):
        """Labelled positions (one per word) in this replica's batch."""
        return tf.reduce_sum(tf.cast(self._labels(inputs) >= 0, tf.float32))

    def soft_sum(self, inputs, student_logits, teacher_logits, temperature):
        return losses.token_soft_cross_entropy(student_logits, teacher_logits,
                                               self._labels(inputs), temperature,
                                               reduction="sum")

    def hard_count(self, inputs):
        return self.soft_count(inputs, self.num_outputs)

    def hard_sum(self, inputs, logits):
        return losses.label_cross_entropy(logits, self._labels(inputs), reduction="sum")

    def label_metrics(self):
        return [MaskedTokenAccuracy(name="accuracy")]

    # --- evaluation -----------------------------------------------------------------
    def predict(self, model, examples, tokenizer, max_seq_len, batch_size,
                length_buckets=()) -> list[np.ndarray]:
        """Per sentence, int tag ids [num words]. With `length_buckets`, sentences run
        sorted by length in bucket-padded batches."""
        aligned = align_words(tokenizer, [words_of(ex) for ex in examples], None, max_seq_len)
        forward = forward_fn(model)
        inputs, order = aligned.inputs, None
        if length_buckets:
            order = buckets.length_order(inputs["input_mask"].sum(axis=1))
            inputs = {k: v[order] for k, v in inputs.items()}
        ds = tf.data.Dataset.from_tensor_slices(inputs).batch(batch_size).map(
            lambda x: buckets.trim(x, length_buckets, max_seq_len))
        ids = [_pad_to(forward(batch).numpy().argmax(-1), max_seq_len) for batch in ds]
        piece_ids = (np.concatenate(ids) if ids else
                     np.zeros((0, max_seq_len), np.int64))  # [N, L]
        if order is not None:
            piece_ids = buckets.unsort(piece_ids, order)
        return word_predictions(piece_ids, aligned.word_index, aligned.num_words,
                                fill=self.outside_id)

    def write_predictions(self, directory: str, predictions: Sequence[Sequence[int]],
                          examples: Sequence[Any]) -> list[str]:
        """predictions.conll: per word `word gold predicted` (conlleval's input; `word
        predicted` for unlabelled examples), a blank line after each sentence."""
        names = self.label_names
        lines = []
        for ex, pred in zip(examples, predictions):
            gold = ex.label if ex.label is not None else [None] * len(pred)
            for word, g, p in zip(words_of(ex), gold, pred):
                word = "_".join(split_words(word)) or "_"  # one column, as conlleval splits
                lines.append(f"{word} {names[int(g)]} {names[int(p)]}\n" if g is not None
                             else f"{word} {names[int(p)]}\n")
            lines.append("\n")
        tf.io.gfile.makedirs(directory)
        path = f"{directory.rstrip('/')}/{PREDICTIONS_FILE}"
        write_bytes_atomic(path, "".join(lines).encode("utf-8"))
        return [path]

    def score(self, predictions, examples) -> dict[str, float]:
        return self.score_words(predictions, [ex.label for ex in examples])

    def score_words(self, predictions: Sequence[Sequence[int]],
                    labels: Sequence[Optional[Sequence[int]]]) -> dict[str, float]:
        """Metrics of per-word tag ids against gold per-word tag ids (one list per sentence)."""
        if any(y is None for y in labels):
            raise ValueError("labels contain None (unlabelled test data cannot be scored).")
        names = self.label_names
        gold = [[names[int(i)] for i in y] for y in labels]
        pred = [[names[int(i)] for i in p] for p in predictions]
        if self.is_iob2:
            values = entities.compute_metrics(gold, pred)
        else:
            values = {"accuracy": entities.token_accuracy(gold, pred)}
        return {k: float(values[k]) for k in self.metric_names}

    def score_labels(self, predictions, labels) -> dict[str, float]:
        """Metrics of export outputs against gold per-word tag ids.

        predictions: per-word tag ids (one sequence per sentence), or per-piece
        outputs [N, L, C] of inputs made by `export_inputs` (whose word positions
        it remembers, by the sentences' word counts).
        """
        p = predictions
        if isinstance(p, np.ndarray) and p.ndim == 3:
            key = tuple(len(y) for y in labels)
            if key not in self._alignments:
                raise ValueError("per-piece outputs [N, L, C] need their word positions: "
                                 "pack the sentences with export_inputs(...) first, or pass "
                                 "per-word tag ids.")
            word_index, num_words = self._alignments[key]
            p = word_predictions(p, word_index, num_words, fill=self.outside_id)
        return self.score_words(p, labels)

    # --- serving --------------------------------------------------------------------
    def serving_outputs(self, logits, label_names):
        """Per word piece: logits, probabilities [B, L, C] and `tags` string [B, L]."""
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                "tags": tf.gather(label_names, tf.argmax(logits, axis=-1))}

    def tflite_output(self, logits):
        return tf.nn.softmax(logits, axis=-1)

    def text_input_specs(self, is_pair: bool) -> list[tf.TensorSpec]:
        if is_pair:
            raise ValueError("token classification tags one sentence per example; it has no "
                             "pair (text_b) input.")
        return [tf.TensorSpec([None], tf.string, name="text")]

    def serve_text(self, module, *texts: tf.Tensor) -> dict[str, tf.Tensor]:
        """Sentences string [B] -> per-word tags (module docstring), in graph, with the
        alignment of `conll.align_words` (a word without pieces gets one [UNK])."""
        tok, length = module.tokenizer, module.max_seq_len
        words = tf.strings.split(texts[0])  # [B, (W)]
        pieces = tok.tokenize(words.flat_values)  # [Wt, (P)]
        real = pieces.row_lengths()  # [Wt]
        count = tf.maximum(real, 1)
        extra = count - real  # 1 for a word without pieces
        unk = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(extra)], tf.cast(tok.unk_id, pieces.dtype)), extra)
        pieces = tf.concat([pieces, unk], axis=1)
        per_sentence = tf.RaggedTensor.from_row_lengths(pieces, words.row_lengths())
        inputs = tok.pack([per_sentence.merge_dims(1, 2)], length)
        logits = module.logits(inputs)  # [B, L, C]
        # Each word's first piece: its offset among its sentence's pieces, + 1 for [CLS].
        first = tf.cumsum(count, exclusive=True)  # [Wt] in all the batch's pieces
        sentence = words.value_rowids()  # [Wt]
        starts = tf.concat([first, tf.zeros([1], first.dtype)], 0)
        offset = first - tf.gather(tf.gather(starts, words.row_starts()), sentence)
        fits = offset < length - 2  # else cut off by max_seq_len
        at = tf.stack([sentence, tf.minimum(offset + 1, length - 1)], axis=1)
        word_logits = tf.gather_nd(logits, at)  # [Wt, C]
        probs = tf.where(fits[:, None], tf.nn.softmax(word_logits, axis=-1), 0.0)
        ids = tf.where(fits, tf.argmax(word_logits, axis=-1, output_type=tf.int32),
                       self.outside_id)

        def padded(values, fill):
            return tf.RaggedTensor.from_value_rowids(
                values, sentence, nrows=words.nrows()).to_tensor(default_value=fill)

        return {"words": words.to_tensor(default_value=""),
                "tags": padded(tf.gather(module.label_names, ids), ""),
                "tag_ids": padded(ids, -1),
                "word_probabilities": padded(probs, 0.0),
                "num_words": tf.cast(words.row_lengths(), tf.int32)}

    def export_inputs(self, tokenizer, texts_a, texts_b, max_seq_len):
        """Sentences -> packed inputs [N, L] + `word_index` [N, L] and `num_words` [N]
        (`conll.align_words`), words split at whitespace as the text signature does."""
        if texts_b is not None and any(b is not None for b in texts_b):
            raise ValueError("token classification tags single sentences; got text pairs.")
        aligned = align_words(tokenizer, [split_words(t) for t in texts_a], None, max_seq_len)
        key = tuple(int(n) for n in aligned.num_words)
        if key not in self._alignments:  # the first set packed (the dev set) wins a tie
            if len(self._alignments) >= _ALIGNMENTS_KEPT:
                self._alignments.pop(next(iter(self._alignments)))
            self._alignments[key] = (aligned.word_index, aligned.num_words)
        return {**aligned.inputs, "word_index": aligned.word_index,
                "num_words": aligned.num_words}

    def agreement(self, reference, outputs, ctx=None):
        """Share of words (first pieces) whose arg-max tag matches the Keras model's."""
        if not len(reference):
            return None
        positions = self._word_index(ctx) >= 0 if ctx is not None else None
        same = np.argmax(outputs, -1) == np.argmax(reference, -1)  # [N, L]
        if positions is None or positions.shape != same.shape:
            return float(np.mean(same))
        return float(np.mean(same[positions])) if positions.any() else None

    def _word_index(self, ctx) -> np.ndarray:
        """First-piece word indices [N, L] of the export's dev sentences."""
        index = getattr(ctx, "dev_inputs", {}).get("word_index")
        if index is None:
            tokenizer = load_tokenizer(ctx.model, ctx.max_seq_len)
            index = align_words(tokenizer, [split_words(t) for t in ctx.dev_a], None,
                                ctx.max_seq_len).word_index
        return np.asarray(index)
