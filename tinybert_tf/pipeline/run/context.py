"""What every stage function receives (`Context`): the configs, the task, the output
folder, the strategy, and the paths of the stage outputs later stages read.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import tensorflow as tf

from tinybert_tf.models.checkpoint import load_tokenizer
from tinybert_tf.pipeline.run.state import RunState
from tinybert_tf.pipeline.settings.configs import PipelineConfig
from tinybert_tf.pipeline.training import task_input
from tinybert_tf.pipeline.training.strategy import is_chief
from tinybert_tf.tasks.catalog import Task


@dataclasses.dataclass
class Context:
    """What every stage needs: the configs, the resolved task, the output folder,
    the strategy."""

    config: PipelineConfig
    task: Task
    state: RunState
    strategy: tf.distribute.Strategy

    @property
    def chief(self) -> bool:
        return is_chief(self.strategy)

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    @property
    def max_seq_len(self) -> int:
        return self.task.max_seq_len(self.config.task.max_seq_len)

    @functools.cached_property
    def tokenizer(self):
        """The task tokenizer at the task length: the teacher's vocab and casing (read
        from --task_teacher when given, else --teacher: fine-tuning keeps the vocab)."""
        return load_tokenizer(self.config.models.vocab_teacher, self.max_seq_len)

    def augmented_path(self) -> str:
        """--augmented_file, or the file this run's augment stage writes."""
        return (self.config.distill.augmented_file
                or self.state.path("augment", self.task.source.augmented_name))

    def examples(self, split: str):
        task = self.task
        if split == "train_aug":
            task = task.with_augmented(self.augmented_path())
        return task.examples(split)

    @functools.cached_property
    def row_lengths(self) -> task_input.RowLengths:
        """Real tokens of each row of a list of examples (computed once per list)."""
        return task_input.RowLengths(self.task.type, self.tokenizer, self.max_seq_len)

    @property
    def inference_buckets(self) -> tuple[int, ...]:
        """Length buckets of evaluation and caching passes (() = padded)."""
        return task_input.inference_buckets(self.config, self.task.type, self.max_seq_len)

    def teacher_path(self) -> str:
        m = self.config.models
        return m.task_teacher if m.teacher_given else self.state.path("finetune_teacher",
                                                                      "model")

    def general_path(self) -> str:
        return self.config.models.general_model or self.state.path("general", "model")

    def student_path(self) -> str:
        return self.state.path("task", "model")

    def trained_on(self) -> dict[str, Any]:
        """What a task model records of its training: the task (its flags, data paths
        absolute), the sequence length, which bin/export defaults to, and the --plugins
        modules, which bin/export names when the task is one of theirs."""
        record = {"task": self.config.task.to_record(), "max_seq_len": self.max_seq_len}
        if self.config.run.plugins:
            record["plugins"] = list(self.config.run.plugins)
        return record

    @property
    def student_task_type(self):
        """The task type with the student's head (--classifier_head); teachers keep
        the task's default head."""
        return self.task.type.with_head_style(self.config.models.classifier_head)

    def quantized_path(self) -> str:
        return self.state.path("quantize", "model")


def rows(ctx: Context, examples) -> int:
    """Training rows of `examples` (QA: windows), the size a phase's steps come from."""
    return ctx.task.type.dataset_rows(examples, ctx.tokenizer, ctx.max_seq_len)
