"""Article text -> sentences: wiki markup cleanup and a rule-based sentence splitter.

The general corpus (`corpus.py`) packs the sentences of each document, and the
proxy pair task (`wiki_pairs.py`, through `corpus.iter_wiki_articles`) pairs
neighbouring ones.
"""
from __future__ import annotations

import re

# Sentence splitting. No sentence splitter ships with our dependencies (NLTK's
# punkt would need a model download at run time), so a rule-based one: break
# after . ! ? (and closing quotes/brackets) followed by space and an upper-case
# letter, digit or opening quote, unless the word before the stop is a common
# abbreviation or a single-letter initial.

_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "no",
           "fig", "al", "inc", "ltd", "co", "corp", "gen", "col", "lt", "sgt", "capt", "rev",
           "mt", "ft", "approx", "ca", "cf", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
           "sep", "sept", "oct", "nov", "dec", "u.s", "u.k", "a.m", "p.m", "vol", "pp", "ed",
           "eds", "op", "dept", "univ", "est"}
_BOUNDARY = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Paragraph -> sentences (rule-based; see the comment above)."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        end = m.start() + 1
        before = text[start:end - 1].rsplit(None, 1)
        word = before[-1].lower().lstrip("(\"'") if before else ""
        if text[m.start()] == "." and (word in _ABBREV or (len(word) == 1 and word.isalpha())):
            continue
        sent = text[start:m.end()].strip()
        if sent:
            out.append(sent)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


WHITESPACE = re.compile(r"\s+")
_HEADING = re.compile(r"^=+\s*(.*?)\s*=+$")
_END_MATTER = {"see also", "references", "external links", "further reading", "notes",
               "bibliography", "sources", "footnotes", "citations", "notes and references"}


def wiki_text_to_paragraphs(text: str, min_words: int = 4) -> list[list[str]]:
    """Markup-stripped article text (gensim's filter_wiki output) -> paragraphs, each
    a list of sentences (a paragraph is one line of the text: wikitext separates
    paragraphs, list items and captions by line breaks).

    Drops headings, bold/italic quote marks, list bullets, lines of fewer than
    `min_words` words (captions, table debris), and everything from the first
    end-matter heading (See also, References, External links, ...) on.
    """
    paragraphs = []
    for line in text.split("\n"):
        line = line.strip()
        if not line:
            continue
        h = _HEADING.match(line)
        if h:
            if h.group(1).strip().lower() in _END_MATTER:
                break
            continue
        line = line.replace("'''", "").replace("''", "").lstrip("*#:; ").strip()
        line = WHITESPACE.sub(" ", line)
        if len(line.split()) < min_words:
            continue
        sentences = [s for s in split_sentences(line) if s]
        if sentences:
            paragraphs.append(sentences)
    return paragraphs


def wiki_text_to_sentences(text: str, min_words: int = 4) -> list[str]:
    """The sentences of `wiki_text_to_paragraphs`, in order (the document the general
    corpus packs)."""
    return [s for para in wiki_text_to_paragraphs(text, min_words) for s in para]
