"""`--task=wiki_pairs`: sentence-pair coherence on the embedded Wikipedia sample.

A proxy pair task (not GLUE) large enough to rank ablations on a machine
without GLUE: does sentence B come right after sentence A in the article?
Data, split and hold-out: `tinybert_tf.data.wiki_pairs`; docs/data.md.
"""
from __future__ import annotations

from tinybert_tf.data import wiki_pairs
from tinybert_tf.data.examples import DataError
from tinybert_tf.tasks.catalog import Task, TaskConfig, refuse_layout_flags, register_task
from tinybert_tf.tasks.sentence import Classification


@register_task(wiki_pairs.NAME)
def wiki_pairs_task(config: TaskConfig) -> Task:
    """Binary classification ("not_next", "next") of sentence pairs, accuracy."""
    given = [f for f in ("data_dir", "train_file", "validation_file", "test_file")
             if getattr(config, f)]
    if given:
        raise DataError(f"--{given[0]}: --task=wiki_pairs builds its data from the Wikipedia "
                        "sample shipped with gensim and reads no files; drop the flag.")
    refuse_layout_flags(config, "builds its own pairs and labels")
    return Task(wiki_pairs.NAME, Classification(wiki_pairs.LABELS), wiki_pairs.WikiPairsSource(),
                is_pair=True, default_max_seq_len=wiki_pairs.MAX_SEQ_LEN)
