"""TFLite model metadata for the Task Library, written without tflite-support.

The TFLite Task Library (`BertNLClassifier`, `BertQuestionAnswerer`) does not
take a tokenizer or labels as arguments: it reads them from the model's
METADATA, and refuses a bare model with "No metadata or input process unit
found". The library that writes metadata, tflite-support, pins protobuf < 4
and cannot live next to TensorFlow 2.20, so this module writes the same bytes
itself, with the `flatbuffers` runtime (a TensorFlow dependency) and the
classes flatc generates from tflite-support's published `metadata_schema.fbs`
(`tflite_metadata_schema.py`, see tools/regenerate_tflite_metadata.sh).

Layout of a model with metadata (what tflite-support's MetadataPopulator
writes and the Task Library's ModelMetadataExtractor reads):
- the TFLite flatbuffer holds one more buffer, the ModelMetadata flatbuffer
  (file identifier "M001"), and a `metadata` entry named "TFLITE_METADATA"
  that points at it;
- the associated files (vocab.txt, labels.txt) follow the flatbuffer as an
  uncompressed zip archive whose offsets count from the start of the file (a
  zip appended to the model, like a self-extracting archive). The extractor
  hands out pointers into the model buffer, so the files must be STORED.

What the Task Library reads (tflite-support v0.4.4, the last release; C++ in
cc/task/text/ and cc/task/processor/bert_preprocessor.cc):
- BertNLClassifier: the tokenizer is the subgraph's FIRST input process unit
  (BertTokenizerOptions with vocab.txt as its first vocab_file); the inputs
  are found by the NAMES in their tensor metadata, "ids", "mask" and
  "segment_ids" (when any is missing it assumes the order ids, segment_ids,
  mask, which is not ours: so the names matter); exactly one output, found by
  the metadata name "probability", float32 [1, C]; labels from the output's
  first associated file, which must be TENSOR_AXIS_LABELS (without it the
  categories are named "0", "1", ...). Inputs: int32 [1, L].
- BertQuestionAnswerer: the same tokenizer and input names; outputs named
  "end_logits" and "start_logits", float32 [1, L]; L must be 384: it packs
  exactly 384 ids (kMaxSeqLen) and fails on any other length.
- Both lower-case every input (ASCII only) whatever the vocabulary: an uncased
  vocabulary is required. Their WordPiece splits on whitespace, punctuation and
  CJK characters but does not strip accents ("café" stays "café", which our
  uncased tokenizer reads as "cafe"), and BertNLClassifier feeds ONE text
  (segment ids all 0): pair tasks cannot use it.
- Vocabulary and label files are read line by line and EMPTY LINES ARE
  SKIPPED, so an empty token would shift every id after it: refused here.

Regression and token classification have no Task Library API; their kinds
("regressor", "token_classifier") and "classifier" (pair or cased
classifiers, which BertNLClassifier would tokenise wrongly) carry the same
tokenizer process unit and input names plus a described output, for apps that
read the metadata with the TFLite Support library's MetadataExtractor and run a
plain Interpreter. The stated fallbacks, all descriptive:
- `fitting_kind` swaps a Task Library kind for its descriptive twin
  (`Kind.fallback`: bert_nl_classifier -> classifier, bert_question_answerer ->
  question_answerer) when the model breaks a Task Library condition (a pair,
  a cased vocabulary, batch > 1, QA not at 384 tokens), and says why;
- "generic" (what `TaskType.tflite_metadata_kind` returns for a task type
  that names no kind) describes the tokenizer and inputs and names every
  output by its tensor name, whatever it is;
- text-in models (the tokenizer inside the graph, `Kind.text_input`:
  "text_classifier", "text_regressor", reached from an ids kind by
  `Kind.text_kind`) describe their string inputs and outputs and pack only
  labels.txt. Their layout is NLClassifier's (string input 0, scores output
  0 with TENSOR_AXIS_LABELS), but the graph needs tensorflow-text's TFLite
  custom ops, which no Task Library build registers, so no Task Library API
  runs them: apps use an Interpreter with those ops (docs/deploy.md).
"""
from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from typing import Any, Optional, Sequence, Union

import flatbuffers
import numpy as np
from tensorflow.lite.python import schema_py_generated as tfl
from tensorflow.lite.tools import flatbuffer_utils

