"""General-distillation corpora -> streaming tf.data of packed (optionally masked) sequences.

Sources (`fmt`, or "auto" from the name):
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
(`tinybert_tf.data.pretrain`) run in graph, in parallel.
"""
from __future__ import annotations

import bz2
import glob
import gzip
import logging
import os
import re
from typing import Iterator, Optional, Sequence, Union

import tensorflow as tf

from tinybert_tf.data import pretrain, tfrecords
from tinybert_tf.data.examples import DataError

logger = logging.getLogger(__name__)

WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
FORMATS = ("auto", "text", "wiki", "tfds", "tfrecord")


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
    files = (tfrecords.resolve_files(source) if detect_format(source) == "tfrecord"
             else resolve_files(source))
    out = []
    for path in files:
        st = os.stat(path)
        out.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    return out


def resolve_files(source: Union[str, Sequence[str]]) -> list[str]:
    """Files of a path, glob or comma list (or a list of those), in sorted order per pattern."""
    parts = [source] if isinstance(source, str) else list(source)
    patterns = [p for part in parts for p in str(part).split(",") if p]
    files: list[str] = []
    for p in patterns:
        if os.path.isfile(p):
            files.append(p)
        elif os.path.isdir(p):
            raise DataError(f"{p}: is a directory; give files or a glob (e.g. {p}/*.txt).")
        else:
            hits = sorted(h for h in glob.glob(p) if os.path.isfile(h))
            if not hits:
                raise DataError(f"{p}: no corpus file matches; --corpus takes files, globs "
                                f"or a comma list (text .txt/.gz/.bz2, .xml.bz2, .tfrecord, "
                                f"or tfds:NAME).")
            files.extend(hits)
    if not files:
        raise DataError(f"{source!r}: no corpus files given.")
    return files


def _open_binary(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


# ---------------------------------------------------------------------------
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


_WS = re.compile(r"\s+")
_HEADING = re.compile(r"^=+\s*(.*?)\s*=+$")
_END_MATTER = {"see also", "references", "external links", "further reading", "notes",
               "bibliography", "sources", "footnotes", "citations", "notes and references"}


def wiki_text_to_sentences(text: str, min_words: int = 4) -> list[str]:
    """Markup-stripped article text (gensim's filter_wiki output) -> sentences.

    Drops headings, bold/italic quote marks, list bullets, lines of fewer than
    `min_words` words (captions, table debris), and everything from the first
    end-matter heading (See also, References, External links, ...) on.
    """
    sentences = []
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
        line = _WS.sub(" ", line)
        if len(line.split()) < min_words:
            continue
        sentences.extend(s for s in split_sentences(line) if s)
    return sentences


# ---------------------------------------------------------------------------
# Document streams.

def _iter_text_file(path: str) -> Iterator[list[str]]:
    doc: list[str] = []
    with _open_binary(path) as f:
        for no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{no}: invalid UTF-8 at byte {e.start}; corpus text "
                                f"files must be UTF-8 (re-encode with iconv -t UTF-8).") from None
            if line:
                doc.append(line)
            elif doc:
                yield doc
                doc = []
    if doc:
        yield doc


def _iter_wiki(path: str, num_shards: int, index: int) -> Iterator[list[str]]:
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    try:
        with _open_binary(path) as f:
            k = -1
            for _, text, _ in extract_pages(f, filter_namespaces=("0",)):
                head = text.lstrip()[:9].upper()
                if not head or head == "#REDIRECT":  # other namespaces come with empty text
                    continue
                k += 1
                if k % num_shards != index:  # shard before the costly markup stripping
                    continue
                sents = wiki_text_to_sentences(filter_wiki(text))
                if sents:
                    yield sents
    except (OSError, EOFError) as e:  # truncated/corrupt bz2, not XML, ...
        raise DataError(f"{path}: cannot read the Wikipedia dump ({e}); expected a "
                        f"pages-articles .xml or .xml.bz2 file.") from None


def _iter_tfds(name: str, tfds_data_dir: Optional[str], num_shards: int, index: int
               ) -> Iterator[list[str]]:
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
        doc = []
        for para in ex["text"].decode("utf-8").split("\n"):
            para = _WS.sub(" ", para).strip()
            if para:
                doc.extend(split_sentences(para))
        if doc:
            yield doc


def iter_documents(source: Optional[str] = None, fmt: str = "auto",
                   tfds_data_dir: Optional[str] = None, num_shards: int = 1, index: int = 0
                   ) -> Iterator[list[str]]:
    """Stream documents (each a list of sentence strings) from a corpus.

    source: files/globs/comma list, a .xml(.bz2) dump, "tfds:NAME"; None or ""
    -> the Wikipedia sample in gensim. With num_shards > 1 only shard `index`
    is produced: every num_shards-th file when there are at least that many
    files, else every num_shards-th document (shards are disjoint).
    """
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise DataError(f"corpus format '{fmt}' unknown; use one of {FORMATS}.")
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} not in [0, {num_shards}).")
    if fmt == "tfrecord":
        raise DataError(f"{source}: TFRecord shards hold packed token ids, not documents; "
                        f"read them with general_dataset(fmt='tfrecord').")
    if fmt == "tfds":
        yield from _iter_tfds(str(source)[len("tfds:"):] if str(source).startswith("tfds:")
                              else str(source), tfds_data_dir, num_shards, index)
        return
    files = resolve_files(source)
    by_file = num_shards > 1 and len(files) >= num_shards
    if by_file:
        files = files[index::num_shards]
    k = -1
    for path in files:
        if fmt == "wiki":
            docs = _iter_wiki(path, 1 if by_file else num_shards, 0 if by_file else index)
            yield from docs
            continue
        for doc in _iter_text_file(path):
            k += 1
            if by_file or k % num_shards == index:
                yield doc


