"""Recipes of the general stage (`--recipe`): how a student is made before task work.

A recipe is a registered object; the general stage asks it, instead of
branching on names, which heads the models carry, how the corpus is packed
and masked, which loss terms train the student, and which teacher layers (if
any) the student starts from. A recipe registered by user code (`--plugins`)
is as valid as ours.

  tinybert      paper Sec. 3.2, general distillation: embd + attn + hidn from the
                pre-trained teacher on sentence pairs (`--loss_terms`,
                `--layer_mapping`); with `--init_from_teacher` the student starts
                from the teacher layers g(m).
  distilbert    Sanh et al. 2019: 5 L_ce + 2 L_mlm + 1 L_cos on single segments with
                dynamic masking, the student started from every other teacher layer.
  mlm           BERT pre-training of the student from scratch, no teacher signal:
                masked LM (80/10/10) + next-sentence prediction, as BERT-Tiny /
                BERT-Small (Turc et al. 2019) and the paper's BERT_TINY baseline.
                The teacher only lends its vocabulary.
  minilm_v1     MiniLM (Wang et al. 2020): the teacher's last-layer attention
                distributions and value relations into the student's last layer
                (minilm_att + minilm_val), width-free, no projections.
  minilm_v2     MiniLMv2 (Wang et al. 2021): Q-Q, K-K, V-V relations with
                --minilm_relation_heads heads from --minilm_teacher_layer (minilm_rel).
  first_layers  no training: the student is the teacher's embeddings and first M
                layers (Patient KD's initialisation, Sun et al. 2019), saved as the
                general model for task-stage phases to start from.
  mapped_layers no training: the teacher's embeddings and the layers g(m) of
                `--layer_mapping`, the start `tinybert --init_from_teacher` gives,
                saved as it is: the "w/o GD" ablation of a teacher-initialised
                student, one change from the recipe.
"""
from __future__ import annotations

from typing import ClassVar, Optional, Sequence, Union

from tinybert_tf import plugins
from tinybert_tf.config import BertConfig
from tinybert_tf.distill.distilbert import init_mismatch
from tinybert_tf.distill.mapping import layer_map
from tinybert_tf.distill.terms import LossTerm, make_terms

# 0-based teacher layers to copy into the student, or "every_other", or None (random).
Layers = Optional[Union[str, Sequence[int]]]


def mapped_layers(config, student: BertConfig, teacher: BertConfig) -> list[int]:
    """The 0-based teacher layers g(m) - 1 of --layer_mapping, one per student layer."""
    return [g - 1 for g in layer_map(config.loss.layer_mapping, student.num_layers,
                                     teacher.num_layers)[1:]]


