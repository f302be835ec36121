"""Own-data text classification and regression files: CSV, TSV and JSON lines.

The format follows the file's extension; `data_format` overrides it:
- `.csv`: Python's `csv` module, default (Excel) dialect. The first record is
  the header naming the columns. A field may be quoted with `"`; a quoted field
  may hold commas, tabs and newlines, and a `"` inside it is doubled (`""`).
- `.tsv` / `.tab`: the same quoting rules with a tab as the delimiter. Unlike
  GLUE's TSV files (`glue.py`, quoting off), a field that STARTS with `"` is a
  quoted field here and must end with `"`; a `"` elsewhere in a field is text.
- `.jsonl` / `.json` / `.ndjson`: JSON lines, one object per line; its keys are
  the columns (a whole-file JSON array is refused with the conversion to use).

Every file is UTF-8 with or without a byte-order mark, with LF or CRLF line
endings, and is read through `tf.io.gfile` (so gs:// and ram:// paths work).
Parsing is strict: a CSV record whose field count differs from the header's, or
a quote that is never closed, is a `DataError` naming the record's starting line
rather than a silently shifted column (an unquoted comma in the text would
otherwise move the label).

Labels are returned RAW (a string from CSV/TSV; whatever JSON held) so that one
reader serves classification and regression: `label_set` + `encode_labels` turn
them into class ids with names, `parse_regression` into floats. Class names are
strings everywhere (DESIGN: labels have names); an integer label 3 is named "3".
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data.examples import DataError, Example, Examples

FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl",
               ".json": "jsonl", ".ndjson": "jsonl"}
_FORMAT_ALIASES = {"csv": "csv", "tsv": "tsv", "tab": "tsv", "jsonl": "jsonl",
                   "json": "jsonl", "jsonlines": "jsonl", "ndjson": "jsonl"}
_INT_NAME = re.compile(r"[+-]?\d+\Z")
_BOM = b"\xef\xbb\xbf"
_JSONL_EXAMPLE = '{"text": "...", "label": "..."}'
_ARRAY_HINT = ("the file looks like one JSON array: write one object per line instead "
               "(e.g. jq -c '.[]' in.json > out.jsonl)")


class TableExamples(Examples):
    """`Examples` plus, per example, the 1-based line its record starts on.

    `lines[i]` belongs to `self[i]`; `label_column` names the column the labels
    came from (None for an unlabelled file). Both only serve error messages.
    """

    def __init__(self, items: Iterable[Any] = (), source: str = "", skipped: int = 0,
                 lines: Iterable[int] = (), label_column: Optional[str] = None):
        super().__init__(items, source=source, skipped=skipped)
        self.lines = list(lines)
        self.label_column = label_column

    def __getitem__(self, index):
        """A slice keeps the source, the lines and the label column."""
        if isinstance(index, slice):
            return TableExamples(list.__getitem__(self, index), self.source, self.skipped,
                                 self.lines[index], self.label_column)
        return list.__getitem__(self, index)


# ---------------------------------------------------------------------------
# Files.

def read_text_file(path: str) -> str:
    """The whole file decoded as UTF-8 (a leading BOM dropped), via `tf.io.gfile`.

    Read whole: the examples it yields are held in memory anyway. Line endings
    are left as they are (the CSV reader needs them raw). A missing file or
    invalid UTF-8 is a `DataError` naming the file (and the line).
    """
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        raise DataError(f"{path}: file not found; check the --train_file / --validation_file "
                        f"/ --test_file path.") from None
    except tf.errors.OpError as e:
        raise DataError(f"{path}: cannot read the file ({e.message}).") from None
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 ({data[max(0, e.start - 10):e.start + 10]!r}"
                        f"); the file must be UTF-8: {files.reencode_hint(data)}.") from None


def detect_format(path: str, data_format: Optional[str] = None) -> str:
    """'csv', 'tsv' or 'jsonl' from `data_format` when given, else from the extension."""
    if data_format:
        fmt = _FORMAT_ALIASES.get(data_format.strip().lower())
        if fmt is None:
            raise DataError(f"unknown data format {data_format!r}; use one of {list(FORMATS)}.")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        conll = (" (a CoNLL file of tagged words is read by --task=token_classification)"
                 if ext in (".conll", ".conllu", ".iob", ".bio") else "")
        raise DataError(f"{path}: cannot tell the format from the extension {ext or '(none)'!r}; "
                        f"name the file .csv, .tsv or .jsonl, or pass --data_format="
                        f"{'|'.join(FORMATS)}{conll}.")
    return _EXTENSIONS[ext]


_FIELD_LIMIT = 2**31 - 1


# More distinct labels than this, in more than half the rows: not a class column.
_MAX_CLASSES = 100
# A different label on every one of more rows than this: an id or text column.
_ONE_PER_ROW = 10


def _csv_records(text: str, path: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(starting line, fields) of every non-blank CSV/TSV record."""
    # A text may be long (a document): Python's csv refuses fields over 128 KiB by default.
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    # newline="" keeps "\r\n" inside quoted fields, exactly as csv wants a file opened.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            why = ("a quoted field is never closed and runs to the end of the file"
                   if "unexpected end of data" in str(e) else str(e))
            raise DataError(f"{path}:{start}: malformed record ({why}); a field that starts "
                            f'with " must end with " and double every " inside it (""), or '
                            f"must not start with a quote.") from None
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # a blank line
        yield start, fields


