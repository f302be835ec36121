"""benchmarks/glue.py's results of one task: every model's predictions and figures.
Run alone, it prints a results.json's tables as markdown.

Models: the fine-tuned teacher, the distilled student (Keras), its int8 TFLite file
(integer-only, from the quantize stage) and its dynamic-range int8 file (int8 weights,
float activations, converted from the float student as the export stage converts it),
the same student fine-tuned without a teacher, and a TF-IDF + logistic regression
baseline. For each: dev metrics, and its dev and GLUE-test predictions in the GLUE
submission format (`index<TAB>prediction`; dev rows are numbered in file order).
Latency: batch-1 TFLite float32 of the teacher, the student and a random-weight
BERT-base of the same sequence length, and the student's two int8 files, timed
interleaved (one call of each in turn, so a load on the machine hits all alike)
with the same thread count.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from typing import Any, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()

import numpy as np  # noqa: E402

from tinybert_tf.config import get_config  # noqa: E402
from tinybert_tf.data import buckets, glue_submission  # noqa: E402
from tinybert_tf.export import tflite  # noqa: E402
from tinybert_tf.export.benchmark import random_inputs, synthetic_vocab  # noqa: E402
from tinybert_tf.models.checkpoint import load_model, load_tokenizer  # noqa: E402
from tinybert_tf.models.encoder import BertModel, count_params, flops_per_example  # noqa: E402
from tinybert_tf.tasks.base import predict_rows  # noqa: E402
from tinybert_tf.tasks.catalog import TaskConfig, resolve_task  # noqa: E402
from tinybert_tf.timing import interleaved_median_ms  # noqa: E402

THREADS = 2
LATENCY_ROUNDS = 60


def _in_task_order(logits: np.ndarray, model_labels: Sequence[str],
                   task_labels: Sequence[str]) -> np.ndarray:
    """Columns of `logits` [N, C] put in the task's label order, matched by name."""
    if list(model_labels) == list(task_labels):
        return logits
    index = {name: i for i, name in enumerate(model_labels)}
    return logits[:, [index[name] for name in task_labels]]


def _write(path: str, indices: Sequence[str], predictions: Sequence[str]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    glue_submission.write(path, indices, predictions)


def _tflite_rows(task, examples, tokenizer, max_seq_len: int) -> dict[str, np.ndarray]:
    batches = [inputs for inputs, _ in task.type.dataset(examples, tokenizer, max_seq_len, 256)]
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in batches[0]}


