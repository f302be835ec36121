"""Data sources: registered readers of a task's labelled data.

A `DataSource` yields `Examples` per split and says what it read (for resume
and stale-stage checks). Sources whose files augmentation can rewrite also
give a `RowTable`: their training rows as raw fields, which text columns to
vary, and how to write rows back in their own format, so the augmented file
reads back with the same reader (`augmented(path)`).

Registered kinds (`SOURCES`): `glue_tsv` (a GLUE-layout folder), `tfds`
(TFDS glue/*, prepared offline), `polarity` (the embedded demo task read
straight from gensim's file). Own-data readers (CSV / TSV / JSON lines,
CoNLL, SQuAD JSON) register here too. `glue_source` holds the one rule that
maps `--task` + `--data_dir` onto a GLUE-style source, the embedded polarity
task for an empty `--data_dir` included.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ClassVar, Iterator, Optional, Sequence

from tinybert_tf import files, plugins
from tinybert_tf.data import glue, polarity
from tinybert_tf.data.examples import DataError, Examples

AUGMENTED_SPLIT = "train_aug"


@dataclasses.dataclass
class RowTable:
    """A source's training rows as augmentation reads and writes them.

    path: the file read (named in errors and in the augmentation's identity);
    header: written first (None: no header row);
    text_columns: indexes of the fields augmentation varies;
    rows(): (line number, fields) for every example, in file order;
    encode(rows): bytes of `rows` in the source's format (a header row too);
    output_name: the augmented file's name (`train_aug.tsv`, ...);
    num_columns: every row's field count (checked before anything is written);
    pre_split: the text columns hold words joined by single spaces (token
      tasks): augmentation replaces whole words one for one and never re-splits
      them, so per-word tags stay aligned.
    """

    path: str
    header: Optional[list[str]]
    text_columns: list[int]
    rows: Callable[[], Iterator[tuple[int, list[str]]]]
    encode: Callable[[Sequence[Sequence[str]]], bytes]
    output_name: str
    num_columns: Optional[int] = None
    pre_split: bool = False

    def fingerprint(self) -> dict[str, Any]:
        st = files.stat(self.path)
        return {"path": files.absolute(self.path), "size": st.size,
                "mtime_ns": st.mtime_ns}


class DataSource:
    """Base class of a registered data source (see the module docstring).

    augmented_name: the file name the augment stage writes for this source.
    """

    kind: ClassVar[str] = ""
    augmented_name: ClassVar[str] = "train_aug.tsv"

    def splits(self) -> tuple[str, ...]:
        raise NotImplementedError

    def load(self, split: str) -> Examples:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What was read: kind, paths, sizes and modification times."""
        raise NotImplementedError

    def input_paths(self) -> list[str]:
        """Every file the source reads: each "path" in `describe()`, sorted, once."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                if isinstance(value.get("path"), str):
                    found.append(value["path"])
                for v in value.values():
                    walk(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)
        walk(self.describe())
        return sorted(set(found))

    def augment_table(self) -> RowTable:
        raise DataError(f"{self.kind} data cannot be augmented in place; write it as files "
                        "(e.g. GLUE TSV or CSV) or run with --nouse_augmented.")

    def augmented(self, path: str) -> "DataSource":
        """The source that reads an augmented file written from `augment_table()`."""
        raise DataError(f"{self.kind} data has no augmented split.")


SOURCES: dict[str, type[DataSource]] = {}


def register_source(cls: Optional[type[DataSource]] = None, *, replace: bool = False):
    """Class decorator: register a data source under its `kind`
    (`@register_source(replace=True)` replaces a registered kind)."""
    def add(c: type[DataSource]) -> type[DataSource]:
        return plugins.register(SOURCES, c.kind, c, what="data source", replace=replace)
    return add(cls) if cls is not None else add


def file_facts(path: str) -> dict[str, Any]:
    """Path, size and modification time (through tf.io.gfile), or {"missing": True}:
    a file's identity for the stale-stage checks."""
    if not files.isfile(path):
        return {"path": files.absolute(path), "missing": True}
    st = files.stat(path)
    return {"path": files.absolute(path), "size": st.size, "mtime_ns": st.mtime_ns}


class AugmentedFile(DataSource):
    """Base of the source of one file the augment stage wrote for a parent source:
    the single split `train_aug`, parsed by `read()` (subclasses)."""

    def __init__(self, path: str):
        self.path = path

    def splits(self) -> tuple[str, ...]:
        return (AUGMENTED_SPLIT,)

    def load(self, split: str) -> Examples:
        if split != AUGMENTED_SPLIT:
            raise DataError(f"{self.path}: holds only the {AUGMENTED_SPLIT} split, not {split}.")
        return self.read()

    def read(self) -> Examples:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": file_facts(self.path)}


def _tsv_bytes(rows: Sequence[Sequence[str]], where: str) -> bytes:
    return "".join(glue.tsv_line(r, where, f"row {i + 1}") for i, r in enumerate(rows)).encode()


@register_source
class GlueTsvSource(DataSource):
    """A GLUE-layout folder (train.tsv, dev.tsv, ...) of a task in `glue`'s table."""

    kind = "glue_tsv"

    def __init__(self, spec: glue.TaskSpec, data_dir: str):
        self.spec = spec
        self.data_dir = data_dir

    def splits(self):
        return tuple(self.spec.layouts)

    def load(self, split):
        return glue.load_examples(self.spec, self.data_dir, split)

    def describe(self):
        found = {s: file_facts(os.path.join(self.data_dir, lay.file))
                 for s, lay in self.spec.layouts.items()
                 if files.isfile(os.path.join(self.data_dir, lay.file))}
        return {"kind": self.kind, "task": self.spec.name,
                "data_dir": files.absolute(self.data_dir), "files": found}

    def augment_table(self):
        layout = self.spec.layout("train")
        path = os.path.join(self.data_dir, layout.file)
        header, _ = glue.read_rows(self.spec, self.data_dir, "train")
        return RowTable(
            path=path, header=header,
            text_columns=[c for c in (layout.text_a_col, layout.text_b_col) if c is not None],
            rows=lambda: glue.read_rows(self.spec, self.data_dir, "train")[1],
            encode=lambda rows: _tsv_bytes(rows, path), output_name="train_aug.tsv",
            num_columns=layout.num_columns)

    def augmented(self, path):
        return _AugmentedTsv(self.spec, path)


class _AugmentedTsv(AugmentedFile):
    """The augmented split of a GLUE-layout task: a TSV in the task's train layout (the
    augment stage's `train_aug.tsv`, or bin/augment's output under any name)."""

    kind = "glue_tsv_augmented"

    def __init__(self, spec: glue.TaskSpec, path: str):
        super().__init__(path)
        self.spec = spec

    def read(self):
        return glue.load_file(self.spec, self.path, AUGMENTED_SPLIT)

    def describe(self):
        return {**super().describe(), "task": self.spec.name}


@register_source
class TfdsGlueSource(DataSource):
    """TFDS `glue/<task>` prepared under `tfds_data_dir` (never downloaded)."""

    kind = "tfds"

    def __init__(self, spec: glue.TaskSpec, tfds_data_dir: Optional[str] = None):
        self.spec = spec
        self.tfds_data_dir = tfds_data_dir or None

    def splits(self):
        return tuple(s for s in self.spec.layouts if s != AUGMENTED_SPLIT)

    def load(self, split):
        return glue.load_tfds_examples(self.spec, split, self.tfds_data_dir)

    def describe(self):
        return {"kind": self.kind, "task": self.spec.name, "name": self.spec.tfds_name,
                "tfds_data_dir": self.tfds_data_dir}

    def augment_table(self):
        raise DataError("--data_dir=tfds: augmentation reads and writes task files; point "
                        "--data_dir at the task's GLUE folder (train.tsv), or run with "
                        "--nouse_augmented.")


@register_source
class PolaritySource(DataSource):
    """The embedded demo task: Pang & Lee sentences in gensim's test data, with
    the fixed split of `polarity.split_rows` (train 160, dev 40)."""

    kind = "polarity"

    def __init__(self, path: Optional[str] = None):
        self.path = path or polarity.default_path()
        self.spec = glue.get_task("polarity")

    def splits(self):
        return polarity.SPLITS

    def load(self, split):
        return polarity.load_examples(split, self.path)

    def describe(self):
        return {"kind": self.kind, "file": file_facts(self.path)}

    def augment_table(self):
        names = self.spec.label_names

        def rows():
            for no, text, label in polarity.split_rows(self.path)["train"]:
                yield no, [text, names[label]]

        # The SST-2 layout of `polarity.write_task_dir`, so the output reads as GLUE TSV.
        return RowTable(path=self.path, header=["sentence", "label"], text_columns=[0],
                        rows=rows, encode=lambda r: _tsv_bytes(r, self.path),
                        output_name="train_aug.tsv", num_columns=2)

    def augmented(self, path):
        return _AugmentedTsv(self.spec, path)


def glue_source(task: Any, data_dir: str, tfds_data_dir: Optional[str] = None) -> DataSource:
    """The source of a task in `glue`'s table (GLUE, polarity) for `--data_dir`.

    "tfds" reads TFDS glue/*; "" is the embedded polarity task (only for
    --task=polarity: other tasks need their folder); anything else is a
    GLUE-layout folder.
    """
    spec = glue.get_task(task)
    if data_dir == glue.TFDS:
        if spec.tfds_name is None:
            raise DataError(f"task {spec.name} has no TFDS source; use a TSV --data_dir.")
        return TfdsGlueSource(spec, tfds_data_dir)
    if not data_dir:
        if spec.name == "polarity":
            return PolaritySource()
        raise DataError(f"--data_dir is required for --task={spec.name}: point it at the task's "
                        "GLUE folder (train.tsv, dev.tsv, ...) or use 'tfds'.")
    return GlueTsvSource(spec, data_dir)
