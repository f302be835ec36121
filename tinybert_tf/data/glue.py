"""GLUE tasks (and the embedded demo task) from TSV directories or TFDS `glue/*`.

One `TaskSpec` per task fixes the label order (the TinyBERT reference's
processors: CoLA/SST-2/MRPC/QQP/WNLI ["0", "1"], MNLI ["contradiction",
"entailment", "neutral"], QNLI/RTE ["entailment", "not_entailment"], STS-B a
float score), the file layout of every split, the metrics and the default
sequence length. TFDS labels are mapped onto the same ids *by name*
(`TaskSpec.tfds_label_map`): TFDS orders MNLI as [entailment, neutral,
contradiction], so its id 0 is our id 1 -- the reference read TFDS-ordered ids
as if they were its own order, which silently scrambles MNLI.

TSV files are read the way GLUE is distributed: tab-separated, quoting off
(a `"` is text), UTF-8, one example per line; headers on every file except
CoLA's train/dev. Any malformed row raises one `DataError` naming file, line
and what was expected, unless `skip_bad_rows=True`, which logs and counts them.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from tinybert_tf import files
from tinybert_tf.data.examples import DataError, Example, Examples

logger = logging.getLogger(__name__)

TFDS = "tfds"  # data_dir value selecting the TFDS glue/* source


@dataclasses.dataclass(frozen=True)
class FileLayout:
    """Columns of one split's TSV file (0-based; negative counts from the end).

    header: the expected header names of (text_a, text_b, label) columns, used to
    recognise the header row (None entries are not checked); None for
    headerless files (CoLA train/dev).
    """
    file: str
    num_columns: int
    text_a_col: int
    text_b_col: Optional[int]
    label_col: Optional[int]  # None: unlabelled (test files)
    header: Optional[tuple] = None

    @property
    def has_header(self) -> bool:
        return self.header is not None


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything the loaders, the pipeline and the metrics need to know of a task."""
    name: str
    label_names: tuple  # empty for regression
    is_pair: bool
    is_regression: bool
    metric_names: tuple
    primary_metric: str
    default_max_seq_len: int
    layouts: Mapping[str, FileLayout]
    dev_splits: tuple  # splits scored for model selection / the report, first = primary
    tfds_name: Optional[str] = None
    tfds_features: tuple = ()  # (text_a key, text_b key or None)
    tfds_label_names: tuple = ()  # TFDS ClassLabel names, in TFDS's own order
    tfds_to_ours: Mapping[str, str] = dataclasses.field(default_factory=dict)
    score_range: Optional[tuple] = None  # regression: the (low, high) scores allowed

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.label_names)

    @property
    def files(self) -> dict[str, str]:
        return {split: lay.file for split, lay in self.layouts.items()}

    def layout(self, split: str) -> FileLayout:
        split = _SPLIT_ALIASES.get((self.name, split), split)
        if split not in self.layouts:
            raise DataError(f"task {self.name} has no split '{split}'; known splits: "
                            f"{', '.join(self.layouts)}.")
        return self.layouts[split]

    # The train file's layout, for callers that only care about training data.
    @property
    def has_header(self) -> bool:
        return self.layouts["train"].has_header

    @property
    def text_a_col(self) -> int:
        return self.layouts["train"].text_a_col

    @property
    def text_b_col(self) -> Optional[int]:
        return self.layouts["train"].text_b_col

    @property
    def label_col(self) -> Optional[int]:
        return self.layouts["train"].label_col

    @property
    def num_columns(self) -> int:
        return self.layouts["train"].num_columns

    @property
    def tfds_label_map(self) -> dict[int, int]:
        """TFDS label id -> our label id, derived from the label names."""
        return {i: self.label_names.index(self.tfds_to_ours[n])
                for i, n in enumerate(self.tfds_label_names)}


# ---------------------------------------------------------------------------
# Task table.

