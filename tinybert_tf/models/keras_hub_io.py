"""keras-hub BERT preset directories: read (teachers) and write (exported students).

Our layers mirror keras-hub's `BertBackbone` by name and shape, so weights
copy by variable path. keras-hub's BERT uses the tanh-approximate GELU and
LayerNorm epsilon 1e-12, always (no setting; it loads Hugging Face BERTs, exact
GELU, that way too), so a loaded preset gets `hidden_act="gelu_tanh"`, and an
export refuses a model whose numerics keras-hub cannot reproduce (exact-erf
GELU unless `allow_activation_mismatch=True`, ReLU, another epsilon):
`keras_hub_problems` says why without building anything. The exported
tokenizer of an uncased vocab strips accents, as BERT's does.

Task presets: `BertTextClassifier` (`logits` dense -> our classifier head) and
`BertMaskedLM` (`mlm_head/intermediate_dense`, `intermediate_layer_norm`,
`output_bias` -> our MLM head). keras-hub's MLM head uses exact GELU and
LayerNorm epsilon 1e-5 where ours follows the encoder's config, so MLM logits
agree only approximately across the two libraries (the encoder is exact).

Presets are read with keras-hub's own loaders (`from_preset` on a local
directory works offline); a remote preset (gs://, ram://) is copied to a
local temporary folder first.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from tinybert_tf import files
from tinybert_tf.config import BertConfig
from tinybert_tf.files import write_json
from tinybert_tf.models.model_dir import (
    CONFIG_FILE,
    CheckpointError,
    CheckpointSpec,
    atomic_directory,
    check_float,
    local_copy,
    model_vocab,
    read_model_json,
    read_model_vocab,
)

VOCAB_ASSET = os.path.join("assets", "tokenizer", "vocabulary.txt")
KERAS_HUB_LAYER_NORM_EPSILON = 1e-12

# keras-hub task variable path -> ours.
_TASK_TO_OURS = {
    "logits/kernel": "classifier_head/classifier/kernel",
    "logits/bias": "classifier_head/classifier/bias",
    "mlm_head/intermediate_dense/kernel": "mlm_head/mlm_dense/kernel",
    "mlm_head/intermediate_dense/bias": "mlm_head/mlm_dense/bias",
    "mlm_head/intermediate_layer_norm/gamma": "mlm_head/mlm_layer_norm/gamma",
    "mlm_head/intermediate_layer_norm/beta": "mlm_head/mlm_layer_norm/beta",
    "mlm_head/output_bias": "mlm_head/output_bias",
}
_OURS_TO_TASK = {v: k for k, v in _TASK_TO_OURS.items()}


def read_vocab_and_case(path: str) -> tuple[Optional[list[str]], bool]:
    """The preset's tokenizer vocabulary (None when it has no tokenizer) and
    its lower-casing (tokenizer.json `lowercase`; True when unknown)."""
    vocab_path = os.path.join(path, VOCAB_ASSET)
    vocab = read_model_vocab(vocab_path) if files.isfile(vocab_path) else None
    lower = True
    tok_json = os.path.join(path, "tokenizer.json")
    if files.isfile(tok_json):
        lower = bool(read_model_json(tok_json).get("config", {}).get("lowercase", True))
    return vocab, lower


def _paths(model: Any) -> dict[str, Any]:
    return {v.path: v for v in model.weights}


def read_keras_hub(path: str) -> CheckpointSpec:
    """Read a keras-hub BERT preset directory into a `CheckpointSpec`."""
    with local_copy(path) as local:
        spec = _read_local_keras_hub(local)
    if local != path:  # name the files where the user put them
        spec.weights_file = spec.weights_file.replace(local, path, 1)
        spec.source_keys = {k: v.replace(local, path) for k, v in spec.source_keys.items()}
        spec.metadata["source"] = path
    return spec


def _read_local_keras_hub(path: str) -> CheckpointSpec:
    import keras_hub

    config_path = os.path.join(path, CONFIG_FILE)
    data = read_model_json(config_path)
    if data.get("class_name") != "BertBackbone":
        raise CheckpointError(f"{config_path}: class_name {data.get('class_name')!r}; only "
                              "keras-hub BertBackbone presets are supported.")
    weights_file = os.path.join(path, "model.weights.h5")
    if not files.isfile(weights_file):
        raise CheckpointError(f"{weights_file}: weights file not found (a keras-hub preset "
                              "needs config.json and model.weights.h5).")
    task_json = os.path.join(path, "task.json")
    task_weights = os.path.join(path, "task.weights.h5")
    task_class = None
    if files.isfile(task_json) and files.isfile(task_weights):
        task_class = read_model_json(task_json).get("class_name")
    source = weights_file
    try:
        if task_class == "BertTextClassifier":
            source = task_weights
            task = keras_hub.models.BertTextClassifier.from_preset(path)
            backbone = task.backbone
        elif task_class == "BertMaskedLM":
            source = task_weights
            task = keras_hub.models.BertMaskedLM.from_preset(path)
            backbone = task.backbone
        else:
            task = None
            backbone = keras_hub.models.BertBackbone.from_preset(path)
    except Exception as e:  # keras raises many types for bad presets
        raise CheckpointError(f"{source}: keras-hub could not load the preset ({type(e).__name__}: "
                              f"{e}); the preset is incomplete, corrupt or does not match "
                              f"{config_path}.") from e
    vocab, lower = read_vocab_and_case(path)
    config = BertConfig(
        vocab_size=int(backbone.vocabulary_size), hidden_size=int(backbone.hidden_dim),
        num_layers=int(backbone.num_layers), num_heads=int(backbone.num_heads),
        intermediate_size=int(backbone.intermediate_dim), hidden_act="gelu_tanh",
        max_position_embeddings=int(backbone.max_sequence_length),
        type_vocab_size=int(backbone.num_segments), hidden_dropout=float(backbone.dropout),
        attention_dropout=float(backbone.dropout),
        layer_norm_epsilon=KERAS_HUB_LAYER_NORM_EPSILON, use_pooler=True, lower_case=lower)
    weights = {p: np.asarray(v.numpy(), np.float32) for p, v in _paths(backbone).items()}
    head, num_labels = None, None
    if task is not None:
        for p, v in _paths(task).items():
            if p in weights:
                continue
            if p not in _TASK_TO_OURS:
                raise CheckpointError(f"{task_weights}: unknown task weight {p!r}.")
            weights[_TASK_TO_OURS[p]] = np.asarray(v.numpy(), np.float32)
        if task_class == "BertTextClassifier":
            num_labels = int(task.num_classes)
            head = "regressor" if num_labels == 1 else "classifier"
        else:
            head = "mlm"
    label_names = None
    ours_json = os.path.join(path, "tinybert_tf.json")
    if files.isfile(ours_json) and head == "classifier":
        names = read_model_json(ours_json).get("label_names")
        if isinstance(names, list) and len(names) == num_labels:
            label_names = [str(n) for n in names]
    source_keys = {p: f"{p} ({source if p in _OURS_TO_TASK else weights_file})"
                   for p in weights}
    return CheckpointSpec(config, vocab, weights, weights_file, head=head,
                          num_labels=num_labels, label_names=label_names,
                          metadata={"source": files.absolute(path),
                                    "source_format": "keras_hub"},
                          source_keys=source_keys)


def inspect_keras_hub(path: str) -> CheckpointSpec:
    """Config, vocab and head of a keras-hub preset. keras-hub offers no way to
    read a preset's shapes without building it, so this reads the weights too."""
    return read_keras_hub(path)


