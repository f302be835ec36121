"""What every model-directory reader and writer shares: file names, the error
type, the in-memory `CheckpointSpec`, and small I/O helpers.

A leaf of `tinybert_tf.models`: `checkpoint` (our format, the dispatcher),
`hf_io` (Hugging Face) and `keras_hub_io` (keras-hub presets) all import it,
and it imports none of them.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from tinybert_tf.config import BertConfig, ConfigError, read_json
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
                 source_keys: Optional[Mapping[str, str]] = None):
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



def read_safetensors(path: str, keys: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
    """All (or `keys`) tensors of a safetensors file as NumPy arrays."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: weights file not found.")
    try:
        out = {}
        with safe_open(path, framework="np") as f:
            for key in (keys if keys is not None else f.keys()):
                out[key] = f.get_tensor(key)
        return out
    except Exception as e:  # safetensors raises several types for bad files
        raise CheckpointError(f"{path}: cannot read the safetensors file ({e}); the file is "
                              "corrupt or truncated: re-export or re-download it.") from e


@contextmanager
def atomic_directory(directory: str) -> Iterator[str]:
    """Yield a temporary sibling directory; on success it replaces `directory`.

    On error the temporary directory is removed and `directory` is untouched.
    """
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: exists and is not a directory; choose another path.")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    # mkdtemp makes 0700 folders; a model directory must be readable by a serving
    # account, like any folder made with the usual umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    try:
        yield tmp
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


def read_model_json(path: str) -> dict[str, Any]:
    try:
        return read_json(path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from e


def read_model_vocab(path: str) -> list[str]:
    try:
        return read_vocab(path)
    except VocabError as e:
        raise CheckpointError(str(e)) from e


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