from tinybert_tf import files
from tinybert_tf.export import tflite_metadata_schema as md
from tinybert_tf.export.common import ExportError
from tinybert_tf.models.encoder import INPUT_NAMES

METADATA_NAME = "TFLITE_METADATA"  # the model's metadata entry the Task Library looks for
METADATA_IDENTIFIER = b"M001"  # the schema's file_identifier
VOCAB_FILE = "vocab.txt"
LABELS_FILE = "labels.txt"
QA_SEQ_LEN = 384  # BertQuestionAnswerer::kMaxSeqLen: the only length it can feed
TASK_LIBRARY_TOKENS = ("[CLS]", "[SEP]", "[UNK]")  # looked up by the Task Library
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so the same model gives the same bytes

# Our input tensor -> (metadata name the Task Library looks for, description).
INPUT_METADATA = {
    "input_word_ids": ("ids", "Tokenized ids of the input text."),
    "input_mask": ("mask", "Mask with 1 for real tokens and 0 for padding tokens."),
    "input_type_ids": ("segment_ids",
                       "0 for the first sequence, 1 for the second sequence if exists."),
}


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output tensor of a kind of model.

    key: the tensor's name or SignatureDef output key (matched when a kind has
      several outputs); name: its metadata name; rank: 2 ([1, C]) or 3
      ([1, L, C]); width: the last axis's size when fixed; per_token: axis 1
      is the input's L; labels: labels.txt names its last axis; unit_range:
      values are probabilities (stats min 0, max 1).
    """
    key: str
    name: str
    description: str
    rank: int = 2
    width: Optional[int] = None
    per_token: bool = False
    labels: bool = False
    unit_range: bool = False
    dimension_names: Optional[tuple[str, ...]] = None


@dataclasses.dataclass(frozen=True)
class Kind:
    """What one kind of model's metadata holds and which client reads it.

    task_library: the Task Library class that reads it (None: no Task Library
    API fits). Task Library kinds need an uncased vocabulary and batch 1;
    single_text: the client feeds one text, never a pair; seq_len, when set,
    is the only sequence length the client can feed. outputs empty: any
    outputs, each described by its tensor name. fallback: the descriptive kind
    to write when the model breaks a Task Library condition (`fitting_kind`).
    text_input: the model takes raw strings (tokenizer in the graph);
    text_kind: the text-in kind of the same task.
    """
    name: str
    description: str
    outputs: tuple[OutputSpec, ...]
    task_library: Optional[str] = None
    single_text: bool = False
    seq_len: Optional[int] = None
    fallback: Optional[str] = None
    text_input: bool = False
    text_kind: Optional[str] = None


_PROBABILITY = OutputSpec("probabilities", "probability",
                          "Probabilities of the labels respectively.",
                          labels=True, unit_range=True)

_SPAN_OUTPUTS = (OutputSpec("end_logits", "end_logits", "Logits of the answer's last token.",
                            per_token=True),
                 OutputSpec("start_logits", "start_logits", "Logits of the answer's first token.",
                            per_token=True))
_SCORE = OutputSpec("score", "score", "The predicted score.", width=1)
_NO_TASK_LIBRARY = "No Task Library API: tokenise in the app with vocab.txt."

KINDS: dict[str, Kind] = {
    "bert_nl_classifier": Kind(
        "BertNLClassifier", "Classify the input text into a set of known categories.",
        (_PROBABILITY,), task_library="BertNLClassifier", single_text=True,
        fallback="classifier", text_kind="text_classifier"),
    "bert_question_answerer": Kind(
        "BertQuestionAnswerer",
        "Answers a question with a span of the context: logits of the span's first and "
        "last token.", _SPAN_OUTPUTS, task_library="BertQuestionAnswerer", seq_len=QA_SEQ_LEN,
        fallback="question_answerer"),
    "classifier": Kind(
        "BertClassifier",
        "Classifies one text or a pair of texts ([CLS] a [SEP] b [SEP]) into a set of "
        f"known categories. {_NO_TASK_LIBRARY}", (_PROBABILITY,), text_kind="text_classifier"),
    "regressor": Kind(
        "BertRegressor",
        "Scores one text or a pair of texts ([CLS] a [SEP] b [SEP]) with one real number. "
        f"{_NO_TASK_LIBRARY}", (_SCORE,), text_kind="text_regressor"),
    "token_classifier": Kind(
        "BertTokenClassifier",
        "Tags every WordPiece token of the input with a set of known categories. "
        f"{_NO_TASK_LIBRARY}",
        (OutputSpec("probabilities", "probability",
                    "Per-token probabilities of the labels (last axis).", rank=3,
                    per_token=True, labels=True, unit_range=True,
                    dimension_names=("batch", "token", "label")),)),
    "question_answerer": Kind(
        "BertSpanQuestionAnswerer",
        "Answers a question ([CLS] question [SEP] context [SEP]) with a span of the context: "
        "logits of the span's first and last token. Not at the 384 tokens "
        f"BertQuestionAnswerer packs: {_NO_TASK_LIBRARY}", _SPAN_OUTPUTS),
    "generic": Kind(
        "BertModel",
        "A BERT task model; each output is described by its tensor name. "
        f"{_NO_TASK_LIBRARY}", ()),
    "text_classifier": Kind(
        "BertTextClassifier",
        "Classifies raw text into a set of known categories; WordPiece tokenisation runs "
        "inside the model (tensorflow-text TFLite custom ops: register them in the "
        "interpreter's op resolver).", (_PROBABILITY,), text_input=True),
    "text_regressor": Kind(
        "BertTextRegressor",
        "Scores raw text with one real number; WordPiece tokenisation runs inside the model "
        "(tensorflow-text TFLite custom ops: register them in the interpreter's op resolver).",
        (_SCORE,), text_input=True),
}

# Text-in inputs: tensor name -> (metadata name, description).
TEXT_INPUT_METADATA = {
    "text": ("text", "The raw input text (UTF-8), one string."),
    "text_b": ("text_b", "The second raw text of a pair (UTF-8), one string."),
}


def fitting_kind(kind: str, *, batch_size: int, seq_len: int, lower_case: bool,
                 pair: bool, runtime_note: Optional[str] = None) -> tuple[str, Optional[str]]:
    """(kind to write, why it differs or None): a Task Library kind whose
    conditions the model breaks becomes its descriptive `fallback`.
    runtime_note: why the model's ops cannot run in the Task Library, if so."""
    spec = _kind(kind)
    if not spec.task_library:
        return kind, None
    reasons = [runtime_note] if runtime_note else []
    if not lower_case:
        reasons.append("the vocabulary is cased and the Task Library lower-cases every input")
    if spec.single_text and pair:
        reasons.append(f"{spec.task_library} feeds one text, the model reads a pair")
    if batch_size != 1:
        reasons.append(f"the Task Library feeds batch 1, the model takes batch {batch_size}")
    if spec.seq_len is not None and seq_len != spec.seq_len:
        reasons.append(f"{spec.task_library} packs exactly {spec.seq_len} tokens, the model "
                       f"takes {seq_len}")
    if not reasons or spec.fallback is None:
        return kind, None
    return spec.fallback, (f"{kind} -> {spec.fallback} (descriptive metadata, no Task "
                           f"Library API): {'; '.join(reasons)}")


