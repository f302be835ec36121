"""Articles a task holds out of the general corpus (`--general_holdout`).

A task built from Wikipedia text (`wiki_pairs`) is evaluated on articles that
the general-distillation corpus may also hold. General distillation packs an
article's consecutive sentences into one sequence, so a student distilled on a
dev article has seen the very sentence order its dev pairs ask about. A
registered hold-out names those articles by page title; the general stage
leaves them out of any corpus that names its documents (Wikipedia dumps, TFDS
wikipedia).

`--general_holdout=auto` (the default) resolves to the task's own hold-out when
one is registered under the task's name, else to "none"; the resolved name is
part of the general stage's settings, so a general model distilled without the
hold-out is not reused for a task that needs it.
"""
from __future__ import annotations

from typing import Callable

from tinybert_tf import plugins
from tinybert_tf.data import corpus
from tinybert_tf.data.examples import DataError

AUTO = "auto"
NONE = "none"

# name -> () -> the page titles to leave out of the general corpus.
HOLDOUTS: dict[str, Callable[[], frozenset[str]]] = {}


def register_holdout(name: str, titles: Callable[[], frozenset[str]], *,
                     replace: bool = False) -> None:
    """Register `titles()` (page titles, computed when first needed) under `name`;
    another function under a taken name is refused unless `replace=True`."""
    plugins.register(HOLDOUTS, name.strip().lower(), titles, what="general hold-out",
                     replace=replace)


def resolve(value: str, task: str) -> str:
    """The hold-out `--general_holdout=value` means for `--task=task`: "none" or a
    registered name (raises ValueError naming the flag for an unknown one)."""
    key = str(value).strip().lower()
    if key == AUTO:
        name = str(task).strip().lower()
        return name if name in HOLDOUTS else NONE
    if key == NONE or key in HOLDOUTS:
        return key
    raise ValueError(f"--general_holdout={value}: unknown hold-out; use auto (the task's own), "
                     f"none, or one of: {', '.join(sorted(HOLDOUTS)) or '(none registered)'}.")


def titles(name: str) -> frozenset[str]:
    """The page titles hold-out `name` leaves out ("none": none)."""
    if name == NONE:
        return frozenset()
    if name not in HOLDOUTS:
        raise DataError(f"--general_holdout={name}: no hold-out of that name is registered.")
    return frozenset(HOLDOUTS[name]())


def corpus_titles(name: str, source: str) -> frozenset[str]:
    """`titles(name)`, once checked that corpus `source` names its articles (a text or
    TFRecord corpus cannot: DataError naming the flags and the fix)."""
    out = titles(name)
    if out and not corpus.has_titles(source):
        raise DataError(f"--general_holdout={name}: --corpus={source} has no article titles, "
                        f"so the {len(out)} held-out articles cannot be left out; use a "
                        "Wikipedia dump (.xml.bz2) or tfds:wikipedia, or --general_holdout=none "
                        "if this corpus holds none of them.")
    return out