# Separators a one-column header may hide (a spreadsheet's export in another locale).
_OTHER_SEPARATORS = {";": "semicolons", "\t": "tabs", "|": "bars", ",": "commas"}


def _separator_hint(header: list[str], path: str) -> str:
    """When the header is one column holding another separator: what to do instead
    ("" when it is not)."""
    if len(header) != 1:
        return ""
    ext = os.path.splitext(path)[1].lower()
    for sep, name in _OTHER_SEPARATORS.items():
        if sep in header[0] and not (sep == "\t" and ext in (".tsv", ".tab")) \
                and not (sep == "," and ext == ".csv"):
            fix = ("name it .tsv (or pass --data_format=tsv)" if sep == "\t" else
                   "write it with commas (.csv) or tabs (.tsv)" if sep != "," else
                   "name it .csv (or pass --data_format=csv)")
            return (f"the header is one column, {header[0][:60]!r}, separated by {name}, "
                    f"which a {ext or 'file without an extension'} file is not split at: "
                    f"{fix}.")
    return ""


def _column_index(header: list[str], column: str, flag: str, path: str, line: int) -> int:
    hits = [i for i, name in enumerate(header) if name == column]
    if not hits:
        raise DataError(f"{path}:{line}: no column {column!r} ({flag}); "
                        + (_separator_hint(header, path) or f"the header has the columns "
                           f"{header}: pass {flag}=NAME with one of them."))
    if len(hits) > 1:
        raise DataError(f"{path}:{line}: the header names column {column!r} {len(hits)} times "
                        f"(columns {[i + 1 for i in hits]}); rename all but one.")
    return hits[0]


