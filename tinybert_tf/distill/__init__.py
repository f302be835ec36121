"""Transformer distillation: layer mapping, losses, loss terms, the Distiller, the optimizer."""
from tinybert_tf.distill.baseline_terms import NextSentenceTerm, PatientTerm, pkd_phase_terms
from tinybert_tf.distill.distilbert import init_student_from_teacher
from tinybert_tf.distill.distiller import Distiller, trackable
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.minilm_terms import (
    MiniLMAttentionTerm,
    MiniLMRelationTerm,
    MiniLMValueTerm,
)
from tinybert_tf.distill.optimizer import WarmupSchedule, create_optimizer
from tinybert_tf.distill.projections import Projections
from tinybert_tf.distill.terms import (
    PHASES,
    TERMS,
    HardLabelTerm,
    LossTerm,
    PredictionTerm,
    make_term,
    make_terms,
    register_term,
    resolve_names,
)

__all__ = ["Distiller", "HardLabelTerm", "LossTerm", "MiniLMAttentionTerm",
           "MiniLMRelationTerm", "MiniLMValueTerm", "NextSentenceTerm", "PHASES",
           "PatientTerm", "PredictionTerm", "Projections", "TERMS", "WarmupSchedule",
           "create_optimizer", "init_student_from_teacher", "layer_map", "make_term",
           "make_terms", "pkd_phase_terms", "register_term", "resolve_names", "trackable"]