class GeneralRecipe:
    """Base class of a general-stage recipe (see the module docstring).

    Class attributes say what the stage builds: `teacher_head` / `student_head`
    (None or a head name, e.g. "mlm"), `pack` ("pair" or "single" segments),
    `masking` (dynamic MLM masking of the batches), `next_sentence` (BERT's
    sentence pairs, half with a random B), `teacher_forward` (whether the
    teacher's weights are loaded and run; else only its vocabulary is read) and
    `trains` (False: the stage only initialises and saves the student).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    teacher_head: ClassVar[Optional[str]] = None
    student_head: ClassVar[Optional[str]] = None
    pack: ClassVar[str] = "pair"
    masking: ClassVar[bool] = False
    next_sentence: ClassVar[bool] = False
    teacher_forward: ClassVar[bool] = True
    trains: ClassVar[bool] = True
    # Appended to the "needs a teacher with a ... head" error: another way out.
    teacher_head_hint: ClassVar[str] = ""
    # Flags (no "--") that only this recipe reads: typed under another --recipe, they
    # get a warning (pipeline/preflight/unread.py).
    own_flags: ClassVar[tuple[str, ...]] = ()

    def terms(self, config) -> list[LossTerm]:
        """The loss terms of the stage (config: the run's `PipelineConfig`)."""
        raise NotImplementedError(f"{type(self).__name__}.terms")

    def terms_flag(self, config) -> str:
        """The flag that chooses the stage's loss terms (for messages): the recipe
        itself, or a flag of its own (TinyBERT's --loss_terms)."""
        return f"--recipe={self.name}"

    def init_layers(self, config, student: BertConfig, teacher: BertConfig) -> Layers:
        """0-based teacher layers the student starts from ("every_other", a list), or
        None for a random start."""
        return None

    def teacher_head_for(self, config) -> Optional[str]:
        """The head the teacher is loaded with under `config` (default: `teacher_head`)."""
        return self.teacher_head

    def check(self, config, student: Optional[BertConfig], teacher) -> list[str]:
        """Preflight errors (one line each, naming the flag) for `teacher`
        (`ModelInfo`: config and head, no weights) and the student config."""
        errors = []
        head = self.teacher_head_for(config)
        if head and teacher is not None and teacher.head != head:
            errors.append(f"--recipe={self.name} needs a teacher with a {head} head; "
                          f"--teacher={config.models.teacher} has {teacher.head or 'none'}. "
                          f"Use a checkpoint with that head or another --recipe"
                          f"{self.teacher_head_hint}.")
        if student is not None and teacher is not None \
                and self.init_layers(config, student, teacher.config) is not None:
            mismatch = init_mismatch(student, teacher.config)
            if mismatch:
                field, s, t = mismatch
                fix = ("an intermediate_size of at most the teacher's"
                       if field == "intermediate_size" else "the teacher's width")
                errors.append(
                    f"{self.init_flag(config)} copies teacher layers into the student, but "
                    f"--student_config={config.models.student_config} has {field}={s} and "
                    f"the teacher {t}; use a student with {fix} or another recipe.")
        return errors

    def init_flag(self, config) -> str:
        """The flag that asks for the copy of teacher layers (for messages)."""
        return f"--recipe={self.name}"

    def describe(self) -> dict:
        return {"name": self.name, "summary": self.summary, "pack": self.pack,
                "masking": self.masking, "next_sentence": self.next_sentence,
                "teacher_forward": self.teacher_forward, "trains": self.trains}


RECIPES: dict[str, GeneralRecipe] = {}
# name -> the registered class (the registry rule compares classes, not instances).
_RECIPE_CLASSES: dict[str, type[GeneralRecipe]] = {}


# `@register_recipe` / `@register_recipe(replace=True)`: a recipe available as
# `--recipe=<cls.name>`.
register_recipe = plugins.class_decorator(RECIPES, _RECIPE_CLASSES, what="general recipe")


def get_recipe(name: str) -> GeneralRecipe:
    """The registered recipe `name`, or a ValueError naming --recipe and the choices."""
    if name not in RECIPES:
        raise ValueError(f"--recipe={name}: unknown recipe; use one of "
                         f"{', '.join(sorted(RECIPES))} (or register one, docs/extending.md).")
    return RECIPES[name]


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(RECIPES))


@register_recipe
class TinyBertRecipe(GeneralRecipe):
    name = "tinybert"
    summary = "general distillation: embd + attn + hidn on sentence pairs (paper Sec. 3.2)"

    def terms(self, config) -> list[LossTerm]:
        loss = config.loss
        return make_terms(loss.loss_terms, **loss.term_settings())

    def terms_flag(self, config) -> str:
        return "--loss_terms"

    def init_flag(self, config) -> str:
        return "--init_from_teacher"

    def init_layers(self, config, student, teacher) -> Layers:
        return mapped_layers(config, student, teacher) if config.models.init_from_teacher \
            else None