def add_metadata(flat: bytes, *, kind: str, vocab: Optional[Sequence[str]], lower_case: bool,
                 labels: Optional[Sequence[str]] = None, pair: bool = False,
                 name: Optional[str] = None, description: Optional[str] = None,
                 version: Optional[str] = None, author: Optional[str] = None,
                 license: Optional[str] = None, note: Optional[str] = None) -> bytes:
    """Attach Task Library metadata and its files to a converted model.

    Args:
      flat: a .tflite flatbuffer with inputs input_word_ids, input_mask,
        input_type_ids (int32 [B, L], any order: found by tensor name or
        SignatureDef key), or for text-in kinds `text` (and `text_b`), string
        [B]; and the outputs of `kind`. Metadata it already has is replaced.
      kind: a key of KINDS: bert_nl_classifier | bert_question_answerer |
        classifier | regressor | token_classifier | question_answerer |
        generic | text_classifier | text_regressor.
      vocab: the WordPiece vocabulary, in id order (packed as vocab.txt);
        unused (may be None) for text-in kinds, whose graph holds it.
      lower_case: whether the model expects lower-cased text; the Task
        Library always lower-cases, so its kinds need True.
      labels: class names in output order (packed as labels.txt); None: the
        Task Library names classes "0", "1", ...
      pair: the model reads a pair of texts (BertNLClassifier cannot feed one).
      name, description, version, author, license: ModelMetadata fields
        (defaults: the kind's name and description).
      note: a sentence appended to the default description (e.g. why a
        descriptive kind was written instead of a Task Library one).

    Returns:
      The model bytes: flatbuffer with the metadata buffer, then the zip of
      vocab.txt (ids kinds) and labels.txt (when given).
    """
    spec = _kind(kind)
    if not spec.text_input:
        _check_vocab(vocab)
    label_list = _check_labels(labels, spec)
    if spec.task_library and not lower_case:
        raise ExportError(f"kind={kind!r}: the Task Library's {spec.task_library} lower-cases "
                          "every input, so a cased vocabulary would see other tokens than it "
                          "was trained on; use an uncased model, or kind='classifier' and "
                          "tokenise in the app.")
    if spec.single_text and pair:
        raise ExportError(f"kind={kind!r}: {spec.task_library} feeds ONE text (segment ids "
                          "all 0) and cannot run a text-pair model; use kind='classifier' "
                          "and tokenise the pair in the app.")
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flat))
    if len(model.subgraphs) != 1:
        raise ExportError(f"expected one TFLite subgraph, got {len(model.subgraphs)}.")
    inputs = (_text_input_metadata(model, pair) if spec.text_input
              else _input_metadata(model, spec, kind))
    outputs = _output_metadata(model, spec, kind, label_list)
    text_desc = ("a pair of texts, [CLS] a [SEP] b [SEP]" if pair
                 else "one text, [CLS] text [SEP]")
    case_desc = "lower-cased, accents stripped" if lower_case else "cased (not lower-cased)"
    subgraph = md.SubGraphMetadataT()
    subgraph.inputTensorMetadata = inputs
    subgraph.outputTensorMetadata = outputs
    files = {}
    if not spec.text_input:
        subgraph.inputProcessUnits = [_tokenizer_unit(case_desc)]
        files[VOCAB_FILE] = _lines(vocab)
    meta = md.ModelMetadataT()
    meta.name = name or spec.name
    meta.description = description or (f"{spec.description} Input: {text_desc}, "
                                        f"WordPiece, {case_desc}."
                                        + (f" Note: {note}." if note else ""))
    meta.version, meta.author, meta.license = version, author, license
    meta.subgraphMetadata = [subgraph]
    meta.minParserVersion = min_parser_version(meta)
    if label_list:
        files[LABELS_FILE] = _lines(label_list)
    return _pack(model, _finish(meta), files)


