"""The embedded demo task: Pang & Lee movie-review polarity sentences shipped in gensim.

`gensim/test/test_data/pang_lee_polarity.cor` holds 200 real review sentences,
one per line, `__label__neg <text>` or `__label__pos <text>` (100 of each); six
lines are Windows-1252 (the original release's encoding), decoded as such.

Fixed split (deterministic, label-balanced, no randomness): within each label,
in file order, every 5th sentence (the 5th, 10th, ..., i.e. 0-based index
i with i % 5 == 4) goes to dev, the rest to train -> train 160 (80 neg, 80 pos),
dev 40 (20 neg, 20 pos). Labels: 0 = "neg", 1 = "pos". Task name "polarity":
single sentence, metric accuracy (see `tinybert_tf.data.glue.get_task`).
"""
from __future__ import annotations

import os
from typing import Optional

from tinybert_tf import files
from tinybert_tf.data import glue
from tinybert_tf.data.examples import DataError, Example, Examples

FILE_NAME = "pang_lee_polarity.cor"
DEV_EVERY = 5
SPLITS = ("train", "dev")


def default_path() -> str:
    """Path of gensim's pang_lee_polarity.cor."""
    import gensim
    return os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", FILE_NAME)


def _read(path: str) -> list[tuple[int, str, int]]:
    """(line number, sentence, label id) of every line of the .cor file."""
    if not files.isfile(path):
        raise DataError(f"{path}: the demo task file is missing; it ships with gensim's "
                             f"test data (pip install --force-reinstall gensim), or pass a "
                             f"--data_dir in GLUE layout.")
    names = glue.get_task("polarity").label_names
    out = []
    for no, raw in enumerate(glue.binary_lines(path), start=1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            try:  # the original release is Windows-1252 (six lines: em dash, e-acute, ...)
                line = raw.decode("cp1252").strip()
            except UnicodeDecodeError:
                raise DataError(f"{path}:{no}: neither UTF-8 nor Windows-1252 "
                                     f"text.") from None
        if not line:
            continue
        tag, _, text = line.partition(" ")
        label = tag[len("__label__"):] if tag.startswith("__label__") else None
        if label not in names or not text.strip():
            raise DataError(f"{path}:{no}: expected '__label__neg <text>' or "
                                 f"'__label__pos <text>', got {line[:60]!r}.")
        out.append((no, text.strip(), names.index(label)))
    if not out:
        raise DataError(f"{path}: empty file.")
    return out


def split_rows(path: Optional[str] = None) -> dict[str, list[tuple[int, str, int]]]:
    """{"train": [...], "dev": [...]} of (line number, sentence, label id), file order."""
    rows = _read(path or default_path())
    seen = {0: 0, 1: 0}
    out = {"train": [], "dev": []}
    for row in rows:
        k = seen[row[2]]
        seen[row[2]] += 1
        out["dev" if k % DEV_EVERY == DEV_EVERY - 1 else "train"].append(row)
    return out


def load_examples(split: str, path: Optional[str] = None) -> Examples:
    """Examples of the fixed split, read straight from gensim's file."""
    if split not in SPLITS:
        raise DataError(f"the polarity demo task has splits {SPLITS}, not '{split}' "
                             f"(write_task_dir() then --data_dir for train_aug).")
    rows = split_rows(path)[split]
    return Examples([Example(f"{split}-{no}", text, None, label)
                          for no, text, label in rows], source=path or default_path())


def write_task_dir(out_dir: str, path: Optional[str] = None) -> str:
    """Write train.tsv / dev.tsv in SST-2 layout (header `sentence\\tlabel`, labels neg/pos).

    GLUE-layout tools (augmentation writes train_aug.tsv next to them) then work
    on the demo task with `--data_dir=out_dir`. Returns out_dir.
    """
    files.makedirs(out_dir)
    names = glue.get_task("polarity").label_names
    for split, rows in split_rows(path).items():
        glue.write_rows(os.path.join(out_dir, f"{split}.tsv"), ["sentence", "label"],
                        ([text, names[label]] for _, text, label in rows))
    return out_dir