def _train_dev(layout: FileLayout, extra: Optional[dict] = None) -> dict[str, FileLayout]:
    out = {"train": layout, "dev": dataclasses.replace(layout, file="dev.tsv"),
           "train_aug": dataclasses.replace(layout, file="train_aug.tsv")}
    out.update(extra or {})
    return out


_ACC = (("accuracy",), "accuracy")
_ACC_F1 = (("accuracy", "f1", "accuracy_f1_mean"), "accuracy")
_SINGLE, _PAIR = 64, 128
# CoLA's and SST-2's test.tsv: index, sentence.
_SENTENCE_TEST = FileLayout("test.tsv", 2, 1, None, None, ("sentence", None, None))


def _mnli_layout(file: str, ncols: int, labelled: bool) -> FileLayout:
    return FileLayout(file, ncols, 8, 9, -1 if labelled else None,
                      ("sentence1", "sentence2", "gold_label" if labelled else None))


def _pair_index_layout(file: str, a: str, b: str, labelled: bool) -> FileLayout:
    # QNLI, RTE, WNLI: index, a, b[, label]
    return FileLayout(file, 4 if labelled else 3, 1, 2, 3 if labelled else None,
                      (a, b, "label" if labelled else None))


_TASKS: dict[str, TaskSpec] = {}


def _register(spec: TaskSpec) -> None:
    _TASKS[spec.name] = spec


_register(TaskSpec(
    name="cola", label_names=("0", "1"), is_pair=False, is_regression=False,
    metric_names=("mcc",), primary_metric="mcc", default_max_seq_len=_SINGLE,
    layouts=_train_dev(FileLayout("train.tsv", 4, 3, None, 1, None),
                       {"test": _SENTENCE_TEST}),
    dev_splits=("dev",), tfds_name="glue/cola", tfds_features=("sentence", None),
    tfds_label_names=("unacceptable", "acceptable"),
    tfds_to_ours={"unacceptable": "0", "acceptable": "1"}))
_register(TaskSpec(
    name="sst-2", label_names=("0", "1"), is_pair=False, is_regression=False,
    metric_names=_ACC[0], primary_metric=_ACC[1], default_max_seq_len=_SINGLE,
    layouts=_train_dev(FileLayout("train.tsv", 2, 0, None, 1, ("sentence", None, "label")),
                       {"test": _SENTENCE_TEST}),
    dev_splits=("dev",), tfds_name="glue/sst2", tfds_features=("sentence", None),
    tfds_label_names=("negative", "positive"), tfds_to_ours={"negative": "0", "positive": "1"}))
_register(TaskSpec(
    name="mrpc", label_names=("0", "1"), is_pair=True, is_regression=False,
    metric_names=_ACC_F1[0], primary_metric=_ACC_F1[1], default_max_seq_len=_PAIR,
    layouts=_train_dev(FileLayout("train.tsv", 5, 3, 4, 0, ("#1 String", "#2 String", "Quality")),
                       {"test": FileLayout("test.tsv", 5, 3, 4, None,
                                           ("#1 String", "#2 String", None))}),
    dev_splits=("dev",), tfds_name="glue/mrpc", tfds_features=("sentence1", "sentence2"),
    tfds_label_names=("not_equivalent", "equivalent"),
    tfds_to_ours={"not_equivalent": "0", "equivalent": "1"}))
_register(TaskSpec(
    name="sts-b", label_names=(), is_pair=True, is_regression=True,
    metric_names=("pearson", "spearman", "pearson_spearman_mean"),
    primary_metric="pearson_spearman_mean", default_max_seq_len=_PAIR,
    layouts=_train_dev(FileLayout("train.tsv", 10, 7, 8, 9, ("sentence1", "sentence2", "score")),
                       {"test": FileLayout("test.tsv", 9, 7, 8, None,
                                           ("sentence1", "sentence2", None))}),
    dev_splits=("dev",), tfds_name="glue/stsb", tfds_features=("sentence1", "sentence2"),
    score_range=(0.0, 5.0)))
