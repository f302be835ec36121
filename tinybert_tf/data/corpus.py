"""General-distillation corpora -> streaming tf.data of packed (optionally masked) sequences.

Sources (`fmt`, or "auto" from the name), local or any `tf.io.gfile` URL
(gs://, hdfs://, ram://):
  text      BERT's format: one sentence per line, a blank line between
            documents; a file, a glob, or a comma list; .gz / .bz2 read as such.
  wiki      a Wikipedia XML dump (.xml or .xml.bz2): pages streamed with
            gensim's `extract_pages`, markup stripped with `filter_wiki`,
            redirects and non-article namespaces skipped, end matter (See also,
            References, ...) cut, text split into sentences.
  tfds      "tfds:wikipedia/20230601.en" (any TFDS dataset with a `text`
            feature), read from a prepared `tfds_data_dir`; never downloads.
  tfrecord  shards written by `bin/pretokenize` (already tokenised and packed).
Documents are streamed from a Python generator (never materialised);
tokenisation (tensorflow-text, via our Tokenizer) and packing
(`tinybert_tf.data.pretrain`) run in graph, in parallel. TFRecord shards are
read, batched and parsed in graph with no Python per sequence.

Input sharding (`general_dataset(input_context=...)`, one input pipeline per
worker under `strategy.distribute_datasets_from_function`): with at least as
many files as pipelines each pipeline reads only its own files (FILE
sharding, `tfrecords.split_files`), else every pipeline reads everything and
keeps every n-th document or record (DATA sharding). Without an input context
the dataset asks tf.distribute for DATA sharding, which keeps the guarantee
that n workers train on exactly the global batches one replica would.

Data errors: a reader that meets a bad file (truncated .gz/.bz2, invalid
UTF-8, XML cut mid-page) raises a one-line DataError naming the file and the
line, page or byte offset (`_reading`, one place for every reader). Inside
tf.data TensorFlow wraps it, with a traceback, in an InvalidArgumentError;
`translate_data_errors()` around iteration (model.fit, a loop) turns that,
and TFRecord DataLossErrors (which name no file), back into one DataError.
"""
from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import logging
import os
import re
import zlib
from typing import Any, Collection, Iterator, Optional, Sequence, Union
from xml.etree.ElementTree import ParseError

import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.data import pretrain, tfrecords
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.sentence_split import (
    WHITESPACE,
    split_sentences,
    wiki_text_to_paragraphs,
    wiki_text_to_sentences,
)

logger = logging.getLogger(__name__)

WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
FORMATS = ("auto", "text", "wiki", "tfds", "tfrecord")
SHARD_POLICIES = ("auto", "file", "data")


def default_corpus_path() -> str:
    """gensim's 206-page English Wikipedia sample (the embedded default corpus)."""
    import gensim
    return os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", WIKI_SAMPLE)


def detect_format(source: str) -> str:
    s = str(source)
    if s.startswith("tfds:"):
        return "tfds"
    if ".tfrecord" in s:
        return "tfrecord"
    if ".xml" in s:
        return "wiki"
    return "text"


def source_facts(source: str) -> list[list]:
    """[path, size, mtime_ns] of every file of a corpus source ([] for tfds:NAME):
    the identity of cached counts, so a changed corpus is counted again."""
    if detect_format(source) == "tfds":
        return []
    found = (tfrecords.resolve_files(source) if detect_format(source) == "tfrecord"
             else resolve_files(source))
    out = []
    for path in found:
        st = files.stat(path)
        out.append([files.absolute(path), st.size, st.mtime_ns])
    return out


def resolve_files(source: Union[str, Sequence[str]]) -> list[str]:
    """Files of a path, glob or comma list (or a list of those), in sorted order per pattern."""
    parts = [source] if isinstance(source, str) else list(source)
    patterns = [p for part in parts for p in str(part).split(",") if p]
    found: list[str] = []
    for p in patterns:
        if files.isfile(p):
            found.append(p)
        elif files.isdir(p):
            raise DataError(f"{p}: is a directory; give files or a glob (e.g. {p}/*.txt).")
        else:
            hits = [h for h in files.glob(p) if not h.endswith("/")
                    and (files.is_remote(h) or not files.isdir(h))]
            if not hits:
                raise DataError(f"{p}: no corpus file matches; --corpus takes files, globs "
                                f"or a comma list (text .txt/.gz/.bz2, .xml.bz2, .tfrecord, "
                                f"or tfds:NAME).")
            found.extend(hits)
    if not found:
        raise DataError(f"{source!r}: no corpus files given.")
    return found


