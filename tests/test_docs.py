"""The docs' own rules: the README opens with the two set-up commands and stays within
800 words, CI runs the second, and no page names an issue number or a dated figure
outside docs/measurements.md."""
from __future__ import annotations

import glob
import os
import re

from pipeline_helpers import REPO


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    readme = _read("README.md")
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]
                if line.strip()]
    assert commands == ["make demo", "make test"]
    assert len(readme.split()) <= 800
    assert "make test" in _read(".ci/run")


def test_no_page_names_an_issue_or_dates_a_figure_outside_the_measurements():
    pages = ["README.md", "BUILD.md", *(os.path.relpath(p, REPO) for p in
                                        glob.glob(os.path.join(REPO, "docs", "*.md")))]
    found = []
    for rel in pages:
        text = _read(rel)
        found += [f"{rel}: {m.group(0)}" for m in re.finditer(r"\bissues? #?\d+\b", text,
                                                             re.IGNORECASE)]
        if not rel.endswith("measurements.md"):
            found += [f"{rel}: {m.group(0)}" for m in re.finditer(r"\b20\d\d-\d\d-\d\d\b",
                                                                 text)]
    assert len(pages) > 5 and not found, found
