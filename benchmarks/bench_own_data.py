"""How long own-data runs take on the embedded teacher: CSV, JSON-lines pairs, TSV regression,
CoNLL NER, each from its files to the exported model.

Data (no network): the polarity sentences shipped in gensim written as your own files
would be (`train.csv` / `dev.csv` with string labels; `pairs_*.jsonl`: two sentences,
label "same" or "different" sentiment; `scores_*.tsv`: a 1-5 score), and the news-style
NER fixture (tests/fixtures/own_data/news_ner_*.conll). Teacher: all-MiniLM-L6-v2
(`--teacher=minilm-l6`), fine-tuned per task; student: `--general_model` (a 1 x 384
General TinyBERT, e.g. OUT/base/general/model of benchmarks/bench_ner_augment.py, or
the demo's runs/demo/general/model). Every stage after general runs: finetune_teacher,
augment (word vectors of the Wikipedia sample), task, evaluate, export (SavedModel and
float32 TFLite).

  .venv/bin/python benchmarks/bench_own_data.py --output_dir=/tmp/own \
      --general_model=runs/demo/general/model

Prints per task the seconds of each stage, the teacher's and the student's dev metrics.
"""
import argparse
import csv
import json
import os
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

STAGES = ("finetune_teacher", "augment", "task", "evaluate", "export")


def write_files(directory: str) -> dict:
    """The polarity split as CSV, JSON-lines pairs and TSV scores; returns {task: flags}."""
    from tinybert_tf.data import polarity

    os.makedirs(directory, exist_ok=True)
    rows = polarity.split_rows(polarity.default_path())
    names = ["negative", "positive"]
    for split, items in (("train", rows["train"]), ("dev", rows["dev"])):
        with open(os.path.join(directory, f"{split}.csv"), "w", encoding="utf-8",
                  newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for _, text, label in items:
                w.writerow([text, names[label]])
        with open(os.path.join(directory, f"pairs_{split}.jsonl"), "w", encoding="utf-8") as f:
            for i, (_, text, label) in enumerate(items):
                _, other, other_label = items[(i * 7 + 3) % len(items)]
                f.write(json.dumps({"premise": text, "hypothesis": other,
                                    "label": "same" if label == other_label else "different"})
                        + "\n")
        with open(os.path.join(directory, f"scores_{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tscore\n")
            for i, (_, text, label) in enumerate(items):
                f.write(f"{text}\t{(4.0 if label else 1.0) + (i % 5) / 5:.1f}\n")
    fixture = os.path.join(REPO, "tests", "fixtures", "own_data")
    d = directory
    return {
        "csv_classification": ["--task=text_classification", f"--train_file={d}/train.csv",
                               f"--validation_file={d}/dev.csv", "--max_seq_len=48"],
        "jsonl_pairs": ["--task=text_classification", f"--train_file={d}/pairs_train.jsonl",
                        f"--validation_file={d}/pairs_dev.jsonl", "--text_column=premise",
                        "--text_pair_column=hypothesis", "--max_seq_len=96"],
        "tsv_regression": ["--task=text_regression", f"--train_file={d}/scores_train.tsv",
                           f"--validation_file={d}/scores_dev.tsv", "--text_column=sentence",
                           "--label_column=score", "--max_seq_len=48"],
        "conll_ner": ["--task=token_classification",
                      f"--train_file={fixture}/news_ner_train.conll",
                      f"--validation_file={fixture}/news_ner_dev.conll", "--max_seq_len=48"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--general_model", required=True)
    parser.add_argument("--tasks", default="csv_classification,jsonl_pairs,tsv_regression,"
                                           "conll_ner")
    args = parser.parse_args()
    from tinybert_tf.startup import start_tensorflow
    start_tensorflow()  # as bin/distill: no CUDA probe error on a machine without a GPU
    from tinybert_tf.pipeline.main import run_argv

    tasks = write_files(os.path.join(args.output_dir, "data"))
    common = ["--teacher=minilm-l6", f"--general_model={args.general_model}", "--stages=all",
              "--teacher_epochs=5", "--teacher_lr=1e-4", "--teacher_batch_size=16",
              "--augment_fallback", "--num_aug=4", "--task_batch_size=16",
              "--intermediate_epochs=1", "--intermediate_lr=5e-4", "--pred_epochs=2",
              "--pred_lr=5e-4", "--latency_runs=10", "--export_latency_runs=10",
              "--export_formats=saved_model,float32", "--seed=42"]
    for name in args.tasks.split(","):
        out = os.path.join(args.output_dir, name)
        start = time.time()
        run_argv(["bin/distill", *common, *tasks[name], f"--output_dir={out}"])
        total = time.time() - start
        seconds = {}
        for stage in STAGES:
            with open(os.path.join(out, stage, "stage_done.json"), encoding="utf-8") as f:
                seconds[stage] = json.load(f)["seconds"]
        with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
            report = json.load(f)
        primary = report["primary_metric"]
        print(json.dumps({"run": name, "total_s": round(total), "stage_s": seconds,
                          "metric": primary, "teacher": report["teacher"]["dev"][primary],
                          "student": report["student"]["dev"][primary],
                          "speedup": report["ratios"].get("speedup")}), flush=True)


if __name__ == "__main__":
    main()
