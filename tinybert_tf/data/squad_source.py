"""SQuAD v1.1 / v2.0 JSON files as a registered data source, augmentation included.

`SquadSource` reads `--train_file` (split "train") and `--validation_file`
(split "dev") with `squad.read_squad`: training questions whose answer is not
at its offset are skipped and counted (an error past 1 %), dev questions keep
every gold answer. Every malformed file raises one `DataError` naming the file
and the question id, which preflight reports before anything is written.

Augmentation (TinyBERT Algorithm 1) for span QA must keep each answer where
its offsets say. The augmenter varies whole text fields and leaves the other
fields of a row as they were (`augment.augmenter.example_rows`), so each
training question becomes one row whose context is cut at its answer:

  qas_id | title | question | before | answer | after | context | answer_start | impossible

The text columns are `question`, `before` (the context up to the answer) and
`after` (the context after it); the answer is never a text column, so no word
inside it changes. `encode` writes each row back as one SQuAD article per line
(JSON lines, `train_aug.jsonl`): the context is `before + answer + after` with
`answer_start = len(before)`, i.e. the offsets are recomputed for the rewritten
text. A variant field (lower-cased words joined by single spaces) is joined to
the answer by one space; the original row keeps its exact context and offset.
An unanswerable v2.0 question has its whole context in `before`. Variant ids
are `<id>#aug<k>` (ids must stay unique).

Cost: contexts are augmented once per question (SQuAD has ~4.6 questions per
paragraph) and each text column gets up to N_a variants, so a question yields
up to 1 + 3 N_a rows. `read_squad(..., is_training=True)` reads the file back,
so every augmented answer passes the same offset check as the original data.
"""
from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Optional, Sequence

from tinybert_tf import files
from tinybert_tf.data import glue
from tinybert_tf.data.examples import DataError, Examples
from tinybert_tf.data.sources import (
    AugmentedFile,
    DataSource,
    RowTable,
    file_facts,
    register_source,
)
from tinybert_tf.data.squad import SquadExample, parse_squad, read_squad
from tinybert_tf.data.squad_metrics import squad_version

# The columns of an augmentation row (see the module docstring).
COLUMNS = ("qas_id", "title", "question", "before", "answer", "after", "context",
           "answer_start", "is_impossible")
TEXT_COLUMNS = (2, 3, 5)  # question, before, after
AUGMENTED_NAME = "train_aug.jsonl"
_FLAGS = {"train": "--train_file", "dev": "--validation_file"}


@register_source
class SquadSource(DataSource):
    """Official SQuAD JSON files.

    Args:
      files: split -> path ("train", "dev"); empty paths are left out.
      version: "1.1" or "2.0" (2.0 reads unanswerable questions).
    """

    kind = "squad"
    augmented_name = AUGMENTED_NAME

    def __init__(self, files: Mapping[str, str], version: str):
        self.files = {split: path for split, path in files.items() if path}
        self.version = squad_version(version)
        self._cache: dict[str, tuple[dict[str, Any], Examples]] = {}

    def splits(self) -> tuple[str, ...]:
        return tuple(self.files)

    def path(self, split: str) -> str:
        if split not in self.files:
            flag = _FLAGS.get(split, f"the {split} file")
            raise DataError(f"--task=squad{self.version}: no {split} data; give {flag}=FILE "
                            f"(an official SQuAD v{self.version} JSON file).")
        path = self.files[split]
        if split in _FLAGS and not files.exists(path):  # named by its flag (a config's)
            raise DataError(f"{_FLAGS[split]}={path}: file not found; give the SQuAD "
                            f"v{self.version} JSON file (such as "
                            f"{'train' if split == 'train' else 'dev'}-v{self.version}.json).")
        return path

    def load(self, split: str) -> Examples:
        """`SquadExample`s of `split`; read once per file version (cached by size, mtime)."""
        path = self.path(split)
        facts = file_facts(path)
        cached = self._cache.get(split)
        if cached is not None and cached[0] == facts:
            return cached[1]
        examples = read_squad(path, self.version, is_training=(split == "train"))
        self._cache[split] = (facts, examples)
        return examples

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version,
                "files": {split: file_facts(path) for split, path in self.files.items()}}

    # --- augmentation ------------------------------------------------------------------
    def augment_table(self) -> RowTable:
        path = self.path("train")
        return RowTable(path=path, header=None, text_columns=list(TEXT_COLUMNS),
                        rows=lambda: _rows(self.load("train")), encode=encode_rows,
                        output_name=AUGMENTED_NAME, num_columns=len(COLUMNS))

    def augmented(self, path: str) -> DataSource:
        return SquadAugmentedSource(path, self.version)


