"""Own-data sources: your CSV / TSV / JSON-lines text files and CoNLL / JSON-lines token files.

Two registered `DataSource` kinds read the files of `--train_file`,
`--validation_file` and `--test_file` (splits train, dev, test):

  tabular      one text (or a pair) and a label per row (`tabular.py`): class names
               (the training file's sorted set, or `--labels`) or regression targets
  token_files  one sentence per example with a tag per word (`conll.py`): CoNLL or
               JSON lines, tags checked as IOB2

Both hold the label names the task trains with, say what they read
(`describe()`: paths, sizes, modification times) and rewrite their training
file for augmentation in its own format (`augment_table()`): CSV stays CSV
(every column kept, quoted where needed), TSV stays TSV, JSON lines stay JSON
lines (every key kept), CoNLL stays CoNLL as `word<TAB>tag` lines (other
columns, e.g. POS and chunk tags, are dropped: a replaced word would make them
wrong). `augmented(path)` reads the written file back with the same settings.

Token examples are `WordsExample`s: `text_a` is the sentence as one line
(`conll.join_words`: what a client sends the SavedModel), `words` the words
themselves, `label` the tag ids, one per word.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from typing import Any, Mapping, Optional, Sequence

from tinybert_tf import files as tf_files
from tinybert_tf.data import conll, tabular
from tinybert_tf.data.examples import DataError, Example, Examples
from tinybert_tf.data.sources import (
    AUGMENTED_SPLIT,
    AugmentedFile,
    DataSource,
    RowTable,
    file_facts,
    register_source,
)

SPLIT_FLAGS = {"train": "--train_file", "dev": "--validation_file", "test": "--test_file"}


@dataclasses.dataclass
class WordsExample(Example):
    """A token-classification example: `words` [W], `label` W tag ids (or None)."""

    words: list[str] = dataclasses.field(default_factory=list)


def _split_file(files: Mapping[str, str], split: str) -> str:
    flag = SPLIT_FLAGS.get(split)
    if split not in files:
        hint = f"give {flag}=FILE" if flag else f"use one of {sorted(files)}"
        raise DataError(f"no {split} split: {hint}.")
    if tf_files.isdir(files[split]):
        raise DataError(f"{flag or split}={files[split]}: is a folder; give the file itself "
                        "(.csv, .tsv, .jsonl, or a CoNLL file).")
    if not tf_files.exists(files[split]):  # named by its flag (a config may have set it)
        drop = f", or give {flag}= (empty: no test split)" if split == "test" else ""
        raise DataError(f"{flag or split}={files[split]}: file not found; fix the path"
                        f"{drop}.")
    return files[split]


class _Cached:
    """Parsed files, re-read when a file's size or modification time changes."""

    def __init__(self):
        self._cache: dict[tuple, tuple[dict, Any]] = {}

    def cached(self, path: str, how: tuple, read) -> Any:
        """read() of `path`, once per (path, how) while the file stays the same."""
        facts = file_facts(path)
        hit = self._cache.get((path, how))
        if hit is not None and hit[0] == facts:
            return hit[1]
        value = read()
        self._cache[(path, how)] = (facts, value)
        return value


