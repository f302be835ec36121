"""Task types (classification, regression, ...) and the task catalog behind `--task`."""
from tinybert_tf.tasks import (
    own_data,  # noqa: F401  (registers the own-data --task names)
    wiki_pairs,  # noqa: F401  (registers --task=wiki_pairs)
)
from tinybert_tf.tasks.base import (
    TASK_TYPES,
    TaskType,
    get_task_type,
    register_task_type,
    task_type_for_head,
    task_type_of,
)
from tinybert_tf.tasks.catalog import (
    TASK_FACTORIES,
    Task,
    TaskConfig,
    register_task,
    resolve_task,
    task_type,
)
from tinybert_tf.tasks.sentence import Classification, Regression
from tinybert_tf.tasks.span import SpanQA  # registers --task=squad1.1 / squad2.0

__all__ = ["TASK_FACTORIES", "TASK_TYPES", "Classification", "Regression", "SpanQA", "Task",
           "TaskConfig", "TaskType", "get_task_type", "register_task", "register_task_type",
           "resolve_task", "task_type", "task_type_for_head", "task_type_of"]