def _tokenizer_unit(case_desc: str) -> "md.ProcessUnitT":
    """The input process unit that tells the Task Library to WordPiece-tokenise with
    the packed vocab.txt."""
    vocab_file = md.AssociatedFileT()
    vocab_file.name = VOCAB_FILE
    vocab_file.description = (f"WordPiece vocabulary, one token a line in id order; "
                              f"input text is {case_desc}.")
    vocab_file.type = md.AssociatedFileType.VOCABULARY
    tokenizer = md.BertTokenizerOptionsT()
    tokenizer.vocabFile = [vocab_file]
    unit = md.ProcessUnitT()
    unit.optionsType = md.ProcessUnitOptions.BertTokenizerOptions
    unit.options = tokenizer
    return unit


@dataclasses.dataclass
class MetadataContents:
    """What `read_metadata` found: the parsed metadata and the packed files."""
    metadata: md.ModelMetadataT
    files: dict[str, bytes]

    def to_dict(self) -> dict[str, Any]:
        """The metadata as plain dicts/lists (enum values by name), e.g. to print as JSON."""
        return _plain(self.metadata)


def read_metadata(model: Union[bytes, str]) -> MetadataContents:
    """Parse the TFLITE_METADATA of a .tflite (bytes or path) and its packed files.

    Raises ExportError when the model has no metadata or it is not an "M001"
    ModelMetadata flatbuffer.
    """
    if isinstance(model, str):
        model = files.read_bytes(model)
    buf = metadata_buffer(model)
    if buf is None:
        raise ExportError(f"the model has no {METADATA_NAME} metadata; attach it with "
                          "tinybert_tf.export.tflite_metadata.add_metadata.")
    if not md.ModelMetadata.ModelMetadataBufferHasIdentifier(buf, 0):
        raise ExportError(f"the model's {METADATA_NAME} buffer is not a TFLite ModelMetadata "
                          f"flatbuffer (identifier {bytes(buf[4:8])!r}, expected "
                          f"{METADATA_IDENTIFIER!r}).")
    parsed = md.ModelMetadataT.InitFromPackedBuf(buf, 0)
    return MetadataContents(parsed, packed_files(model))