def _csv_bytes(rows: Sequence[Sequence[str]], delimiter: str) -> bytes:
    """Rows as CSV / TSV text: a field holding the delimiter, a quote or a newline is
    quoted with every quote doubled (what `tabular` reads back)."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n",
                        quoting=csv.QUOTE_MINIMAL)
    for row in rows:
        writer.writerow(row)
    return buf.getvalue().encode("utf-8")


def _json_line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# Text classification / regression.

@register_source
class TabularSource(DataSource):
    """CSV / TSV / JSON-lines files of a text (or pair) classification or regression task.

    Args:
      files: split -> path ("train" and "dev" required, "test" optional and
        unlabelled or labelled).
      text_column, text_pair_column, label_column: the columns (JSON keys) read.
      data_format: csv | tsv | jsonl; None: from each file's extension.
      labels: `--labels` (class names in id order), or None for the training
        file's sorted set.
      regression: labels are numbers (no label set).
    """

    kind = "tabular"

    def __init__(self, files: Mapping[str, str], text_column: str = "text",
                 text_pair_column: Optional[str] = None, label_column: str = "label",
                 data_format: Optional[str] = None,
                 labels: Optional[Sequence[str]] = None, regression: bool = False):
        self.files = dict(files)
        self.text_column = text_column
        self.text_pair_column = text_pair_column or None
        self.label_column = label_column
        same = [f for f, c in (("--text_column", text_column),
                               ("--text_pair_column", self.text_pair_column)) if c == label_column]
        if same:
            raise DataError(f"--label_column={label_column} is also {same[0]}: the label column "
                            "must hold the labels (or targets), not the text; name the column "
                            "that holds them.")
        self.data_format = data_format or None
        self.regression = bool(regression)
        self.format = tabular.detect_format(_split_file(self.files, "train"), self.data_format)
        self._files = _Cached()
        train = self.raw("train")
        self.label_names: tuple[str, ...] = (
            () if regression else tuple(tabular.label_set(train, list(labels) if labels
                                                          else None)))

    @property
    def augmented_name(self) -> str:  # train_aug.csv, .tsv or .jsonl
        return f"train_aug.{self.format}"

    def splits(self):
        return tuple(self.files)

    def raw(self, split: str, path: Optional[str] = None) -> tabular.TableExamples:
        """The split's examples with raw labels (cached per file)."""
        path = path or _split_file(self.files, split)
        return self._files.cached(path, (split == "test",), lambda: tabular.load_examples(
            path, self.text_column, self.text_pair_column, self.label_column, self.data_format,
            require_label=split != "test"))

    def encode(self, raw: tabular.TableExamples) -> Examples:
        """Raw labels -> class ids (or floats for regression)."""
        if self.regression:
            return tabular.parse_regression(raw)
        return tabular.encode_labels(raw, self.label_names)

    def load(self, split):
        return self.encode(self.raw(split))

    def describe(self):
        return {"kind": self.kind, "format": self.format,
                "files": {s: file_facts(p) for s, p in self.files.items()},
                "text_column": self.text_column, "text_pair_column": self.text_pair_column,
                "label_column": self.label_column, "labels": list(self.label_names),
                "regression": self.regression}

    def augment_table(self) -> RowTable:
        path = self.files["train"]
        self.raw("train")  # every text checked (file and line named) before any is written
        text_columns = [c for c in (self.text_column, self.text_pair_column) if c]
        if self.format == "jsonl":
            return self._jsonl_table(path, text_columns)
        delimiter = "," if self.format == "csv" else "\t"
        _, header, _ = tabular.read_table(path, self.format)
        names = [h.strip() for h in header]
        return RowTable(
            path=path, header=header, text_columns=[names.index(c) for c in text_columns],
            rows=lambda: iter(tabular.read_table(path, self.format)[2]),
            encode=lambda rows: _csv_bytes(rows, delimiter),
            output_name=self.augmented_name, num_columns=len(header))

    def _jsonl_table(self, path: str, text_columns: list[str]) -> RowTable:
        """Fields: the texts, then the whole object (its other keys are copied)."""
        def rows():
            for line, obj in tabular.read_table(path, "jsonl")[2]:
                yield line, [obj[c] for c in text_columns] + [json.dumps(obj,
                                                                         ensure_ascii=False)]

        def encode(rows_: Sequence[Sequence[str]]) -> bytes:
            out = []
            for fields in rows_:
                obj = json.loads(fields[-1])
                for i, c in enumerate(text_columns):
                    obj[c] = fields[i]
                out.append(_json_line(obj))
            return "".join(out).encode("utf-8")

        return RowTable(path=path, header=None, text_columns=list(range(len(text_columns))),
                        rows=rows, encode=encode, output_name=self.augmented_name,
                        num_columns=len(text_columns) + 1)

    def augmented(self, path):
        return _AugmentedTable(self, path)


class _AugmentedTable(AugmentedFile):
    """The augmented training file of a `TabularSource`: same columns and format,
    labels encoded with the original training file's label set."""

    kind = "tabular_augmented"

    def __init__(self, parent: TabularSource, path: str):
        super().__init__(path)
        self.parent = parent

    def read(self):
        return self.parent.encode(self.parent.raw(AUGMENTED_SPLIT, self.path))


# ---------------------------------------------------------------------------
# Token classification.

def token_format(path: str, data_format: Optional[str] = None) -> str:
    """'conll' or 'jsonl' for a token file: `data_format` ('tsv' = tab-separated CoNLL)
    or the extension (.jsonl/.json/.ndjson: JSON lines; anything else CoNLL)."""
    fmt = (data_format or "").strip().lower()
    if fmt in ("conll", "tsv"):
        return "conll"
    if fmt in ("jsonl", "json", "ndjson", "jsonlines"):
        return "jsonl"
    if fmt:
        raise DataError(f"--data_format={data_format}: token classification reads CoNLL "
                        "(--data_format=conll) or JSON lines (--data_format=jsonl).")
    jsonl = os.path.splitext(path)[1].lower() in (".jsonl", ".json", ".ndjson")
    return "jsonl" if jsonl else "conll"


