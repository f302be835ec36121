"""Span question answering (SQuAD v1.1 / v2.0): the task type and `--task=squad1.1|squad2.0`.

What the paper's Appendix B does, with BERT's SQuAD recipe:

- Data: examples are questions (`data.squad.SquadExample`); the task type
  turns them into BERT's windows (`make_features`) inside `dataset` and
  `predict`, so every stage handles questions and this module handles windows.
  Labels: int32 [B, 2], the start and end piece of the answer in each window
  (0, i.e. [CLS], when the window does not hold it or there is none).
- Losses, per window, over its REAL positions (input_mask = 1: [CLS],
  question, context, [SEP]s; padding excluded from both distributions):
    soft (Eq. 10): CE(softmax(z_t/t), log_softmax(z_s/t)) for the start and
      for the end distribution; the element is one window and its value
      (CE_start + CE_end) / 2, so the loss is the mean over windows of
      (CE_start + CE_end) / 2 -- BERT's SQuAD loss with soft targets;
    hard: BERT's SQuAD loss, the mean over windows of (CE(start) + CE(end)) / 2
      against the gold positions (BERT also softmaxes over padding; no answer
      is ever there, and excluding it makes hard and soft losses compare the
      same distributions).
  The prediction-layer phase trains on the ORIGINAL training set even when
  the intermediate phase used augmented data (paper, Appendix B).
- Prediction: logits of all windows of a question -> n-best spans
  (`--n_best_size`, `--max_answer_len`) -> the answer text, a slice of the
  original context (`data.squad_answers.postprocess`).
- Metrics: the official EM / F1 on the 0-100 scale (`exact_match`, `f1`;
  primary `f1`). SQuAD 2.0 adds total, HasAns_*, NoAns_*, best_exact /
  best_f1 with their thresholds, and `null_threshold`: the official script's
  best-F1 threshold on the null-score difference, searched over the dev set's
  best non-empty answers, moved halfway to the next larger difference so it
  never sits on a question's score (`_effective_threshold`). exact_match / f1
  (and predictions.json) are at that threshold, so they equal best_exact /
  best_f1 up to ties: like BERT's reported v2.0 numbers, they are tuned on dev.
- The threshold is stored with the model: `model_metadata(metrics)` gives
  config.json's metadata a "squad" entry (version, null_threshold, window
  settings) whenever the task and teacher stages save a model, and serving
  (`serve_text`) reads it from there.
- Serving: the SavedModel text signature takes `question` and `context`
  strings, builds the windows and picks the answer in the graph
  (`tasks.span_graph`) and returns `answer`, `score`, `start_logits`,
  `end_logits` (+ `null_score_diff` for 2.0); the ids signature returns
  `logits` [B, L, 2], `start_logits`, `end_logits`; TFLite has the Task
  Library BertQuestionAnswerer's outputs, `end_logits` then `start_logits`,
  float32 [1, L] (the Task Library runs only L = 384). Parity compares the
  answers of each format with Keras's on the dev windows (EM).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tinybert_tf.data import squad, squad_answers, squad_metrics
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.squad import SquadExample, SquadFeature
from tinybert_tf.data.squad_answers import SquadPredictions
from tinybert_tf.data.squad_source import squad_source
from tinybert_tf.distill import losses
from tinybert_tf.files import write_json_atomic
from tinybert_tf.tasks import span_graph
from tinybert_tf.tasks.base import TaskType, forward_fn, register_task_type
from tinybert_tf.tasks.catalog import Task, TaskConfig, refuse_layout_flags, register_task
from tinybert_tf.tokenizer import INPUT_NAMES

DEFAULT_MAX_SEQ_LEN = 384  # BERT's SQuAD length (and the only one the Task Library feeds)
PREDICTIONS_FILE = "predictions.json"
NULL_ODDS_FILE = "null_odds.json"
# Finite stand-in for "masked": exp() of it is exactly 0 in float32, and
# 0 * (it / t) stays 0 (no inf * 0 = NaN) for any temperature t >= 1e-20.
_MASKED = -1e9
# Examples tokenised per step while streaming training windows.
_CHUNK = 256
# Extra arrays `export_inputs` adds for `agreement` (runtimes read only INPUT_NAMES).
_EXPORT_EXTRAS = ("example_index", "token_char_spans", "token_is_max_context")


def _masked_positions(logits: tf.Tensor, input_mask: tf.Tensor) -> tf.Tensor:
    """[B, L, 2] logits -> [B, 2, L] float32, padded positions at `_MASKED`."""
    z = tf.cast(logits, tf.float32)
    real = tf.cast(input_mask, tf.bool)[:, :, None]
    return tf.transpose(tf.where(real, z, _MASKED), [0, 2, 1])


@register_task_type
class SpanQA(TaskType):
    """Extractive question answering (see the module docstring).

    Args:
      version: "1.1" or "2.0" (unanswerable questions, null threshold).
      max_query_len, doc_stride: windows, as BERT's run_squad.
      n_best_size, max_answer_len: post-processing.
      null_threshold: the 2.0 threshold used when a model stores none.
    """

    kind = "span_qa"
    head = "span"
    own_flags = ("max_query_len", "doc_stride", "n_best_size", "max_answer_len")
    output_name = "logits"
    predict_on_original_data = True  # paper, Appendix B
    named_outputs = False  # start / end are positions of the head, not labels to reorder
    parity_through_text = False

    def __init__(self, version: str = "1.1", max_query_len: int = 64, doc_stride: int = 128,
                 n_best_size: int = 20, max_answer_len: int = 30,
                 metric_names: Sequence[str] = (), primary_metric: Optional[str] = None,
                 null_threshold: float = 0.0):
        super().__init__(("start", "end"), metric_names, primary_metric or "f1")
        self.version = squad_metrics.squad_version(version)
        for flag, value in (("--max_query_len", max_query_len), ("--doc_stride", doc_stride),
                            ("--n_best_size", n_best_size),
                            ("--max_answer_len", max_answer_len)):
            if int(value) < 1:
                raise ValueError(f"{flag}={value}: must be >= 1.")
        self.max_query_len, self.doc_stride = int(max_query_len), int(doc_stride)
        self.n_best_size, self.max_answer_len = int(n_best_size), int(max_answer_len)
        self.null_threshold = float(null_threshold)
        self._features: Optional[tuple[Any, Any, int, list[SquadFeature]]] = None

    def default_metrics(self) -> tuple[str, ...]:
        return ("exact_match", "f1")

    def settings(self) -> dict[str, Any]:
        return {"version": self.version, "max_query_len": self.max_query_len,
                "doc_stride": self.doc_stride, "n_best_size": self.n_best_size,
                "max_answer_len": self.max_answer_len}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.settings()}

    @classmethod
    def for_model(cls, model) -> "SpanQA":
        """The task type a span model was saved with (its config.json "squad" entry)."""
        stored = dict((getattr(model, "metadata", None) or {}).get("squad") or {})
        kwargs = {k: stored[k] for k in ("version", "max_query_len", "doc_stride",
                                         "n_best_size", "max_answer_len") if k in stored}
        return cls(**kwargs, null_threshold=float(stored.get("null_threshold", 0.0)))

    def model_metadata(self, metrics: dict[str, float]) -> dict[str, Any]:
        """config.json metadata of a model evaluated with `metrics`: the settings and,
        for 2.0, the dev-chosen null threshold that serving applies."""
        entry = self.settings()
        if self.version == "2.0":
            entry["null_threshold"] = float(metrics.get("null_threshold", self.null_threshold))
        return {"squad": entry}

    def threshold_of(self, model) -> float:
        """The null threshold stored with `model` (this task's default when none is)."""
        stored = (getattr(model, "metadata", None) or {}).get("squad") or {}
        return float(stored.get("null_threshold", self.null_threshold))

    # --- data ---------------------------------------------------------------------------
    def features(self, examples: Sequence[SquadExample], tokenizer,
                 max_seq_len: int) -> list[SquadFeature]:
        """BERT's windows of `examples` (the last call's are reused for the same list)."""
        cached = self._features
        if cached is not None and cached[0] is examples and cached[1] is tokenizer \
                and cached[2] == max_seq_len:
            return cached[3]
        feats = squad.make_features(examples, tokenizer, max_seq_len, self.doc_stride,
                                    self.max_query_len)
        self._features = (examples, tokenizer, max_seq_len, feats)
        return feats

    def dataset(self, examples, tokenizer, max_seq_len, batch_size, *, drop_remainder=False,
                input_context=None) -> tf.data.Dataset:
        """Questions -> their windows as (inputs int32 [B, L], labels int32 [B, 2]).

        Windows are made _CHUNK questions at a time while the dataset is read, so an
        augmented training set never sits in memory as windows. B counts windows.
        """
        examples = list(examples)
        if not examples:
            raise DataError("span QA dataset: no examples.")
        L = int(max_seq_len)

        def chunks():
            for s in range(0, len(examples), _CHUNK):
                arrays = squad.feature_arrays(squad.make_features(
                    examples[s:s + _CHUNK], tokenizer, L, self.doc_stride, self.max_query_len))
                labels = np.stack([arrays["start_positions"], arrays["end_positions"]], -1)
                yield {k: arrays[k] for k in INPUT_NAMES}, labels

        spec = ({k: tf.TensorSpec([None, L], tf.int32) for k in INPUT_NAMES},
                tf.TensorSpec([None, 2], tf.int32))
        ds = tf.data.Dataset.from_generator(chunks, output_signature=spec).unbatch()
        if input_context is not None:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)

    def dataset_rows(self, examples, tokenizer, max_seq_len) -> int:
        """Windows of `examples` (each question gives one or more)."""
        examples = list(examples)
        return sum(len(squad.make_features(examples[s:s + _CHUNK], tokenizer, int(max_seq_len),
                                           self.doc_stride, self.max_query_len))
                   for s in range(0, len(examples), _CHUNK))

    # --- losses -------------------------------------------------------------------------
    def soft_count(self, inputs, num_outputs):
        """One element per window."""
        return tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)

    def soft_sum(self, inputs, student_logits, teacher_logits, temperature):
        """sum over windows of (CE_start + CE_end) / 2 at temperature t, real positions only."""
        mask = inputs["input_mask"]
        ce = losses.soft_cross_entropy(_masked_positions(student_logits, mask),
                                       _masked_positions(teacher_logits, mask),
                                       temperature, reduction="sum")
        return ce / 2.0

    def hard_count(self, inputs):
        return tf.cast(tf.shape(inputs["labels"])[0], tf.float32)

    def hard_sum(self, inputs, logits):
        """sum over windows of (CE(start) + CE(end)) / 2 against labels [B, 2]."""
        z = _masked_positions(logits, inputs["input_mask"])
        return losses.label_cross_entropy(z, inputs["labels"], reduction="sum") / 2.0

    # --- evaluation -----------------------------------------------------------------------
    def window_logits(self, model, arrays: dict[str, np.ndarray],
                      batch_size: int) -> np.ndarray:
        """float32 [N, L, 2] logits of packed windows."""
        forward = forward_fn(model)
        n = len(arrays["input_word_ids"])
        out = [forward({k: tf.constant(arrays[k][s:s + batch_size]) for k in INPUT_NAMES})
               .numpy() for s in range(0, n, batch_size)]
        return np.concatenate(out, 0)

    def predict(self, model, examples, tokenizer, max_seq_len, batch_size) -> SquadPredictions:
        """n-best answers of every question from the logits of all its windows."""
        feats = self.features(examples, tokenizer, max_seq_len)
        logits = self.window_logits(model, squad.feature_arrays(feats), batch_size)
        return self.postprocess(examples, feats, logits)

    def postprocess(self, examples, feats, logits: np.ndarray,
                    null_threshold: float = 0.0) -> SquadPredictions:
        return squad_answers.postprocess(examples, feats, logits[..., 0], logits[..., 1],
                                         self.n_best_size, self.max_answer_len,
                                         self.version, null_threshold)

    def answers(self, predictions: SquadPredictions, examples: Sequence[SquadExample]
                ) -> tuple[dict[str, str], dict[str, float]]:
        """(question id -> answer text, metrics): 2.0 at the dev-chosen null threshold."""
        gold = squad.gold_answers(examples)
        if self.version == "1.1":
            answers = dict(predictions.predictions)
            return answers, squad_metrics.evaluate(gold, answers, "1.1")
        diffs = predictions.null_score_diff
        search = squad_metrics.evaluate(gold, predictions.best_non_null, "2.0", na_probs=diffs)
        threshold = _effective_threshold(search, gold, diffs)
        answers = {q: "" if diffs[q] > threshold else text
                   for q, text in predictions.best_non_null.items()}
        metrics = squad_metrics.evaluate(gold, answers, "2.0")
        for key in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"):
            metrics[key] = search[key]
        metrics["null_threshold"] = float(threshold)
        return answers, metrics

    def score(self, predictions: SquadPredictions, examples) -> dict[str, float]:
        """The official EM / F1 (0-100) and, for 2.0, the HasAns / NoAns split and threshold."""
        return {k: float(v) for k, v in self.answers(predictions, examples)[1].items()}

    def write_predictions(self, directory: str, predictions: SquadPredictions,
                          examples: Sequence[SquadExample]) -> list[str]:
        """predictions.json (question id -> answer text, "" = none) as the official
        scripts read it; for 2.0 also null_odds.json (their --na-prob-file)."""
        answers, _ = self.answers(predictions, examples)
        tf.io.gfile.makedirs(directory)
        path = f"{directory.rstrip('/')}/{PREDICTIONS_FILE}"
        squad_metrics.write_predictions(path, answers)
        written = [path]
        if self.version == "2.0":
            odds = f"{directory.rstrip('/')}/{NULL_ODDS_FILE}"
            write_json_atomic(odds, {q: (d if math.isfinite(d) else 1e30)
                                     for q, d in predictions.null_score_diff.items()})
            written.append(odds)
        return written

    # --- serving ------------------------------------------------------------------------
    def serving_outputs(self, logits, label_names):
        """ids signature: logits [B, L, 2], start_logits and end_logits [B, L]."""
        return {"logits": logits, "start_logits": logits[..., 0], "end_logits": logits[..., 1]}

    def tflite_output(self, logits):
        """The space parity compares: the logits [B, L, 2]."""
        return logits

    def tflite_outputs(self, logits):
        return {"end_logits": logits[..., 1], "start_logits": logits[..., 0]}

    def tflite_outputs_names(self) -> tuple[str, ...]:
        # BertQuestionAnswerer reads end_logits first (output 0 without metadata).
        return ("end_logits", "start_logits")

    def from_tflite(self, outputs: Any) -> np.ndarray:
        return np.stack([outputs["start_logits"], outputs["end_logits"]], -1)

    def tflite_metadata_kind(self, is_pair: bool, lower_case: bool) -> str:
        """The Task Library's BertQuestionAnswerer (it feeds only max_seq_len 384)."""
        return "bert_question_answerer"

    def text_input_specs(self, is_pair: bool) -> list[tf.TensorSpec]:
        return [tf.TensorSpec([None], tf.string, name="question"),
                tf.TensorSpec([None], tf.string, name="context")]

    def serve_text(self, module, question: tf.Tensor, context: tf.Tensor
                   ) -> dict[str, tf.Tensor]:
        """question, context: string [B] -> answer (string [B]), score [B], start_logits
        and end_logits [B, L] (+ null_score_diff [B] for 2.0); windows built in graph."""
        windows = span_graph.window_inputs(module.tokenizer, question, context,
                                           module.max_seq_len, self.max_query_len,
                                           self.doc_stride)
        logits = module.logits({k: windows[k] for k in INPUT_NAMES})
        return span_graph.select_answers(
            windows, logits, context, self.n_best_size, self.max_answer_len,
            self.version == "2.0", tf.constant(self.threshold_of(module.model), tf.float32))

    def export_inputs(self, tokenizer, texts_a, texts_b, max_seq_len):
        """(question, context) pairs -> their windows [N, L], plus what `agreement` needs
        to map windows back to answers (example_index, token_char_spans, is_max)."""
        if texts_b is None:
            raise ValueError("span QA export needs (question, context) pairs.")
        examples = [SquadExample(str(i), "", q, c, []) for i, (q, c)
                    in enumerate(zip(texts_a, texts_b))]
        feats = squad.make_features(examples, tokenizer, max_seq_len, self.doc_stride,
                                    self.max_query_len)
        arrays = {k: v for k, v in squad.feature_arrays(feats).items()
                  if k in INPUT_NAMES or k == "example_index"}
        arrays["token_char_spans"] = np.stack([f.token_char_spans for f in feats])
        arrays["token_is_max_context"] = np.stack([f.token_is_max_context for f in feats]
                                                  ).astype(np.int32)
        return arrays

    def agreement(self, reference, outputs, ctx=None) -> Optional[float]:
        """Share of dev questions whose answer from `outputs` is the Keras answer
        (the official exact-match rule), both through `postprocess`."""
        if ctx is None or ctx.dev_b is None or not len(reference):
            return None
        examples, feats = _examples_and_features(ctx.dev_a, ctx.dev_b, ctx.dev_inputs)
        threshold = self.threshold_of(ctx.model)
        ref = self.postprocess(examples, feats, np.asarray(reference), threshold).predictions
        got = self.postprocess(examples, feats, np.asarray(outputs), threshold).predictions
        return float(np.mean([squad_metrics.exact_match_score(got[q], ref[q]) for q in ref]))