@dataclasses.dataclass(frozen=True)
class InputShard:
    """What one input pipeline of a corpus reads.

    mode: "all" (a single pipeline), "file" (only `files`, its own) or "data"
    (every file, keeping every `num_pipelines`-th document or record from
    `index` on).
    """
    mode: str
    files: tuple[str, ...]
    num_pipelines: int
    index: int


def input_shard(source: Optional[str], num_pipelines: int = 1, index: int = 0,
                policy: str = "auto", fmt: str = "auto") -> InputShard:
    """The part of corpus `source` that input pipeline `index` of `num_pipelines` reads.

    policy "auto": FILE sharding (file i to pipeline i mod n, in sorted order, so
    every worker computes the same split with no communication) when the corpus
    has at least n files, else DATA sharding. "file" insists (error with too few
    files); "data" always shards by document/record. tfds: sources shard by
    example (DATA) through TFDS.
    """
    if policy not in SHARD_POLICIES:
        raise ValueError(f"input sharding policy {policy!r}: use one of {SHARD_POLICIES}.")
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "tfds":
        return InputShard("all" if num_pipelines <= 1 else "data", (), num_pipelines, index)
    every = (tfrecords.resolve_files(source) if fmt == "tfrecord" else resolve_files(source))
    own, by_record = tfrecords.split_files(every, num_pipelines, index, policy)
    mode = "all" if num_pipelines <= 1 else ("data" if by_record else "file")
    return InputShard(mode, tuple(own), max(1, int(num_pipelines)), int(index))


def pipeline_sequence_counts(source: str, num_pipelines: int, policy: str = "auto"
                             ) -> Optional[list[int]]:
    """Packed sequences each input pipeline gets under FILE sharding of TFRecord
    shards, from PREFIX.json (None when unknown or not FILE-sharded).

    With FILE sharding pipelines get different amounts; a multi-worker run must
    take the same number of steps on every worker, so it sizes an epoch by the
    smallest: steps = min(counts) // (per-replica batch x replicas per worker).
    """
    if detect_format(source) != "tfrecord" or num_pipelines <= 1:
        return None
    per_file = tfrecords.shard_set(source).sequences_per_file()
    if per_file is None:
        return None
    out = []
    for i in range(num_pipelines):
        own, by_record = tfrecords.split_files(list(per_file), num_pipelines, i, policy)
        if by_record:
            return None
        out.append(sum(per_file[f] for f in own))
    return out


# ---------------------------------------------------------------------------
# Reading files, and the one place where reading errors become DataErrors.

@dataclasses.dataclass
class _Cursor:
    """Where a reader is in a file: `count` lines (text) or pages (wiki) read so far."""
    path: str
    unit: str = "line"
    count: int = 0
    offset: Optional[int] = None  # bytes of the file read when reading failed


def _compression(path: str) -> Optional[str]:
    return "gzip" if path.endswith(".gz") else "bzip2" if path.endswith(".bz2") else None


