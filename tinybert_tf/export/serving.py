"""TF Serving layout: numbered version folders, warm-up requests, a models.config.

TF Serving watches a model's base folder and loads every child whose name parses
as an integer (absl::SimpleAtoi, so "7", "007" and " 7" are all version 7); by
default it serves the highest. Other names (".publish-...", "models.config") are
ignored. Hence:

- A version is never rewritten or deleted here: the server may be loading or
  serving it. A re-export publishes the next number; rolling back is a version
  policy in models.config, not a file operation.
- A version appears only once whole. Locally it is assembled in a hidden
  sibling (".publish-*") and renamed to its number in one atomic step. On an
  object store (gs://, s3://; ram:// in the tests), where no folder rename
  exists, it is built in a local temporary folder, uploaded into a hidden
  ".publish-*" folder of the serving root (the slow part, invisible to the
  server), then moved file by file into its number folder with
  saved_model.pb last: until that last object exists the folder holds no
  SavedModel, so a server that lists it early cannot load a part of a model
  (it gets NotFound and retries, per --max_num_load_retries /
  --load_retry_interval_micros, 5 x 60 s by default); the moves are server-side
  copies, seconds for BERT-base. A failed upload removes what it moved. Two
  processes publishing to one remote root at once could pick the same number:
  bin/distill and bin/export hold the output folder's lock while they publish.
- Warm-up: when TF Serving loads a version it first replays
  assets.extra/tf_serving_warmup_requests (a TFRecord of PredictionLog protos, at
  most 1000) so the first client requests do not pay graph initialisation. A
  record that fails makes the whole version fail to load, so every request is
  checked against the SavedModel's signatures before it is written, and
  `replay_warmup` runs the records the way the server will (signature by name,
  inputs by key) in the calling process.

Typical use (the export stage):

    version, path = publish_version(
        lambda d: export_saved_model(model, d, max_seq_len, is_pair), "OUT/serving/tinybert",
        warmup_texts=dev_texts[:8], tokenizer=load_tokenizer(model, max_seq_len))
    write_models_config("OUT/serving/tinybert", "tinybert", base_path="/models/tinybert")
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import uuid
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops the text signature runs)
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
from tensorflow_serving.config import model_server_config_pb2

from tinybert_tf import files
from tinybert_tf.export.common import ExportError, Text, split_texts
from tinybert_tf.models.encoder import INPUT_NAMES
from tinybert_tf.tokenizer import Tokenizer

WARMUP_DIR = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords
WARMUP_BATCH_SIZES = (1, 8)
MODELS_CONFIG = "models.config"
DEFAULT_SIGNATURE = "serving_default"  # what TF Serving runs for an empty signature_name
TEXT_B_INPUT = "text_b"  # the second segment of saved_model.py's pair text signature
DEFAULT_TEXT_INPUTS = ("text", TEXT_B_INPUT)
MAX_VERSION = 2**63 - 1  # versions are int64 in TF Serving
_VERSION_NAME = re.compile(r"^\s*[+-]?\d+\s*$")  # what absl::SimpleAtoi accepts
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_STAGING_PREFIX = ".publish-"

SavedModelWriter = Callable[[str], Any]


@dataclasses.dataclass
class Replayed:
    """One warm-up record run against a SavedModel: what went in, what came out."""
    signature_name: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


# ---------------------------------------------------------------- versions

def list_versions(serving_root: str) -> dict[int, str]:
    """Version number -> folder name, for every child TF Serving would load."""
    if not tf.io.gfile.isdir(serving_root):
        return {}
    versions: dict[int, str] = {}
    for name in tf.io.gfile.listdir(serving_root):
        name = name.rstrip("/")
        if _VERSION_NAME.match(name) and tf.io.gfile.isdir(os.path.join(serving_root, name)):
            number = int(name)
            if -MAX_VERSION - 1 <= number <= MAX_VERSION:
                versions[number] = name
    return versions


def check_version(version: Any, what: str = "version") -> int:
    """A positive int64 from an int or a string of digits (a flag value), else ExportError
    (0 and negative numbers: not a version; above 2**63 - 1: past TF Serving's int64)."""
    number = None
    if isinstance(version, (int, np.integer)) and not isinstance(version, bool):
        number = int(version)
    elif isinstance(version, str) and version.strip().isdigit():
        number = int(version)
    if number is not None and number > MAX_VERSION:
        raise ExportError(f"{what}={number}: too large; TF Serving's versions are int64, at "
                          f"most {MAX_VERSION} (2**63 - 1): pick a smaller number, or leave it "
                          "unset to publish as the next free version.")
    if number is None or number < 1:
        raise ExportError(f"{what}={version!r}: must be a positive integer (TF Serving loads "
                          "only folders named by an integer); leave it unset to publish as the "
                          "next free version.")
    return number


def publish_version(source: Union[str, os.PathLike, SavedModelWriter], serving_root: str, *,
                    version: Any = None, warmup_texts: Optional[Sequence[Text]] = None,
                    tokenizer: Optional[Tokenizer] = None,
                    text_inputs: Sequence[str] = DEFAULT_TEXT_INPUTS) -> tuple[int, str]:
    """Publish a SavedModel as a new version folder `serving_root/<version>/`.

    Args:
      source: a SavedModel directory (copied), or a writer called with a path that
        does not exist yet, which must write a SavedModel there (e.g.
        `lambda d: export_saved_model(model, d, max_seq_len, is_pair)`).
      serving_root: the model's base folder (TF Serving's --model_base_path).
      version: an explicit version; default the highest existing one + 1 (or 1).
      warmup_texts: example texts ("text" or ("a", "b") for pair tasks); when given,
        warm-up requests for every signature at batch sizes 1 and 8 are written
        into the new version before it appears (see `build_warmup_requests`).
      tokenizer: the model's tokenizer (`load_tokenizer(model, max_seq_len)`); needed
        with warmup_texts when the SavedModel has a token-id signature.
      text_inputs: the text signature's string inputs for the first and second
        segment (`TaskType.text_input_specs` names; default text, text_b).
    Returns (version, absolute path of the version folder). Existing versions are
    never touched; on any error nothing is published and no temporary is left.
    serving_root may be remote (gs://, ram://): see the module docstring.
    """
    if not callable(source) and files.is_remote(os.fspath(source)):
        raise ExportError(f"{source}: publish_version copies a local SavedModel folder; "
                          "pass a local folder or a writer (lambda d: export_saved_model(...)).")
    root = files.absolute(os.fspath(serving_root))
    if files.exists(root) and not files.isdir(root):
        raise ExportError(f"{root}: exists and is not a folder; serving_root must be the "
                          "model's base folder that holds version folders (1/, 2/, ...).")
    if files.isfile(os.path.join(root, "saved_model.pb")):
        raise ExportError(f"{root}: holds a saved_model.pb itself; serving_root is the base "
                          "folder ABOVE the version folders (root/1/saved_model.pb): pass a "
                          "new or empty folder.")
    requested = None if version is None else check_version(version)
    if not callable(source):
        source = os.path.abspath(os.fspath(source))
        saved_model_signatures(source)  # a clear error for a missing/broken SavedModel
    existing = list_versions(root)
    if requested is not None and requested in existing:
        raise ExportError(_version_exists(root, requested, existing))
    files.makedirs(root)
    name = f"{_STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    remote = files.is_remote(root)
    # Assembled where a rename is atomic: next to the versions, or (remote) locally.
    scratch = tempfile.mkdtemp(prefix="tinybert-publish-") if remote else None
    staged = os.path.join(scratch or root, name)
    try:
        _assemble(source, staged, warmup_texts, tokenizer, text_inputs)
        if remote:
            number = _upload_version(staged, root, name, requested)
        else:
            number = _rename_to_version(staged, root, requested)
    finally:
        shutil.rmtree(scratch or staged, ignore_errors=True)
    return number, os.path.join(root, str(number))


def _assemble(source: Union[str, SavedModelWriter], staged: str,
              warmup_texts: Optional[Sequence[Text]], tokenizer: Optional[Tokenizer],
              text_inputs: Sequence[str]) -> None:
    """Write (or copy) the SavedModel to the local folder `staged`, with its warm-up."""
    if callable(source):
        source(staged)
        if not os.path.isdir(staged):
            raise ExportError(f"the SavedModel writer wrote nothing at {staged}; it must "
                              "write a SavedModel to the path it is given.")
        try:
            signatures = saved_model_signatures(staged)
        except ExportError as e:
            raise ExportError(f"the SavedModel writer did not write a SavedModel: {e}") from e
    else:
        shutil.copytree(source, staged)
        signatures = saved_model_signatures(staged)
    if warmup_texts is not None:
        requests = build_warmup_requests(staged, warmup_texts, tokenizer,
                                         text_inputs=text_inputs, signatures=signatures)
        write_warmup_requests(staged, requests, overwrite=True)
    files.usual_permissions(staged)  # a served version is read by the server's account


def _upload_version(staged: str, root: str, name: str, requested: Optional[int]) -> int:
    """Publish the local folder `staged` under the remote `root` (module docstring):
    upload into root/.publish-*, then move into root/<N>/ with saved_model.pb last."""
    relative = sorted(os.path.relpath(os.path.join(folder, f), staged)
                      for folder, _, names in os.walk(staged) for f in names)
    relative.sort(key=lambda rel: rel == "saved_model.pb")  # the SavedModel marker last
    hidden = f"{root}/{name}"
    target = None
    try:
        for rel in relative:
            files.makedirs(os.path.dirname(f"{hidden}/{rel}"))
            files.copy(os.path.join(staged, rel), f"{hidden}/{rel}")
        existing = list_versions(root)
        if requested is not None and requested in existing:
            raise ExportError(_version_exists(root, requested, existing))
        number = requested or max([0, *existing]) + 1
        if number > MAX_VERSION:
            raise ExportError(f"{root}: the highest version is {max(existing)}; no next int64 "
                              "version exists, publish with an explicit unused version.")
        target = f"{root}/{number}"
        for rel in relative:
            files.makedirs(os.path.dirname(f"{target}/{rel}"))
            files.rename(f"{hidden}/{rel}", f"{target}/{rel}", overwrite=False)
        return number
    except BaseException:
        if target is not None and not files.isfile(f"{target}/saved_model.pb"):
            with contextlib.suppress(Exception):
                files.rmtree(target)  # never whole, so never loadable: not a version
        raise
    finally:
        with contextlib.suppress(Exception):
            if files.exists(hidden):
                files.rmtree(hidden)


def _rename_to_version(staged: str, root: str, requested: Optional[int]) -> int:
    """Rename `staged` to the requested or next free version; retry on a lost race."""
    for _ in range(20):
        existing = list_versions(root)
        if requested is not None and requested in existing:
            raise ExportError(_version_exists(root, requested, existing))
        number = requested or max([0, *existing]) + 1
        if number > MAX_VERSION:
            raise ExportError(f"{root}: the highest version is {max(existing)}; no next int64 "
                              "version exists, publish with an explicit unused version.")
        target = os.path.join(root, str(number))
        try:
            os.rename(staged, target)  # fails when another publisher created it meanwhile
            return number
        except OSError:
            if not os.path.exists(target):
                raise
    raise ExportError(f"{root}: other processes keep publishing versions; retry.")


def _version_exists(root: str, version: int, existing: Mapping[int, str]) -> str:
    return (f"{os.path.join(root, existing[version])}: version {version} already exists and "
            "published versions are never rewritten (TF Serving may be serving it); leave "
            f"version unset to publish as version {max(existing) + 1}, or pick an unused "
            "number.")


# ---------------------------------------------------------------- signatures

def saved_model_signatures(directory: str) -> dict[str, meta_graph_pb2.SignatureDef]:
    """Signature name -> SignatureDef of the SavedModel's serving meta graph."""
    path = os.path.join(directory, "saved_model.pb")
    if not tf.io.gfile.exists(path):
        raise ExportError(f"{directory}: no saved_model.pb; not a SavedModel folder. Pass the "
                          "folder that holds saved_model.pb (export_saved_model(model, dir, "
                          "max_seq_len) writes one).")
    sm = saved_model_pb2.SavedModel()
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            sm.ParseFromString(f.read())
    except Exception as e:  # protobuf's DecodeError, or a read error
        raise ExportError(f"{path}: not a readable SavedModel ({e}); export it again.") from e
    for meta_graph in sm.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags and meta_graph.signature_def:
            return {k: v for k, v in meta_graph.signature_def.items() if not k.startswith("__")}
    raise ExportError(f"{path}: no meta graph tagged 'serve' with signatures; TF Serving "
                      "cannot serve it. Export with tf.saved_model.save(..., signatures=...).")


# ---------------------------------------------------------------- warm-up requests

def predict_request(signature_name: str, inputs: Mapping[str, Any],
                    model_name: Optional[str] = None) -> predict_pb2.PredictRequest:
    """A PredictRequest for one signature; `inputs` values are lists or numpy arrays.

    Warm-up requests leave model_spec.name empty: the server runs them against
    the version it is loading, whatever the model is called.
    """
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature_name
    if model_name:
        request.model_spec.name = model_name
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


def build_warmup_requests(saved_model_dir: str, texts: Sequence[Text],
                          tokenizer: Optional[Tokenizer] = None,
                          batch_sizes: Sequence[int] = WARMUP_BATCH_SIZES, *,
                          signatures: Optional[Mapping[str, Any]] = None,
                          text_inputs: Sequence[str] = DEFAULT_TEXT_INPUTS
                          ) -> list[predict_pb2.PredictRequest]:
    """One request per signature of the SavedModel and batch size, from example texts.

    String inputs get the texts (the second of `text_inputs`, `text_b` by default,
    the second segments of pairs, e.g. a SQuAD signature's `context`); the
    token-id inputs (input_word_ids, input_mask, input_type_ids) get the same
    texts packed by `tokenizer` at its max_seq_len. A batch larger than the
    number of texts repeats them. Order: signatures by name, then batch sizes.
    """
    signatures = signatures or saved_model_signatures(saved_model_dir)
    second = text_inputs[1] if len(text_inputs) > 1 else None
    is_pair = second is not None and any(second in s.inputs for s in signatures.values())
    texts_a, texts_b = split_texts(list(texts), is_pair, "warmup_texts")
    if not texts_a:
        raise ExportError("warmup_texts is empty: give a few typical inputs (e.g. the first "
                          "dev examples) so TF Serving can warm the model up.")
    sizes = list(batch_sizes)
    if (not sizes or len(sizes) * len(signatures) > MAX_WARMUP_RECORDS
            or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1
                   for b in sizes)):
        raise ExportError(f"batch_sizes={sizes!r}: give 1 to "
                          f"{MAX_WARMUP_RECORDS // len(signatures)} positive integers (TF "
                          f"Serving reads at most {MAX_WARMUP_RECORDS} warm-up records).")
    for name, sig in signatures.items():
        for key, info in sig.inputs.items():
            if key in INPUT_NAMES and tokenizer is None:
                raise ExportError(f"{saved_model_dir}: signature {name!r} takes token ids "
                                  f"({key}); pass tokenizer=load_tokenizer(model, max_seq_len) "
                                  "to build its warm-up requests.")
            if key not in INPUT_NAMES and info.dtype != types_pb2.DT_STRING:
                raise ExportError(f"{saved_model_dir}: signature {name!r} input {key!r} is "
                                  "neither text nor token ids; build its PredictRequests "
                                  "yourself and pass them to write_warmup_requests.")
    requests = []
    for name in sorted(signatures):
        keys = list(signatures[name].inputs)
        for size in sizes:
            pick = [i % len(texts_a) for i in range(size)]
            batch_a = [texts_a[i] for i in pick]
            batch_b = None if texts_b is None else [texts_b[i] for i in pick]
            ids = {}
            if any(k in INPUT_NAMES for k in keys):
                packed = tokenizer(batch_a, batch_b, max_seq_len=tokenizer.max_seq_len)
                ids = {k: v.numpy() for k, v in packed.items()}
            inputs = {k: ids[k] if k in INPUT_NAMES else
                      (batch_b if k == second else batch_a) for k in keys}
            requests.append(predict_request(name, inputs))
    return requests


