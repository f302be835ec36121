"""Task examples and the one data error type every reader raises.

A leaf module: every data source (GLUE TSV, TFDS, the embedded polarity
task, CSV/JSON lines, CoNLL, SQuAD JSON) and every corpus reader imports it,
and it imports nothing of ours.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Union


class DataError(ValueError):
    """A task/corpus file is missing or malformed; the message names file, line and fix."""


@dataclasses.dataclass
class Example:
    """One task example.

    label: a class id (classification), a float (regression), a list of tag
    ids (token classification), or None (unlabelled).
    """
    guid: str
    text_a: str
    text_b: Optional[str]
    label: Union[int, float, list, None]


class Examples(list):
    """A list of examples that also says where it came from and how many rows it skipped."""

    def __init__(self, items: Iterable[Any] = (), source: str = "", skipped: int = 0):
        super().__init__(items)
        self.source = source
        self.skipped = skipped