@register_source
class TokenSource(DataSource):
    """CoNLL / JSON-lines files of a token classification task (NER).

    Args:
      files: split -> path ("train" and "dev" required, "test" optional).
      data_format: conll | jsonl; None: from the extension.
      tag_column: CoNLL: the tag's column (0-based, -1 = last).
      labels: `--labels`: the tags in id order (also the names of integer tags in
        JSON lines); None: "O" then B-/I- of every type seen in training, sorted.
      tokens_key, tags_key: JSON-lines keys of the words and the tags.
      scheme: "iob2" (tags checked, entity metrics), None (plain tags, token
        accuracy) or "auto": decided by the training file's tags
        (`conll.decide_scheme`), then used for every split.
    """

    kind = "token_files"

    def __init__(self, files: Mapping[str, str], data_format: Optional[str] = None,
                 tag_column: int = -1, labels: Optional[Sequence[str]] = None,
                 tokens_key: str = "tokens", tags_key: str = "tags",
                 scheme: Optional[str] = "iob2"):
        self.files = dict(files)
        self.format = token_format(_split_file(self.files, "train"), data_format)
        # None: each file's own extension (the augmented file is named for its format).
        self.data_format = self.format if data_format else None
        self.tag_column = int(tag_column)
        self.explicit = list(labels) if labels else None
        self.tokens_key, self.tags_key = tokens_key, tags_key
        self.scheme = scheme
        self._files = _Cached()
        train = self.sentences("train")
        self.scheme = train.scheme  # "auto": what the training tags decided
        self.label_names: tuple[str, ...] = tuple(conll.tag_set(train, self.explicit))

    @property
    def augmented_name(self) -> str:  # train_aug.conll or .jsonl
        return f"train_aug.{self.format}"

    def splits(self):
        return tuple(self.files)

    def sentences(self, split: str, path: Optional[str] = None,
                  tag_column: Optional[int] = None) -> conll.Sentences:
        """The split's sentences (cached per file)."""
        path = path or _split_file(self.files, split)
        column = self.tag_column if tag_column is None else tag_column
        return self._files.cached(path, (split == "test", column), lambda: conll.load_sentences(
            path, self.data_format, column, self.tokens_key, self.tags_key, self.explicit,
            require_tags=split != "test", scheme=self.scheme))

    def encode(self, sentences: conll.Sentences) -> Examples:
        """Sentences -> `WordsExample`s with tag ids (a tag unseen in training: DataError)."""
        ids = conll.encode_tags(sentences, self.label_names)
        stem = os.path.splitext(os.path.basename(sentences.source))[0]
        out = [WordsExample(f"{stem}-{s.line}", conll.join_words(s.words), None, t,
                            words=list(s.words))
               for s, t in zip(sentences, ids)]
        return Examples(out, source=sentences.source, skipped=sentences.skipped)

    def load(self, split):
        return self.encode(self.sentences(split))

    def describe(self):
        return {"kind": self.kind, "format": self.format,
                "files": {s: file_facts(p) for s, p in self.files.items()},
                "tag_column": self.tag_column, "labels": list(self.label_names),
                "scheme": self.scheme}

    def augment_table(self) -> RowTable:
        """Fields: the sentence as one line (the text augmentation varies, word for
        word), its words (JSON), then its tags (CoNLL) or whole object (JSON lines)."""
        path = self.files["train"]
        train = self.sentences("train")
        if self.format == "jsonl":
            def rows():
                objects = dict(tabular.read_table(path, "jsonl")[2])
                for s in train:
                    yield s.line, [conll.join_words(s.words), json.dumps(s.words),
                                   json.dumps(objects[s.line], ensure_ascii=False)]
            encode = self._encode_jsonl
        else:
            def rows():
                for s in train:
                    yield s.line, [conll.join_words(s.words), json.dumps(s.words),
                                   json.dumps(s.tags)]
            encode = self._encode_conll
        return RowTable(path=path, header=None, text_columns=[0], rows=rows, encode=encode,
                        output_name=self.augmented_name, num_columns=3, pre_split=True)

    @staticmethod
    def _words(fields: Sequence[str]) -> list[str]:
        """A row's words: a variant's replacements, the original where unchanged (so a
        word holding a space, written with a no-break space in the text, comes back)."""
        new, original = fields[0].split(" "), json.loads(fields[1])
        if len(new) != len(original):
            raise ValueError(f"augmentation changed the word count ({len(original)} -> "
                             f"{len(new)}) of {fields[0]!r}; token rows are pre-split.")
        return [o if w == conll.join_words([o]) else w for w, o in zip(new, original)]

    def _encode_conll(self, rows: Sequence[Sequence[str]]) -> bytes:
        out = []
        for fields in rows:
            tags = json.loads(fields[2])
            out.append("".join(f"{w}\t{t}\n" for w, t in zip(self._words(fields), tags)))
            out.append("\n")
        return "".join(out).encode("utf-8")

    def _encode_jsonl(self, rows: Sequence[Sequence[str]]) -> bytes:
        out = []
        for fields in rows:
            obj = json.loads(fields[2])
            obj[self.tokens_key] = self._words(fields)
            out.append(_json_line(obj))
        return "".join(out).encode("utf-8")

    def augmented(self, path):
        return _AugmentedTokens(self, path)


class _AugmentedTokens(AugmentedFile):
    """The augmented training file of a `TokenSource` (CoNLL `word<TAB>tag`, or JSON lines)."""

    kind = "token_files_augmented"

    def __init__(self, parent: TokenSource, path: str):
        super().__init__(path)
        self.parent = parent

    def read(self):
        # CoNLL is written as word<TAB>tag: the tag is the last column whatever --tag_column.
        sentences = self.parent.sentences(AUGMENTED_SPLIT, self.path, tag_column=-1)
        return self.parent.encode(sentences)