def _effective_threshold(search: dict[str, float], gold: dict[str, list[str]],
                         diffs: dict[str, float]) -> float:
    """The null threshold that gives the official search's best F1 on these scores,
    placed between two score differences, never on one.

    The official search returns the difference of the last question it answers, so
    that question sits exactly on the threshold and a rounding change of 1e-8 (another
    CPU's kernels, another runtime) flips its answer. The same dev answers come from
    any threshold from that difference up to (not including) the next larger one; we
    take the midpoint, so every dev question keeps a margin of half the gap to its
    neighbour. Two more cases: the official script reports 0.0 when answering no
    question is best (right for its probabilities in [0, 1], wrong for BERT's
    null-score differences, which may be negative), and +inf when every question with
    a valid span is answered; they become 1.0 below the smallest and 1.0 above the
    largest finite difference.
    """
    finite = sorted({d for d in diffs.values() if math.isfinite(d)})
    if not finite:
        return 0.0  # no question has a valid span: every threshold answers "" everywhere
    nothing = 100.0 * sum(1 for q in gold if not gold[q]) / len(gold)
    if search["best_f1"] <= nothing:
        return finite[0] - 1.0
    threshold = search["best_f1_thresh"]
    above = [d for d in finite if d > threshold]
    if not math.isfinite(threshold) or not above:
        return finite[-1] + 1.0
    return float(threshold + (above[0] - threshold) / 2.0)