_register(TaskSpec(
    name="qqp", label_names=("0", "1"), is_pair=True, is_regression=False,
    metric_names=_ACC_F1[0], primary_metric=_ACC_F1[1], default_max_seq_len=_PAIR,
    layouts=_train_dev(FileLayout("train.tsv", 6, 3, 4, 5,
                                  ("question1", "question2", "is_duplicate")),
                       {"test": FileLayout("test.tsv", 3, 1, 2, None,
                                           ("question1", "question2", None))}),
    dev_splits=("dev",), tfds_name="glue/qqp", tfds_features=("question1", "question2"),
    tfds_label_names=("not_duplicate", "duplicate"),
    tfds_to_ours={"not_duplicate": "0", "duplicate": "1"}))
_register(TaskSpec(
    name="mnli", label_names=("contradiction", "entailment", "neutral"), is_pair=True,
    is_regression=False, metric_names=_ACC[0], primary_metric=_ACC[1],
    default_max_seq_len=_PAIR,
    layouts={"train": _mnli_layout("train.tsv", 12, True),
             "train_aug": _mnli_layout("train_aug.tsv", 12, True),
             "dev_matched": _mnli_layout("dev_matched.tsv", 16, True),
             "dev_mismatched": _mnli_layout("dev_mismatched.tsv", 16, True),
             "test_matched": _mnli_layout("test_matched.tsv", 10, False),
             "test_mismatched": _mnli_layout("test_mismatched.tsv", 10, False)},
    dev_splits=("dev_matched", "dev_mismatched"), tfds_name="glue/mnli",
    tfds_features=("premise", "hypothesis"),
    tfds_label_names=("entailment", "neutral", "contradiction"),
    tfds_to_ours={"entailment": "entailment", "neutral": "neutral",
                  "contradiction": "contradiction"}))
_register(TaskSpec(
    name="qnli", label_names=("entailment", "not_entailment"), is_pair=True,
    is_regression=False, metric_names=_ACC[0], primary_metric=_ACC[1],
    default_max_seq_len=_PAIR,
    layouts=_train_dev(_pair_index_layout("train.tsv", "question", "sentence", True),
                       {"test": _pair_index_layout("test.tsv", "question", "sentence", False)}),
    dev_splits=("dev",), tfds_name="glue/qnli", tfds_features=("question", "sentence"),
    tfds_label_names=("entailment", "not_entailment"),
    tfds_to_ours={"entailment": "entailment", "not_entailment": "not_entailment"}))
_register(TaskSpec(
    name="rte", label_names=("entailment", "not_entailment"), is_pair=True,
    is_regression=False, metric_names=_ACC[0], primary_metric=_ACC[1],
    default_max_seq_len=_PAIR,
    layouts=_train_dev(_pair_index_layout("train.tsv", "sentence1", "sentence2", True),
                       {"test": _pair_index_layout("test.tsv", "sentence1", "sentence2", False)}),
    dev_splits=("dev",), tfds_name="glue/rte", tfds_features=("sentence1", "sentence2"),
    tfds_label_names=("entailment", "not_entailment"),
    tfds_to_ours={"entailment": "entailment", "not_entailment": "not_entailment"}))
_register(TaskSpec(
    name="wnli", label_names=("0", "1"), is_pair=True, is_regression=False,
    metric_names=_ACC[0], primary_metric=_ACC[1], default_max_seq_len=_PAIR,
    layouts=_train_dev(_pair_index_layout("train.tsv", "sentence1", "sentence2", True),
                       {"test": _pair_index_layout("test.tsv", "sentence1", "sentence2", False)}),
    dev_splits=("dev",), tfds_name="glue/wnli", tfds_features=("sentence1", "sentence2"),
    # GLUE's WNLI TSV: 1 = entailment; TFDS orders the names [not_entailment, entailment].
    tfds_label_names=("not_entailment", "entailment"),
    tfds_to_ours={"not_entailment": "0", "entailment": "1"}))
