"""Resolve `--task` and its data flags into a `Task`: a task type plus a data source.

`TaskConfig` holds the flags that define a task's data (`--task`,
`--data_dir`, own-data files and columns, `--max_seq_len`). `resolve_task`
looks the name up among the registered task factories (own-data kinds such as
`text_classification` register themselves) and otherwise in the GLUE table
(`tinybert_tf.data.glue`, which includes the embedded `polarity` task).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from tinybert_tf import fields, files, plugins
from tinybert_tf.data import glue
from tinybert_tf.data.examples import DataError, Examples
from tinybert_tf.data.sources import AUGMENTED_SPLIT, DataSource, glue_source
from tinybert_tf.fields import TASK_STAGES as _STAGES
from tinybert_tf.fields import at_least, non_negative, setting
from tinybert_tf.tasks.base import TASK_TYPES, TaskType
from tinybert_tf.tasks.sentence import Classification, Regression


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The flags that define a task's data: each field is a setting (flag, help, range and
    the stages it shapes: every stage that reads the task)."""

    task: str = setting(
        "polarity", lambda: f"Task: {', '.join(task_names())} (case-insensitive). GLUE names "
        "read --data_dir; text_classification, text_regression, token_classification, "
        "squad1.1 and squad2.0 read --train_file/--validation_file.", stages=_STAGES)
    data_dir: str = setting("", "GLUE-layout task folder (train.tsv, dev.tsv, ...), 'tfds' to "
                            "read TFDS glue/*, or empty for the embedded demo task "
                            "(--task=polarity).", stages=_STAGES)
    tfds_data_dir: str = setting("", "TFDS data_dir for tfds sources (prepared offline).",
                                 stages=_STAGES)
    train_file: str = setting("", "Your training data: .csv, .tsv, .jsonl (text tasks), CoNLL "
                              "or .jsonl (token_classification), SQuAD .json.", stages=_STAGES)
    validation_file: str = setting("", "Your dev data, same format as --train_file.",
                                   stages=_STAGES)
    test_file: str = setting("", "Optional unlabelled test data, same format.", stages=_STAGES)
    data_format: str = setting("", "Format of the own-data files; empty = from the file "
                               "extension.", choices=("", "csv", "tsv", "jsonl", "conll"),
                               stages=_STAGES)
    text_column: str = setting("text", "Column (or JSON key) of the text.", stages=_STAGES)
    text_pair_column: str = setting("", "Column of the second text of a pair task (empty: "
                                    "single sentences).", stages=_STAGES)
    label_column: str = setting("label", "Column of the label (or regression target).",
                                stages=_STAGES)
    tag_column: int = setting(-1, "CoNLL: the column holding the tag (-1 = last).",
                              stages=_STAGES)
    labels: tuple[str, ...] = setting([], "Label names in the order to use (default: sorted "
                                      "names of the training file).", stages=_STAGES)
    max_seq_len: int = setting(0, "Task sequence length; 0 = the task's default (64 single "
                               "sentences, 128 pairs, 384 SQuAD).",
                               check=non_negative("0 = the task's default"), stages=_STAGES)
    max_query_len: int = setting(64, "SQuAD: question pieces kept.", check=at_least(1),
                                 stages=_STAGES)
    doc_stride: int = setting(128, "SQuAD: step between context windows (pieces).",
                              check=at_least(1), stages=_STAGES)
    n_best_size: int = setting(20, "SQuAD: candidate spans kept per question.",
                               check=at_least(1), stages=_STAGES)
    max_answer_len: int = setting(30, "SQuAD: longest answer in word pieces.",
                                  check=at_least(1), stages=_STAGES)

    @classmethod
    def from_flags(cls, values: Any) -> "TaskConfig":
        """From parsed flags (any object with these attributes, e.g. absl FLAGS)."""
        return fields.from_flags(cls, values)

    def to_record(self) -> dict[str, Any]:
        """The config as JSON with absolute data paths: what a task model records of the
        task it was trained on (bin/export reads it back with `from_record`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in _PATH_FIELDS:
            value = out[name]
            if value and value != glue.TFDS:
                out[name] = files.absolute(value)
        out["labels"] = list(self.labels)
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "TaskConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record.items()
                  if k in known}
        return cls(**values)


_PATH_FIELDS = ("data_dir", "tfds_data_dir", "train_file", "validation_file", "test_file")


@dataclasses.dataclass
class Task:
    """A task ready to run: what it predicts (`type`) and where its data is (`source`)."""

    name: str
    type: TaskType
    source: DataSource
    is_pair: bool
    default_max_seq_len: int
    dev_splits: tuple[str, ...] = ("dev",)
    # The source of the augmented training file, once the augment stage wrote it.
    augmented_source: Optional[DataSource] = None

    def examples(self, split: str) -> Examples:
        """Examples of `split` ("train_aug": the augmented file)."""
        if split == AUGMENTED_SPLIT:
            if self.augmented_source is None:
                raise DataError("the augmented training data is not there yet: run the "
                                "augment stage first, or --nouse_augmented.")
            return self.augmented_source.load(split)
        return self.source.load(split)

    def with_augmented(self, path: str) -> "Task":
        return dataclasses.replace(self, augmented_source=self.source.augmented(path))

    def max_seq_len(self, override: int = 0) -> int:
        return int(override) or self.default_max_seq_len

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.describe(), "source": self.source.describe(),
                "is_pair": self.is_pair, "dev_splits": list(self.dev_splits)}


TASK_FACTORIES: dict[str, Callable[[TaskConfig], Task]] = {}


def register_task(*names: str, replace: bool = False):
    """Decorator: `factory(config) -> Task` answers `--task=NAME` for each name. A name
    already taken (by another factory or a GLUE-table task such as sst-2) is refused
    unless `replace=True`."""
    def decorate(factory: Callable[[TaskConfig], Task]) -> Callable[[TaskConfig], Task]:
        for name in names:
            key = name.lower()
            if not replace and key not in TASK_FACTORIES and _glue_name(key):
                raise plugins.PluginError(
                    f"task name {name!r} is a built-in task ({_glue_name(key)}); registering "
                    f"{factory.__qualname__} by {factory.__module__} would replace it "
                    "silently. Choose another name, or say it replaces it (replace=True).")
            plugins.register(TASK_FACTORIES, key, factory, what="task name (--task)",
                             replace=replace)
        return factory
    return decorate


def _glue_name(key: str) -> Optional[str]:
    try:
        return glue.get_task(key).name
    except DataError:
        return None


def task_names() -> tuple[str, ...]:
    return tuple(TASK_FACTORIES) + glue.task_names()


def is_known_task(name: str) -> bool:
    """Whether `resolve_task` knows --task=name (as registered so far)."""
    key = str(name).strip().lower()
    if key in TASK_FACTORIES:
        return True
    try:
        glue.get_task(key)
    except DataError:
        return False
    return True


def glue_task_type(spec: glue.TaskSpec) -> TaskType:
    """The task type of a task in the GLUE table (its labels and metrics)."""
    if spec.is_regression:
        return Regression(metric_names=spec.metric_names, primary_metric=spec.primary_metric)
    return Classification(spec.label_names, spec.metric_names, spec.primary_metric)


def task_type(name: str) -> TaskType:
    """The task type of a GLUE-table task by name (e.g. for scoring predictions)."""
    return glue_task_type(glue.get_task(name))


# TaskConfig fields that say how to read your own files (columns, labels, format).
OWN_DATA_LAYOUT = ("data_format", "text_column", "text_pair_column", "label_column",
                   "tag_column", "labels")


def refuse_layout_flags(config: TaskConfig, why: str) -> None:
    """A task whose files have a fixed layout (GLUE's, SQuAD's) refuses the flags that
    describe your own files: a value given would be ignored without a word."""
    given = _set_fields(config, OWN_DATA_LAYOUT)
    if given:
        raise DataError(f"--{given[0]}={_flag_text(getattr(config, given[0]))}: describes "
                        f"your own files (--task=text_classification, ...); --task="
                        f"{config.task} {why}, so it would be ignored: drop it.")


def _set_fields(config: TaskConfig, names: Sequence[str]) -> list[str]:
    """Of `names` (TaskConfig fields), those `config` sets to other than the default."""
    defaults = {f.name: f.default for f in dataclasses.fields(TaskConfig)}
    return [name for name in names if getattr(config, name) != defaults[name]]


def _flag_text(value) -> str:
    return ",".join(value) if isinstance(value, (list, tuple)) else str(value)


def _glue_task(config: TaskConfig) -> Task:
    spec = glue.get_task(config.task)
    own = [f for f in ("train_file", "validation_file", "test_file") if getattr(config, f)]
    if own:
        raise DataError(f"--{own[0]} is for your own data (--task=text_classification, "
                        f"text_regression, token_classification, squad1.1, squad2.0); "
                        f"--task={config.task} reads --data_dir.")
    refuse_layout_flags(config, "has its own columns and labels")
    source = glue_source(spec, config.data_dir, config.tfds_data_dir or None)
    return Task(spec.name, glue_task_type(spec), source, spec.is_pair,
                spec.default_max_seq_len, tuple(spec.dev_splits))


def resolve_task(config: TaskConfig) -> Task:
    """The `Task` for `config` (raises DataError naming --task for an unknown name)."""
    key = str(config.task).strip().lower()
    if key in TASK_FACTORIES:
        return _reads_its_flags(TASK_FACTORIES[key](config), config)
    if not is_known_task(key):
        raise DataError(f"--task={config.task}: unknown task; use one of "
                        f"{', '.join(task_names())} (case-insensitive), or a task a "
                        "--plugins module registers (docs/extending.md).")
    return _reads_its_flags(_glue_task(config), config)


def _reads_its_flags(task: Task, config: TaskConfig) -> Task:
    """`task`, unless `config` sets a flag that only tasks of another kind read (a task
    type's `own_flags`, e.g. --doc_stride for SQuAD): it would be ignored."""
    for kind in TASK_TYPES.values():
        if isinstance(task.type, kind):
            continue
        for name in _set_fields(config, kind.own_flags):
            if name not in task.type.own_flags:
                raise DataError(f"--{name}={_flag_text(getattr(config, name))}: only "
                                f"tasks of type {kind.kind} read it, and --task={config.task} "
                                f"is {task.type.kind}, so it would be ignored: drop it.")
    return task