@register_recipe
class DistilBertRecipe(GeneralRecipe):
    """A term weighted 0 is left out; with --alpha_ce=0 the teacher needs no MLM head
    (a teacher without one, such as the embedded MiniLM, then runs L_cos only)."""

    name = "distilbert"
    summary = "5 L_ce + 2 L_mlm + 1 L_cos, single segments, dynamic masking (Sanh et al.)"
    student_head = "mlm"
    pack = "single"
    masking = True
    teacher_head_hint = " (or --alpha_ce=0)"
    own_flags = ("alpha_ce", "alpha_mlm", "alpha_cos", "distil_temperature",
                 "restrict_ce_to_mask")

    def terms(self, config) -> list[LossTerm]:
        c = config.general
        weights = {"ce": c.alpha_ce, "mlm": c.alpha_mlm, "cos": c.alpha_cos}
        names = [name for name, w in weights.items() if w > 0]
        if not names:
            raise ValueError("--recipe=distilbert: --alpha_ce, --alpha_mlm and --alpha_cos are "
                             "all 0; give at least one a positive weight.")
        return make_terms(names, temperature=c.distil_temperature,
                          restrict_ce_to_mask=c.restrict_ce_to_mask, weights=weights)

    def teacher_head_for(self, config) -> Optional[str]:
        return "mlm" if config.general.alpha_ce > 0 else None

    def init_layers(self, config, student, teacher) -> Layers:
        return "every_other"


@register_recipe
class MaskedLMRecipe(GeneralRecipe):
    name = "mlm"
    summary = ("BERT pre-training from scratch: masked LM + next-sentence prediction "
               "(BERT-Tiny, Turc et al.)")
    student_head = "mlm"
    masking = True
    next_sentence = True
    teacher_forward = False

    def terms(self, config) -> list[LossTerm]:
        # MLM logits only at the masked positions (BERT's get_masked_lm_output).
        return make_terms("mlm,nsp", restrict_ce_to_mask=True,
                          weights={"mlm": 1.0, "nsp": 1.0})


@register_recipe
class FirstLayersRecipe(GeneralRecipe):
    name = "first_layers"
    summary = "no training: the teacher's embeddings and first M layers (Patient KD's init)"
    trains = False

    def terms(self, config) -> list[LossTerm]:
        return []

    def init_layers(self, config, student, teacher) -> Layers:
        if student.num_layers > teacher.num_layers:
            raise ValueError(f"--recipe=first_layers: the student has {student.num_layers} "
                             f"layers, the teacher only {teacher.num_layers}.")
        return list(range(student.num_layers))


@register_recipe
class MappedLayersRecipe(FirstLayersRecipe):
    name = "mapped_layers"
    summary = ("no training: the teacher's embeddings and layers g(m) of --layer_mapping "
               "(tinybert --init_from_teacher's start, without general distillation)")

    def init_layers(self, config, student, teacher) -> Layers:
        return mapped_layers(config, student, teacher)


class _PlannedTermsRecipe(GeneralRecipe):
    """A recipe whose terms check the two shapes themselves (head counts, relation
    heads, teacher layer): preflight reports what `LossTerm.plan` refuses."""

    def check(self, config, student: Optional[BertConfig], teacher) -> list[str]:
        errors = super().check(config, student, teacher)
        if student is None or teacher is None:
            return errors
        for term in self.terms(config):
            try:
                term.plan(student, teacher.config)
            except ValueError as e:
                errors.append(f"--recipe={self.name}: {e}")
        return errors


@register_recipe
class MiniLMv1Recipe(_PlannedTermsRecipe):
    name = "minilm_v1"
    summary = ("MiniLM: last-layer attention distributions + value relations "
               "(minilm_att + minilm_val, Wang et al. 2020)")

    def terms(self, config) -> list[LossTerm]:
        return make_terms("minilm_att,minilm_val", **config.loss.term_settings())


@register_recipe
class MiniLMv2Recipe(_PlannedTermsRecipe):
    name = "minilm_v2"
    summary = ("MiniLMv2: Q-Q, K-K, V-V relations of --minilm_teacher_layer "
               "(minilm_rel, Wang et al. 2021)")

    def terms(self, config) -> list[LossTerm]:
        return make_terms("minilm_rel", **config.loss.term_settings())
