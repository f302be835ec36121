"""GLUE test-set predictions in the files the GLUE server (gluebenchmark.com) takes.

A submission is a zip of one TSV per task, named as the server expects:
CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv,
QNLI.tsv, RTE.tsv, WNLI.tsv and AX.tsv (the diagnostic set, predicted by the
MNLI model). Each has the header `index<TAB>prediction` and one row per test
example in test-file order; the index is the test file's own first column
(`index`, QQP's `id`). Predictions are label names for the tasks whose labels
are words (MNLI, AX: entailment / neutral / contradiction; QNLI, RTE:
entailment / not_entailment), the integer label for the others, and the score
for STS-B.

Test files are read from the GLUE layout `download_glue_data.py` writes:
TASK/test.tsv (MNLI: test_matched.tsv, test_mismatched.tsv), and the
diagnostic set at diagnostic/diagnostic.tsv beside the task folders (its
header names `index`, `sentence1`, `sentence2`; they are found by name).
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Callable, Sequence

import numpy as np

from tinybert_tf import files
from tinybert_tf.data import glue
from tinybert_tf.data.examples import DataError, Example, Examples

HEADER = ("index", "prediction")
TAB = "\t"
AX = "ax"  # the diagnostic set's pseudo-split
DIAGNOSTIC = ("diagnostic", "diagnostic.tsv")  # beside the task folders


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file of a submission: its name and the split it predicts."""

    file: str
    split: str


# Our task name -> the files its model writes.
SUBMISSIONS: dict[str, tuple[Entry, ...]] = {
    "cola": (Entry("CoLA.tsv", "test"),),
    "sst-2": (Entry("SST-2.tsv", "test"),),
    "mrpc": (Entry("MRPC.tsv", "test"),),
    "sts-b": (Entry("STS-B.tsv", "test"),),
    "qqp": (Entry("QQP.tsv", "test"),),
    "mnli": (Entry("MNLI-m.tsv", "test_matched"), Entry("MNLI-mm.tsv", "test_mismatched"),
             Entry("AX.tsv", AX)),
    "qnli": (Entry("QNLI.tsv", "test"),),
    "rte": (Entry("RTE.tsv", "test"),),
    "wnli": (Entry("WNLI.tsv", "test"),),
}


def diagnostic_path(data_dir: str) -> str:
    """Where the GLUE layout keeps the diagnostic set for a task folder `data_dir`."""
    parent = posixpath.dirname(data_dir.rstrip("/")) if files.is_remote(data_dir) else \
        os.path.dirname(os.path.abspath(data_dir))
    return posixpath.join(parent, *DIAGNOSTIC) if files.is_remote(parent) else \
        os.path.join(parent, *DIAGNOSTIC)


def _path(task: str, data_dir: str, entry: Entry) -> str:
    if entry.split == AX:
        return diagnostic_path(data_dir)
    return os.path.join(data_dir, glue.get_task(task).layout(entry.split).file)