class Predictor:
    """Dev and test predictions of one model, written as GLUE files."""

    def __init__(self, task_name: str, task, tokenizer, max_seq_len: int, out_dir: str):
        self.name, self.task, self.tokenizer, self.len = task_name, task, tokenizer, max_seq_len
        self.out_dir = out_dir
        self.dev = task.examples("dev")
        self.test_indices, self.test = glue_submission.test_set(
            task_name, task.source.data_dir, "test")
        self.gold = task.type.gold(self.dev)
        self.task_file = glue_submission.SUBMISSIONS[task_name.lower()][0].file

    def write(self, model_name: str, dev_ids: np.ndarray, test_ids: np.ndarray
              ) -> dict[str, float]:
        strings = glue_submission.prediction_strings
        _write(os.path.join(self.out_dir, model_name, "dev", self.task_file),
               [str(i) for i in range(len(dev_ids))], strings(self.name, dev_ids))
        _write(os.path.join(self.out_dir, model_name, self.task_file),
               self.test_indices, strings(self.name, test_ids))
        return self.task.type.score_labels(dev_ids, self.gold)

    def _keras_ids(self, model: BertModel, examples) -> np.ndarray:
        logits = predict_rows(model, self.task.type, examples, self.tokenizer, self.len, 64,
                              buckets.bucket_boundaries(self.len, 8))
        return _in_task_order(logits, model.label_names, self.task.type.label_names).argmax(-1)

    def keras(self, model_name: str, model: BertModel) -> dict[str, float]:
        return self.write(model_name, self._keras_ids(model, self.dev),
                          self._keras_ids(model, self.test))

    def keras_dev(self, model: BertModel) -> dict[str, float]:
        """Dev metrics alone: no test pass, no files written."""
        return self.task.type.score_labels(self._keras_ids(model, self.dev), self.gold)

    def tflite(self, model_name: str, path: str, label_names: Sequence[str]
               ) -> dict[str, float]:
        runner = tflite.TFLiteRunner(path, batch_size=1, num_threads=THREADS)

        def ids(examples):
            logits = runner.predict(_tflite_rows(self.task, examples, self.tokenizer, self.len))
            return _in_task_order(np.asarray(logits, np.float32), label_names,
                                  self.task.type.label_names).argmax(-1)
        return self.write(model_name, ids(self.dev), ids(self.test))

    def tfidf(self, model_name: str) -> dict[str, float]:
        """TF-IDF (word 1-2 grams) + logistic regression, C chosen on dev from a small
        grid; pairs: both texts' vectors and their element-wise product (overlap)."""
        from scipy import sparse
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        train = self.task.examples("train")
        pair = self.task.is_pair
        vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
        vec.fit([e.text_a for e in train] + ([e.text_b for e in train] if pair else []))

        def features(examples):
            a = vec.transform([e.text_a for e in examples])
            if not pair:
                return a
            b = vec.transform([e.text_b for e in examples])
            return sparse.hstack([a, b, a.multiply(b)]).tocsr()

        x_train, y_train = features(train), self.task.type.gold(train)
        x_dev = features(self.dev)
        best = None
        for c in (0.25, 1.0, 4.0, 16.0):
            clf = LogisticRegression(C=c, max_iter=2000).fit(x_train, y_train)
            score = self.task.type.score_labels(clf.predict(x_dev), self.gold)
            if best is None or score[self.task.type.primary_metric] > best[0]:
                best = (score[self.task.type.primary_metric], c, clf)
        _, c, clf = best
        metrics = self.write(model_name, clf.predict(x_dev), clf.predict(features(self.test)))
        return {**metrics, "C": c}


