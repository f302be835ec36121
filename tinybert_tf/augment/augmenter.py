"""TinyBERT data augmentation (paper Algorithm 1) of a task's training file, streamed and resumable.

For each example and each text field:
  1. split the text into words (BERT basic tokenisation, `words.WordSplitter`);
  2. eligible words (alphabetic, not a stopword) get K candidates: single-piece
     words the K most probable whole-word MLM tokens with the word masked
     (`candidates.MLMCandidates`, batched), multi-piece words -- or every word
     when no MLM model is given -- their K nearest word vectors
     (`vectors.NeighbourIndex`, cached per word);
  3. N_a times: each eligible word with candidates is replaced, with probability
     p_t, by a candidate drawn uniformly; the words are joined with spaces;
  4. the original row comes first, then the distinct variants (a variant equal
     to the original, or to its tokenised form, or to an earlier one is dropped).
Pair tasks: variants of the first field keep the original second field and
vice versa (the reference builds the second field's variants on a mutated
first field, a bug we do not copy). Labels and other columns are copied.
Token tasks (`RowTable.pre_split`): the text is the sentence's own words joined
by spaces; it is split on those spaces only, each replacement is one word for
one word (so every tag still belongs to its word and is copied), and a
candidate takes the capitalisation of the word it replaces ("Paris" -> "Rome",
"EU" -> "UN"), which cased models and entity tags depend on.

Determinism: example i draws from `np.random.default_rng([seed, i])`, and MLM
batches are formed within fixed chunks of `chunk_size` consecutive examples,
so a shard or a resumed run writes exactly the bytes of the same chunks of an
uninterrupted run. Output: `OUTPUT.partial` grows a chunk at a time;
`OUTPUT.progress.json` records the chunks and bytes done (written after the
chunk's bytes are on disk); the final rename makes `OUTPUT` appear only when
complete. On object stores (gs://, ram://: no append, no truncate) each chunk
is its own object `OUTPUT.parts/chunk-NNNNNN`, written whole; when the last
one is done they are concatenated into `OUTPUT` (one upload) and removed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from tinybert_tf import files
from tinybert_tf.augment.candidates import MLMCandidates, MLMError
from tinybert_tf.augment.vectors import (
    DEFAULT_VOCAB_LIMIT,
    NeighbourIndex,
    fingerprint,
    resolve_vectors,
)
from tinybert_tf.augment.words import WordSplitter, is_eligible
from tinybert_tf.data import sources
from tinybert_tf.data.examples import DataError
from tinybert_tf.files import read_json, write_json_atomic
from tinybert_tf.models.checkpoint import load_model
from tinybert_tf.progress import progress_bar
from tinybert_tf.tokenizer import read_vocab

logger = logging.getLogger(__name__)

CHUNK_SIZE = 128  # examples per resumable unit (and per MLM batching window)
_PROGRESS_VERSION = 1


class AugmentError(ValueError):
    """Bad augmentation input (flag value, task file); the message names it and the fix."""


# ---------------------------------------------------------------------------
# Sampling (Algorithm 1, lines "for i in 1..N_a").

def sample_variants(words: Sequence[str], candidates: Sequence[tuple[int, Sequence[str]]],
                    num_aug: int, replace_prob: float, rng: np.random.Generator,
                    seen: set) -> list[str]:
    """Up to `num_aug` distinct variants of one text.

    Args:
      words: the text's words.
      candidates: (word index, candidate words) for each word that may change;
        lists must be non-empty.
      num_aug: N_a tries; replace_prob: p_t.
      rng: the example's generator; draws a [N_a, n] candidate index and a
        [N_a, n] uniform number (replace when < p_t).
      seen: texts that do not count as new (updated in place).
    """
    if not candidates or num_aug <= 0:
        return []
    pos = [p for p, _ in candidates]
    lists = [list(c) for _, c in candidates]
    lens = np.array([len(c) for c in lists])
    choice = rng.integers(0, lens, size=(num_aug, len(pos)))
    replace = rng.random((num_aug, len(pos))) < replace_prob
    out = []
    for t in range(num_aug):
        new = list(words)
        for j in np.flatnonzero(replace[t]):
            new[pos[j]] = lists[j][choice[t, j]]
        text = " ".join(new)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


# ---------------------------------------------------------------------------
# Candidates for a chunk of texts.

@dataclasses.dataclass
class ChunkStats:
    eligible: int = 0      # eligible words seen
    mlm_words: int = 0     # ... served by the MLM
    vector_words: int = 0  # ... served by word vectors
    skipped: int = 0       # ... with no candidate (not in the vectors, beyond max_len)

    def add(self, other: "ChunkStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Augmenter:
    """Algorithm 1 on batches of texts.

    Args:
      neighbours: word-vector neighbours (multi-piece words, or all words).
      mlm: MLM candidates for single-piece words, or None.
      num_aug, replace_prob, seed: N_a, p_t and the base seed.
      pre_split: texts are words joined by single spaces, replaced one for one
        with the replaced word's capitalisation (token tasks; module doc).
    """

    def __init__(self, neighbours: NeighbourIndex, mlm: Optional[MLMCandidates] = None,
                 num_aug: int = 20, replace_prob: float = 0.4, seed: int = 42,
                 pre_split: bool = False):
        self.neighbours = neighbours
        self.mlm = mlm
        self.splitter = WordSplitter(mlm.lower_case if mlm is not None else True)
        self.num_aug = int(num_aug)
        self.replace_prob = float(replace_prob)
        self.seed = int(seed)
        self.pre_split = bool(pre_split)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        """texts [T] -> the words Algorithm 1 replaces, per text."""
        if self.pre_split:
            return [t.split(" ") for t in texts]
        return self.splitter.split(texts)

    def _vector_key(self, word: str) -> str:
        """The form a word has in the vectors: the splitter's case (pre-split words
        keep theirs; eligible words are ASCII, so lower() is the whole folding)."""
        return word.lower() if self.pre_split and self.splitter.lower_case else word

    def word_candidates(self, texts: Sequence[str]
                        ) -> tuple[list[list[str]], list[list[tuple[int, list[str]]]], ChunkStats]:
        """texts [T] -> words per text, (word index, candidates) per text, stats."""
        words = self.split(texts)
        stats = ChunkStats()
        eligible = [[i for i, w in enumerate(ws) if is_eligible(w)] for ws in words]
        found: list[dict[int, list[str]]] = [{} for _ in texts]
        by_vectors: list[tuple[int, int]] = []  # (text, word index)
        if self.mlm is not None:
            flat = [w for ws in words for w in ws]
            flat_pieces = self.mlm.pieces(flat)
            rows, owners = [], []
            at = 0
            for t, ws in enumerate(words):
                pieces = flat_pieces[at:at + len(ws)]
                at += len(ws)
                single = [i for i in eligible[t] if len(pieces[i]) == 1]
                by_vectors += [(t, i) for i in eligible[t] if len(pieces[i]) > 1]
                for i, row in zip(single, self.mlm.make_rows(pieces, single)):
                    if row is not None:
                        rows.append(row)
                        owners.append((t, i))
            for (t, i), cands in zip(owners, self.mlm.candidates(rows)):
                found[t][i] = cands
            stats.mlm_words = len(rows)
        else:
            by_vectors = [(t, i) for t in range(len(texts)) for i in eligible[t]]
        table = self.neighbours.neighbours([self._vector_key(words[t][i])
                                            for t, i in by_vectors])
        for t, i in by_vectors:
            found[t][i] = table[self._vector_key(words[t][i])]
        stats.vector_words = len(by_vectors)
        out = []
        for t in range(len(texts)):
            cands = [(i, found[t][i]) for i in eligible[t] if found[t].get(i)]
            if self.pre_split:
                cased = [(i, _same_case(words[t][i], c)) for i, c in cands]
                cands = [(i, c) for i, c in cased if c]
            stats.eligible += len(eligible[t])
            stats.skipped += len(eligible[t]) - len(cands)
            out.append(cands)
        return words, out, stats

    def augment_fields(self, examples: Sequence[tuple[int, Sequence[str]]]
                       ) -> tuple[list[list[list[str]]], ChunkStats]:
        """(example index, text fields) -> per example, per field, the new texts."""
        texts = [t for _, fields in examples for t in fields]
        words, cands, stats = self.word_candidates(texts)
        out, at = [], 0
        for index, fields in examples:
            rng = np.random.default_rng([self.seed, index])
            per_field = []
            for text in fields:
                seen = {text, " ".join(words[at])}
                per_field.append(sample_variants(words[at], cands[at], self.num_aug,
                                                 self.replace_prob, rng, seen))
                at += 1
            out.append(per_field)
        return out, stats


def _same_case(word: str, candidates: Sequence[str]) -> list[str]:
    """`candidates` with the capitalisation of `word` (all caps, or a capital first),
    those equal to `word` once cased dropped."""
    if len(word) > 1 and word.isupper():
        cased = [c.upper() for c in candidates]
    elif word[:1].isupper():
        cased = [c[:1].upper() + c[1:] for c in candidates]
    else:
        cased = list(candidates)
    out: list[str] = []
    for c in cased:
        if c != word and c not in out:
            out.append(c)
    return out


def example_rows(fields: Sequence[str], cols: Sequence[int],
                 variants: Sequence[Sequence[str]]) -> list[list[str]]:
    """The original row, then for each text column its variants with the other
    columns (including the other text) left as in the original."""
    rows = [list(fields)]
    for col, texts in zip(cols, variants):
        for text in texts:
            row = list(fields)
            row[col] = text
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# The task-level driver.

def parse_shard(shard: Optional[str]) -> tuple[int, int]:
    """"i/n" -> (i, n); None/"" -> (0, 1)."""
    if not shard:
        return 0, 1
    try:
        i, n = (int(x) for x in str(shard).split("/"))
    except ValueError:
        raise AugmentError(f"--shard={shard}: expected i/n, e.g. 0/4 (0-based).") from None
    if n < 1 or not 0 <= i < n:
        raise AugmentError(f"--shard={shard}: need 0 <= i < n (0-based), e.g. 0/4 .. 3/4.")
    return i, n


def load_mlm_model(path: str):
    """Load `path` keeping its stored head; it must be an MLM head (never a fresh one)."""
    model = load_model(path)
    if model.head_type != "mlm":
        raise MLMError(f"--mlm_model={path}: the checkpoint has no MLM head (head: "
                       f"{model.head_type}); give a BertForMaskedLM / keras-hub BertMaskedLM / "
                       "our MLM directory, or leave --mlm_model empty to use word vectors for "
                       "every word.")
    return model


def _check_vocab(mlm: MLMCandidates, vocab: Union[str, Sequence[str]]) -> None:
    name = vocab if isinstance(vocab, str) else "the task tokenizer"
    tokens = read_vocab(vocab) if isinstance(vocab, str) else list(vocab)
    if tokens == mlm.vocab:
        return
    diff = next((i for i, (a, b) in enumerate(zip(tokens, mlm.vocab)) if a != b),
                min(len(tokens), len(mlm.vocab)))
    got = mlm.vocab[diff] if diff < len(mlm.vocab) else "(end)"
    want = tokens[diff] if diff < len(tokens) else "(end)"
    raise MLMError(f"--mlm_model: its vocab ({len(mlm.vocab)} tokens) differs from {name} "
                   f"({len(tokens)} tokens) at line {diff + 1} ({got!r} vs {want!r}); "
                   "candidates must be words of the model trained on the output: use an MLM "
                   "model with the same vocab.txt.")


def _validate(num_aug, replace_prob, num_candidates, seed, batch_size, chunk_size) -> None:
    checks = [(isinstance(num_aug, int) and num_aug >= 1, f"--num_aug={num_aug}: need >= 1"),
              (0.0 <= float(replace_prob) <= 1.0,
               f"--replace_prob={replace_prob}: need 0 <= p_t <= 1"),
              (isinstance(num_candidates, int) and num_candidates >= 1,
               f"--num_candidates={num_candidates}: need >= 1"),
              (isinstance(seed, int) and seed >= 0, f"--seed={seed}: need an integer >= 0"),
              (isinstance(batch_size, int) and batch_size >= 1,
               f"--augment_batch_size={batch_size}: need >= 1"),
              (isinstance(chunk_size, int) and chunk_size >= 1,
               f"chunk_size={chunk_size}: need >= 1")]
    for ok, message in checks:
        if not ok:
            raise AugmentError(message + ".")


def _mlm_fingerprint(mlm: Optional[MLMCandidates]) -> Optional[str]:
    if mlm is None:
        return None
    h = hashlib.sha1(json.dumps(mlm.model.bert_config.to_dict(), sort_keys=True).encode())
    h.update("\n".join(mlm.vocab).encode())
    for path, var in sorted(mlm.model.weight_dict().items()):
        if path.endswith("output_bias") or path.startswith("embeddings_layer_norm"):
            h.update(path.encode())
            h.update(np.asarray(var.numpy()).tobytes())
    return h.hexdigest()[:16]


class _LocalPartial:
    """OUTPUT.partial, appended a chunk at a time (fsynced) and cut back on resume to
    the bytes the progress record vouches for."""

    def __init__(self, output_path: str):
        self.output_path = output_path
        self.path = output_path + ".partial"

    def usable(self, state: dict) -> bool:
        return os.path.isfile(self.path) and os.path.getsize(self.path) >= state["bytes"]

    def resume(self, state: dict) -> None:
        with open(self.path, "r+b") as f:
            f.truncate(state["bytes"])  # drop a chunk written after the last record

    def start(self, head: bytes) -> None:
        self.append(-1, head)

    def append(self, index: int, data: bytes) -> None:
        with open(self.path, "ab" if index >= 0 else "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def publish(self, chunks: int) -> None:
        os.replace(self.path, self.output_path)


class _ChunkObjects:
    """OUTPUT.parts/: the header and each chunk as its own object, written whole (object
    stores cannot append or truncate); concatenated into OUTPUT at the end."""

    def __init__(self, output_path: str):
        self.output_path = output_path
        self.path = output_path + ".parts"

    def _part(self, index: int) -> str:
        return f"{self.path}/{'head' if index < 0 else f'chunk-{index:06d}'}"

    def usable(self, state: dict) -> bool:
        done = state["chunks_done"]
        return files.isfile(self._part(-1)) and (done == 0 or files.isfile(self._part(done - 1)))

    def resume(self, state: dict) -> None:
        done = state["chunks_done"]
        for path in files.glob(f"{self.path}/chunk-*"):
            if int(path.rsplit("-", 1)[1]) >= done:
                files.remove(path)  # a chunk written after the last record

    def start(self, head: bytes) -> None:
        if files.exists(self.path):
            files.rmtree(self.path)
        files.makedirs(self.path)
        self.append(-1, head)

    def append(self, index: int, data: bytes) -> None:
        files.write_bytes_atomic(self._part(index), data)

    def publish(self, chunks: int) -> None:
        with files.atomic_path(self.output_path) as tmp:
            with files.open(tmp, "wb") as out, files.translate_errors(tmp, "write"):
                for index in range(-1, chunks):
                    out.write(files.read_bytes(self._part(index)))
        files.rmtree(self.path)


def _read_progress(path: str) -> Optional[dict]:
    """The progress record, or None when absent or unreadable (then we start over)."""
    try:
        return read_json(path, default=None, expect=dict)
    except ValueError:
        return None


def augment_task(task: str, data_dir: str, output_path: str, **kwargs: Any) -> dict[str, Any]:
    """Augment a GLUE-style task's train split (`sources.glue_source(task, data_dir)`:
    a GLUE folder, or "" for the embedded polarity task) into `output_path`.
    See `augment_source` for the arguments."""
    return augment_source(sources.glue_source(task, data_dir), output_path, **kwargs)


def augment_source(source: sources.DataSource, output_path: str, *,
                   mlm_model: Any = None, word_vectors: Any = None, corpus: Any = None,
                   num_aug: int = 20, replace_prob: float = 0.4, num_candidates: int = 15,
                   seed: int = 42, shard: Optional[str] = None, batch_size: int = 256,
                   vector_cache_dir: Optional[str] = None, progress: bool = True,
                   vocab: Union[None, str, Sequence[str]] = None, chunk_size: int = CHUNK_SIZE,
                   vocab_limit: int = DEFAULT_VOCAB_LIMIT, stop_after_chunks: Optional[int] = None,
                   done_record: Optional[str] = None) -> dict[str, Any]:
    """Augment a data source's training rows into `output_path`, in the source's
    own format (same header and columns), so `source.augmented(output_path)`
    reads it back.

    Args:
      source: a `tinybert_tf.data.sources.DataSource` whose `augment_table()` gives
        its training rows (GLUE TSV, the polarity demo, CSV / JSON lines, ...).
      output_path: the file to write (the source names it, e.g. `train_aug.tsv`).
      mlm_model: a BertModel with an MLM head, a model directory, or None (word
        vectors then serve every word; the result's "mode" says so).
      word_vectors: a vector file path, a gensim KeyedVectors, or None (Word2Vec
        on `corpus`, default the general corpus, cached in `vector_cache_dir`).
      num_aug, replace_prob, num_candidates: N_a, p_t, K.
      seed: example i uses the generator seeded with (seed, i).
      shard: "i/n": only the i-th of n contiguous ranges of chunks; shard 0 writes
        the header, so `cat` of the n outputs in order is the unsharded file.
      batch_size: MLM rows per forward pass.
      vocab: the task tokenizer's vocab (path or tokens); must equal the MLM's.
      chunk_size: examples per resumable chunk (part of the output's identity).
      vocab_limit: neighbours among the first this-many vector words (0 = all).
      stop_after_chunks: stop (leaving a resumable partial output) after this many
        chunks in this call; for tests of interruption.
      done_record: a JSON record of the finished output (bin/augment's `.NAME.shard`);
        when it records this call's input, settings and models, and the output still
        holds what it recorded, the output is kept (stats as recorded, `reused`).
    Returns:
      stats: examples, written (rows in the file), eligible/mlm/vector/skipped
      words, examples_per_s, mode, shard, resumed_chunks, complete, reused.
    """
    _validate(num_aug, replace_prob, num_candidates, seed, batch_size, chunk_size)
    shard_i, shard_n = parse_shard(shard)
    output_path = files.absolute(output_path)
    table = source.augment_table()
    total = _count_rows(table)  # a malformed row fails before anything is written
    files.makedirs(os.path.dirname(output_path))
    mlm, kv, augmenter = _build_augmenter(table, mlm_model, word_vectors, corpus,
                                          vector_cache_dir, vocab, num_aug, replace_prob,
                                          num_candidates, seed, batch_size, vocab_limit)
    mode = "vectors-only" if mlm is None else "mlm+vectors"

    # This shard's chunks.
    num_chunks = math.ceil(total / chunk_size)
    c_begin, c_end = (shard_i * num_chunks // shard_n, (shard_i + 1) * num_chunks // shard_n)
    identity = _identity(source, table, total, chunk_size=chunk_size, num_aug=num_aug,
                         replace_prob=float(replace_prob), num_candidates=num_candidates,
                         seed=seed, batch_size=batch_size, mode=mode,
                         mlm=_mlm_fingerprint(mlm), vectors=fingerprint(kv),
                         vocab_limit=vocab_limit, shard=[shard_i, shard_n])
    earlier = _finished_earlier(output_path, done_record, identity)
    if earlier is not None:
        return earlier
    progress_path = output_path + ".progress.json"
    partial, state, resumed = _open_output(output_path, progress_path, identity, table,
                                           write_header=shard_i == 0,
                                           shard_chunks=c_end - c_begin)

    first_example = (c_begin + resumed) * chunk_size
    last_example = min(c_end * chunk_size, total)
    shard_examples = max(0, last_example - c_begin * chunk_size)
    bar = _progress_bar(progress, shard_examples, first_example - c_begin * chunk_size, mode)
    processed, elapsed = _augment_chunks(table, augmenter, partial, state, progress_path,
                                         range(c_begin + resumed, c_end), chunk_size,
                                         first_example, last_example, stop_after_chunks, bar)
    complete = state["chunks_done"] >= c_end - c_begin
    result = _stats(state, mlm, examples=shard_examples,
                    examples_per_s=processed / elapsed if elapsed > 0 and processed else 0.0,
                    mode=mode, shard=f"{shard_i}/{shard_n}", resumed_chunks=resumed,
                    complete=complete, output=output_path if complete else partial.path)
    if complete:
        _finish(partial, state, output_path, progress_path, done_record, identity, result)
        _warn_if_nothing_replaced(result, word_vectors, output_path)
    return result


def _stats(state: dict[str, Any], mlm: Optional[MLMCandidates],
           **facts: Any) -> dict[str, Any]:
    """`augment_source`'s summary: `facts`, then the rows and word counts `state` holds."""
    totals = ChunkStats(**state["stats"])
    result = {**facts, "written": state["rows"], "eligible_words": totals.eligible,
              "mlm_words": totals.mlm_words, "vector_words": totals.vector_words,
              "skipped_words": totals.skipped, "reused": False}
    if mlm is not None:
        result["mlm_forward_calls"] = mlm.forward_calls
    return result


def _finish(partial: Any, state: dict[str, Any], output_path: str, progress_path: str,
            done_record: Optional[str], identity: dict[str, Any],
            result: dict[str, Any]) -> None:
    """Publish the finished output, record it in `done_record` (when given), then drop
    the progress record: at every moment one of the two vouches for the output."""
    partial.publish(state["chunks_done"])
    if done_record is not None:
        shard_i, shard_n = identity["shard"]
        write_json_atomic(done_record, {
            "shard": "" if shard_n == 1 else f"{shard_i}/{shard_n}", "identity": identity,
            "output": files.recorded_fingerprint(output_path), "stats": result})
    files.remove(progress_path)


def _finished_earlier(output_path: str, done_record: Optional[str],
                      identity: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The stats `done_record` holds when it records `identity` and `output_path` still
    holds the bytes it recorded (`reused` set); None otherwise (the work is done again)."""
    record = (files.json_object(done_record) if done_record and files.exists(done_record)
              else None)
    if (record is None or record.get("identity") != identity
            or not isinstance(record.get("stats"), dict)
            or not isinstance(record.get("output"), str)
            or not files.same_content(output_path, record["output"])):
        return None
    logger.info("augment: %s is finished with these settings and input (%s); kept.",
                output_path, done_record)
    return {**record["stats"], "examples_per_s": 0.0, "resumed_chunks": 0, "reused": True}


def _warn_if_nothing_replaced(stats: dict[str, Any], word_vectors: Any,
                              output_path: str) -> None:
    """A warning when the finished file is the original rows: vectors of another
    language or casing replaced no word, and task distillation would take the file for
    augmented data."""
    eligible = stats["eligible_words"]
    if not (eligible and stats["skipped_words"] >= eligible):
        return
    logger.warning(
        "augment: no word of %d found a replacement: the word vectors (%s) hold none of the "
        "task's words, so %s holds the original rows only and task distillation sees no "
        "augmentation; give vectors of the task's language and casing.", eligible,
        word_vectors if isinstance(word_vectors, str) else
        "trained on --corpus" if word_vectors is None else "given", output_path)


def _identity(source: sources.DataSource, table: Any, total: int,
              **settings: Any) -> dict[str, Any]:
    """What a partial output was made from and with: resumed only when all match."""
    facts = table.fingerprint()
    order = ("shard", "chunk_size", "num_aug", "replace_prob", "num_candidates", "seed",
             "batch_size", "mode", "mlm", "vectors", "vocab_limit")
    return {"version": _PROGRESS_VERSION, "source": source.kind, "train": facts["path"],
            "train_size": facts["size"], "train_mtime_ns": facts["mtime_ns"],
            "examples": total, **{k: settings[k] for k in order}}


def _count_rows(table: Any) -> int:
    """The number of training rows; a row with the wrong column count is a DataError."""
    total = 0
    for no, fields in table.rows():
        if table.num_columns is not None and len(fields) != table.num_columns:
            raise DataError(f"{table.path}:{no}: {len(fields)} column(s), expected "
                            f"{table.num_columns} (the file's layout).")
        total += 1
    return total


def _build_augmenter(table: Any, mlm_model: Any, word_vectors: Any, corpus: Any,
                     vector_cache_dir: Optional[str],
                     vocab: Union[None, str, Sequence[str]], num_aug: int,
                     replace_prob: float, num_candidates: int, seed: int, batch_size: int,
                     vocab_limit: int) -> tuple[Optional[MLMCandidates], Any, Augmenter]:
    """The MLM candidates (None without an MLM model), the word vectors and the
    Augmenter that uses them."""
    if isinstance(mlm_model, str):
        mlm_model = load_mlm_model(mlm_model) if mlm_model else None
    mlm = (MLMCandidates(mlm_model, num_candidates, batch_size) if mlm_model is not None
           else None)
    if mlm is not None and vocab is not None:
        _check_vocab(mlm, vocab)
    lower_case = mlm.lower_case if mlm is not None else True
    kv = resolve_vectors(word_vectors, corpus, vector_cache_dir, lower_case=lower_case)
    neighbours = NeighbourIndex(kv, num_candidates, vocab_limit, lower_case)
    if mlm is None:
        logger.warning("augment: no MLM model (--mlm_model) given: word-vector neighbours "
                       "serve every word, single-piece words included (the paper uses the "
                       "MLM for those).")
    augmenter = Augmenter(neighbours, mlm, num_aug, replace_prob, seed,
                          pre_split=table.pre_split)
    return mlm, kv, augmenter


def _open_output(output_path: str, progress_path: str, identity: dict[str, Any], table: Any,
                 write_header: bool, shard_chunks: int) -> tuple[Any, dict[str, Any], int]:
    """The partial output and its progress record: resumed when the record's identity
    matches, else started over (with the header when `write_header`). Returns
    (partial, state, chunks already done)."""
    partial = (_ChunkObjects if files.is_remote(output_path) else _LocalPartial)(output_path)
    state = _read_progress(progress_path)
    if state and state.get("identity") == identity and partial.usable(state):
        partial.resume(state)
        logger.info("augment: resuming %s after %d of %d chunk(s)", partial.path,
                    state["chunks_done"], shard_chunks)
        return partial, state, state["chunks_done"]
    if state:
        logger.warning("augment: %s was started with other settings or data; starting "
                       "over.", progress_path)
    head = (table.encode([table.header]) if table.header is not None and write_header
            else b"")
    partial.start(head)
    state = {"identity": identity, "chunks_done": 0, "bytes": len(head), "rows": 0,
             "stats": dataclasses.asdict(ChunkStats())}
    write_json_atomic(progress_path, state)
    return partial, state, 0


def _augment_chunks(table: Any, augmenter: Augmenter, partial: Any, state: dict[str, Any],
                    progress_path: str, chunks: range, chunk_size: int, first_example: int,
                    last_example: int, stop_after_chunks: Optional[int],
                    bar: Any) -> tuple[int, float]:
    """Augment and append `chunks` in order, recording progress (in `state` and its
    file) after each; stops early after `stop_after_chunks`; closes `bar`. Returns the
    examples done and the seconds taken."""
    started = time.perf_counter()
    try:
        processed = _append_chunks(table, augmenter, partial, state, progress_path, chunks,
                                   chunk_size, first_example, last_example,
                                   stop_after_chunks, bar)
    finally:
        if bar is not None:
            bar.close()
    return processed, time.perf_counter() - started


def _append_chunks(table: Any, augmenter: Augmenter, partial: Any, state: dict[str, Any],
                   progress_path: str, chunks: range, chunk_size: int, first_example: int,
                   last_example: int, stop_after_chunks: Optional[int], bar: Any) -> int:
    """The loop of `_augment_chunks`: the examples done."""
    cols = table.text_columns
    totals = ChunkStats(**state["stats"])
    it = _examples(table.rows(), first_example, last_example)
    processed = 0
    for chunks_now, chunk_no in enumerate(chunks):
        if stop_after_chunks is not None and chunks_now >= stop_after_chunks:
            break
        chunk = [next(it) for _ in range(min(chunk_size, last_example
                                             - chunk_no * chunk_size))]
        variants, stats = augmenter.augment_fields(
            [(i, [fields[c] for c in cols]) for i, fields in chunk])
        out_rows = []
        for (_, fields), per_field in zip(chunk, variants):
            out_rows += example_rows(fields, cols, per_field)
        data = table.encode(out_rows)
        partial.append(state["chunks_done"], data)
        totals.add(stats)
        state.update(chunks_done=state["chunks_done"] + 1, bytes=state["bytes"] + len(data),
                     rows=state["rows"] + len(out_rows), stats=dataclasses.asdict(totals))
        write_json_atomic(progress_path, state)
        processed += len(chunk)
        if bar is not None:
            bar.update(len(chunk))
    return processed


def _examples(rows: Iterator, first: int, last: int) -> Iterator[tuple[int, list]]:
    """(example index, fields) for examples first..last-1 of a row iterator."""
    for index, (_, fields) in enumerate(rows):
        if index >= last:
            return
        if index >= first:
            yield index, fields


def _progress_bar(enabled: bool, total: int, initial: int, mode: str):
    if not enabled:
        return None
    return progress_bar(total=total, initial=initial, unit="ex", desc=f"augment [{mode}]")