def metadata_buffer(model: bytes) -> Optional[bytes]:
    """The raw TFLITE_METADATA buffer of a .tflite, or None if it has none."""
    root = tfl.Model.GetRootAs(model, 0)
    for i in range(root.MetadataLength()):
        entry = root.Metadata(i)
        if entry.Name() is not None and entry.Name().decode() == METADATA_NAME:
            return root.Buffers(entry.Buffer()).DataAsNumpy().tobytes()
    return None


def packed_files(model: bytes) -> dict[str, bytes]:
    """Files of the zip appended to a .tflite, by name ({} when there is none)."""
    try:
        with zipfile.ZipFile(io.BytesIO(model)) as zf:
            return {info.filename: zf.read(info) for info in zf.infolist()}
    except zipfile.BadZipFile:
        return {}


# Schema members added after 1.0.0, with the version that added them (from the
# "Added in" notes of metadata_schema.fbs): the parser version a reader needs.
_FILE_TYPE_VERSIONS = {md.AssociatedFileType.VOCABULARY: (1, 0, 1),
                       md.AssociatedFileType.SCANN_INDEX_FILE: (1, 4, 0)}
_UNIT_VERSIONS = {md.ProcessUnitOptions.BertTokenizerOptions: (1, 1, 0),
                  md.ProcessUnitOptions.SentencePieceTokenizerOptions: (1, 1, 0),
                  md.ProcessUnitOptions.RegexTokenizerOptions: (1, 2, 1)}
_SUBGRAPH_FIELD_VERSIONS = {"inputProcessUnits": (1, 1, 0), "outputProcessUnits": (1, 1, 0),
                            "inputTensorGroups": (1, 2, 0), "outputTensorGroups": (1, 2, 0),
                            "customMetadata": (1, 5, 0)}


def min_parser_version(meta: md.ModelMetadataT) -> str:
    """The lowest metadata parser version that understands every field `meta` uses."""
    found = [(1, 0, 0)]

    def files(items):
        for f in items or ():
            found.append(_FILE_TYPE_VERSIONS.get(f.type, (1, 0, 0)))
            if f.version is not None:
                found.append((1, 4, 1))

    def units(items):
        for u in items or ():
            found.append(_UNIT_VERSIONS.get(u.optionsType, (1, 0, 0)))
            for field in ("vocabFile", "sentencePieceModel"):
                files(getattr(u.options, field, None))

    def tensors(items):
        for t in items or ():
            files(t.associatedFiles)
            units(t.processUnits)
            if t.content is not None and (t.content.contentPropertiesType
                                          == md.ContentProperties.AudioProperties):
                found.append((1, 3, 0))

    files(meta.associatedFiles)
    for sg in meta.subgraphMetadata or ():
        tensors(sg.inputTensorMetadata)
        tensors(sg.outputTensorMetadata)
        files(sg.associatedFiles)
        units(sg.inputProcessUnits)
        units(sg.outputProcessUnits)
        found += [v for f, v in _SUBGRAPH_FIELD_VERSIONS.items() if getattr(sg, f) is not None]
    return ".".join(str(n) for n in max(found))


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ExportError(f"unknown metadata kind {kind!r}; use one of {', '.join(KINDS)}.")
    return KINDS[kind]