@contextlib.contextmanager
def _reading(path: str, unit: str = "line") -> Iterator[_Cursor]:
    """Reads `path` (through gfile, decompressing .gz/.bz2); any failure while reading
    becomes one DataError naming the file, the line or page and the byte offset."""
    cursor = _Cursor(path, unit)
    try:
        yield cursor
    except (DataError, files.FileAccessError):
        raise
    except UnicodeDecodeError as e:
        first = e.object if cursor.count <= 1 and isinstance(e.object, bytes) else b""
        raise DataError(f"{path}:{cursor.count}: invalid UTF-8 at byte {e.start} of the line; "
                        f"corpus text files must be UTF-8: {files.reencode_hint(first)}."
                        ) from None
    except ParseError as e:
        line, column = e.position
        raise DataError(f"{path}: the XML is cut or malformed at line {line}, column {column}"
                        f"{' of the decompressed dump' if _compression(path) else ''} "
                        f"(after {cursor.count} pages: {e.msg}); the dump is incomplete or not "
                        "a pages-articles dump: download it again.") from None
    except (EOFError, OSError, zlib.error) as e:
        kind = _compression(path)
        where = f"after {cursor.count} {cursor.unit}s"
        if cursor.offset is not None:
            with contextlib.suppress(files.FileAccessError):
                where += f", near byte {cursor.offset} of {files.stat(path).size}"
        if kind is None:
            raise DataError(f"{path}: cannot read {where} ({e}).") from None
        check = f"`{kind} -t {os.path.basename(path)}`"
        raise DataError(f"{path}: {kind} data truncated or corrupt {where} ({e}); the file is "
                        "incomplete or damaged (an interrupted download or copy?): fetch it "
                        f"again ({check} checks it).") from None
    except tf.errors.OpError as e:
        raise DataError(f"{path}: cannot read after {cursor.count} {cursor.unit}s "
                        f"({' '.join((e.message or '').split())}).") from None


@contextlib.contextmanager
def _open_binary(cursor: _Cursor) -> Iterator[Any]:
    """The file as a binary stream, decompressed by extension; on a failure the bytes
    read so far go to `cursor.offset`."""
    with files.open(cursor.path, "rb") as raw:
        kind = _compression(cursor.path)
        try:
            if kind == "gzip":
                with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                    yield f
            elif kind == "bzip2":
                with bz2.BZ2File(raw, mode="rb") as f:
                    yield f
            else:
                yield raw
        except Exception:
            with contextlib.suppress(Exception):
                cursor.offset = raw.tell()
            raise


# ---------------------------------------------------------------------------
# Document streams.

def _iter_text_file(path: str) -> Iterator[list[str]]:
    doc: list[str] = []
    with _reading(path, "line") as cursor, _open_binary(cursor) as f:
        for raw in f:
            cursor.count += 1
            line = raw.decode("utf-8").strip()
            if line:
                doc.append(line)
            elif doc:
                yield doc
                doc = []
    if doc:
        yield doc


def _iter_wiki_pages(path: str) -> Iterator[tuple[str, str]]:
    """(title, raw wikitext) of the articles of a dump (namespace 0, no redirects), in order."""
    from gensim.corpora.wikicorpus import extract_pages
    with _reading(path, "page") as cursor, _open_binary(cursor) as f:
        for title, text, _ in extract_pages(f, filter_namespaces=("0",)):
            cursor.count += 1
            head = (text or "").lstrip()[:9].upper()
            if head and head != "#REDIRECT":  # other namespaces come with empty text
                yield title, text


def iter_wiki_articles(path: Optional[str] = None) -> Iterator[tuple[str, list[list[str]]]]:
    """(title, paragraphs of sentences) of every article of a Wikipedia dump with text
    left after markup stripping, in dump order; None: the sample in gensim."""
    from gensim.corpora.wikicorpus import filter_wiki
    for title, text in _iter_wiki_pages(path or default_corpus_path()):
        paragraphs = wiki_text_to_paragraphs(filter_wiki(text))
        if paragraphs:
            yield title, paragraphs


def _iter_tfds(name: str, tfds_data_dir: Optional[str], num_shards: int, index: int,
               exclude_titles: Collection[str] = frozenset()) -> Iterator[list[str]]:
    import tensorflow_datasets as tfds
    split = "train"
    if "[" in name or ":" in name.split("/")[-1]:
        name, _, split = name.partition(":")
    try:
        ds = tfds.load(name, split=split, data_dir=tfds_data_dir or None, download=False,
                       try_gcs=False)
    except (AssertionError, FileNotFoundError, OSError, ValueError) as e:
        raise DataError(
            f"tfds:{name} split {split} is not prepared under --tfds_data_dir="
            f"{tfds_data_dir or '(TFDS default ~/tensorflow_datasets)'} and this run does not "
            f"download. Prepare it where the network is reachable (`tfds build {name} "
            f"--data_dir=DIR`), copy DIR here, or use a local dump/text --corpus. ({e})") from None
    if num_shards > 1:
        ds = ds.shard(num_shards, index)
    for ex in tfds.as_numpy(ds):
        if "text" not in ex:
            raise DataError(f"tfds:{name} has no 'text' feature (has {sorted(ex)}).")
        if exclude_titles and _tfds_title(ex) in exclude_titles:
            continue
        doc = []
        for para in ex["text"].decode("utf-8").split("\n"):
            para = WHITESPACE.sub(" ", para).strip()
            if para:
                doc.extend(split_sentences(para))
        if doc:
            yield doc


