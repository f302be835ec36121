"""Word vectors for multi-piece words: loading, Word2Vec training, nearest neighbours.

Algorithm 1 gives a word that WordPiece splits into several pieces the K
nearest words in a word-embedding space (the paper: GloVe). We read vectors
with gensim's `KeyedVectors` (GloVe `.txt` without header, word2vec `.txt`
with header or `.bin`, gensim `.kv`) and, when no file is given, train a
gensim `Word2Vec` on the general corpus once and cache it.

Neighbours are by cosine similarity over the first `vocab_limit` words of the
file (the reference reads only the first 100,000 GloVe words, the most
frequent ones), excluding the word itself, as the reference's `_word_distance`.
They are computed many words at a time (one float32 matrix product) and
re-scored exactly in float64 with a per-row formula, so a word's neighbour
list never depends on which other words shared its batch: the augmented file
is then identical whether a run was sharded, resumed or not.

Paths may be remote (gs://, ram://): gensim reads and writes local files, so a
remote vector file is copied to a local temporary file first, and the
Word2Vec cache is written locally and copied up whole. A cache that cannot be
read (cut by a full disk or a kill) is rebuilt with a warning.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from tinybert_tf import files
from tinybert_tf.augment.words import WordSplitter
from tinybert_tf.data import corpus as corpus_lib
from tinybert_tf.processes import left_by_a_dead_writer

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_LIMIT = 100_000  # the reference's `prepare_embedding_retrieval(vocab_size=100000)`
# Word2Vec on the general corpus (gensim defaults except min_count; one worker so the
# vectors are the same on every run).
W2V_PARAMS = {"vector_size": 100, "window": 5, "min_count": 3, "epochs": 5, "sg": 0,
              "negative": 5}


class VectorsError(ValueError):
    """A word-vector file is missing or unreadable; the message names it and the fix."""


_FORMATS = ("a GloVe .txt (no header), a word2vec .txt (with 'count dim' header) or .bin, "
            "or a gensim KeyedVectors .kv file")


@contextlib.contextmanager
def _local(path: str) -> Iterator[str]:
    """`path` itself when local; a remote file copied to a temporary local one."""
    if not files.is_remote(path):
        yield path
        return
    folder = tempfile.mkdtemp(prefix="tinybert-vectors-")
    try:
        local = os.path.join(folder, os.path.basename(path))
        files.copy(path, local)
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _has_header(path: str) -> bool:
    """True if the first line of a text vector file is word2vec's 'count dim' header."""
    from gensim import utils
    with utils.open(path, "rb") as f:
        first = f.readline().decode("utf-8", errors="replace").split()
    return len(first) == 2 and all(p.isdigit() for p in first)


def load_vectors(path: str, flag: str = "--word_vectors"):
    """Read word vectors into a gensim `KeyedVectors`.

    Format by file name: `.kv` -> `KeyedVectors.load`; `.bin`/`.bin.gz` ->
    binary word2vec; anything else is text: word2vec text if its first line is
    a 'count dim' header, else GloVe (`no_header=True`).
    """
    if not path or not files.isfile(path):
        raise VectorsError(f"{flag}={path}: word-vector file not found; give {_FORMATS}, or "
                           f"leave {flag} empty to train Word2Vec on the general corpus.")
    with _local(path) as local:
        return _load_local(local, path, flag)


def _load_local(path: str, shown: str, flag: str):
    from gensim.models import KeyedVectors
    name = path.lower()
    try:
        if name.endswith(".kv"):
            kv = KeyedVectors.load(path)
            kv = getattr(kv, "wv", kv)  # a full Word2Vec model saved under .kv
        elif name.endswith(".bin") or name.endswith(".bin.gz"):
            kv = KeyedVectors.load_word2vec_format(path, binary=True)
        else:
            kv = KeyedVectors.load_word2vec_format(path, binary=False,
                                                   no_header=not _has_header(path))
    except Exception as e:  # gensim raises ValueError, UnicodeDecodeError, pickle errors...
        raise VectorsError(f"{flag}={shown}: cannot read word vectors "
                           f"({type(e).__name__}: {str(e)[:200]}); give {_FORMATS}.") from None
    if not hasattr(kv, "vectors") or len(kv) == 0:
        raise VectorsError(f"{flag}={shown}: the file holds no word vectors; give {_FORMATS}.")
    return kv


def _corpus_key(corpus: Any, seed: int, lower_case: bool) -> str:
    if isinstance(corpus, str) and files.isfile(corpus):
        st = files.stat(corpus)
        ident = f"{files.absolute(corpus)}|{st.size}|{st.mtime_ns}"
    else:
        ident = repr(corpus)
    blob = f"{ident}|{sorted(W2V_PARAMS.items())}|{seed}|{lower_case}".encode()
    return hashlib.sha1(blob).hexdigest()[:16]


def _documents(corpus: Any) -> Iterable[Sequence[str]]:
    """Documents (lists of sentence strings) of a corpus source or an iterable of them."""
    if isinstance(corpus, str):
        return corpus_lib.iter_documents(corpus)
    return corpus


