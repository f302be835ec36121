"""The pipeline's stages (paper Figure 1), one module each, registered in run order:

  general          GD: pre-trained teacher -> student on the general corpus
  finetune_teacher the teacher fine-tuned on the task (skipped with --task_teacher)
  augment          Algorithm 1 -> OUTPUT/augment/<the source's augmented file>
  task             TD: the phases of --task_phases; the best dev checkpoint is the model
  quantize         the task student teaches its int8 fake-quantised copy
  evaluate         dev metrics, params, FLOPs, latency -> report.json, loss_curves.png
  export           every --export_formats artefact + parity.json under OUTPUT/export

Each module declares its `STAGE` (base.py) and holds its code; every stage writes its
model as a model directory, so a user can start anywhere by pointing the next stage
at an explicit path. Importing this package registers the built-ins, in this order.
"""
import dataclasses

from tinybert_tf.pipeline.stages import (
    augment,
    evaluate,
    export,
    finetune_teacher,
    general,
    quantize,
    task,
)
from tinybert_tf.pipeline.stages.base import (  # noqa: F401  (the registry's API)
    AUGMENTED_ROWS,
    NEEDS,
    STAGE_TABLE,
    STUDENT_CONFIG,
    TASK_DATA,
    TASK_LENGTH,
    TASK_ROWS,
    TASK_STUDENT,
    TASK_TEACHER,
    TEACHER,
    TEACHER_VOCAB,
    Findings,
    Models,
    PlanInputs,
    Stage,
    get_stage,
    in_order,
    makes_output,
    output_entries,
    register_stage,
    settings_of,
    stage_names,
    stage_seed,
    unregister_stage,
    upstream,
)

BUILT_IN = (general, finetune_teacher, augment, task, quantize, evaluate, export)
# A built-in's seed offset is its place in this order (as before plugins could add
# stages between them), so a stage's seed does not move when one is registered.
for _offset, _module in enumerate(BUILT_IN):
    register_stage(dataclasses.replace(_module.STAGE, seed_offset=_offset))