def _check_vocab(vocab: Sequence[str]) -> None:
    """Refuse what the Task Library would read differently from our tokenizer."""
    if isinstance(vocab, str) or not vocab:
        raise ExportError("vocab: pass the vocabulary as a list of tokens in id order "
                          "(model.vocab), not empty and not a path.")
    bad = [i for i, t in enumerate(vocab) if not t or "\n" in t or "\r" in t]
    if bad:
        raise ExportError(f"vocab[{bad[0]}] = {vocab[bad[0]]!r}: the Task Library reads "
                          "vocab.txt line by line and skips empty lines, so every id after "
                          "it would shift; fix the vocabulary.")
    seen: dict[str, int] = {}
    for i, t in enumerate(vocab):
        if t in seen:
            raise ExportError(f"vocab[{i}] = {t!r} repeats vocab[{seen[t]}]: the Task Library "
                              "would map it to the last id; fix the vocabulary.")
        seen[t] = i
    missing = [t for t in TASK_LIBRARY_TOKENS if t not in seen]
    if missing:
        raise ExportError(f"vocab lacks {' '.join(missing)}: BERT packing and the Task Library's "
                          "tokenizer need them.")


def _check_labels(labels: Optional[Sequence[str]], spec: Kind) -> Optional[list[str]]:
    if labels is None:
        return None
    if isinstance(labels, str):
        raise ExportError("labels: pass a list of class names, not a string.")
    if not any(o.labels for o in spec.outputs):
        raise ExportError(f"labels given for a {spec.name} model, whose outputs have none; "
                          "pass labels=None.")
    labels = [str(x) for x in labels]
    bad = [i for i, x in enumerate(labels) if not x.strip() or "\n" in x or "\r" in x]
    if bad:
        raise ExportError(f"labels[{bad[0]}] = {labels[bad[0]]!r}: labels.txt is read line by "
                          "line with empty lines skipped; name every class on one line.")
    if len(set(labels)) != len(labels):
        raise ExportError(f"labels {labels} repeat a name; classes are matched by name.")
    return labels


def _names(model, subgraph, indices, signature_field: str) -> dict[int, set[str]]:
    """Tensor index -> its names: the tensor name and the SignatureDef keys that
    map to it, also without the converter's "serving_default_" prefix and ":0"."""
    out: dict[int, set[str]] = {}
    for idx in indices:
        raw = subgraph.tensors[idx].name.decode()
        out[int(idx)] = {raw}
    for sig in model.signatureDefs or ():
        for entry in getattr(sig, signature_field) or ():
            if entry.tensorIndex in out:
                out[entry.tensorIndex].add(entry.name.decode())
    for names in out.values():
        for n in list(names):
            bare = n.split(":")[0]
            names.add(bare)
            if bare.startswith("serving_default_"):
                names.add(bare[len("serving_default_"):])
    return out


def _shape(tensor) -> list[int]:
    sig = tensor.shapeSignature
    return [int(d) for d in (sig if sig is not None and len(sig) else tensor.shape)]


def _input_metadata(model, spec: Kind, kind: str) -> list[md.TensorMetadataT]:
    """TensorMetadata for the model's inputs, in the model's input order."""
    sg = model.subgraphs[0]
    names = _names(model, sg, sg.inputs, "inputs")
    if len(names) != len(INPUT_NAMES):
        raise ExportError(f"TFLite model has {len(names)} inputs "
                          f"{[sorted(a) for a in names.values()]}; expected {list(INPUT_NAMES)}.")
    found: dict[str, int] = {}
    for idx, alias in names.items():
        match = [n for n in INPUT_NAMES if n in alias]
        if len(match) != 1:
            raise ExportError(f"unexpected TFLite input tensor {sorted(alias)}; the model "
                              f"must have exactly the inputs {list(INPUT_NAMES)} "
                              "(tinybert_tf.export.tflite.convert names them).")
        found[match[0]] = idx
    if sorted(found) != sorted(INPUT_NAMES):
        raise ExportError(f"TFLite model has inputs {sorted(found)}; expected {list(INPUT_NAMES)}.")
    shapes = {n: _shape(sg.tensors[i]) for n, i in found.items()}
    for n, i in found.items():
        if sg.tensors[i].type != tfl.TensorType.INT32 or len(shapes[n]) != 2:
            raise ExportError(f"input {n}: expected int32 [batch, L], got "
                              f"{flatbuffer_utils.type_to_name(sg.tensors[i].type)} "
                              f"{shapes[n]}.")
    if len({tuple(s) for s in shapes.values()}) != 1:
        raise ExportError(f"inputs have different shapes {shapes}; expected one [batch, L].")
    batch, length = shapes[INPUT_NAMES[0]]
    if spec.task_library and batch != 1:
        raise ExportError(f"kind={kind!r}: the Task Library feeds batch 1, the model takes "
                          f"[{batch}, {length}]; convert with batch_size=1.")
    if spec.seq_len is not None and length != spec.seq_len:
        raise ExportError(f"kind={kind!r}: {spec.task_library} always packs {spec.seq_len} "
                          f"tokens, the model takes {length}; convert with "
                          f"max_seq_len={spec.seq_len}.")
    by_index = {i: n for n, i in found.items()}
    out = []
    for idx in sg.inputs:
        meta_name, desc = INPUT_METADATA[by_index[int(idx)]]
        out.append(_tensor_metadata(meta_name, desc))
    return out


