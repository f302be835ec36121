"""Task-stage phase kinds of the paper's baselines, registered like the built-in ones
(`pipeline.training.phases`), so `--task_phases` names them.

  pkd  Patient KD (Sun et al. 2019) in one phase: (1 - alpha) x ground truth +
       alpha x soft targets at temperature T + beta x the patient loss on the
       normalised [CLS] states of student layers 1..M-1 and their teacher layers g(m)
       (`distill.baseline_terms.pkd_phase_terms`; --pkd_alpha, --pkd_beta,
       --temperature, --layer_mapping: uniform = PKD-Skip, top = PKD-Last). On the
       original training set (PKD uses no augmentation); --pkd_epochs, --pkd_lr,
       linear warm-up (--warmup_proportion) and decay, as BertAdam in the PKD code.
"""
from __future__ import annotations

from tinybert_tf.distill.baseline_terms import pkd_phase_terms
from tinybert_tf.pipeline.training.phases import PhaseKind, register_phase


@register_phase
class PatientKDPhase(PhaseKind):
    name = "pkd"
    reads_augmented = False
    epochs_flag, lr_flag = "--pkd_epochs", "--pkd_lr"

    def terms(self, config, task):
        loss = config.loss
        return pkd_phase_terms(task, alpha=loss.pkd_alpha, beta=loss.pkd_beta,
                               temperature=loss.temperature, layer_mapping=loss.layer_mapping)

    def epochs(self, config):
        return config.distill.pkd_epochs

    def lr(self, config):
        return config.distill.pkd_lr
