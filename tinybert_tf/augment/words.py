"""Words of a sentence as Algorithm 1 sees them: BERT basic tokenisation + eligibility.

Words come from BERT's *basic* tokenisation (whitespace split, punctuation and
CJK characters split off, lower-casing with NFD accent stripping for uncased
vocabularies): the same pre-tokenisation the WordPiece tokenizer runs before
splitting words into pieces, so every word maps to a whole number of pieces.
We use tensorflow-text's `BasicTokenizer` (the first half of its
`BertTokenizer`): it is batched C++, and identical in its splitting rules to
the reference's Python `BasicTokenizer`. (Differences: it case-folds with
NFKC, e.g. "ß" -> "ss", and drops control characters as separators where
BERT deletes them; both are harmless here, since every later step works on
the words it produced.) tensorflow-text does not re-export it at top level,
hence the module import below.

Eligibility follows the reference (TinyBERT `data_augmentation.py`): a word
is considered for replacement only if it is ASCII-alphabetic ([a-z]+ after
lower-casing) and, lower-cased, not in the reference's `StopWordsList`
(reproduced below; see docs/augmentation.md).
"""
from __future__ import annotations

import re
from typing import Sequence

import tensorflow as tf
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

# The reference's StopWordsList (173 words: NLTK's English list of its time without
# what/which/who/whom/when/where/why/how, plus "'s" and "'re").
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them
their theirs themselves this that that'll these those am is are was were be been being
have has had having do does did doing a an the and but if or because as until while of at
by for with about against between into through during before after above below to from up
down in out on off over under again further then once here there all any both each few
more most other some such no nor not only own same so than too very s t can will just don
don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't
doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn
mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't
wouldn wouldn't 's 're
""".split())

_ALPHA = re.compile(r"[a-z]+")


def is_eligible(word: str) -> bool:
    """True if Algorithm 1 may replace `word`: ASCII letters only, not a stopword."""
    lower = word.lower()
    return bool(_ALPHA.fullmatch(lower)) and lower not in STOPWORDS


class WordSplitter:
    """Sentences -> lists of words (BERT basic tokenisation).

    Args:
      lower_case: lower-case and strip accents (uncased models, e.g. bert-base-uncased).

    Example:
      >>> WordSplitter().split(["It's a café!"])
      [['it', "'", 's', 'a', 'cafe', '!']]
    """

    def __init__(self, lower_case: bool = True):
        self.lower_case = bool(lower_case)
        self._basic = BasicTokenizer(lower_case=self.lower_case)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        """texts: N strings -> N lists of words (batched in one op)."""
        if not texts:
            return []
        ragged = self._basic.tokenize(tf.constant(list(texts), tf.string))
        return [[w.decode("utf-8") for w in row] for row in ragged.to_list()]