def _text_input_metadata(model, pair: bool) -> list[md.TensorMetadataT]:
    """TensorMetadata for a text-in model's string inputs, in the model's input order."""
    sg = model.subgraphs[0]
    names = _names(model, sg, sg.inputs, "inputs")
    wanted = ["text", "text_b"] if pair else ["text"]
    out = []
    for idx, alias in names.items():
        match = [n for n in wanted if n in alias]
        if len(match) != 1 or sg.tensors[idx].type != tfl.TensorType.STRING:
            raise ExportError(f"text-in TFLite input {sorted(alias)}: expected string inputs "
                              f"named {wanted} (tinybert_tf.export.tflite converts them).")
        out.append(_tensor_metadata(*TEXT_INPUT_METADATA[match[0]]))
    if len(out) != len(wanted):
        raise ExportError(f"text-in TFLite model has {len(out)} inputs; expected {wanted}.")
    return out


def _output_metadata(model, spec: Kind, kind: str, labels: Optional[list[str]]
                     ) -> list[md.TensorMetadataT]:
    """TensorMetadata for the model's outputs, in the model's output order."""
    sg = model.subgraphs[0]
    names = _names(model, sg, sg.outputs, "outputs")
    if not spec.outputs:  # generic: every output described by its own name
        return [_tensor_metadata(_plain_name(names[int(i)], sg.tensors[i]),
                                 "Model output (see the task type's documentation).")
                for i in sg.outputs]
    if len(names) != len(spec.outputs):
        raise ExportError(f"kind={kind!r} expects {len(spec.outputs)} output(s) "
                          f"({[o.key for o in spec.outputs]}); the model has {len(names)}: "
                          f"{[sorted(a) for a in names.values()]}.")
    if len(spec.outputs) == 1:
        assigned = {next(iter(names)): spec.outputs[0]}
    else:
        assigned = {}
        for o in spec.outputs:
            hits = [i for i, alias in names.items() if o.key in alias]
            if len(hits) != 1:
                raise ExportError(f"kind={kind!r}: no single output named {o.key!r} among "
                                  f"{[sorted(a) for a in names.values()]} (tensor names or "
                                  "SignatureDef keys).")
            assigned[hits[0]] = o
    length = None if spec.text_input else _shape(sg.tensors[sg.inputs[0]])[1]
    out = []
    for idx in sg.outputs:
        o, tensor = assigned[int(idx)], sg.tensors[idx]
        shape = _shape(tensor)
        if (tensor.type != tfl.TensorType.FLOAT32 or len(shape) != o.rank
                or (o.width is not None and shape[-1] != o.width)):
            want = f"[1, {o.width}]" if o.width is not None else f"rank {o.rank}"
            raise ExportError(f"output {o.key}: expected float32 {want}, got "
                              f"{flatbuffer_utils.type_to_name(tensor.type)} {shape}.")
        if o.per_token and length is not None and shape[1] != length:
            raise ExportError(f"output {o.key}: expected [1, {length}] (one logit a token), "
                              f"got {shape}.")
        if labels is not None and o.labels and shape[-1] != len(labels):
            raise ExportError(f"{len(labels)} labels for output {o.key} of shape {shape}; "
                              f"pass one name per class ({shape[-1]}).")
        meta = _tensor_metadata(o.name, o.description)
        if o.unit_range:
            meta.stats = md.StatsT()
            meta.stats.max, meta.stats.min = [1.0], [0.0]
        if o.dimension_names:
            meta.dimensionNames = list(o.dimension_names)
        if o.labels and labels is not None:
            label_file = md.AssociatedFileT()
            label_file.name = LABELS_FILE
            label_file.description = "Labels for categories that the model can recognize."
            label_file.type = md.AssociatedFileType.TENSOR_AXIS_LABELS
            meta.associatedFiles = [label_file]
        out.append(meta)
    return out