def _examples_and_features(questions: Sequence[str], contexts: Sequence[str],
                           arrays: dict[str, np.ndarray]
                           ) -> tuple[list[SquadExample], list[SquadFeature]]:
    """The examples and features `SpanQA.export_inputs` packed into `arrays`."""
    examples = [SquadExample(str(i), "", q, c, []) for i, (q, c)
                in enumerate(zip(questions, contexts))]
    idx = arrays["example_index"]
    feats = [SquadFeature(int(e), str(e), 0, arrays["input_word_ids"][i],
                          arrays["input_mask"][i], arrays["input_type_ids"][i], 0, 0,
                          arrays["token_char_spans"][i],
                          arrays["token_is_max_context"][i].astype(bool))
             for i, e in enumerate(idx)]
    return examples, feats


# --- --task=squad1.1 | squad2.0 ------------------------------------------------------------

def _squad_task(config: TaskConfig, version: str) -> Task:
    refuse_layout_flags(config, "reads SQuAD JSON, whose fields are fixed")
    if config.data_dir:
        raise DataError(f"--data_dir={config.data_dir} is for GLUE tasks; --task={config.task} "
                        "reads --train_file and --validation_file (SQuAD JSON): drop "
                        "--data_dir.")
    length = int(config.max_seq_len) or DEFAULT_MAX_SEQ_LEN
    if length - 3 - int(config.max_query_len) < 1:
        raise ValueError(f"--max_seq_len={length} leaves no room for context after "
                         f"--max_query_len={config.max_query_len} question pieces, [CLS] and "
                         "two [SEP]; lower --max_query_len (BERT: 64 at 384).")
    task_type = SpanQA(version, config.max_query_len, config.doc_stride, config.n_best_size,
                       config.max_answer_len)
    source = squad_source(config.train_file, config.validation_file, version,
                          config.test_file or None)
    return Task(f"squad{version}", task_type, source, is_pair=True,
                default_max_seq_len=DEFAULT_MAX_SEQ_LEN)


@register_task("squad1.1", "squad1", "squad_v1")
def squad11_task(config: TaskConfig) -> Task:
    """SQuAD v1.1: every question has an answer in its context."""
    return _squad_task(config, "1.1")


@register_task("squad2.0", "squad2", "squad_v2")
def squad20_task(config: TaskConfig) -> Task:
    """SQuAD v2.0: some questions have no answer (the model may answer "")."""
    return _squad_task(config, "2.0")


__all__ = ["SpanQA", "squad11_task", "squad20_task"]
