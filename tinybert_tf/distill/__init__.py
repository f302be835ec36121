"""Transformer distillation: layer mapping, losses, the Distiller, the optimizer."""
from tinybert_tf.distill.distilbert import init_student_from_teacher
from tinybert_tf.distill.distiller import Distiller, parse_loss_terms
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.optimizer import WarmupSchedule, create_optimizer
from tinybert_tf.distill.projections import Projections

__all__ = ["Distiller", "Projections", "WarmupSchedule", "create_optimizer",
           "init_student_from_teacher", "layer_map", "parse_loss_terms"]
