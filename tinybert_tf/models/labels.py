"""Matching a model's label outputs to a task's label order, by name.

A teacher fine-tuned elsewhere orders its classes its own way (Hugging Face's
MNLI: entailment, neutral, contradiction; ours: contradiction, entailment,
neutral). Soft targets are compared position by position, so the teacher's
outputs are reordered to the task's order once, when it is loaded, from the
names its directory stores (or `--teacher_label_order` when it stores none).
"""
from __future__ import annotations

from typing import Optional, Sequence


class LabelOrderError(ValueError):
    """The model's labels cannot be matched to the task's; the message lists both."""


def same_labels(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two lists name the same labels, in any order (names compared as strings)."""
    return sorted(str(n) for n in a) == sorted(str(n) for n in b)


def label_order(model_names: Optional[Sequence[str]], task_names: Sequence[str],
                what: str = "--task_teacher", flag: str = "--teacher_label_order"
                ) -> list[int]:
    """For each task label (in task order), the index of the model output with that name.

    model_names: the model's label names in its output order (None: it names none).
    """
    task_names = [str(n) for n in task_names]
    if not model_names:
        raise LabelOrderError(
            f"{what} does not name its {len(task_names)} outputs (no id2label, or only "
            f"LABEL_0, LABEL_1, ...), so its order cannot be matched to the task's labels "
            f"{task_names}; give {flag}=name,name,... listing the task's label names in the "
            "order of the teacher's outputs.")
    names = [str(n) for n in model_names]
    if len(set(names)) != len(names):
        raise LabelOrderError(f"{what} repeats label names {names}.")
    if not same_labels(names, task_names):
        raise LabelOrderError(
            f"{what} has the labels {names} (in its output order) but the task has "
            f"{task_names}; they must be the same names: fine-tune the teacher on this task, "
            f"or give {flag} with the task's names in the teacher's output order.")
    return [names.index(n) for n in task_names]


def output_names(own: Optional[Sequence[str]], given: Sequence[str] = (),
                 what: str = "--task_teacher", flag: str = "--teacher_label_order"
                 ) -> Optional[list[str]]:
    """The names of a model's outputs in their order: its own (its config names them),
    else `given` (`--teacher_label_order`). `given` never overrides names the model
    gives: it must repeat them, or it is refused."""
    own = [str(n) for n in own] if own else None
    given = [str(n) for n in given]
    if own and given and own != given:
        raise LabelOrderError(
            f"{flag}={','.join(given)} contradicts the names {what} gives its outputs "
            f"({', '.join(own)}, in its config); drop {flag}: the model's own names are "
            "matched to the task's labels by name.")
    return own or given or None


def put_in_order(model, task_names: Sequence[str], given: Sequence[str] = (),
                 what: str = "--task_teacher") -> dict[str, int]:
    """Reorder `model`'s head outputs (in place) to `task_names`; returns the mapping
    {task label: the model's original output index}. `given` names the outputs of a
    model that names none (`--teacher_label_order`; see `output_names`)."""
    order = label_order(output_names(model.label_names, given, what), task_names, what)
    if order != list(range(len(order))):
        model.head.permute_outputs(order)
    model.label_names = [str(n) for n in task_names]
    return {str(n): i for n, i in zip(task_names, order)}