def _rows(examples: Sequence[SquadExample]) -> Iterator[tuple[int, list[str]]]:
    """(question number, row) per training question: the context cut at its answer."""
    for no, ex in enumerate(examples, 1):
        if ex.is_impossible or not ex.answers:
            before, answer, after, start = ex.context, "", "", len(ex.context)
        else:
            answer, start = ex.answers[0]
            before, after = ex.context[:start], ex.context[start + len(answer):]
        yield no, [ex.qas_id, ex.title, ex.question, before, answer, after, ex.context,
                   str(start), "1" if ex.is_impossible else "0"]


def _article(row: Sequence[str], qas_id: str) -> dict[str, Any]:
    """One row -> a SQuAD article with one paragraph and one question."""
    _, title, question, before, answer, after, context, start, impossible = row
    s = int(start)
    # A field the augmenter rewrote no longer ends (starts) at the answer: one space.
    if answer and before and before != context[:s]:
        before += " "
    if answer and after and after != context[s + len(answer):]:
        after = " " + after
    qa: dict[str, Any] = {"id": qas_id, "question": question,
                          "is_impossible": impossible == "1", "answers": []}
    if answer:
        qa["answers"] = [{"text": answer, "answer_start": len(before)}]
    return {"title": title, "paragraphs": [{"context": before + answer + after, "qas": [qa]}]}


def encode_rows(rows: Sequence[Sequence[str]]) -> bytes:
    """Rows (an original, then its variants, per question) -> JSON lines, one article each.

    The first row of a question keeps its id; the k-th variant is `<id>#aug<k>`.
    """
    seen: dict[str, int] = {}
    lines = []
    for row in rows:
        qid = row[0]
        k = seen.get(qid, 0)
        seen[qid] = k + 1
        article = _article(row, qid if k == 0 else f"{qid}#aug{k}")
        lines.append(json.dumps(article, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


class SquadAugmentedSource(AugmentedFile):
    """The augmented training split: `train_aug.jsonl`, one SQuAD article per line."""

    kind = "squad_augmented"

    def __init__(self, path: str, version: str):
        super().__init__(path)
        self.version = squad_version(version)

    def read(self) -> Examples:
        return parse_squad({"data": read_articles(self.path)}, self.path, self.version,
                           is_training=True)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "version": self.version}


def read_articles(path: str) -> list[Any]:
    """The JSON value of every non-empty line of a JSON-lines file."""
    if not files.exists(path):
        raise DataError(f"{path}: file not found; run the augment stage (or --nouse_augmented).")
    out: list[Any] = []
    for no, raw in enumerate(glue.binary_lines(path), 1):
        line = raw.decode("utf-8").strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{no}: not valid JSON ({e.msg}); the augmented file "
                            "is cut or edited: delete it and rerun the augment stage."
                            ) from None
    return out


def squad_source(train_file: str, validation_file: str, version: str,
                 test_file: Optional[str] = None) -> SquadSource:
    """The source of `--task=squad1.1|squad2.0`; --test_file is refused (SQuAD test sets
    are hidden: evaluate on --validation_file)."""
    if test_file:
        raise DataError(f"--test_file={test_file}: SQuAD tasks read --train_file and "
                        "--validation_file only; drop --test_file (predictions for the dev "
                        "set are written to OUTPUT/evaluate/predictions.json).")
    return SquadSource({"train": train_file, "dev": validation_file}, version)