# ---------------------------------------------------------------------------
# tf.data.

def _shard_of(input_context) -> tuple[int, int]:
    if input_context is None:
        return 1, 0
    return int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)


def packed_dataset(source: Optional[str], tokenizer, max_seq_len: int = 128,
                   pack: str = "pair", seed: int = 0, fmt: str = "auto",
                   tfds_data_dir: Optional[str] = None, num_shards: int = 1, index: int = 0,
                   repeat: bool = False):
    """Unbatched packed sequences (dict of int32 [max_seq_len]) of one shard of the corpus."""

    if pack not in ("pair", "single"):
        raise ValueError(f"pack must be 'pair' or 'single', not {pack!r}.")
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "tfrecord":
        ctx = (tf.distribute.InputContext(num_shards, index) if num_shards > 1 else None)
        ds = tfrecords.record_dataset(source, max_seq_len, input_context=ctx,
                                      shuffle=False, seed=seed, tokenizer=tokenizer)
        return ds.repeat() if repeat else ds
    # Fail now, in the caller's thread, on a missing file or unprepared TFDS source.
    if fmt != "tfds":
        resolve_files(source)
    else:
        next(iter(iter_documents(source, fmt, tfds_data_dir, num_shards, index)), None)

    def gen():
        for doc in iter_documents(source, fmt, tfds_data_dir, num_shards, index):
            yield doc

    docs = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([None], tf.string))
    if repeat:
        docs = docs.repeat()
    cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id

    @tf.autograph.experimental.do_not_convert
    def pack_one(sentences):
        ids = tokenizer.tokenize(sentences)
        # The A/B split points are keyed by (seed, the document's text), so a document
        # packs the same however the corpus is sharded or ordered.
        doc_hash = tf.strings.to_hash_bucket_fast(
            tf.strings.reduce_join(sentences, separator="\n"), 2 ** 62)
        doc_seed = tf.stack([tf.cast(seed, tf.int64), doc_hash])
        return pretrain.pack_document(ids, max_seq_len, cls_id, sep_id, pad_id,
                                      pack == "pair", doc_seed)

    ds = docs.map(pack_one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.unbatch()


def general_dataset(source: Optional[str], tokenizer, max_seq_len: int = 128,
                    batch_size: int = 32, seed: int = 0, fmt: str = "auto", pack: str = "pair",
                    masking: bool = False, mask_prob: float = 0.15, max_predictions: int = 20,
                    shuffle_buffer: int = 10000, repeat: bool = False, input_context=None,
                    tfds_data_dir: Optional[str] = None, drop_remainder: bool = False):
    """The general-distillation input pipeline.

    Yields dicts of int32 [B, max_seq_len] input_word_ids / input_mask /
    input_type_ids; with masking also masked_lm_positions / masked_lm_ids
    (int32 [B, P]) and masked_lm_weights (float32 [B, P]), P = max_predictions,
    masks drawn anew for every batch (dynamic masking, seeded).
    `batch_size` is global: with a tf.distribute.InputContext each input
    pipeline reads its disjoint shard and yields per-replica batches.
    shuffle_buffer: packed sequences held for shuffling (0 = no shuffle).
    """

    num, idx = _shard_of(input_context)
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    ds = packed_dataset(source, tokenizer, max_seq_len, pack, seed, fmt, tfds_data_dir,
                        num, idx, repeat)
    if shuffle_buffer and shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed * 1000003 + idx, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if masking:
        special = [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id]
        random_ids = pretrain.random_token_ids(tokenizer.vocab)

        @tf.autograph.experimental.do_not_convert
        def mask(i, batch):
            s = tf.stack([tf.cast(seed, tf.int64) + 7919, i * num + idx])
            return pretrain.mask_batch(batch, s, tokenizer.mask_id, special, random_ids,
                                       mask_prob, max_predictions)

        ds = ds.enumerate().map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def count_sequences(source: Optional[str], tokenizer, max_seq_len: int = 128,
                    pack: str = "pair", fmt: str = "auto",
                    tfds_data_dir: Optional[str] = None) -> int:
    """Packed sequences per epoch (for schedules). TFRecord shards with PREFIX.json:
    read from the metadata; otherwise one tokenise-and-pack pass (no masking)."""
    source = source or default_corpus_path()
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "tfrecord":
        meta = tfrecords.read_meta(source)
        if meta is not None and len(tfrecords.resolve_files(source)) == len(meta["shards"]):
            return int(meta["num_sequences"])
    ds = packed_dataset(source, tokenizer, max_seq_len, pack, 0, fmt, tfds_data_dir)
    n = 0
    for b in ds.batch(1024).prefetch(2):
        n += int(b["input_mask"].shape[0])
    return n