def check_request(request: predict_pb2.PredictRequest,
                  signatures: Mapping[str, meta_graph_pb2.SignatureDef], where: str) -> str:
    """Raise unless `request` would run on one of `signatures`; returns its signature name."""
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in signatures:
        raise ExportError(f"{where}: signature {name!r} is not in the SavedModel (it has "
                          f"{sorted(signatures)}); a failing warm-up request fails the load.")
    expected = signatures[name].inputs
    if set(request.inputs) != set(expected):
        raise ExportError(f"{where}: signature {name!r} takes inputs {sorted(expected)}, the "
                          f"request has {sorted(request.inputs)}; give exactly those keys.")
    batch = set()
    for key, tensor in request.inputs.items():
        info = expected[key]
        if tensor.dtype != info.dtype:
            raise ExportError(f"{where}: input {key!r} of {name!r} is "
                              f"{tf.dtypes.as_dtype(tensor.dtype).name}, the signature wants "
                              f"{tf.dtypes.as_dtype(info.dtype).name}.")
        dims = [d.size for d in tensor.tensor_shape.dim]
        if not info.tensor_shape.unknown_rank and len(dims) != len(info.tensor_shape.dim):
            raise ExportError(f"{where}: input {key!r} of {name!r} has shape {dims}, the "
                              f"signature wants rank {len(info.tensor_shape.dim)}.")
        batch.add(dims[0] if dims else None)
    if len(batch) > 1:
        raise ExportError(f"{where}: the inputs of {name!r} have different batch sizes "
                          f"{sorted(batch)}.")
    return name