def train_word2vec(corpus: Any, cache_dir: Optional[str] = None, seed: int = 42,
                   lower_case: bool = True):
    """Train (or load from `cache_dir`) Word2Vec on a corpus; returns `KeyedVectors`.

    Args:
      corpus: a corpus source for `tinybert_tf.data.corpus.iter_documents` (path,
        glob, tfds:NAME) or an iterable of documents, each a list of sentences.
      cache_dir: where the trained vectors are kept (word2vec binary, keyed by the
        corpus file's path/size/mtime, the parameters and the seed).
      seed: Word2Vec's seed (one worker thread, so the result is reproducible).
      lower_case: split words as the uncased tokenizer does.

    Sentences are split with BERT's basic tokenisation and only alphabetic
    words are kept, so every neighbour found later is a word.
    """
    from gensim.models import KeyedVectors, Word2Vec
    from gensim.models.word2vec import LineSentence
    key = _corpus_key(corpus, seed, lower_case)
    cached = os.path.join(cache_dir, f"word2vec-{key}.bin") if cache_dir else None
    if cached and files.isfile(cached):
        kv = _read_cache(cached)
        if kv is not None:
            return kv
    # The sentences file is gensim's input: always local.
    work = (cache_dir if cache_dir and not files.is_remote(cache_dir)
            else os.environ.get("TMPDIR", "/tmp"))
    os.makedirs(work, exist_ok=True)
    _remove_dead_writers_sentences(work)
    text = os.path.join(work, f"word2vec-{key}.sentences.tmp-{os.getpid()}")
    splitter = WordSplitter(lower_case)
    sentences = 0
    try:
        # Tokenised sentences go to a temporary file that gensim streams (twice per
        # epoch at most), so a corpus larger than memory trains too.
        with open(text, "w", encoding="utf-8") as f:
            for doc in _documents(corpus):
                for words in splitter.split(list(doc)):
                    words = [w for w in words if w.isalpha()]
                    if len(words) > 1:
                        f.write(" ".join(words) + "\n")
                        sentences += 1
        if sentences == 0:
            raise VectorsError(f"--corpus={corpus if isinstance(corpus, str) else '(given)'}: "
                               f"no sentences to train word vectors on; give --word_vectors "
                               f"or a non-empty corpus.")
        logger.info("word vectors: training Word2Vec on %d sentences (no --word_vectors "
                    "given)", sentences)
        model = Word2Vec(LineSentence(text), workers=1, seed=seed, **W2V_PARAMS)
    finally:
        if os.path.exists(text):
            os.remove(text)
    kv = model.wv
    if len(kv) == 0:
        raise VectorsError("the corpus is too small to train word vectors (no word occurs "
                           f"{W2V_PARAMS['min_count']} times); give --word_vectors.")
    if cached:
        folder = tempfile.mkdtemp(prefix="tinybert-vectors-")
        try:
            local = os.path.join(folder, os.path.basename(cached))
            kv.save_word2vec_format(local, binary=True)
            with files.atomic_path(cached) as tmp:
                files.copy(local, tmp)
            # Reload so a fresh run and a cached run see byte-identical vectors.
            return KeyedVectors.load_word2vec_format(local, binary=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return kv


# `train_word2vec`'s sentences file (`processes.TEMPORARY` knows it too).
_SENTENCES = re.compile(r"^word2vec-[0-9a-f]+\.sentences\.tmp-\d+$")


def _remove_dead_writers_sentences(work: str) -> None:
    """Remove the sentences files that killed trainings left in the local folder `work`
    (as large as the tokenised corpus; a finished or failed training removes its own)."""
    now = time.time()
    for name in sorted(os.listdir(work)):
        path = os.path.join(work, name)
        if _SENTENCES.match(name) and left_by_a_dead_writer(path, now):
            with contextlib.suppress(FileNotFoundError):  # another process was faster
                os.remove(path)
                logger.info("word vectors: removed %s, left by a killed training", name)


def _read_cache(cached: str):
    """The cached Word2Vec vectors, or None (with a warning) when the file is damaged."""
    from gensim.models import KeyedVectors
    logger.info("word vectors: loading cached Word2Vec %s", cached)
    try:
        with _local(cached) as local:
            return KeyedVectors.load_word2vec_format(local, binary=True)
    except Exception as e:  # gensim raises several types for a cut file
        logger.warning("word vectors: the cache %s cannot be read (%s: %s); training "
                       "Word2Vec again", cached, type(e).__name__, str(e)[:120])
        return None


def resolve_vectors(word_vectors: Union[None, str, Any], corpus: Any = None,
                    cache_dir: Optional[str] = None, seed: int = 42, lower_case: bool = True):
    """KeyedVectors from a path, an existing KeyedVectors, or Word2Vec on `corpus`."""
    if word_vectors is None or (isinstance(word_vectors, str) and not word_vectors):
        if corpus is None:
            corpus = corpus_lib.default_corpus_path()
        return train_word2vec(corpus, cache_dir, seed, lower_case)
    if isinstance(word_vectors, str):
        return load_vectors(word_vectors)
    if not hasattr(word_vectors, "key_to_index"):
        raise VectorsError(f"word_vectors must be a path or a gensim KeyedVectors, got "
                           f"{type(word_vectors).__name__}.")
    return word_vectors


def fingerprint(kv) -> str:
    """A short digest identifying a set of vectors (for resume checks)."""
    h = hashlib.sha1()
    h.update(f"{len(kv)}|{kv.vector_size}|".encode())
    h.update("\n".join(kv.index_to_key[:2000]).encode("utf-8", errors="replace"))
    h.update(np.ascontiguousarray(kv.vectors[:256]).tobytes())
    return h.hexdigest()[:16]


class NeighbourIndex:
    """K nearest words by cosine similarity, cached per word.

    Args:
      kv: gensim KeyedVectors.
      num_candidates: K.
      vocab_limit: search (and look words up) among the first this-many words only
        (the file's order, most frequent first for GloVe/Word2Vec); 0 = all.
      lower_case: lower-case neighbours (uncased models), dropping those that then
        equal the word or an earlier neighbour.

    `neighbours(words)` -> {word: [up to K words]}; [] for a word absent from the vectors.
    """

    _SLACK = 1e-4  # > float32 error of a cosine of unit vectors (~1e-6): see _top_exact
    _QUERY_BATCH = 256

    def __init__(self, kv, num_candidates: int = 15, vocab_limit: int = DEFAULT_VOCAB_LIMIT,
                 lower_case: bool = True):
        n = len(kv) if not vocab_limit else min(len(kv), int(vocab_limit))
        self.keys = list(kv.index_to_key[:n])
        self.index = {k: i for i, k in enumerate(self.keys)}
        vectors = np.asarray(kv.vectors[:n], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        self.unit = np.ascontiguousarray(vectors / norms)  # [n, D] float32
        self.k = int(num_candidates)
        self.lower_case = lower_case
        self.cache: dict[str, list[str]] = {}

    def neighbours(self, words: Iterable[str]) -> dict[str, list[str]]:
        todo = sorted({w for w in words if w not in self.cache})
        present = [w for w in todo if w in self.index]
        for w in todo:
            if w not in self.index:
                self.cache[w] = []
        for start in range(0, len(present), self._QUERY_BATCH):
            batch = present[start:start + self._QUERY_BATCH]
            rows = np.array([self.index[w] for w in batch])
            approx = self.unit[rows] @ self.unit.T  # [Q, n] float32
            approx[np.arange(len(rows)), rows] = -np.inf
            for r, w in enumerate(batch):
                self.cache[w] = self._top_exact(w, rows[r], approx[r])
        return {w: self.cache[w] for w in words}

    def _exact(self, query: int, cand: np.ndarray) -> np.ndarray:
        """float64 cosine of `query` with rows `cand`; a per-row sum, independent of batching."""
        q = self.unit[query].astype(np.float64)
        return (self.unit[cand].astype(np.float64) * q).sum(axis=1)

    def _accept(self, word: str, token: str, seen: set) -> Optional[str]:
        out = token.lower() if self.lower_case else token
        if out == word or out in seen or not out or any(c.isspace() for c in out):
            return None
        return out

    def _top_exact(self, word: str, query: int, approx: np.ndarray) -> list[str]:
        """Top-K by exact score, from a shortlist of the approximate scores.

        Every word outside the shortlist has approx <= floor, so an exact score
        <= floor + 2 * error; shortlist words scoring above floor + _SLACK are
        therefore certainly ranked right. If too few qualify (many filtered or
        near-ties at the boundary), fall back to exact scores over all words.
        """
        n = approx.shape[0]
        m = min(n - 1, 4 * self.k + 16)
        if m <= 0:
            return []
        if m < n - 1:
            cand = np.argpartition(-approx, m - 1)[:m]
            floor = float(approx[cand].min())
        else:
            cand = np.array([i for i in range(n) if i != query])
            floor = -np.inf
        out = self._pick(word, cand, self._exact(query, cand), floor + self._SLACK)
        if out is None:
            cand = np.array([i for i in range(n) if i != query])
            out = self._pick(word, cand, self._exact(query, cand), -np.inf)
        return out

    def _pick(self, word, cand, exact, threshold) -> Optional[list[str]]:
        order = np.lexsort((cand, -exact))  # best score first, ties by vocab order
        out, seen = [], set()
        for j in order:
            if exact[j] <= threshold:
                return None  # below the certainty line before K were found
            token = self._accept(word, self.keys[cand[j]], seen)
            if token is not None:
                out.append(token)
                seen.add(token)
                if len(out) == self.k:
                    return out
        # Shortlist exhausted by the filter: only final if it was every word.
        return out if len(cand) >= len(self.keys) - 1 else None