# Heads keras-hub has a BERT task for.
KERAS_HUB_HEADS = (None, "classifier", "regressor", "mlm")


def keras_hub_problems(config: BertConfig, head: Optional[str],
                       allow_activation_mismatch: bool = False) -> list[str]:
    """Why a model of `config` with `head` cannot be a keras-hub BERT preset (empty:
    it can). What `export_keras_hub` refuses, and what `bin/distill --dry_run` and
    `bin/export` check before anything is written."""
    problems = []
    if config.hidden_act == "relu":
        problems.append("keras-hub's BERT has no ReLU variant; a model with "
                        "hidden_act='relu' cannot be exported to keras-hub.")
    if config.hidden_act == "gelu" and not allow_activation_mismatch:
        problems.append(
            "the model uses exact GELU (hidden_act='gelu', as the embedded MiniLM teacher and "
            "BERT do) but keras-hub's BertBackbone always computes the tanh approximation "
            "(it loads Hugging Face BERTs that way too). Pass allow_activation_mismatch=True "
            "(bin/distill and bin/export: --keras_hub_approximate_gelu) to export it with "
            "the approximation (parity.json's keras_hub row shows the cost), or train the "
            "student with hidden_act='gelu_tanh'.")
    if abs(config.layer_norm_epsilon - KERAS_HUB_LAYER_NORM_EPSILON) > 1e-15:
        problems.append(f"layer_norm_epsilon={config.layer_norm_epsilon} but keras-hub's BERT "
                        f"is fixed at {KERAS_HUB_LAYER_NORM_EPSILON}.")
    if head not in KERAS_HUB_HEADS:
        problems.append(f"keras-hub has no BERT task for a {head!r} head; export this model "
                        "with --export_formats=hf instead.")
    if head in ("classifier", "regressor") and not config.use_pooler:
        problems.append("keras-hub's BertTextClassifier reads the pooled output, but this "
                        "model has no pooler (use_pooler=false).")
    return problems