def write_warmup_requests(version_dir: str, requests: Sequence[predict_pb2.PredictRequest],
                          overwrite: bool = False) -> str:
    """Write `version_dir/assets.extra/tf_serving_warmup_requests`; returns its path.

    Each request is checked against the SavedModel's signatures and together
    they must cover every signature. Call it on a folder TF Serving does not
    watch yet (or use publish_version(..., warmup_texts=...)): the server reads
    warm-up only when it loads a version. An existing warm-up file is an error
    unless `overwrite`.
    """
    signatures = saved_model_signatures(version_dir)
    requests = list(requests)
    if not requests:
        raise ExportError(f"{version_dir}: no warm-up requests given; build them with "
                          "build_warmup_requests(dir, texts, tokenizer).")
    if len(requests) > MAX_WARMUP_RECORDS:
        raise ExportError(f"{version_dir}: {len(requests)} warm-up requests; TF Serving refuses "
                          f"more than {MAX_WARMUP_RECORDS}. Use fewer texts or batch sizes.")
    covered = {check_request(r, signatures, f"warm-up request {i}")
               for i, r in enumerate(requests)}
    missing = sorted(set(signatures) - covered)
    if missing:
        raise ExportError(f"{version_dir}: no warm-up request for signature(s) {missing}; their "
                          "first client requests would pay the warm-up. Add requests for them "
                          "(build_warmup_requests covers every signature).")
    folder = os.path.join(version_dir, WARMUP_DIR)
    path = os.path.join(folder, WARMUP_FILE)
    if tf.io.gfile.exists(path) and not overwrite:
        raise ExportError(f"{path}: already exists; a published version is never rewritten. "
                          "Publish a new version with warmup_texts=..., or pass overwrite=True "
                          "for a folder TF Serving does not serve.")
    tf.io.gfile.makedirs(folder)
    tmp = os.path.join(folder, f".{WARMUP_FILE}.tmp-{os.getpid()}")
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for r in requests:
                log = prediction_log_pb2.PredictionLog(
                    predict_log=prediction_log_pb2.PredictLog(request=r))
                writer.write(log.SerializeToString())
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise
    return path