# The embedded demo task (tinybert_tf.data.polarity): SST-2 layout, label names in the TSV.
_register(TaskSpec(
    name="polarity", label_names=("neg", "pos"), is_pair=False, is_regression=False,
    metric_names=_ACC[0], primary_metric=_ACC[1], default_max_seq_len=_SINGLE,
    layouts=_train_dev(FileLayout("train.tsv", 2, 0, None, 1, ("sentence", None, "label"))),
    dev_splits=("dev",)))

# "dev" on MNLI means the matched dev set (the one checkpoints are selected on).
_SPLIT_ALIASES = {("mnli", "dev"): "dev_matched", ("mnli", "test"): "test_matched"}
_NAME_ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-m": "mnli",
                 "mnli_matched": "mnli", "pang_lee": "polarity"}


def task_names() -> tuple:
    return tuple(_TASKS)


def get_task(name: str) -> TaskSpec:
    """Task spec by case-insensitive name: 'SST-2', 'sst-2', 'sst2', 'STS-B', 'polarity', ..."""
    if isinstance(name, TaskSpec):
        return name
    key = str(name).strip().lower().replace("_", "-")
    key = _NAME_ALIASES.get(key, _NAME_ALIASES.get(key.replace("-", ""), key))
    if key not in _TASKS:
        key2 = key.replace("-", "")
        matches = [n for n in _TASKS if n.replace("-", "") == key2]
        if not matches:
            raise DataError(f"unknown task '{name}'; known tasks: {', '.join(_TASKS)} "
                            f"(case-insensitive, e.g. --task=SST-2).")
        key = matches[0]
    return _TASKS[key]


def label_names(task: Union[str, TaskSpec]) -> tuple:
    """The task's label names in id order (empty tuple for STS-B)."""
    return get_task(task).label_names


# ---------------------------------------------------------------------------
# Raw TSV rows.

def _task_file(spec: TaskSpec, data_dir: str, split: str) -> tuple[str, FileLayout]:
    layout = spec.layout(split)
    if not data_dir or not files.isdir(data_dir):
        raise DataError(
            f"{data_dir or '(empty --data_dir)'}: task directory not found; --data_dir must be a "
            f"directory in GLUE layout holding {layout.file} for task {spec.name} "
            f"(or --data_dir=tfds to read TFDS glue/*).")
    path = os.path.join(data_dir, layout.file)
    if not files.isfile(path):
        present = sorted(f for f in files.listdir(data_dir) if f.endswith(".tsv"))
        hint = (" (train_aug.tsv is written by the augment stage)" if split == "train_aug" else "")
        inner = _task_folder_inside(spec, data_dir, layout.file)
        where = (f"; --data_dir={inner} holds it (the GLUE download's folder of the task)"
                 if inner else "")
        raise DataError(f"{path}: file not found for split '{split}' of task {spec.name}{hint}; "
                        f"the directory holds {present or 'no .tsv files'}{where}.")
    return path, layout


def _task_folder_inside(spec: TaskSpec, data_dir: str, name: str) -> Optional[str]:
    """A folder in `data_dir` holding `name`, the task's own first (e.g. RTE/ in the root
    of a GLUE download given as --data_dir), else None."""
    def other_task(folder: str) -> bool:
        return folder.lower().replace("-", "") != spec.name.lower().replace("-", "")
    folders = sorted((f.rstrip("/") for f in files.listdir(data_dir)
                      if files.isfile(os.path.join(data_dir, f.rstrip("/"), name))),
                     key=lambda f: (other_task(f), f))
    return os.path.join(data_dir, folders[0]) if folders else None


_CHUNK_BYTES = 1 << 20