def has_titles(source: Optional[str], fmt: str = "auto") -> bool:
    """Whether the corpus names its documents (Wikipedia dumps, TFDS wikipedia), so
    articles can be held out by title."""
    source = source or default_corpus_path()
    return (detect_format(source) if fmt == "auto" else fmt) in ("wiki", "tfds")


def _check_titles(source: str, fmt: str, exclude_titles: Collection[str]) -> None:
    if exclude_titles and not has_titles(source, fmt):
        raise DataError(f"{source}: a {fmt} corpus has no article titles, so articles cannot "
                        "be held out by title; use a Wikipedia dump (.xml.bz2) or a tfds: "
                        "source.")


def _tfds_title(example: dict) -> str:
    title = example.get("title", b"")
    return title.decode("utf-8") if isinstance(title, bytes) else str(title)


def iter_documents(source: Optional[str] = None, fmt: str = "auto",
                   tfds_data_dir: Optional[str] = None, num_shards: int = 1, index: int = 0,
                   shard_policy: str = "auto",
                   exclude_titles: Collection[str] = frozenset()) -> Iterator[list[str]]:
    """Stream documents (each a list of sentence strings) from a corpus.

    source: files/globs/comma list, a .xml(.bz2) dump, "tfds:NAME"; None or ""
    -> the Wikipedia sample in gensim. With num_shards > 1 only shard `index`
    is produced (`input_shard`): its own files when there are at least that
    many files, else every num_shards-th document (shards are disjoint). For
    dumps the skip happens before the costly markup stripping.
    exclude_titles: articles left out, by page title (corpora with titles only:
    `has_titles`; a task's held-out articles, see `tinybert_tf.data.holdout`).
    """
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise DataError(f"corpus format '{fmt}' unknown; use one of {FORMATS}.")
    _check_titles(source, fmt, exclude_titles)
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} not in [0, {num_shards}).")
    if fmt == "tfrecord":
        raise DataError(f"{source}: TFRecord shards hold packed token ids, not documents; "
                        f"read them with general_dataset(fmt='tfrecord').")
    if fmt == "tfds":
        yield from _iter_tfds(str(source)[len("tfds:"):] if str(source).startswith("tfds:")
                              else str(source), tfds_data_dir, num_shards, index,
                              frozenset(exclude_titles))
        return
    shard = input_shard(source, num_shards, index, shard_policy, fmt)
    keep_all = shard.mode != "data"
    if fmt == "wiki":
        from gensim.corpora.wikicorpus import filter_wiki
    k = -1
    for path in shard.files:
        if fmt == "wiki":
            for title, text in _iter_wiki_pages(path):
                if title in exclude_titles:
                    continue
                k += 1
                if keep_all or k % num_shards == index:
                    sents = wiki_text_to_sentences(filter_wiki(text))
                    if sents:
                        yield sents
            continue
        for doc in _iter_text_file(path):
            k += 1
            if keep_all or k % num_shards == index:
                yield doc


# ---------------------------------------------------------------------------
# The boundary: TensorFlow's wrapped errors -> one line.

_WRAPPED = re.compile(r"\b(?:DataError|FileAccessError|FileMissingError): ([^\n]+)")


