"""Sentence-level task types: classification (GLUE, polarity, your CSV) and regression (STS-B).

Both read one text or a text pair per example (`tinybert_tf.data.sentences`)
and put one head on the pooled [CLS] state.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tinybert_tf.data import metrics as M
from tinybert_tf.data.sentences import make_dataset, packed_lengths
from tinybert_tf.distill import losses
from tinybert_tf.tasks.base import TaskType, predict_rows, register_task_type


class _SentenceTask(TaskType):
    is_regression = False
    supports_length_buckets = True

    def dataset(self, examples, tokenizer, max_seq_len, batch_size, *, drop_remainder=False,
                input_context=None, length_buckets=()):
        return make_dataset(examples, tokenizer, max_seq_len, batch_size,
                            drop_remainder=drop_remainder, input_context=input_context,
                            is_regression=self.is_regression, length_buckets=length_buckets)

    def row_lengths(self, examples, tokenizer, max_seq_len) -> np.ndarray:
        return packed_lengths(examples, tokenizer, max_seq_len)

    def cut_examples(self, examples, tokenizer, max_seq_len) -> int:
        """Packed one piece longer, a cut example fills every position."""
        if not len(examples):
            return 0
        return int(np.sum(packed_lengths(examples, tokenizer, max_seq_len + 1) > max_seq_len))

    def logits(self, model, examples, tokenizer, max_seq_len, batch_size,
               length_buckets=()) -> np.ndarray:
        """Float32 logits [N, outputs] in example order (bucketed: rows sorted by length)."""
        return predict_rows(model, self, examples, tokenizer, max_seq_len, batch_size,
                            length_buckets)

    @staticmethod
    def gold(examples: Sequence[Any]) -> np.ndarray:
        return _gold_array([ex.label for ex in examples])


def _gold_array(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.dtype == object and any(v is None for v in labels.reshape(-1)):
        raise ValueError("labels contain None (unlabelled test data cannot be scored).")
    return labels


# Classification metrics by name: f(pred ids [N], gold ids [N], num_classes) -> value.
def _acc_f1_mean(p, y, n):
    return (M.accuracy(p, y) + M.f1(p, y, positive=1)) / 2.0


CLASSIFICATION_METRICS = {
    "accuracy": lambda p, y, n: M.accuracy(p, y),
    "f1": lambda p, y, n: M.f1(p, y, positive=1),           # binary, class 1 (MRPC, QQP)
    "accuracy_f1_mean": _acc_f1_mean,
    "mcc": lambda p, y, n: M.matthews_corrcoef(p, y),       # CoLA
    "macro_f1": lambda p, y, n: M.macro_f1(p, y, n),
}


@register_task_type
class Classification(_SentenceTask):
    """One label per text (or pair) from `label_names`; soft cross-entropy
    against the teacher's distribution (Eq. 10); outputs class probabilities.

    metric_names: any of accuracy, f1 (binary, class 1), accuracy_f1_mean,
    mcc, macro_f1, per_class_f1 (one `f1_<label>` entry per class).
    """

    kind = "classification"
    head = "classifier"
    head_styles = {"pre_classifier": "pre_classifier"}
    output_name = "probabilities"

    def __init__(self, label_names: Sequence[str], metric_names: Sequence[str] = (),
                 primary_metric: Optional[str] = None):
        if len(label_names) < 2:
            raise ValueError(f"a classification task needs >= 2 labels, got {list(label_names)}.")
        super().__init__(label_names, metric_names, primary_metric)
        unknown = [m for m in self.metric_names
                   if m not in CLASSIFICATION_METRICS and m != "per_class_f1"]
        if unknown:
            raise ValueError(f"unknown classification metric(s) {', '.join(unknown)}; use "
                             f"any of {sorted(CLASSIFICATION_METRICS) + ['per_class_f1']}.")

    def default_metrics(self) -> tuple[str, ...]:
        return ("accuracy",)

    # losses
    def soft_count(self, inputs, num_outputs):
        return tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)

    def soft_sum(self, inputs, student_logits, teacher_logits, temperature):
        return losses.soft_cross_entropy(student_logits, teacher_logits, temperature,
                                         reduction="sum")

    def hard_count(self, inputs):
        return tf.reduce_sum(tf.cast(tf.cast(inputs["labels"], tf.int32) >= 0, tf.float32))

    def hard_sum(self, inputs, logits):
        return losses.label_cross_entropy(logits, inputs["labels"], reduction="sum")

    def label_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # evaluation
    def predict(self, model, examples, tokenizer, max_seq_len, batch_size,
                length_buckets=()) -> np.ndarray:
        """Class ids [N]."""
        return self.logits(model, examples, tokenizer, max_seq_len, batch_size,
                           length_buckets).argmax(-1)

    def score(self, predictions, examples) -> dict[str, float]:
        return self.score_labels(predictions, self.gold(examples))

    def score_labels(self, predictions, labels) -> dict[str, float]:
        """Metrics of class ids [N] (or logits / probabilities [N, C]) against gold ids [N]."""
        labels = _gold_array(labels)
        p = np.asarray(predictions)
        if p.ndim == 2:
            p = p.argmax(-1)
        p = p.astype(np.int64).reshape(-1)
        y = labels.astype(np.int64).reshape(-1)
        n = len(self.label_names)
        out: dict[str, float] = {}
        for name in self.metric_names:
            if name == "per_class_f1":
                for label, value in zip(self.label_names, M.per_class_f1(p, y, n)):
                    out[f"f1_{label}"] = float(value)
            else:
                out[name] = float(CLASSIFICATION_METRICS[name](p, y, n))
        return out

    # serving
    def serving_outputs(self, logits, label_names):
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                "label": tf.gather(label_names, tf.argmax(logits, axis=-1))}

    def tflite_output(self, logits):
        return tf.nn.softmax(logits, axis=-1)

    def agreement(self, reference, outputs, ctx=None):
        if not len(reference):
            return None
        return float(np.mean(np.argmax(outputs, -1) == np.argmax(reference, -1)))

    def tflite_metadata_kind(self, is_pair, lower_case):
        # The Task Library's BertNLClassifier feeds one lower-cased text.
        return "classifier" if is_pair or not lower_case else "bert_nl_classifier"


@register_task_type
class Regression(_SentenceTask):
    """One score per text (or pair); MSE to the teacher's score in the prediction
    layer; Pearson / Spearman on dev; outputs `score`."""

    kind = "regression"
    head = "regressor"
    head_styles = {"pre_classifier": "pre_regressor"}
    output_name = "score"
    is_regression = True
    predict_on_original_data = True  # paper Sec. 4.2 (STS-B)
    named_outputs = False
    has_answers = False  # a score: parity compares it within a tolerance, not by agreement

    def __init__(self, label_names: Sequence[str] = ("score",),
                 metric_names: Sequence[str] = (), primary_metric: Optional[str] = None):
        super().__init__(label_names or ("score",), metric_names,
                         primary_metric or "pearson_spearman_mean")

    def default_metrics(self) -> tuple[str, ...]:
        return ("pearson", "spearman", "pearson_spearman_mean")

    @property
    def num_outputs(self) -> int:
        return 1

    @classmethod
    def for_model(cls, model) -> "Regression":
        return cls()

    # losses
    def soft_count(self, inputs, num_outputs):
        rows = tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)
        return rows * float(num_outputs)

    def soft_sum(self, inputs, student_logits, teacher_logits, temperature):
        return losses.prediction_mse(student_logits, teacher_logits, reduction="sum")

    def hard_count(self, inputs):
        return tf.cast(tf.size(inputs["labels"]), tf.float32)

    def hard_sum(self, inputs, logits):
        return losses.label_mse(logits, inputs["labels"], reduction="sum")

    # evaluation
    def predict(self, model, examples, tokenizer, max_seq_len, batch_size,
                length_buckets=()) -> np.ndarray:
        """Scores [N]."""
        return self.logits(model, examples, tokenizer, max_seq_len, batch_size,
                           length_buckets)[:, 0]

    def score(self, predictions, examples) -> dict[str, float]:
        return self.score_labels(predictions, self.gold(examples))

    def score_labels(self, predictions, labels) -> dict[str, float]:
        """Pearson / Spearman of scores [N] (or [N, 1]) against gold scores [N]."""
        p = np.asarray(predictions, np.float64).reshape(-1)
        y = _gold_array(labels).astype(np.float64).reshape(-1)
        pr, sp = M.pearson(p, y), M.spearman(p, y)
        values = {"pearson": pr, "spearman": sp, "pearson_spearman_mean": (pr + sp) / 2.0}
        return {k: float(values[k]) for k in self.metric_names}

    # serving
    def serving_outputs(self, logits, label_names):
        return {"logits": logits, "score": logits[:, 0]}

    def tflite_output(self, logits):
        return logits

    def tflite_metadata_kind(self, is_pair, lower_case):
        return "regressor"  # no Task Library API scores text