def check(task: str, data_dir: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of --glue_test_predictions for `task` and its --data_dir: a
    GLUE task in a TSV folder with its test file(s); the diagnostic set is optional
    (a warning: AX.tsv is then not written)."""
    key = task.lower()
    if key not in SUBMISSIONS:
        return [f"--glue_test_predictions: --task={task} is not a GLUE task; the GLUE "
                f"server scores {', '.join(sorted(SUBMISSIONS))} only."], []
    if not data_dir or data_dir == glue.TFDS:
        return [f"--glue_test_predictions needs the GLUE TSV folder of {task} as --data_dir "
                "(its test file's index column names the rows), not "
                f"{data_dir or 'the empty default'}."], []
    errors, warnings = [], []
    for entry in SUBMISSIONS[key]:
        path = _path(task, data_dir, entry)
        if files.isfile(path):
            continue
        if entry.split == AX:
            warnings.append(f"--glue_test_predictions: {path} not found, so AX.tsv (the "
                            "diagnostic set, scored with MNLI) is not written; put GLUE's "
                            "diagnostic.tsv there for a complete submission.")
        else:
            errors.append(f"--glue_test_predictions: {path} not found; the GLUE download "
                          f"has it in the {task} folder (--data_dir).")
    return errors, warnings


def _diagnostic(path: str) -> tuple[list[str], Examples]:
    """The diagnostic set's indices and (premise, hypothesis) examples."""
    rows = glue.iter_lines(path)
    first = next(rows, None)
    header = first[1].split("\t") if first else []
    missing = [c for c in ("index", "sentence1", "sentence2") if c not in header]
    if missing:
        raise DataError(f"{path}:1: the diagnostic set's header must name index, sentence1 "
                        f"and sentence2 (GLUE's diagnostic.tsv); {missing} not in {header}.")
    at = {name: header.index(name) for name in ("index", "sentence1", "sentence2")}
    indices, out = [], []
    for no, line in rows:
        fields = line.split("\t")
        if len(fields) < len(header):
            raise DataError(f"{path}:{no}: {len(fields)} columns, the header has "
                            f"{len(header)}.")
        indices.append(fields[at["index"]])
        out.append(Example(guid=f"ax-{no}", text_a=fields[at["sentence1"]],
                           text_b=fields[at["sentence2"]], label=None))
    if not out:
        raise DataError(f"{path}: no examples after the header.")
    return indices, Examples(out, source=path)


def test_set(task: str, data_dir: str, split: str) -> tuple[list[str], Examples]:
    """A test split's indices (its first column) and examples, in file order."""
    if split == AX:
        return _diagnostic(diagnostic_path(data_dir))
    examples = glue.load_examples(task, data_dir, split)
    _, rows = glue.read_rows(task, data_dir, split)
    indices = [fields[0] for _, fields in rows]
    if len(indices) != len(examples):
        raise DataError(f"{examples.source}: {len(indices)} rows but {len(examples)} "
                        "examples were read.")
    return indices, examples


def prediction_strings(task: str, predictions: np.ndarray) -> list[str]:
    """The GLUE server's prediction column: label names (integers for 0/1 tasks) for
    class ids [N], formatted scores for STS-B's [N]."""
    spec = glue.get_task(task)
    values = np.asarray(predictions).reshape(-1)
    if spec.is_regression:
        return [f"{float(v):.4f}" for v in values]
    return [spec.label_names[int(v)] for v in values]


def write(path: str, indices: Sequence[str], predictions: Sequence[str]) -> int:
    """One submission file, written whole (header, then a row per example)."""
    if len(indices) != len(predictions):
        raise ValueError(f"{path}: {len(indices)} indices but {len(predictions)} "
                         "predictions.")
    return glue.write_rows(path, HEADER, zip(indices, predictions))


def write_submission(task: str, data_dir: str, out_dir: str,
                     predict: Callable[[Examples], np.ndarray]) -> dict[str, int]:
    """Predict every test set of `task` with `predict` (examples -> class ids [N] or
    scores [N]) and write its submission files into `out_dir`; returns {file: rows}.
    The diagnostic set is skipped when absent (see `check`)."""
    written: dict[str, int] = {}
    files.makedirs(out_dir)
    for entry in SUBMISSIONS[task.lower()]:
        if entry.split == AX and not files.isfile(diagnostic_path(data_dir)):
            continue
        indices, examples = test_set(task, data_dir, entry.split)
        strings = prediction_strings(task, predict(examples))
        written[entry.file] = write(os.path.join(out_dir, entry.file), indices, strings)
    return written


def read(path: str) -> tuple[list[str], list[str]]:
    """(indices, predictions) of a submission file, checking its header."""
    lines = list(glue.iter_lines(path))
    if not lines or lines[0][1].split("\t") != list(HEADER):
        raise DataError(f"{path}:1: expected the header {TAB.join(HEADER)!r}.")
    pairs = [line.split("\t") for _, line in lines[1:]]
    return [p[0] for p in pairs], [p[1] for p in pairs]