def data_error_from(error: BaseException) -> Optional[DataError]:
    """The one-line DataError a data failure means, or None when `error` is not one.

    Recognises our DataError/FileAccessError raised inside a tf.data generator
    (which TensorFlow re-raises as an InvalidArgumentError with a traceback)
    and TFRecord "truncated/corrupted record" DataLossErrors (the damaged
    shard is looked up, as TensorFlow does not name it).
    """
    if isinstance(error, DataError):
        return error
    if isinstance(error, files.FileAccessError):
        return DataError(str(error))
    if not isinstance(error, tf.errors.OpError):
        return None
    message = error.message or ""
    m = _WRAPPED.search(message)
    if m:
        return DataError(m.group(1).strip())
    if isinstance(error, tf.errors.DataLossError):
        return tfrecords.damaged_record_error(message)
    return None


@contextlib.contextmanager
def translate_data_errors() -> Iterator[None]:
    """Around iteration of our datasets (`model.fit`, a for loop, a writer): data
    failures reach the caller as one DataError naming the file, others unchanged.

        with corpus.translate_data_errors():
            model.fit(corpus.general_dataset(...), ...)
    """
    try:
        yield
    except tf.errors.OpError as e:
        translated = data_error_from(e)
        if translated is None:
            raise
        raise translated from None


# ---------------------------------------------------------------------------
# tf.data.

def _shard_of(input_context) -> tuple[int, int]:
    if input_context is None:
        return 1, 0
    return int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)


