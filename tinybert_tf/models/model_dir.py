"""What every model-directory reader and writer shares: file names, the error
type, the in-memory `CheckpointSpec`, and small I/O helpers.

A leaf of `tinybert_tf.models`: `checkpoint` (our format, the dispatcher),
`hf_io` (Hugging Face) and `keras_hub_io` (keras-hub presets) all import it,
and it imports none of them.

Model directories may live on any `tf.io.gfile` file system (gs://, ram://).
Safetensors files are memory-mapped when local and read whole into memory
when remote (`safetensors.numpy.load(bytes)`); headers alone are read with a
few bytes. A directory is written in a local temporary folder first; locally
it replaces the target with one rename, remotely its files are uploaded with
`config.json` (a SavedModel's `saved_model.pb`) last, as object stores have no
directory rename: a reader, which starts at that file, sees no model or the
complete new one.
"""
from __future__ import annotations

import json
import os
import posixpath
import shutil
import struct
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import safetensors.numpy

from tinybert_tf import files
from tinybert_tf.config import BertConfig, ConfigError, read_json
from tinybert_tf.models.quantization import is_quantized
from tinybert_tf.tokenizer import VocabError, read_vocab

FORMAT = "tinybert_tf"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the model; the message names
    the file, the key and what to do."""



class CheckpointSpec:
    """What a reader found: config, vocab, stored head and weights in our
    layout (`weight_dict` paths -> float32 arrays), plus where they came from."""

    def __init__(self, config: BertConfig, vocab: Optional[list[str]],
                 weights: dict[str, np.ndarray], weights_file: str,
                 head: Optional[str] = None, num_labels: Optional[int] = None,
                 label_names: Optional[Sequence[str]] = None,
                 metadata: Optional[Mapping[str, Any]] = None,
                 source_keys: Optional[Mapping[str, str]] = None,
                 quantization: Optional[Mapping[str, Any]] = None):
        self.config = config
        self.vocab = vocab
        self.weights = weights
        self.weights_file = weights_file
        self.head = head
        self.num_labels = num_labels
        self.label_names = list(label_names) if label_names else None
        self.metadata = dict(metadata or {})
        # our path -> the key in the source file, for error messages.
        self.source_keys = dict(source_keys or {})
        # A fake-quantised model's QuantizationConfig as a dict (models/quantization.py).
        self.quantization = dict(quantization) if quantization else None



def read_safetensors(path: str, keys: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
    """All (or `keys`) tensors of a safetensors file as NumPy arrays."""
    from safetensors import safe_open

    if not files.isfile(path):
        raise CheckpointError(f"{path}: weights file not found.")
    try:
        if files.is_remote(path):
            arrays = safetensors.numpy.load(files.read_bytes(path))
            return arrays if keys is None else {k: arrays[k] for k in keys}
        out = {}
        with safe_open(path, framework="np") as f:
            for key in (keys if keys is not None else f.keys()):
                out[key] = f.get_tensor(key)
        return out
    except files.FileAccessError:
        raise
    except Exception as e:  # safetensors raises several types for bad files
        raise CheckpointError(f"{path}: cannot read the safetensors file ({e}); the file is "
                              "corrupt or truncated: re-export or re-download it.") from e


def safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a safetensors file, from its header alone (8-byte little-endian
    length, then JSON), local or remote."""
    try:
        with files.open(path, "rb") as f, files.translate_errors(path, "read"):
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise ValueError(f"header length {length}")
            header = json.loads(f.read(length).decode("utf-8"))
        return {k: tuple(int(d) for d in v["shape"]) for k, v in header.items()
                if k != "__metadata__"}
    except (files.FileAccessError, CheckpointError):
        raise
    except Exception as e:  # struct, JSON and key errors of a bad header
        raise CheckpointError(f"{path}: cannot read the safetensors header ({e}); the file "
                              "is corrupt or truncated.") from e