def _rows_from_delimited(text: str, path: str, delimiter: str, columns: dict[str, str],
                         optional: set) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, {column: value}) from CSV/TSV text; `columns` maps column -> its flag."""
    records = _csv_records(text, path, delimiter)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: empty file; expected a header row naming the columns "
                        f"({', '.join(columns)}) and one row per example.")
    header_line, header = first
    header = [h.strip() for h in header]
    where = {}
    for column, flag in columns.items():
        if column in optional and column not in header:
            continue
        where[column] = _column_index(header, column, flag, path, header_line)
    for line, fields in records:
        _check_width(fields, len(header), header_line, line, path, delimiter)
        yield line, {column: fields[i] for column, i in where.items()}


def _check_width(fields: list[str], width: int, header_line: int, line: int, path: str,
                 delimiter: str) -> None:
    if len(fields) != width:
        name = "tab" if delimiter == "\t" else "comma"
        raise DataError(
            f"{path}:{line}: {len(fields)} {name}-separated fields, but the header (line "
            f"{header_line}) has {width}; put a field that holds a {name} or a "
            f'newline in double quotes and double every " inside it: "he said ""hi"", then '
            f'left".')


def read_table(path: str, data_format: Optional[str] = None
               ) -> tuple[str, Optional[list[str]], list[tuple[int, Any]]]:
    """The raw records of a file, for tools that rewrite it (augmentation).

    Returns (format, header, records). CSV / TSV: the header's fields as written
    and (starting line, fields) of every non-blank record after it, each checked
    to have the header's field count. JSON lines: header None and (line, object).
    """
    fmt = detect_format(path, data_format)
    text = read_text_file(path)
    if fmt == "jsonl":
        return fmt, None, list(iter_jsonl(text, path, _JSONL_EXAMPLE))
    delimiter = "," if fmt == "csv" else "\t"
    records = _csv_records(text, path, delimiter)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: empty file; expected a header row and one row per example.")
    header_line, header = first
    out = []
    for line, fields in records:
        _check_width(fields, len(header), header_line, line, path, delimiter)
        out.append((line, fields))
    return fmt, header, out


def iter_jsonl(text: str, path: str, example: str) -> Iterator[tuple[int, dict]]:
    """(1-based line, object) of every non-blank line of JSON-lines `text`.

    A line that is not JSON, or not a JSON object, is a `DataError` naming
    file and line; `example` is an object to show as the expected shape.
    """
    for line, raw in enumerate(io.StringIO(text, newline=None), start=1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            hint = (_ARRAY_HINT if line == 1 and raw.startswith("[") else
                    f"write one JSON object per line: {example}")
            raise DataError(f"{path}:{line}: not JSON ({e.msg} at column {e.colno}); {hint}."
                            ) from None
        if not isinstance(obj, dict):
            hint = f"; {_ARRAY_HINT}" if line == 1 and isinstance(obj, list) else ""
            raise DataError(f"{path}:{line}: a JSON {json_type(obj)}, expected an object "
                            f"such as {example}{hint}.")
        yield line, obj


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


# ---------------------------------------------------------------------------
# Examples.

def load_examples(path: str, text_column: str = "text", text_pair_column: Optional[str] = None,
                  label_column: Optional[str] = "label", data_format: Optional[str] = None,
                  require_label: bool = True) -> TableExamples:
    """Examples of one CSV / TSV / JSON-lines file, labels RAW.

    Args:
      path: the file (any `tf.io.gfile` path).
      text_column: column holding the (first) text.
      text_pair_column: column holding the second text of a pair task, or None.
      label_column: column holding the label, or None for an unlabelled file.
      data_format: 'csv', 'tsv' or 'jsonl'; None: from the extension.
      require_label: False lets a test file lack the label column (or leave a
        label empty): those examples get label None.
    Returns:
      `TableExamples` of `Example(guid="<file stem>-<line>", text_a, text_b,
      label)`, label the raw value (str from CSV/TSV; str/number from JSON; None
      when unlabelled), with `.source`, `.lines` and `.label_column`.
    """
    fmt = detect_format(path, data_format)
    text = read_text_file(path)
    columns = {text_column: "--text_column"}
    if text_pair_column:
        columns[text_pair_column] = "--text_pair_column"
    if label_column:
        columns[label_column] = "--label_column"
    optional = set() if require_label or not label_column else {label_column}
    if fmt == "jsonl":
        rows = iter_jsonl(text, path, _JSONL_EXAMPLE)
    else:
        rows = _rows_from_delimited(text, path, "," if fmt == "csv" else "\t", columns, optional)
    stem = os.path.splitext(os.path.basename(path))[0]
    out, lines = [], []
    for line, row in rows:
        if fmt == "jsonl":
            _check_keys(row, columns, optional, path, line)
        text_a = _text(row, text_column, path, line)
        text_b = _text(row, text_pair_column, path, line) if text_pair_column else None
        label = _raw_label(row, label_column, require_label, path, line) if label_column else None
        out.append(Example(guid=f"{stem}-{line}", text_a=text_a, text_b=text_b, label=label))
        lines.append(line)
    if not out:
        what = "only blank lines" if fmt == "jsonl" else "a header and no rows"
        raise DataError(f"{path}: no examples (the file has {what}); add one "
                        f"{'object per line' if fmt == 'jsonl' else 'row per example'}.")
    return TableExamples(out, source=path, lines=lines,
                         label_column=label_column if any(e.label is not None for e in out)
                         else None)


def _check_keys(row: dict, columns: dict[str, str], optional: set, path: str, line: int) -> None:
    for column, flag in columns.items():
        if column not in row and column not in optional:
            raise DataError(f"{path}:{line}: the object has no key {column!r} ({flag}); its keys "
                            f"are {sorted(row)}: pass {flag}=NAME with one of them, or add the "
                            f"key to this line.")


def _text(row: dict, column: str, path: str, line: int) -> str:
    value = row[column]
    if not isinstance(value, str):
        raise DataError(f"{path}:{line}: column {column!r} holds a JSON {json_type(value)} "
                        f"({value!r}); a text must be a string.")
    if not value.strip():
        raise DataError(f"{path}:{line}: empty text in column {column!r}; every example needs "
                        f"text there: fill it in or delete the row.")
    return value


def _raw_label(row: dict, column: str, required: bool, path: str, line: int) -> Any:
    value = row.get(column)
    if isinstance(value, str) and not value.strip():
        value = None
    if value is None and required:
        raise DataError(f"{path}:{line}: empty label in column {column!r}; every training and "
                        f"validation example needs one: fill it in or delete the row.")
    if isinstance(value, (list, dict)):
        raise DataError(f"{path}:{line}: column {column!r} holds a JSON {json_type(value)}; a "
                        f"label is a string or a number.")
    return value


# ---------------------------------------------------------------------------
# Labels.

def _label_name(value: Any) -> str:
    """A raw label's class name; ValueError (the reason) when it cannot name a class."""
    if isinstance(value, bool):
        return "true" if value else "false"  # JSON's spelling
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return str(int(value))
        raise ValueError(f"the number {value!r} is not a class name; class labels are names or "
                         f"integers (for a numeric target use --task=text_regression)")
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"a JSON {json_type(value)} is not a class name")