def _document_sequences(source: str, tokenizer, max_seq_len: int, pack: str, seed: int,
                        fmt: str, tfds_data_dir: Optional[str], num_shards: int, index: int,
                        repeat: bool, shard_policy: str,
                        document_ids: bool = False,
                        exclude_titles: Collection[str] = frozenset()) -> tf.data.Dataset:
    """Unbatched packed sequences tokenised and packed from documents (text, wiki, tfds),
    without the articles titled in `exclude_titles`; with `document_ids`, each also
    carries its document's fingerprint (`pretrain.DOCUMENT_KEY`, int64), for
    next-sentence pairs."""
    exclude_titles = frozenset(exclude_titles)
    # Fail now, in the caller's thread, on a missing file or unprepared TFDS source.
    if fmt != "tfds":
        input_shard(source, num_shards, index, shard_policy, fmt)
    else:
        next(iter(iter_documents(source, fmt, tfds_data_dir, num_shards, index)), None)

    def gen():
        yield from iter_documents(source, fmt, tfds_data_dir, num_shards, index, shard_policy,
                                  exclude_titles)

    docs = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([None], tf.string))
    if repeat:
        docs = docs.repeat()
    packer = pretrain.document_packer(int(max_seq_len), tokenizer.cls_id, tokenizer.sep_id,
                                      tokenizer.pad_id, pack == "pair")

    @tf.autograph.experimental.do_not_convert
    def pack_one(sentences):
        ids = tokenizer.tokenize(sentences)
        # The A/B split points are keyed by (seed, the document's text), so a document
        # packs the same however the corpus is sharded or ordered.
        doc_hash = tf.strings.to_hash_bucket_fast(
            tf.strings.reduce_join(sentences, separator="\n"), 2 ** 62)
        doc_seed = tf.stack([tf.cast(seed, tf.int64), doc_hash])
        rows = packer(tf.cast(ids, tf.int64), doc_seed)
        if document_ids:
            rows[pretrain.DOCUMENT_KEY] = tf.fill(tf.shape(rows["input_mask"])[:1], doc_hash)
        return rows

    ds = docs.map(pack_one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.unbatch()


def _serialized_records(source: str, tokenizer, max_seq_len: int, num_shards: int,
                        index: int, repeat: bool, shard_policy: str,
                        deterministic: bool = True) -> tf.data.Dataset:
    """Serialized TFRecord sequences of this pipeline's shard (checked set and metadata)."""
    shard_set = tfrecords.shard_set(source)
    for meta in shard_set.metas.values():
        tfrecords.check_meta(source, meta, max_seq_len, tokenizer)
    own, by_record = tfrecords.split_files(shard_set.files, num_shards, index, shard_policy)
    tfrecords.remember_files(source, shard_set.files)
    ds = tfrecords.serialized_dataset(own, num_shards, index, by_record,
                                      deterministic=deterministic)
    return ds.repeat() if repeat else ds


def packed_dataset(source: Optional[str], tokenizer, max_seq_len: int = 128,
                   pack: str = "pair", seed: int = 0, fmt: str = "auto",
                   tfds_data_dir: Optional[str] = None, num_shards: int = 1, index: int = 0,
                   repeat: bool = False, shard_policy: str = "auto",
                   document_ids: bool = False,
                   exclude_titles: Collection[str] = frozenset()) -> tf.data.Dataset:
    """Unbatched packed sequences (dict of int32 [max_seq_len]) of one shard of the corpus,
    without the articles titled in `exclude_titles` (`iter_documents`); `document_ids`
    adds each row's document fingerprint (not for TFRecord shards, which keep no
    document boundaries)."""
    if pack not in ("pair", "single"):
        raise ValueError(f"pack must be 'pair' or 'single', not {pack!r}.")
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "tfrecord" and document_ids:
        raise _no_documents(source)
    _check_titles(source, fmt, exclude_titles)
    if fmt == "tfrecord":
        L, pad = int(max_seq_len), tokenizer.pad_id
        ds = _serialized_records(source, tokenizer, L, num_shards, index, repeat, shard_policy)
        return ds.batch(256).map(lambda r: tfrecords.parse_batch(r, L, pad),
                                 num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return _document_sequences(source, tokenizer, max_seq_len, pack, seed, fmt, tfds_data_dir,
                               num_shards, index, repeat, shard_policy, document_ids,
                               exclude_titles)


def _no_documents(source: str) -> DataError:
    return DataError(f"{source}: next-sentence pairs (--recipe=mlm) need documents, and "
                     "pre-tokenised TFRecord shards keep no document boundaries; give the "
                     "text corpus (files, a Wikipedia dump or tfds:NAME) as --corpus.")


def general_dataset(source: Optional[str], tokenizer, max_seq_len: int = 128,
                    batch_size: int = 32, seed: int = 0, fmt: str = "auto", pack: str = "pair",
                    masking: bool = False, mask_prob: float = 0.15, max_predictions: int = 20,
                    shuffle_buffer: int = 10000, repeat: bool = False, input_context=None,
                    tfds_data_dir: Optional[str] = None, drop_remainder: bool = False,
                    shard_policy: str = "auto", next_sentence: bool = False,
                    exclude_titles: Collection[str] = frozenset()) -> tf.data.Dataset:
    """The general-distillation input pipeline.

    Yields dicts of int32 [B, max_seq_len] input_word_ids / input_mask /
    input_type_ids; with masking also masked_lm_positions / masked_lm_ids
    (int32 [B, P]) and masked_lm_weights (float32 [B, P]), P = max_predictions,
    masks drawn anew for every batch (dynamic masking, seeded). With
    `next_sentence` (pair packing, document corpora) half the pairs get a B from
    another document of the batch and `next_sentence_labels` [B] says which
    (`pretrain.next_sentence_pairs`); masking comes after, on the final pairs.
    shuffle_buffer: packed sequences held for shuffling (0 = no shuffle).

    `batch_size` is global. With a tf.distribute.InputContext (one input
    pipeline per worker, e.g. `strategy.distribute_datasets_from_function(
    lambda ctx: general_dataset(..., input_context=ctx))`) each pipeline reads
    its disjoint part (`input_shard`, `shard_policy`) and yields per-replica
    batches. FILE sharding reads each file on one worker only, but each
    worker's order differs from a single replica's (n workers no longer train
    on exactly one replica's global batches), and workers may hold different
    amounts: pass repeat=True and size the epoch with `pipeline_sequence_counts`
    so no worker runs dry while others wait in a collective. Without an input
    context the dataset asks tf.distribute for DATA sharding: every worker
    reads the whole corpus and takes its slice of each global batch, exactly
    as one replica would train.
    exclude_titles: articles left out by title (a task's held-out articles).
    """
    num, idx = _shard_of(input_context)
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    _check_titles(source, fmt, exclude_titles)
    shuffle_seed = seed * 1000003 + idx
    if fmt == "tfrecord" and next_sentence:
        raise _no_documents(source)
    if fmt == "tfrecord":
        # Shuffle and batch the serialized records, then parse a whole batch at once.
        L, pad = int(max_seq_len), tokenizer.pad_id
        ds = _serialized_records(source, tokenizer, L, num, idx, repeat, shard_policy)
        if shuffle_buffer and shuffle_buffer > 1:
            ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(lambda r: tfrecords.parse_batch(r, L, pad),
                    num_parallel_calls=tf.data.AUTOTUNE)
    else:
        if next_sentence and pack != "pair":
            raise ValueError("next-sentence pairs need pack='pair'.")
        ds = packed_dataset(source, tokenizer, max_seq_len, pack, seed, fmt, tfds_data_dir,
                            num, idx, repeat, shard_policy, document_ids=next_sentence,
                            exclude_titles=exclude_titles)
        if shuffle_buffer and shuffle_buffer > 1:
            ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if masking or next_sentence:
        ds = _pretraining_batches(ds, tokenizer, seed, num, idx, masking, next_sentence,
                                  mask_prob, max_predictions)
    if input_context is None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.DATA
        ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE)


def _pretraining_batches(ds: tf.data.Dataset, tokenizer, seed: int, num: int, idx: int,
                         masking: bool, next_sentence: bool, mask_prob: float,
                         max_predictions: int) -> tf.data.Dataset:
    """Batches with next-sentence pairs and/or dynamic masks, seeded per batch and
    pipeline (`num` pipelines, this one `idx`)."""
    special = [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id]
    random_ids = pretrain.random_token_ids(tokenizer.vocab)

    @tf.autograph.experimental.do_not_convert
    def prepare(i, batch):
        if next_sentence:
            s = tf.stack([tf.cast(seed, tf.int64) + 104729, i * num + idx])
            batch = pretrain.next_sentence_pairs(batch, s, tokenizer.cls_id,
                                                 tokenizer.sep_id, tokenizer.pad_id)
        if not masking:
            return batch
        s = tf.stack([tf.cast(seed, tf.int64) + 7919, i * num + idx])
        return pretrain.mask_batch(batch, s, tokenizer.mask_id, special, random_ids,
                                   mask_prob, max_predictions)

    return ds.enumerate().map(prepare, num_parallel_calls=tf.data.AUTOTUNE)


def count_sequences(source: Optional[str], tokenizer, max_seq_len: int = 128,
                    pack: str = "pair", fmt: str = "auto",
                    tfds_data_dir: Optional[str] = None,
                    exclude_titles: Collection[str] = frozenset(),
                    limit: Optional[int] = None) -> int:
    """Packed sequences per epoch (for schedules). TFRecord shards with PREFIX.json:
    read from the metadata; otherwise one tokenise-and-pack pass (no masking).
    limit: stop counting there, returning min(count, limit) (a phase that a step cap
    ends within its first epoch needs no more).
    A corpus with no sequence at all is a DataError (nothing to train on)."""
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    _check_titles(source, fmt, exclude_titles)
    n = 0
    if fmt == "tfrecord":
        per_file = tfrecords.shard_set(source).sequences_per_file()
        if per_file is not None:
            n = sum(per_file.values())
        else:  # order does not matter for a count
            records = _serialized_records(source, tokenizer, max_seq_len, 1, 0, False, "auto",
                                          deterministic=False)
            if limit is not None:
                records = records.take(limit)
            with translate_data_errors():
                n = int(records.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    else:
        ds = packed_dataset(source, tokenizer, max_seq_len, pack, 0, fmt, tfds_data_dir,
                            exclude_titles=exclude_titles)
        with translate_data_errors():
            batches = ds.batch(1024).prefetch(2) if limit is None else \
                ds.batch(max(1, min(1024, limit)))  # no batch read ahead past the limit
            for b in batches:
                n += int(b["input_mask"].shape[0])
                if limit is not None and n >= limit:
                    break
    if n == 0:
        raise DataError(f"{source}: the corpus holds no text to pack into sequences (empty "
                        "files, or only blank lines/redirects); give a corpus with documents.")
    return n if limit is None else min(n, limit)