@contextmanager
def local_copy(directory: str) -> Iterator[str]:
    """`directory` itself when local; a remote one downloaded into a temporary local
    folder (for libraries that read only local paths, e.g. keras-hub presets)."""
    if not files.is_remote(directory):
        yield directory
        return
    tmp = tempfile.mkdtemp(prefix="tinybert-model-")
    try:
        for name in _tree(directory):
            target = os.path.join(tmp, *name.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            files.copy(posixpath.join(directory, name), target)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tree(directory: str) -> list[str]:
    """Relative paths ("a/b.txt") of every file under a folder, through gfile."""
    out = []
    for name in files.listdir(directory):
        full = posixpath.join(directory, name)
        if files.isdir(full):
            out.extend(f"{name}/{sub}" for sub in _tree(full))
        else:
            out.append(name)
    return out


def _publish_remote(local: str, directory: str) -> None:
    """Upload a finished local folder to a remote `directory`: the old one goes first,
    config.json (saved_model.pb for a SavedModel) comes last: the marker every
    reader starts from."""
    if files.exists(directory):
        files.rmtree(directory)
    names = sorted(_tree(local), key=lambda n: n in (CONFIG_FILE, "saved_model.pb"))
    for name in names:
        target = posixpath.join(directory, name)
        files.makedirs(posixpath.dirname(target))
        files.copy(os.path.join(local, *name.split("/")), target)


@contextmanager
def atomic_directory(directory: str) -> Iterator[str]:
    """Yield a temporary sibling directory; on success it gets the umask's usual
    permissions (`files.usual_permissions`) and replaces `directory`.

    On error the temporary directory is removed and `directory` is untouched. A
    remote `directory` (gs://, ram://) is written in a local temporary folder and
    uploaded when complete (`_publish_remote`).
    """
    if files.is_remote(directory):
        if files.isfile(directory):
            raise CheckpointError(f"{directory}: exists and is not a directory; choose "
                                  "another path.")
        tmp = tempfile.mkdtemp(prefix="tinybert-model-")
        try:
            yield tmp
            _publish_remote(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: exists and is not a directory; choose another path.")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        yield tmp
        # mkdtemp makes a 0700 folder and some writers (safetensors) 0600 files; a model
        # directory must be readable by a serving account, like anything made under the
        # usual umask.
        files.usual_permissions(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(directory):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=parent)
        os.rmdir(old)
        os.rename(directory, old)
    os.rename(tmp, directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# A model directory's JSON files are not regenerated: they come with the model.
_RESTORE = ("restore it from where the model came from (its Hugging Face repository or "
            "keras-hub preset, or the run or tool that saved it)")


def read_model_json(path: str) -> dict[str, Any]:
    """A JSON file of a model directory; CheckpointError naming the file and the fix."""
    if not files.isfile(path):
        raise CheckpointError(f"{path}: file not found; a model directory needs it: "
                              f"{_RESTORE}.")
    try:
        return read_json(path, fix=f"fix the file or {_RESTORE}")
    except ConfigError as e:
        raise CheckpointError(str(e)) from e


def read_model_vocab(path: str) -> list[str]:
    try:
        return read_vocab(path)
    except VocabError as e:
        raise CheckpointError(str(e)) from e


def check_float(model: Any, what: str) -> None:
    """Refuse an int8 fake-quantised model (the quantize stage's output): its
    activation ranges mean something only to the int8 TFLite conversion, and a format
    without them would pass its weights off as a float student."""
    if is_quantized(model):
        raise CheckpointError(
            f"{what}: the model is int8 fake-quantised (the quantize stage's student), "
            "whose activation ranges this format cannot hold; export the float student it "
            "was made from (OUTPUT/task/model), and this one as TFLite int8.")


def model_vocab(model: Any, what: str) -> list[str]:
    vocab = getattr(model, "vocab", None)
    if not vocab:
        raise CheckpointError(
            f"{what}: the model has no vocab; set `model.vocab = read_vocab('vocab.txt')` "
            "(the WordPiece vocab its token embeddings were trained with).")
    if len(vocab) != model.bert_config.vocab_size:
        raise CheckpointError(
            f"{what}: model.vocab has {len(vocab)} tokens but the model has "
            f"vocab_size={model.bert_config.vocab_size} embedding rows.")
    return list(vocab)