def _plain_name(alias: set[str], tensor) -> str:
    """A tensor's most telling name: the shortest alias that is not a converter
    placeholder (output_N, PartitionedCall:N)."""
    telling = [n for n in alias if not re.match(r"^(output_\d+|\w*PartitionedCall)", n)]
    return min(telling or alias or {tensor.name.decode()}, key=lambda n: (len(n), n))


def _tensor_metadata(name: str, description: str) -> md.TensorMetadataT:
    meta = md.TensorMetadataT()
    meta.name, meta.description = name, description
    meta.content = md.ContentT()
    meta.content.contentPropertiesType = md.ContentProperties.FeatureProperties
    meta.content.contentProperties = md.FeaturePropertiesT()
    return meta


def _lines(items: Sequence[str]) -> bytes:
    return ("\n".join(items) + "\n").encode("utf-8")


def _finish(meta: md.ModelMetadataT) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(meta.Pack(builder), file_identifier=METADATA_IDENTIFIER)
    return bytes(builder.Output())


def _pack(model, metadata: bytes, files: dict[str, bytes]) -> bytes:
    """Model object + metadata flatbuffer + files -> .tflite bytes (flatbuffer, then zip).

    Re-serialising the model object drops any zip the input carried, so
    metadata added twice replaces the first.
    """
    data = np.frombuffer(metadata, np.uint8)
    entry = next((m for m in model.metadata or () if m.name.decode() == METADATA_NAME), None)
    if entry is not None:
        model.buffers[entry.buffer].data = data
    else:
        buffer = tfl.BufferT()
        buffer.data = data
        model.buffers.append(buffer)
        entry = tfl.MetadataT()
        entry.name = METADATA_NAME.encode()
        entry.buffer = len(model.buffers) - 1
        model.metadata = list(model.metadata or []) + [entry]
    out = io.BytesIO()
    out.write(flatbuffer_utils.convert_object_to_bytearray(model))
    # Mode "w" on a stream positioned after the flatbuffer: the archive starts
    # there and its offsets count from byte 0 of the file, as minizip expects.
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for file_name, content in files.items():
            info = zipfile.ZipInfo(file_name, date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, content)
    return out.getvalue()


_ENUMS = {("AssociatedFileT", "type"): md.AssociatedFileType,
          ("ProcessUnitT", "optionsType"): md.ProcessUnitOptions,
          ("ContentT", "contentPropertiesType"): md.ContentProperties,
          ("ImagePropertiesT", "colorSpace"): md.ColorSpaceType,
          ("BoundingBoxPropertiesT", "type"): md.BoundingBoxType,
          ("BoundingBoxPropertiesT", "coordinateType"): md.CoordinateType,
          ("ScoreCalibrationOptionsT", "scoreTransformation"): md.ScoreTransformationType}


def _plain(value):
    """Generated *T objects -> dicts without unset fields; enums by name; bytes decoded."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dict__") and type(value).__name__.endswith("T"):
        out = {}
        for key, v in vars(value).items():
            if v is None:
                continue
            enum = _ENUMS.get((type(value).__name__, key))
            if enum is not None:
                v = next((k for k, n in vars(enum).items() if n == v and not k.startswith("_")),
                         v)
            out[key] = _plain(v)
        return out
    return value


__all__ = ["KINDS", "Kind", "OutputSpec", "add_metadata", "fitting_kind", "read_metadata",
           "MetadataContents", "metadata_buffer", "packed_files", "min_parser_version",
           "METADATA_NAME",
           "VOCAB_FILE", "LABELS_FILE", "QA_SEQ_LEN"]
