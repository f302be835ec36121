"""docs/extending.md: every Python block runs, in order, as a newcomer would paste them,
and each adds a capability without editing the package."""
from __future__ import annotations

import os
import re

import pytest

from pipeline_helpers import REPO

DOC = os.path.join(REPO, "docs", "extending.md")


def _blocks() -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.fixture
def registries():
    """Snapshots of every registry, restored after the test (the doc registers examples)."""
    from tinybert_tf.data import sources
    from tinybert_tf.distill import terms
    from tinybert_tf.export import formats
    from tinybert_tf.pipeline import phases, recipes, strategy
    from tinybert_tf.tasks import base, catalog
    tables = [terms.TERMS, base.TASK_TYPES, catalog.TASK_FACTORIES, sources.SOURCES,
              formats.FORMATS, strategy.BUILDERS, phases.PHASE_KINDS, recipes.RECIPES]
    saved = [dict(t) for t in tables]
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)


def test_every_example_of_the_extending_guide_runs(registries):
    blocks = _blocks()
    assert len(blocks) == 8, "setup + one example per extension point"
    namespace: dict = {"__name__": "extending_doc"}
    for block in blocks:
        exec(compile(block, DOC, "exec"), namespace)  # the blocks assert their own results
    from tinybert_tf.data.sources import SOURCES
    from tinybert_tf.distill.terms import TERMS
    from tinybert_tf.export.formats import FORMATS
    from tinybert_tf.pipeline.phases import PHASE_KINDS
    from tinybert_tf.pipeline.recipes import RECIPES
    from tinybert_tf.pipeline.strategy import BUILDERS
    from tinybert_tf.tasks import TASK_FACTORIES, TASK_TYPES
    assert "soft_and_hard" in PHASE_KINDS
    assert "clscos" in TERMS and "multi_label" in TASK_TYPES and "fasttext" in SOURCES
    assert "fasttext_sentiment" in TASK_FACTORIES and "npz" in FORMATS
    assert "cpu_pair" in BUILDERS and "attention_only" in RECIPES


def test_a_plugin_term_is_accepted_by_bin_distill_flags(registries, tmp_path, monkeypatch):
    """--plugins imports a user module whose term --loss_terms then names."""
    from tinybert_tf.pipeline.main import parse_argv
    (tmp_path / "my_terms.py").write_text(_blocks()[0] + "\n" + _blocks()[1])
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                         "--plugins=my_terms", "--loss_terms=attn,clscos"])
    assert config.loss.loss_terms == ("attn", "clscos")
    from tinybert_tf.distill.terms import make_terms
    assert [t.name for t in make_terms(config.loss.loss_terms)] == ["attn", "clscos"]