def binary_lines(path: str) -> Iterator[bytes]:
    """The lines of a file, each with its b"\\n", bytes exactly as stored; any
    tf.io.gfile path. (gfile's own readline drops every b"\\r" of a line; remote
    files are read in 1 MiB chunks and split here instead.)"""
    if not files.is_remote(path):
        with open(path, "rb") as f:
            yield from f
        return
    rest = b""
    with files.open(path, "rb") as f, files.translate_errors(path, "read"):
        while True:
            chunk = f.read(_CHUNK_BYTES)
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
    if rest:
        yield rest


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its newline). Binary read so only
    '\\n' ends a line (a stray '\\r' inside text is kept) and bad UTF-8 names its line."""
    for no, raw in enumerate(binary_lines(path), start=1):
        if no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # UTF-8 byte-order mark (MRPC's source files carry one)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{no}: invalid UTF-8 at byte {e.start} of the line "
                            f"({raw[max(0, e.start - 10):e.start + 10]!r}); GLUE files are "
                            f"UTF-8: {files.reencode_hint(raw if no == 1 else b'')}.") from None
        yield no, line


def _looks_like_header(fields: list[str], layout: FileLayout) -> bool:
    cols = (layout.text_a_col, layout.text_b_col, layout.label_col)
    for col, want in zip(cols, layout.header):
        if col is None or want is None:
            continue
        if fields[col].strip().lower() != want.lower():
            return False
    return True


def _other_task_hint(fields: list[str], split: str, spec: TaskSpec) -> str:
    """When a file's header is another GLUE task's: which (the --data_dir of one task
    given with --task of another)."""
    others = []
    for other in _TASKS.values():
        if other.name == spec.name:
            continue
        try:
            layout = other.layout(split)
        except (DataError, KeyError):
            continue
        if layout.has_header and len(fields) == layout.num_columns \
                and _looks_like_header(fields, layout):
            others.append(other.name)
    if not others:
        return ""
    return (f" The header is the GLUE {' / '.join(others)} layout: is --data_dir another "
            f"task's folder? Give --task={others[0]} or the {spec.name} folder.")


def _read(spec: TaskSpec, path: str, layout: FileLayout, split: str
          ) -> tuple[Optional[list], Iterator[tuple[int, list]]]:
    """(header fields or None, rows) of the TSV file `path` in `layout`."""
    lines = iter_lines(path)
    header = None
    first = next(lines, None)
    if first is None:
        raise DataError(f"{path}: empty file; expected "
                        f"{'a header row and ' if layout.has_header else ''}"
                        f"{layout.num_columns}-column tab-separated rows.")
    if layout.has_header:
        no, line = first
        fields = line.split("\t")
        if len(fields) != layout.num_columns or not _looks_like_header(fields, layout):
            want = [h for h in layout.header if h]
            raise DataError(
                f"{path}:{no}: missing or unexpected header; expected a {layout.num_columns}-"
                f"column header row naming {want} (the GLUE {spec.name} layout), got "
                f"{fields[:layout.num_columns + 1]!r}.{_other_task_hint(fields, split, spec)}")
        header = fields

        def rows():
            for n, text in lines:
                yield n, text.split("\t")
    else:
        def rows():
            no, text = first
            yield no, text.split("\t")
            for n, text in lines:
                yield n, text.split("\t")
    return header, rows()


def read_rows(task: Union[str, TaskSpec], data_dir: str, split: str
              ) -> tuple[Optional[list], Iterator[tuple[int, list]]]:
    """(header fields or None, iterator of (line number, fields)) of a task's TSV file.

    Rows are raw (every column, text exactly as in the file); the header is
    checked, rows are not (augmentation copies them to train_aug.tsv).
    """
    spec = get_task(task)
    path, layout = _task_file(spec, data_dir, split)
    header, rows = _read(spec, path, layout, split)
    return header, rows


def write_rows(path: str, header: Optional[Sequence[str]], rows: Iterable[Sequence[str]]) -> int:
    """Write a GLUE TSV (quoting off, text kept exactly) atomically; returns rows written.

    A field holding a tab or newline cannot be represented in GLUE TSV: ValueError.
    """
    n = 0
    with files.atomic_path(path) as tmp:
        with files.open(tmp, "w") as f, files.translate_errors(tmp, "write"):
            if header is not None:
                f.write(tsv_line(header, path, "header"))
            for fields in rows:
                n += 1
                f.write(tsv_line(fields, path, f"row {n}"))
    return n


def tsv_line(fields: Sequence[str], path: str, what: str) -> str:
    for v in fields:
        if any(c in str(v) for c in "\t\n\r"):
            raise ValueError(f"{path}: {what} has a field with a tab or newline ({str(v)[:40]!r}); "
                             f"GLUE TSV cannot hold it: replace it with a space first.")
    return "\t".join(str(v) for v in fields) + "\n"


# ---------------------------------------------------------------------------
# Examples.

def _parse_label(spec: TaskSpec, value: str):
    if spec.is_regression:
        v = float(value)  # ValueError handled by the caller
        if not np.isfinite(v):
            raise ValueError(value)
        return v
    return spec.label_names.index(value)  # ValueError when unknown


def load_examples(task: Union[str, TaskSpec], data_dir: str, split: str,
                  skip_bad_rows: bool = False, tfds_data_dir: Optional[str] = None) -> Examples:
    """Examples of one split.

    Args:
      task: task name (case-insensitive) or spec.
      data_dir: a GLUE-layout directory, or "tfds" for TFDS glue/* (under
        `tfds_data_dir`). (The embedded polarity task's own file is read by
        `tinybert_tf.data.sources.glue_source(task, "")`.)
      split: the file: train, dev, test, train_aug, dev_matched, dev_mismatched,
        test_matched, test_mismatched ("dev"/"test" on MNLI = the matched ones).
      skip_bad_rows: log and count malformed rows instead of raising `DataError`;
        the count is `result.skipped`.
    Returns:
      `Examples` (a list of `Example`) with `.source` and `.skipped`.
    """
    spec = get_task(task)
    if data_dir == TFDS:
        return load_tfds_examples(spec, split, tfds_data_dir)
    path, layout = _task_file(spec, data_dir, split)
    return _examples(spec, path, layout, split, skip_bad_rows)


def load_file(task: Union[str, TaskSpec], path: str, split: str) -> Examples:
    """Examples of the TSV file `path` in the layout of `split`, whatever the file's name:
    an augmented training file (bin/augment --output=aug/my_aug.tsv, read as train_aug)."""
    spec = get_task(task)
    if not files.isfile(path):
        raise DataError(f"{path}: no such file.")
    return _examples(spec, path, spec.layout(split), split, skip_bad_rows=False)


def _examples(spec: TaskSpec, path: str, layout: FileLayout, split: str,
              skip_bad_rows: bool) -> Examples:
    _, rows = _read(spec, path, layout, split)
    out, bad = [], 0
    first_bad = None
    for no, fields in rows:
        try:
            out.append(_row_to_example(spec, layout, split, no, fields, path))
        except DataError as e:
            if not skip_bad_rows:
                raise
            bad += 1
            first_bad = first_bad or str(e)
    if bad:
        logger.warning("%s: skipped %d malformed row(s) (skip_bad_rows); first: %s",
                       path, bad, first_bad)
    if not out:
        raise DataError(f"{path}: no examples (the file has only a header"
                        f"{' and bad rows' if bad else ''}); expected "
                        f"{layout.num_columns}-column rows.")
    return Examples(out, source=path, skipped=bad)


def _row_to_example(spec: TaskSpec, layout: FileLayout, split: str, no: int,
                    fields: list, path: str) -> Example:
    if len(fields) != layout.num_columns:
        raise DataError(f"{path}:{no}: {len(fields)} tab-separated column(s), expected "
                        f"{layout.num_columns} (GLUE {spec.name} {layout.file} layout).")
    label = None
    if layout.label_col is not None:
        raw = fields[layout.label_col]
        try:
            label = _parse_label(spec, raw)
        except ValueError:
            want = ("a finite float score" if spec.is_regression
                    else f"one of {list(spec.label_names)}")
            column = layout.label_col % layout.num_columns + 1
            raise DataError(f"{path}:{no}: unknown label {raw!r} in column {column}; "
                            f"expected {want}.") from None
        if spec.score_range is not None and not spec.score_range[0] <= label \
                <= spec.score_range[1]:
            low, high = spec.score_range
            column = layout.label_col % layout.num_columns + 1
            raise DataError(f"{path}:{no}: score {raw!r} in column {column} is outside "
                            f"{spec.name}'s range [{low:g}, {high:g}]; fix the row (a "
                            "shifted column or a scaled score?) or remove it.")
    text_b = fields[layout.text_b_col] if layout.text_b_col is not None else None
    return Example(guid=f"{split}-{no}", text_a=fields[layout.text_a_col], text_b=text_b,
                   label=label)


# ---------------------------------------------------------------------------
# TFDS glue/*.

_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test",
                "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched"}


def tfds_split(spec: TaskSpec, split: str) -> str:
    split = _SPLIT_ALIASES.get((spec.name, split), split)
    if split not in _TFDS_SPLITS or split not in spec.layouts:
        raise DataError(f"TFDS {spec.tfds_name} has no split for '{split}'; use one of "
                        f"{[s for s in spec.layouts if s in _TFDS_SPLITS]} (train_aug exists "
                        f"only in a TSV directory).")
    return _TFDS_SPLITS[split]


def load_tfds_examples(task: Union[str, TaskSpec], split: str,
                       tfds_data_dir: Optional[str] = None) -> Examples:
    """Examples from TFDS `glue/<task>` prepared under `tfds_data_dir`, never downloading.

    TFDS label ids are mapped to ours by name (see module doc); -1 (TFDS's
    unlabelled test rows) becomes None.
    """
    spec = get_task(task)
    if spec.tfds_name is None:
        raise DataError(f"task {spec.name} has no TFDS source; use a TSV --data_dir.")
    import tensorflow_datasets as tfds
    name, tsplit = spec.tfds_name, tfds_split(spec, split)
    try:
        ds, info = tfds.load(name, split=tsplit, data_dir=tfds_data_dir or None, download=False,
                             try_gcs=False, with_info=True)
    except (AssertionError, FileNotFoundError, OSError, ValueError) as e:
        raise DataError(
            f"TFDS {name} split {tsplit} is not prepared under --tfds_data_dir="
            f"{tfds_data_dir or '(TFDS default ~/tensorflow_datasets)'} and this run does not "
            f"download. Prepare it where the network is reachable (`tfds build {name} "
            f"--data_dir=DIR`) and copy DIR here, or use a GLUE TSV --data_dir. ({e})") from None
    mapping = None
    if not spec.is_regression:
        names = tuple(info.features["label"].names)
        if names != spec.tfds_label_names:
            raise DataError(f"TFDS {name} label names {names} differ from the expected "
                            f"{spec.tfds_label_names}; the label mapping cannot be trusted.")
        mapping = spec.tfds_label_map
    key_a, key_b = spec.tfds_features
    out = []
    for i, ex in enumerate(tfds.as_numpy(ds)):
        raw = ex["label"]
        if spec.is_regression:
            label = None if float(raw) < 0 else float(raw)
        else:
            label = None if int(raw) < 0 else mapping[int(raw)]
        text_b = ex[key_b].decode("utf-8") if key_b else None
        out.append(Example(guid=f"{split}-{int(ex.get('idx', i))}",
                           text_a=ex[key_a].decode("utf-8"), text_b=text_b, label=label))
    if not out:
        raise DataError(f"TFDS {name} split {tsplit} is empty.")
    return Examples(out, source=f"tfds:{name}/{tsplit}")
