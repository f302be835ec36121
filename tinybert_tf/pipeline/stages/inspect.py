"""Model checks before training that several stages make: a model flag inspected
without its weights, and a (student, teacher) pair a stage distils."""
from __future__ import annotations

from typing import Optional

from tinybert_tf import files
from tinybert_tf.config import BertConfig
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.terms import layer_weights, resolve_names
from tinybert_tf.models.checkpoint import ModelInfo, could_be_preset_name, inspect_model
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import unfinished_stage_output
from tinybert_tf.pipeline.stages.base import Findings
from tinybert_tf.tokenizer import SPECIAL_TOKENS


def inspect_flag(found: Findings, path: str, flag: str) -> Optional[ModelInfo]:
    """The model `flag` names, read without weights; None (and an error naming the flag
    and the fix) when it is missing, unfinished, or lacks a usable vocab."""
    if path and ("/" in path or path.startswith(".")):  # a path, not a short or hub name
        if not files.exists(path):
            hub = (f" If {path} is a Hugging Face model id (ORG/NAME), it needs a download, "
                   "which this offline tool does not do: on a connected machine run "
                   f"huggingface_hub.snapshot_download({path!r}, local_dir=DIR), copy DIR "
                   "here and pass its path." if could_be_preset_name(path) else "")
            found.errors.append(f"{flag}={path}: no such folder; give a model directory "
                                f"(config.json, vocab.txt and weights).{hub}")
            return None
        unfinished = unfinished_stage_output(path)
        if unfinished:
            found.errors.append(f"{flag}={path}: {unfinished}")
            return None
    info = found.run(lambda: inspect_model(path), f"{flag}={path}: ")
    if info is None:
        return None
    if info.vocab is None:
        found.errors.append(f"{flag}={path}: the model directory has no vocab.txt.")
        return None
    missing = [t for t in SPECIAL_TOKENS if t not in info.vocab]
    if missing:
        found.errors.append(f"{flag}={path}: vocab.txt lacks "
                            f"{' '.join(missing)}; BERT inputs need them.")
    return info


def loss_terms(names) -> tuple[str, ...]:
    """--loss_terms resolved, or () when they do not resolve (reported once, by
    preflight)."""
    try:
        return resolve_names(names)
    except ValueError:
        return ()


def check_distilled_pair(ctx: Context, found: Findings, student: Optional[BertConfig],
                         teacher: Optional[BertConfig]) -> None:
    """--layer_mapping and --layer_weights against a (student, teacher) pair a stage
    distils (nothing when either failed its own check)."""
    if student is None or teacher is None:
        return
    c = ctx.config
    found.run(lambda: layer_map(c.loss.layer_mapping, student.num_layers, teacher.num_layers))
    if "--layer_weights" not in found.bad_flags:
        found.run(lambda: layer_weights(c.loss.lambdas, student.num_layers))
    if student.num_heads != teacher.num_heads and "attn" in loss_terms(c.loss.loss_terms):
        found.warnings.append(f"student has {student.num_heads} heads, teacher "
                              f"{teacher.num_heads}: the attention loss compares "
                              "head-averaged maps.")