@contextlib.contextmanager
def flavour_file(model: BertModel, fmt: str, max_seq_len: int, task):
    """Yields the path of `model`'s TFLite `fmt` flavour, converted as the export stage
    converts it, in a temporary folder (never beside the results) removed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"model_{fmt}.tflite")
        with open(path, "wb") as f:
            f.write(tflite.convert(model, fmt, max_seq_len, task=task.type))
        yield path


def latencies(models: dict[str, Any], max_seq_len: int) -> dict[str, float]:
    """Batch-1 TFLite latency (median ms) of each {name: .tflite bytes or path},
    one call of each in turn per round, THREADS threads each."""
    runners = {n: tflite.TFLiteRunner(m, batch_size=1, num_threads=THREADS)
               for n, m in models.items()}
    inputs = random_inputs(get_config("bert_base_uncased"), 1, max_seq_len, seed=0)
    times = interleaved_median_ms({n: functools.partial(r, inputs) for n, r in runners.items()},
                                  runs=LATENCY_ROUNDS, warmup=3)
    return {n: round(ms, 3) for n, ms in times.items()}


def shape_name(config) -> str:
    """"layers x width", with the feed-forward size where it is not BERT's 4 x width:
    "2x384", "3x384, FFN 768"."""
    name = f"{config.num_layers}x{config.hidden_size}"
    if config.intermediate_size != 4 * config.hidden_size:
        name += f", FFN {config.intermediate_size}"
    return name


def facts(model: BertModel, max_seq_len: int) -> dict[str, Any]:
    return {"params": count_params(model),
            "params_without_embeddings": count_params(model, exclude_embeddings=True),
            "gflops_per_example": round(flops_per_example(
                model.bert_config, max_seq_len, model.num_labels or 0) / 1e9, 4),
            "shape": shape_name(model.bert_config)}


def collect(task_name: str, run: dict[str, Any], results_dir: str, primary: str,
            paper: dict[str, Any]) -> dict[str, Any]:
    task = resolve_task(TaskConfig(task=task_name, data_dir=run["data_dir"]))
    max_seq_len = task.max_seq_len(0)
    main = run["main_dir"]
    teacher = load_model(run["teacher"])
    student = load_model(os.path.join(main, "task", "model"))
    finetuned = load_model(os.path.join(run["finetuned_dir"], "task", "model"))
    tokenizer = load_tokenizer(run["teacher"], max_seq_len)
    p = Predictor(task_name, task, tokenizer, max_seq_len, results_dir)
    int8_path = os.path.join(main, "export", tflite.tflite_file("int8"))
    models: dict[str, Any] = {
        "teacher": {**facts(teacher, max_seq_len), "dev": p.keras("teacher", teacher)},
        "tinybert": {**facts(student, max_seq_len), "dev": p.keras("tinybert", student)},
        "tinybert_int8_tflite": {"dev": p.tflite("tinybert_int8_tflite", int8_path,
                                                 student.label_names)},
        "finetuned_no_kd": {**facts(finetuned, max_seq_len),
                            "dev": p.keras("finetuned_no_kd", finetuned)},
        "tfidf_logreg": {"dev": p.tfidf("tfidf_logreg")},
    }
    with open(os.path.join(main, "report.json")) as f:
        report = json.load(f)
    models["teacher"]["latency_ms_keras"] = report["teacher"].get("latency_ms")
    models["tinybert"]["latency_ms_keras"] = report["student"].get("latency_ms")
    base_config = get_config("bert_base_uncased")
    bert_base = BertModel(base_config, head="classifier", num_labels=2, label_names=["0", "1"],
                          vocab=synthetic_vocab(base_config.vocab_size))
    bert_base(random_inputs(base_config, 1, max_seq_len))
    with flavour_file(student, "dynamic_int8", max_seq_len, task) as dynamic:
        models["tinybert_dynamic_int8_tflite"] = {
            "dev": p.tflite("tinybert_dynamic_int8_tflite", dynamic, student.label_names),
            "size_bytes": os.path.getsize(dynamic)}
        lat = latencies({"teacher": tflite.convert(teacher, "float32", max_seq_len,
                                                   metadata=False),
                         "tinybert": tflite.convert(student, "float32", max_seq_len,
                                                    metadata=False),
                         "tinybert_int8": int8_path, "tinybert_dynamic_int8": dynamic,
                         "bert_base_random": tflite.convert(bert_base, "float32", max_seq_len,
                                                            metadata=False)},
                        max_seq_len)
    models["teacher"]["latency_ms_tflite_float32"] = lat["teacher"]
    models["tinybert"]["latency_ms_tflite_float32"] = lat["tinybert"]
    models["tinybert_int8_tflite"]["latency_ms_tflite_int8"] = lat["tinybert_int8"]
    models["tinybert_dynamic_int8_tflite"]["latency_ms_tflite_dynamic_int8"] = \
        lat["tinybert_dynamic_int8"]
    t_score = models["teacher"]["dev"][primary]
    s_score = models["tinybert"]["dev"][primary]
    return {
        "primary_metric": primary, "max_seq_len": max_seq_len, "models": models,
        "teacher_grid": run["teacher_grid"], "teacher_cell": run["teacher_cell"],
        "retained": round(s_score / t_score, 4) if t_score else None,
        "int8_minus_float_points": round(
            100 * (models["tinybert_int8_tflite"]["dev"][primary] - s_score), 2),
        "speedup_tflite_float32": {
            "teacher_over_tinybert": round(lat["teacher"] / lat["tinybert"], 2),
            "bert_base_over_tinybert": round(lat["bert_base_random"] / lat["tinybert"], 2),
            "bert_base_ms": lat["bert_base_random"], "threads": THREADS},
        "paper": {**paper, "retained": round(paper["tinybert4"] / paper["bert_base"], 4)},
        "train_rows": len(task.examples("train")),
        "commands": run["commands"],
        "data_dir": os.path.relpath(run["data_dir"]),
        "pipeline_seconds": {who: seconds(d) for who, d in (
            ("tinybert", main), ("finetuned_no_kd", run["finetuned_dir"]))},
        "report": {"ratios": report.get("ratios"), "pred_grid": report.get("pred_grid")},
    }


def seconds(folder: str) -> dict[str, float]:
    out = {}
    for stage in sorted(os.listdir(folder)):
        path = os.path.join(folder, stage, "stage_done.json")
        if os.path.exists(path):
            with open(path) as f:
                out[stage] = json.load(f).get("seconds")
    return out



MODEL_ROWS = (("teacher", "teacher: MiniLM-L6 fine-tuned"),
              ("tinybert", "TinyBERT student (GD + TD with DA)"),
              ("tinybert_int8_tflite", "TinyBERT student, int8 TFLite file"),
              ("tinybert_dynamic_int8_tflite",
               "TinyBERT student, dynamic-range int8 TFLite file"),
              ("finetuned_no_kd", "same student fine-tuned, no distillation"),
              ("tfidf_logreg", "TF-IDF + logistic regression"))


def markdown(results: dict[str, Any]) -> str:
    """The dev-set table of results.json: one row per model, one column per task, the
    paper's GLUE-test figures below for comparison."""
    tasks = list(results.get("tasks", {}))
    head = "| model | " + " | ".join(
        f"{t} dev {results['tasks'][t]['primary_metric']}" for t in tasks) + " |"
    lines = [head, "|---" * (len(tasks) + 1) + "|"]
    for key, label in MODEL_ROWS:
        cells = []
        for t in tasks:
            entry = results["tasks"][t]
            dev = entry["models"].get(key, {}).get("dev", {})
            value = dev.get(entry["primary_metric"])
            cells.append("" if value is None else f"{100 * value:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| student / teacher | " + " | ".join(
        f"{100 * results['tasks'][t]['retained']:.1f}%" if results["tasks"][t].get("retained")
        else "" for t in tasks) + " |")
    papers = [results["tasks"][t]["paper"] for t in tasks]
    lines.append("| paper (GLUE test): BERT-base -> TinyBERT4 | " + " | ".join(
        f"{p['bert_base']} -> {p['tinybert4']} ({100 * p['retained']:.1f}%)" for p in papers)
        + " |")
    lines.append("")
    lines.append("| task | teacher ms | student ms | int8 ms | dynamic int8 ms | BERT-base ms "
                 "| teacher / student | BERT-base / student |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for t in tasks:
        e = results["tasks"][t]
        m, s = e["models"], e["speedup_tflite_float32"]
        # A dynamic int8 file scored after the table (benchmarks/glue_flavour.py) was
        # timed in its own run, beside the float student: its ratio to that, not ms.
        dynamic = m.get("tinybert_dynamic_int8_tflite", {})
        if "latency_interleaved_with" in dynamic:
            beside = dynamic["latency_interleaved_with"]["tinybert_tflite_float32"]
            dynamic_cell = (f"{dynamic['latency_ms_tflite_dynamic_int8'] / beside:.2f} of "
                            "the student's (timed later)")
        else:
            dynamic_cell = str(dynamic.get("latency_ms_tflite_dynamic_int8", ""))
        lines.append(f"| {t} | {m['teacher']['latency_ms_tflite_float32']} | "
                     f"{m['tinybert']['latency_ms_tflite_float32']} | "
                     f"{m['tinybert_int8_tflite']['latency_ms_tflite_int8']} | "
                     f"{dynamic_cell} | "
                     f"{s['bert_base_ms']} | {s['teacher_over_tinybert']}x | "
                     f"{s['bert_base_over_tinybert']}x |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> None:
    """`benchmarks/glue_results.py [results.json]`: print its tables as markdown."""
    path = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "glue", "results.json")
    with open(path) as f:
        print(markdown(json.load(f)), end="")


if __name__ == "__main__":
    main(sys.argv)