def export_keras_hub(model: Any, directory: str, sequence_length: Optional[int] = None,
                     allow_activation_mismatch: bool = False) -> str:
    """Write `model` as a keras-hub preset directory; returns its path.

    No head: a `BertBackbone` preset plus its `BertTokenizer`. Classifier or
    regressor: a `BertTextClassifier` preset (with preprocessor) that
    `keras_hub.models.TextClassifier.from_preset(directory)` loads; MLM: a
    `BertMaskedLM` preset. `sequence_length` is the preprocessor's packing
    length (default: min(512, max positions)). The tokenizer lower-cases and
    strips accents for an uncased vocabulary, as BERT's (and ours) does.
    keras-hub computes GELU with the tanh approximation; a model trained with
    exact GELU is refused unless `allow_activation_mismatch=True`
    (`keras_hub_problems`). A model without token types exports one all-zero
    segment row. Written atomically.
    """
    import keras_hub

    where = f"export_keras_hub({directory})"
    check_float(model, where)
    config: BertConfig = model.bert_config
    vocab = model_vocab(model, "export_keras_hub")
    head = model.head_type
    problems = keras_hub_problems(config, head, allow_activation_mismatch)
    if problems:
        raise CheckpointError(f"{where}: {problems[0]}")
    seen: set[str] = set()
    dupes = [t for t in vocab if t in seen or seen.add(t)]
    if dupes:
        raise CheckpointError(f"{where}: the vocab repeats tokens {dupes[:5]}; keras-hub's "
                              "WordPiece tokenizer needs unique tokens. Fix the vocab file.")
    seq_len = int(sequence_length or min(512, config.max_position_embeddings))
    ours = model.weight_dict()
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_layers,
        num_heads=config.num_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, dropout=config.hidden_dropout,
        max_sequence_length=config.max_position_embeddings,
        num_segments=max(config.type_vocab_size, 1), dtype="float32")
    # An uncased vocab has no accented pieces: strip accents as BERT does ("Café" ->
    # "cafe"); keras-hub's default keeps them, and "café" becomes [UNK].
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=list(vocab),
                                               lowercase=config.lower_case,
                                               strip_accents=config.lower_case)
    if head in ("classifier", "regressor"):
        pre = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=seq_len)
        task = keras_hub.models.BertTextClassifier(backbone, num_classes=model.num_labels,
                                                   preprocessor=pre,
                                                   dropout=config.hidden_dropout)
    elif head == "mlm":
        pre = keras_hub.models.BertMaskedLMPreprocessor(tokenizer, sequence_length=seq_len)
        task = keras_hub.models.BertMaskedLM(backbone, preprocessor=pre)
    else:
        task = None
    target = _paths(task if task is not None else backbone)
    for path, var in target.items():
        src = _TASK_TO_OURS.get(path, path)
        if src in ours:
            value = np.asarray(ours[src].numpy(), np.float32)
        elif path == "segment_embedding/embeddings" and config.type_vocab_size == 0:
            value = np.zeros(var.shape, np.float32)
        elif path.startswith("pooled_dense/") and not config.use_pooler:
            continue  # keras-hub always has a pooler; ours has none to copy.
        else:
            raise CheckpointError(f"{where}: keras-hub weight {path!r} has no counterpart "
                                  f"{src!r} in the model.")
        if tuple(var.shape) != value.shape:
            raise CheckpointError(f"{where}: {path!r} is {tuple(var.shape)} in keras-hub but "
                                  f"{value.shape} in the model.")
        var.assign(value)
    with atomic_directory(directory) as tmp:
        if task is not None:
            task.save_to_preset(tmp)
        else:
            backbone.save_to_preset(tmp)
            tokenizer.save_to_preset(tmp)
        write_json(os.path.join(tmp, "tinybert_tf.json"),
                   {"exported_from": "tinybert_tf", "hidden_act": config.hidden_act,
                    "keras_hub_activation": "gelu_tanh",
                    "label_names": model.label_names})
    return files.absolute(directory)
