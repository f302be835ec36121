"""A real-text classification task built from the Wikipedia sample in gensim: is a
sentence from an article about a person or about a place?

The 206-page sample that ships with gensim (`corpus.iter_wiki_articles`) holds
biographies and articles on countries, states and regions. Every sentence of
four words or more of the articles named below is one example, labelled with
its article's kind. Train and dev are split by article, so dev asks about
people and places the student never read a labelled sentence of: names do not
give the answer away, the words around them must. Deterministic (no seed): the
lists fix it.

Used by benchmarks/bench_quantize.py to measure the quantize stage on a student
that learnt something from real text (docs/deploy.md); a task for the own-data
path (`--task=text_classification`, CSV with `text` and `label` columns).

Usage: python benchmarks/wiki_kinds.py OUT_DIR  -> OUT_DIR/train.csv, OUT_DIR/dev.csv
"""
from __future__ import annotations

import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

from tinybert_tf.data.corpus import iter_wiki_articles  # noqa: E402

# Chosen by hand from the sample's titles: its biographies (Achilles, a hero of myth,
# counted as a person; Apollo, a god, left out) and its articles on a country, state,
# province, continent or ocean (sub-topics such as "Economy of Angola", and the
# Aa River, left out).
PEOPLE = ("Abraham Lincoln", "Aristotle", "Albert Einstein", "Andre Agassi",
          "Arthur Schopenhauer", "Achilles", "Ayn Rand", "Aldous Huxley",
          "Andrei Tarkovsky", "Albert Sidney Johnston", "Allan Dwan", "Alain Connes")
PLACES = ("Albania", "Alabama", "Alaska", "Azerbaijan", "Algeria", "Afghanistan",
          "Alberta", "Angola", "Asia", "Andorra", "Atlantic Ocean", "Aruba")
# Dev: about 600 sentences of each kind, from articles train never sees.
DEV = ("Arthur Schopenhauer", "Albert Sidney Johnston", "Allan Dwan", "Alberta", "Aruba")
MIN_WORDS = 4


def build(out_dir: str) -> dict[str, int]:
    """Write train.csv and dev.csv (text,label); returns the row count of each."""
    kinds = {**{t: "person" for t in PEOPLE}, **{t: "place" for t in PLACES}}
    rows: dict[str, list] = {"train": [], "dev": []}
    found = set()
    for title, paragraphs in iter_wiki_articles():
        if title not in kinds:
            continue
        found.add(title)
        split = "dev" if title in DEV else "train"
        rows[split] += [(s, kinds[title]) for p in paragraphs for s in p
                        if len(s.split()) >= MIN_WORDS]
    missing = sorted(set(kinds) - found)
    if missing:
        raise SystemExit(f"articles not in gensim's Wikipedia sample: {missing}")
    os.makedirs(out_dir, exist_ok=True)
    for split, split_rows in rows.items():
        with open(os.path.join(out_dir, f"{split}.csv"), "w", encoding="utf-8",
                  newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(split_rows)
    return {split: len(r) for split, r in rows.items()}


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    counts = build(sys.argv[1])
    print(", ".join(f"{split}: {n} sentences" for split, n in counts.items()))


if __name__ == "__main__":
    main()