def _where(examples: Sequence[Example], i: int, path: Optional[str]) -> str:
    lines = getattr(examples, "lines", None)
    src = path or getattr(examples, "source", "") or "examples"
    if lines and i < len(lines):
        return f"{src}:{lines[i]}"
    return f"{src}: example {i + 1}"


def _column_note(examples: Sequence[Example]) -> str:
    column = getattr(examples, "label_column", None)
    return f" in column {column!r}" if column else ""


def parse_label_list(explicit: Union[str, Sequence[str]]) -> list[str]:
    """`--labels=a,b,c` (a comma-separated string or a sequence) -> names in that order."""
    names = explicit.split(",") if isinstance(explicit, str) else [str(n) for n in explicit]
    names = [n.strip() for n in names]
    if not names or any(not n for n in names):
        raise DataError(f"--labels={','.join(names)}: empty label name; give the class names "
                        f"separated by commas, e.g. --labels=negative,neutral,positive.")
    seen = set()
    for n in names:
        if n in seen:
            raise DataError(f"--labels={','.join(names)}: {n!r} is listed twice; every class "
                            f"once, in class-id order.")
        seen.add(n)
    return names


def label_set(examples: Sequence[Example], explicit: Union[str, Sequence[str], None] = None
              ) -> list[str]:
    """The class names of a training file, in class-id order.

    Without `explicit`: the distinct names sorted -- numerically when every
    name is an integer ("2" before "10"), else as strings -- so the order does
    not depend on row order. With `explicit` (`--labels`): exactly that order,
    after checking that every label in the file is listed.
    """
    seen: dict[str, int] = {}  # name -> index of its first example
    for i, e in enumerate(examples):
        if e.label is None:
            continue
        try:
            name = _label_name(e.label)
        except ValueError as err:
            raise DataError(f"{_where(examples, i, None)}: label {e.label!r}"
                            f"{_column_note(examples)}: {err}.") from None
        seen.setdefault(name, i)
    if explicit is not None:
        names = parse_label_list(explicit)
        for name, i in seen.items():
            if name not in names:
                raise DataError(f"{_where(examples, i, None)}: label {name!r} is not in --labels="
                                f"{','.join(names)}; add it to --labels or fix the row.")
        return names
    if not seen:
        src = getattr(examples, "source", "") or "examples"
        raise DataError(f"{src}: no labels; a training file needs a label column "
                        f"(--label_column).")
    labelled = sum(e.label is not None for e in examples)
    if len(seen) > _MAX_CLASSES and len(seen) > labelled // 2 \
            or len(seen) == labelled > _ONE_PER_ROW:
        src = getattr(examples, "source", "") or "examples"
        raise DataError(f"{src}: the labels{_column_note(examples)} take {len(seen)} "
                        f"different values in {labelled} rows, {_some(list(seen), 3)}: "
                        "that is text or ids, not class labels; pass --label_column=NAME of "
                        "the column that holds the classes (or "
                        "--task=text_regression for numeric targets).")
    _one_spelling_per_class(examples, seen)
    if all(_INT_NAME.match(n) for n in seen):
        return sorted(seen, key=lambda n: (int(n), n))
    return sorted(seen)