def read_warmup_requests(version_dir: str) -> list[predict_pb2.PredictRequest]:
    """The PredictRequests of `version_dir`'s warm-up file, in file order."""
    path = os.path.join(version_dir, WARMUP_DIR, WARMUP_FILE)
    if not tf.io.gfile.exists(path):
        raise ExportError(f"{path}: no warm-up file; write one with write_warmup_requests or "
                          "publish_version(..., warmup_texts=...).")
    requests = []
    for i, record in enumerate(tf.data.TFRecordDataset(path)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if log.WhichOneof("log_type") != "predict_log":
            raise ExportError(f"{path}: record {i} is a {log.WhichOneof('log_type')}, not a "
                              "predict_log; only Predict warm-up is written and replayed here.")
        requests.append(log.predict_log.request)
    return requests


def run_request(loaded: Any, request: predict_pb2.PredictRequest) -> dict[str, np.ndarray]:
    """Run one PredictRequest on a `tf.saved_model.load`ed model as TF Serving does:
    the signature by name (empty = serving_default), the inputs by key."""
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in loaded.signatures:
        raise ExportError(f"signature {name!r} is not in the SavedModel (it has "
                          f"{sorted(loaded.signatures)}).")
    kwargs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
    outputs = {k: v.numpy() for k, v in loaded.signatures[name](**kwargs).items()}
    if request.output_filter:
        outputs = {k: outputs[k] for k in request.output_filter}
    return outputs


def replay_warmup(version_dir: str) -> list[Replayed]:
    """Load the SavedModel in this process and run every warm-up record on it."""
    requests = read_warmup_requests(version_dir)
    loaded = tf.saved_model.load(version_dir)
    return [Replayed(r.model_spec.signature_name or DEFAULT_SIGNATURE,
                     {k: tf.make_ndarray(v) for k, v in r.inputs.items()},
                     run_request(loaded, r)) for r in requests]


# ---------------------------------------------------------------- models.config

def check_model_name(name: Any, what: str = "model_name") -> str:
    """`name` if TF Serving takes it as a model name (used as given: names are
    case-sensitive in its URLs); else an ExportError naming `what`."""
    if not isinstance(name, str) or not _MODEL_NAME.match(name):
        raise ExportError(f"{what}={name!r}: use letters, digits, '_', '.' or '-', starting "
                          "with a letter or digit (it becomes the /v1/models/NAME URL and "
                          "the gRPC model_spec.name).")
    return name


def write_models_config(serving_root: str, model_name: str, *, base_path: Optional[str] = None,
                        path: Optional[str] = None) -> str:
    """Write a TF Serving model config (text ModelServerConfig) for one model.

    base_path: the model folder as the SERVER sees it (e.g. /models/tinybert in
    the container); default the absolute serving_root. path: where to write it;
    default serving_root/models.config (TF Serving ignores it there: not a number).
    Returns the path written. Use with --model_config_file=PATH.
    """
    check_model_name(model_name)
    if not list_versions(serving_root):
        raise ExportError(f"{serving_root}: no version folder (1/, 2/, ...); publish one with "
                          "publish_version first, or TF Serving has nothing to load.")
    if base_path is None:
        base_path = serving_root if "://" in serving_root else os.path.abspath(serving_root)
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add()
    entry.name = model_name
    entry.base_path = base_path
    entry.model_platform = "tensorflow"
    path = path or os.path.join(serving_root, MODELS_CONFIG)
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text_format.MessageToString(config))
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise
    return path
