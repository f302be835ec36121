"""Token classification data: CoNLL and JSON-lines files, tag sets, word-piece alignment.

Files (UTF-8 with or without BOM, LF or CRLF, read through `tf.io.gfile`):
- CoNLL: one word per line, its columns separated by runs of spaces/tabs -- or
  by single tabs when the file's first word line holds a tab, so that a word
  may contain a space (WNUT-style files). The word is the first column, the tag
  the last one (or `tag_column`, 0-based, negative from the end). A blank line
  ends a sentence; `-DOCSTART-` lines are dropped. Every word line has the
  column count of the file's first word line. A file with a single column is
  words only (unlabelled; allowed with `require_tags=False`).
- JSON lines: one object per sentence with a `tokens` list and a `tags` list
  of the same length (the keys can be renamed); tags may be ids when
  `tag_names` gives the names in id order (Hugging Face `ner_tags` exports).

Tags (scheme "iob2", the default) must be O / B-TYPE / I-TYPE. An I-X that
does not continue an entity of type X is not an error: it is counted
(`Sentences.invalid_iob2`) and warned about once per file, as conlleval
tolerates it; `entities.py` decides what such a tag means when scoring. With
`scheme=None` tags are plain labels (e.g. part-of-speech tags). `scheme="auto"`
(what `--task=token_classification` reads with) decides from the file: IOB2
when every tag is, plain when no tag has a span prefix (B-, I-, E-, S-, L-,
U- and a type: part of speech), and an error for span tags of another scheme
(IOBES, BILOU) or IOB2 in lower case ("b-per"), which would otherwise score as
plain tags. The tag set derived from a file needs two tags or more, and refuses
entity types that differ only in case ("PER" and "Per").

Alignment (`align_words`): a sentence becomes `[CLS] pieces [SEP] padding`. The
FIRST word piece of each word carries the word's tag id; continuation pieces,
[CLS], [SEP] and padding carry `IGNORE` (-1: skipped by losses and metrics).
`word_index` gives, on the same first pieces, the word's position in its
sentence (-1 elsewhere), so `word_predictions` maps outputs back to words.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from tinybert_tf.data.entities import OUTSIDE, invalid_iob2, is_iob2_tag, split_tag
from tinybert_tf.data.examples import DataError
from tinybert_tf.data.tabular import iter_jsonl, json_type, parse_label_list, read_text_file

logger = logging.getLogger(__name__)

IGNORE = -1  # label / word_index of positions that are no word's first piece
DOCSTART = "-DOCSTART-"
SCHEMES = ("iob2", None, "auto")
# A tag of a span scheme: IOB2's B-/I-, IOBES' E-/S-, BILOU's L-/U-, and a type.
_SPAN_TAG = re.compile(r"^[BIESLU]-.+$")
# IOB2 whatever the case of its prefixes ("b-per", "o"): a file written in lower case.
_IOB2_ANY_CASE = re.compile(r"^(?:[oO]|[bBiI]-.+)$")
_SPACES = re.compile(r"[ \t]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # not str.splitlines: a word may hold U+2028
_JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")


@dataclasses.dataclass
class Sentence:
    """One sentence: its words, their tags (None when unlabelled) and where it starts.

    line: 1-based line of the first word. In a CoNLL file word i sits on line
    `line + i`; in a JSON-lines file the whole sentence is on `line`.
    """
    words: list[str]
    tags: Optional[list[str]]
    line: int
    one_word_per_line: bool = True

    def word_line(self, i: int) -> int:
        """The line of word i, for messages."""
        return self.line + i if self.one_word_per_line else self.line


class Sentences(list):
    """A list of `Sentence` that also says where it came from.

    skipped: sentences dropped (empty token lists in JSON lines);
    invalid_iob2: I- tags that continue no entity of their type (see module doc);
    scheme: "iob2" or None (plain tags); what "auto" decided, for a file read with it.
    """

    def __init__(self, items: Iterable[Sentence] = (), source: str = "", skipped: int = 0,
                 invalid_iob2: int = 0, scheme: Optional[str] = "iob2"):
        super().__init__(items)
        self.source = source
        self.skipped = skipped
        self.invalid_iob2 = invalid_iob2
        self.scheme = scheme

    def __getitem__(self, index):
        """A slice keeps the source and the scheme (counts stay those of the file)."""
        if isinstance(index, slice):
            return Sentences(list.__getitem__(self, index), self.source, self.skipped,
                             self.invalid_iob2, self.scheme)
        return list.__getitem__(self, index)


# ---------------------------------------------------------------------------
# Files.

def load_sentences(path: str, data_format: Optional[str] = None, tag_column: int = -1,
                   tokens_key: str = "tokens", tags_key: str = "tags",
                   tag_names: Optional[Sequence[str]] = None, require_tags: bool = True,
                   scheme: Optional[str] = "iob2") -> Sentences:
    """Sentences of a CoNLL or JSON-lines file: .jsonl/.json/.ndjson are JSON lines,
    anything else CoNLL; `data_format` ('conll' or 'jsonl') overrides the extension."""
    fmt = (data_format or "").strip().lower()
    if not fmt:
        fmt = "jsonl" if os.path.splitext(path)[1].lower() in _JSONL_EXTENSIONS else "conll"
    if fmt in ("jsonl", "json", "ndjson", "jsonlines"):
        return load_token_jsonl(path, tokens_key, tags_key, tag_names, require_tags, scheme)
    if fmt == "conll":
        return load_conll(path, tag_column, require_tags, scheme)
    raise DataError(f"unknown token data format {data_format!r}; use 'conll' or 'jsonl'.")


def load_conll(path: str, tag_column: int = -1, require_tags: bool = True,
               scheme: Optional[str] = "iob2") -> Sentences:
    """Sentences of a CoNLL file (format in the module doc).

    Args:
      path: the file (any `tf.io.gfile` path).
      tag_column: the tag's column, 0-based (negative: from the end); column 0 is the word.
      require_tags: False accepts a one-column (words only) file: tags None.
      scheme: "iob2" checks tags; None takes them as plain labels; "auto" decides
        from the tags (module doc).
    """
    _check_scheme(scheme)
    text = read_text_file(path)
    out = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    ncols = first_line = tag_at = None
    tab_separated = False

    def close():
        nonlocal words, tags
        if words:
            out.append(Sentence(words, tags if tag_at is not None else None, start))
        words, tags = [], []

    for no, raw in enumerate(_LINE_BREAK.split(text), start=1):
        line = raw.strip(" \t")
        if not line:
            close()
            continue
        if _SPACES.split(line, 1)[0] == DOCSTART:
            close()
            continue
        if ncols is None:
            tab_separated = "\t" in line
        fields = ([f.strip(" ") for f in line.split("\t")] if tab_separated
                  else _SPACES.split(line))
        if ncols is None:
            ncols, first_line = len(fields), no
            tag_at = _tag_index(ncols, tag_column, require_tags, path, no)
        elif len(fields) != ncols:
            sep = "tab" if tab_separated else "whitespace"
            hint = "" if tab_separated else "; a word with a space needs a tab-separated file"
            raise DataError(
                f"{path}:{no}: {len(fields)} {sep}-separated columns, but the file's first word "
                f"line ({first_line}) has {ncols}; every word line needs the same columns "
                f"(word ... tag) and a blank line separates sentences{hint}.")
        if not words:
            start = no
        words.append(fields[0])
        if tag_at is not None:
            tags.append(fields[tag_at])
    close()
    if not out:
        raise DataError(f"{path}: no sentences (the file is empty or holds only {DOCSTART} "
                        f"lines); expected one word per line with its tag in the last column, "
                        f"and a blank line between sentences.")
    return _finish(out, path, scheme, skipped=0)


def _tag_index(ncols: int, tag_column: int, require_tags: bool, path: str, line: int
               ) -> Optional[int]:
    if ncols == 1:
        if require_tags:
            raise DataError(f"{path}:{line}: one column (the word) and no tag; a labelled CoNLL "
                            f"file has each word's tag in its last column (or --tag_column).")
        return None
    if not -ncols <= tag_column < ncols or tag_column % ncols == 0:
        raise DataError(f"{path}:{line}: tag_column={tag_column} does not name a tag column of "
                        f"this {ncols}-column file; use 1..{ncols - 1} (0-based; column 0 is "
                        f"the word) or -1 for the last.")
    return tag_column % ncols


def load_token_jsonl(path: str, tokens_key: str = "tokens", tags_key: str = "tags",
                     tag_names: Optional[Sequence[str]] = None, require_tags: bool = True,
                     scheme: Optional[str] = "iob2") -> Sentences:
    """Sentences of a JSON-lines file: `{"tokens": [...], "tags": [...]}` per line.

    tag_names: names in id order, when the tags are integer ids. A line without
    `tags_key` is unlabelled (allowed with `require_tags=False`). Lines with an
    empty token list are skipped and counted in `.skipped`.
    """
    _check_scheme(scheme)
    text = read_text_file(path)
    example = f'{{"{tokens_key}": ["EU", "rejects"], "{tags_key}": ["B-ORG", "O"]}}'
    out, skipped = [], 0
    for line, obj in iter_jsonl(text, path, example):
        if tokens_key not in obj:
            raise DataError(f"{path}:{line}: the object has no key {tokens_key!r}; its keys are "
                            f"{sorted(obj)} (rename the key or pass tokens_key=).")
        words = _string_list(obj[tokens_key], tokens_key, path, line)
        tags = None
        if tags_key in obj:
            tags = _tag_list(obj[tags_key], tags_key, tag_names, path, line)
            if len(tags) != len(words):
                raise DataError(f"{path}:{line}: {len(words)} {tokens_key} but {len(tags)} "
                                f"{tags_key}; give exactly one tag per token.")
        elif require_tags:
            raise DataError(f"{path}:{line}: the object has no key {tags_key!r}; its keys are "
                            f"{sorted(obj)}; a labelled file needs one tag per token (rename the "
                            f"key or pass tags_key=).")
        if not words:
            skipped += 1
            continue
        out.append(Sentence(words, tags, line, one_word_per_line=False))
    if skipped:
        logger.warning("%s: skipped %d line(s) with an empty %r list.", path, skipped,
                       tokens_key)
    if not out:
        raise DataError(f"{path}: no sentences (empty file, or every {tokens_key!r} list is "
                        f"empty); expected one object per line such as {example}.")
    if len({s.tags is None for s in out}) > 1:
        first = next(s for s in out if s.tags is None)
        raise DataError(f"{path}:{first.line}: no {tags_key!r} here while other lines have "
                        f"them; label every line or none.")
    return _finish(out, path, scheme, skipped)


def _string_list(value: Any, key: str, path: str, line: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        what = json_type(value) if not isinstance(value, list) else "list with a non-string"
        raise DataError(f"{path}:{line}: {key!r} is a JSON {what}; expected a list of strings.")
    return value


def _tag_list(value: Any, key: str, tag_names: Optional[Sequence[str]], path: str, line: int
              ) -> list[str]:
    if not isinstance(value, list):
        raise DataError(f"{path}:{line}: {key!r} is a JSON {json_type(value)}; expected a list "
                        f"of tags.")
    out = []
    for v in value:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            if tag_names is None:
                raise DataError(f"{path}:{line}: tag {v} is an id, not a name; write tag names "
                                f"(B-PER, O, ...) or pass tag_names= (the names in id order).")
            if not 0 <= v < len(tag_names):
                raise DataError(f"{path}:{line}: tag id {v} is outside tag_names (ids 0.."
                                f"{len(tag_names) - 1}); fix the line or the names.")
            out.append(str(tag_names[v]))
        else:
            raise DataError(f"{path}:{line}: a tag is a JSON {json_type(v)} ({v!r}); tags are "
                            f"names (or ids with tag_names=).")
    return out


def _check_scheme(scheme: Optional[str]) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}: use 'iob2', None (plain tags) or 'auto'.")


def decide_scheme(sentences: Sequence[Sentence]) -> Optional[str]:
    """"iob2" when every tag is O / B-X / I-X, None (plain tags, e.g. part of speech)
    when no tag has a span prefix; span tags of another scheme (IOBES, BILOU) stay
    "iob2", which then refuses them naming the line."""
    tags = {t for s in sentences for t in (s.tags or ())}
    if all(is_iob2_tag(t) for t in tags):
        return "iob2"
    lower_case_iob2 = (all(_IOB2_ANY_CASE.match(t) for t in tags)
                       and any(t[:2] in ("b-", "i-") for t in tags))
    return "iob2" if lower_case_iob2 or any(_SPAN_TAG.match(t) for t in tags) else None


def _finish(sentences: list[Sentence], path: str, scheme: Optional[str], skipped: int
            ) -> Sentences:
    """Check IOB2 tags (malformed: error; I-X continuing nothing: counted, one warning)."""
    invalid, first = 0, None
    auto = scheme == "auto"
    if auto:
        scheme = decide_scheme(sentences)
        if scheme is None:
            logger.info("%s: the tags are not IOB2 entity tags (e.g. part of speech): plain "
                        "tags, scored by token accuracy (for entity scores point --tag_column "
                        "at an IOB2 column).", path)
    if scheme == "iob2":
        for s in sentences:
            if s.tags is None:
                continue
            for i, tag in enumerate(s.tags):
                if not is_iob2_tag(tag) and _IOB2_ANY_CASE.match(tag):
                    capital = tag[0].upper() + tag[1:]
                    raise DataError(
                        f"{path}:{s.word_line(i)}: tag {tag!r} (word {s.words[i]!r}) is IOB2 "
                        f"in lower case; entity scoring reads O, B-TYPE and I-TYPE in "
                        f"capitals: write the file's O, B- and I- so (here {capital!r}).")
                if not is_iob2_tag(tag):
                    plain = ("tags without span prefixes (part of speech) are read as plain "
                             "tags, scored by token accuracy" if auto else
                             "in Python, plain tags such as POS read with scheme=None")
                    raise DataError(
                        f"{path}:{s.word_line(i)}: tag {tag!r} (word {s.words[i]!r}) is not IOB2 "
                        f"(O, B-TYPE or I-TYPE). If the file has part-of-speech or chunk columns "
                        f"(word POS chunk NER, as CoNLL-2003), the entity tags are the column "
                        f"--tag_column names (0-based; default -1, the last): point it at the "
                        f"NER column. Else convert IOBES/BILOU tags to IOB2 ({plain}).")
            bad = invalid_iob2(s.tags)
            if bad and first is None:
                first = (s.word_line(bad[0]), s.tags[bad[0]],
                         s.tags[bad[0] - 1] if bad[0] else "the sentence start")
            invalid += len(bad)
    if invalid:
        line, tag, prev = first
        logger.warning(
            "%s: %d I- tag(s) continue no entity of their type, invalid IOB2 (first: line %d, "
            "%s after %s). Strict scoring gives them no entity; conlleval-style scoring starts "
            "one there. An IOB1 file converts with entities.iob1_to_iob2.",
            path, invalid, line, tag, prev)
    return Sentences(sentences, source=path, skipped=skipped, invalid_iob2=invalid,
                     scheme=scheme)


# ---------------------------------------------------------------------------
# Tags.

def tag_set(sentences: Sequence[Sentence], explicit: Union[str, Sequence[str], None] = None
            ) -> list[str]:
    """Tag names in id order, from the training sentences.

    IOB2: "O" first, then B-X and I-X of every type X seen (both, so that a
    type seen only as B-X in training can still be predicted inside a longer
    entity), sorted. Plain tags: sorted, "O" first when present. `explicit`
    (`--labels=O,B-PER,...`): exactly that order, after checking that every tag
    in the file is listed.
    """
    seen: dict[str, tuple[Sentence, int]] = {}
    for s in sentences:
        for i, tag in enumerate(s.tags or ()):
            seen.setdefault(tag, (s, i))
    source = getattr(sentences, "source", "") or "sentences"
    if explicit is not None:
        names = parse_label_list(explicit)
        for tag, (s, i) in seen.items():
            if tag not in names:
                raise DataError(f"{source}:{s.word_line(i)}: tag {tag!r} is not in --labels="
                                f"{','.join(names)}; add it to --labels or fix the line.")
        return names
    if not seen:
        raise DataError(f"{source}: no tags; a training file needs a tag per word.")
    if getattr(sentences, "scheme", "iob2") == "iob2":
        types: dict[str, str] = {}  # casefolded type -> the tag that first had it
        for tag, (s, i) in seen.items():
            if tag == OUTSIDE:
                continue
            other = types.setdefault(split_tag(tag)[1].casefold(), tag)
            if split_tag(other)[1] != split_tag(tag)[1]:
                first, j = seen[other]
                raise DataError(
                    f"{source}:{s.word_line(i)}: tag {tag!r} and tag {other!r} "
                    f"({source}:{first.word_line(j)}) name entity types that differ only in "
                    f"case, so they would be two types; write each type one way (e.g. "
                    f"{split_tag(other)[1]!r}), or list both with --labels if they are "
                    "different types.")
        names = [OUTSIDE] + sorted(f"{p}-{k}" for k in {split_tag(t)[1] for t in types.values()}
                                   for p in "BI")
    else:
        names = sorted(seen)
        names = ([OUTSIDE] + [n for n in names if n != OUTSIDE]) if OUTSIDE in seen else names
    if len(names) < 2:
        raise DataError(f"{source}: every word is tagged {names[0]!r}; a tagger needs at least "
                        "two tags (list them with --labels, e.g. --labels=O,B-PER,I-PER, if "
                        "some never occur in training).")
    return names


def encode_tags(sentences: Sequence[Sentence], names: Sequence[str], path: Optional[str] = None
                ) -> list[Optional[list[int]]]:
    """Per sentence, the id of each word's tag (its index in `names`); None when unlabelled.

    A tag missing from `names` (a validation tag never seen in training) is a
    `DataError` naming file and line.
    """
    index = {n: i for i, n in enumerate(names)}
    source = path or getattr(sentences, "source", "") or "sentences"
    out = []
    for s in sentences:
        if s.tags is None:
            out.append(None)
            continue
        ids = []
        for i, tag in enumerate(s.tags):
            if tag not in index:
                raise DataError(
                    f"{source}:{s.word_line(i)}: tag {tag!r} (word {s.words[i]!r}) does not "
                    f"occur in the training file, whose tags are {list(names)}; if it is a real "
                    f"tag, list every tag with --labels={','.join(list(names) + [tag])}, else "
                    f"fix the line.")
            ids.append(index[tag])
        out.append(ids)
    return out


# ---------------------------------------------------------------------------
# Word-piece alignment.

@dataclasses.dataclass
class AlignedWords:
    """Packed model inputs of N sentences and how their positions map to words.

    inputs: input_word_ids, input_mask, input_type_ids, each int32 [N, L].
    labels: int32 [N, L]: a word's tag id on its first piece, IGNORE elsewhere.
    word_index: int32 [N, L]: the word's index in its sentence on its first
      piece, IGNORE elsewhere.
    num_words: int32 [N] words per sentence.
    dropped: int32 [N] words whose first piece did not fit in L - 2 positions.
    """
    inputs: dict[str, np.ndarray]
    labels: np.ndarray
    word_index: np.ndarray
    num_words: np.ndarray
    dropped: np.ndarray


def align_words(tokenizer, words: Sequence[Sequence[str]],
                tag_ids: Optional[Sequence[Optional[Sequence[int]]]] = None,
                max_seq_len: Optional[int] = None, batch_size: int = 1024) -> AlignedWords:
    """Sentences of words (and their tag ids) -> `AlignedWords` of length max_seq_len.

    tokenizer: a `tinybert_tf.tokenizer.Tokenizer` (its WordPiece and special
    ids); every word of `batch_size` sentences is tokenised in one call. A word
    with no piece (whitespace, a stripped accent) gets [UNK], so every word has
    a position. Pieces past L - 2 are cut: a word whose first piece is cut gets
    no position and counts in `dropped` (one warning per call). tag_ids: None,
    or per sentence a list of ids (or None: unlabelled), the word count long.
    """
    length = int(max_seq_len or tokenizer.max_seq_len)
    if length < 3:
        raise ValueError(f"max_seq_len={length} leaves no room for a word; use >= 3.")
    if tag_ids is not None and len(tag_ids) != len(words):
        raise ValueError(f"{len(words)} sentences but {len(tag_ids)} tag lists.")
    parts = []
    for lo in range(0, len(words), batch_size):
        hi = lo + batch_size
        parts.append(_align_batch(tokenizer, words[lo:hi],
                                  None if tag_ids is None else tag_ids[lo:hi], length, lo))
    if not parts:
        parts.append(_align_batch(tokenizer, [], None, length, 0))
    keys = ("input_word_ids", "input_mask", "input_type_ids", "labels", "word_index",
            "num_words", "dropped")
    cat = {k: np.concatenate([p[k] for p in parts]) for k in keys}
    dropped = int(cat["dropped"].sum())
    if dropped:
        logger.warning("%d word(s) in %d of %d sentence(s) do not fit max_seq_len=%d and get no "
                       "prediction (score them as O, or raise max_seq_len).", dropped,
                       int((cat["dropped"] > 0).sum()), len(words), length)
    return AlignedWords(inputs={k: cat[k] for k in keys[:3]}, labels=cat["labels"],
                        word_index=cat["word_index"], num_words=cat["num_words"],
                        dropped=cat["dropped"])


def _align_batch(tokenizer, words: Sequence[Sequence[str]],
                 tag_ids: Optional[Sequence[Optional[Sequence[int]]]], length: int,
                 offset: int) -> dict[str, np.ndarray]:
    """`align_words` on one batch; `offset` numbers its sentences in messages."""
    n = len(words)
    budget = length - 2  # room between [CLS] and [SEP]
    counts = np.array([len(ws) for ws in words], np.int64)  # words per sentence [n]
    flat = [w for ws in words for w in ws]
    total = len(flat)
    if total:
        ragged = tokenizer.tokenize(flat)  # int32 [W, (pieces)]
        values = np.asarray(ragged.flat_values, np.int32)
        real = np.asarray(ragged.row_lengths(), np.int64)
    else:
        values, real = np.zeros([0], np.int32), np.zeros([0], np.int64)
    pieces = np.maximum(real, 1)  # [W]: a word without pieces gets one [UNK]
    word_first = np.cumsum(pieces) - pieces  # [W] its first piece in the flat piece array
    piece_ids = np.full(int(pieces.sum()), tokenizer.unk_id, np.int32)  # [P]
    piece_ids[np.repeat(word_first - (np.cumsum(real) - real), real)
              + np.arange(values.size)] = values
    word_sent = np.repeat(np.arange(n), counts)  # [W] sentence of each word
    sent_first_word = np.cumsum(counts) - counts  # [n]
    word_pos = np.arange(total) - sent_first_word[word_sent]  # [W] index in its sentence
    sent_pieces = np.bincount(word_sent, weights=pieces, minlength=n).astype(np.int64)  # [n]
    piece_word = np.repeat(np.arange(total), pieces)  # [P]
    piece_sent = word_sent[piece_word]
    piece_pos = np.arange(piece_ids.size) - (np.cumsum(sent_pieces) - sent_pieces)[piece_sent]
    keep = piece_pos < budget
    first = keep & (np.arange(piece_ids.size) == word_first[piece_word])

    ids = np.full((n, length), tokenizer.pad_id, np.int32)
    ids[:, 0] = tokenizer.cls_id
    ids[piece_sent[keep], piece_pos[keep] + 1] = piece_ids[keep]
    kept = np.minimum(sent_pieces, budget)
    ids[np.arange(n), kept + 1] = tokenizer.sep_id
    mask = (np.arange(length)[None, :] <= kept[:, None] + 1).astype(np.int32)

    rows, cols = piece_sent[first], piece_pos[first] + 1
    word_index = np.full((n, length), IGNORE, np.int32)
    word_index[rows, cols] = word_pos[piece_word[first]]
    labels = np.full((n, length), IGNORE, np.int32)
    if tag_ids is not None:
        flat_tags = np.full(total, IGNORE, np.int64)
        for i, (ws, t) in enumerate(zip(words, tag_ids)):
            if t is None:
                continue
            if len(t) != len(ws):
                raise ValueError(f"sentence {offset + i}: {len(ws)} words but {len(t)} tag ids.")
            flat_tags[sent_first_word[i]:sent_first_word[i] + len(ws)] = t
        labels[rows, cols] = flat_tags[piece_word[first]]
    kept_words = np.bincount(piece_sent[first], minlength=n)
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": np.zeros_like(ids),
            "labels": labels, "word_index": word_index, "num_words": counts.astype(np.int32),
            "dropped": (counts - kept_words).astype(np.int32)}


def word_predictions(predictions: np.ndarray, word_index: np.ndarray, num_words: np.ndarray,
                     fill: int = 0) -> list[np.ndarray]:
    """Per-position predictions back to per-word tag ids.

    predictions: int [N, L] tag ids, or float [N, L, C] logits (arg-max taken);
    word_index, num_words: from `AlignedWords`. Returns N int arrays, sentence i
    of length num_words[i]; words that got no position (truncated) get `fill`
    (the id of "O", so their true entities count as missed).
    """
    p = np.asarray(predictions)
    if p.ndim == 3:
        p = p.argmax(axis=-1)
    word_index = np.asarray(word_index)
    num_words = np.asarray(num_words)
    out = np.full((len(num_words), int(num_words.max(initial=0))), fill, np.int64)
    rows, cols = np.nonzero(word_index >= 0)
    out[rows, word_index[rows, cols]] = p[rows, cols]
    return [out[i, :k] for i, k in enumerate(num_words)]


# ---------------------------------------------------------------------------
# Sentences as text: what exports and serving see.

# The separators of `tf.strings.split` (ASCII whitespace): a served sentence's
# words are what that op splits it into, so Python splits the same way.
WORD_SEPARATORS = " \t\n\v\f\r"
_SEPARATOR_RUN = re.compile(f"[{re.escape(WORD_SEPARATORS)}]+")
NO_BREAK_SPACE = "\u00a0"


def join_words(words: Sequence[str]) -> str:
    """Words -> one line that `split_words` (and the SavedModel) splits back into them.

    A word holding a separator (a tab-separated file allows "New York") gets a
    no-break space there instead: the WordPiece tokenizer treats U+00A0 as
    whitespace too, so the word keeps its pieces, and it stays one word.
    """
    return " ".join(_SEPARATOR_RUN.sub(NO_BREAK_SPACE, w) for w in words)


def split_words(text: str) -> list[str]:
    """A sentence -> its words, split at runs of ASCII whitespace (as `tf.strings.split`)."""
    return [w for w in _SEPARATOR_RUN.split(text) if w]