def _class_key(name: str) -> tuple[str, str]:
    """What two spellings of one class share: the number ("1", "1.0", "01") or the
    letters up to case ("Pos", "pos"); with how the spellings differ."""
    try:
        number = float(name)
    except ValueError:
        number = math.nan
    if math.isfinite(number):
        return repr(number), "are the same number"
    return name.casefold(), "differ only in case"


def _one_spelling_per_class(examples: Sequence[Example], seen: dict[str, int]) -> None:
    """Refuse a label set derived from the file where one class is written two ways
    ("pos" and "Pos", "1" and "1.0"): they would train as two classes, each with part
    of the rows. `--labels` listing both says they are two on purpose."""
    first: dict[str, str] = {}
    for name in seen:  # in the order of their first rows
        key, how = _class_key(name)
        other = first.setdefault(key, name)
        if other != name:
            raise DataError(
                f"{_where(examples, seen[name], None)}: label {name!r}{_column_note(examples)} "
                f"and label {other!r} ({_where(examples, seen[other], None)}) {how}, so they "
                f"would be two classes; write the class one way in every row (e.g. {other!r}), "
                f"or list both with --labels if they are different classes.")


def _relabel(examples: Sequence[Example], labels: list, path: Optional[str]) -> TableExamples:
    out = [Example(e.guid, e.text_a, e.text_b, y) for e, y in zip(examples, labels)]
    return TableExamples(out, source=path or getattr(examples, "source", ""),
                         skipped=getattr(examples, "skipped", 0),
                         lines=getattr(examples, "lines", ()),
                         label_column=getattr(examples, "label_column", None))


def _some(names: Sequence[str], limit: int = 8) -> str:
    """A list of names for a message, cut after `limit` (a column of texts has thousands)."""
    shown = ", ".join(repr(str(n)[:40]) for n in names[:limit])
    return f"[{shown}]" if len(names) <= limit else f"[{shown}, ... ({len(names)} in all)]"


def encode_labels(examples: Sequence[Example], names: Sequence[str],
                  path: Optional[str] = None) -> TableExamples:
    """Copies of `examples` whose labels are class ids: the index of their name in `names`.

    `names` is the training file's `label_set`; a label of a validation or test
    file that is not among them is a `DataError` naming file and line. Unlabelled
    examples keep label None. `path` defaults to `examples.source`.
    """
    index = {str(n): i for i, n in enumerate(names)}
    ids = []
    for i, e in enumerate(examples):
        if e.label is None:
            ids.append(None)
            continue
        try:
            name = _label_name(e.label)
        except ValueError as err:
            raise DataError(f"{_where(examples, i, path)}: label {e.label!r}"
                            f"{_column_note(examples)}: {err}.") from None
        if name not in index:
            listed = ",".join(list(index) + [name]) if len(index) < 20 else "A,B,..."
            raise DataError(
                f"{_where(examples, i, path)}: label {name!r}{_column_note(examples)} does not "
                f"occur in the training file, whose labels are {_some(list(index))}; if it is "
                f"a real class, list every class with --labels={listed} (the order fixes the "
                f"class ids), else fix the row.")
        ids.append(index[name])
    return _relabel(examples, ids, path)


def parse_regression(examples: Sequence[Example], path: Optional[str] = None) -> TableExamples:
    """Copies of `examples` whose labels are finite floats (regression targets).

    A target that is not a number, or is NaN/infinite, is a `DataError` naming
    file and line. Unlabelled examples keep label None.
    """
    values = []
    for i, e in enumerate(examples):
        raw = e.label
        if raw is None:
            values.append(None)
            continue
        value = None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw)
        elif isinstance(raw, str):
            try:
                value = float(raw.strip())
            except ValueError:
                value = None
        if value is None:
            raise DataError(f"{_where(examples, i, path)}: regression target {raw!r}"
                            f"{_column_note(examples)} is not a number; "
                            f"--task=text_regression needs a number in every row (for class "
                            f"names use --task=text_classification).")
        if not math.isfinite(value):
            raise DataError(f"{_where(examples, i, path)}: regression target {raw!r}"
                            f"{_column_note(examples)} is not finite; replace it with a finite "
                            f"number or delete the row.")
        values.append(value)
    return _relabel(examples, values, path)
