"""Every command-line flag of the `bin/` tools, defined here and only here.

It sits in the pipeline package, the top of the data flow, because it reads the
lists of choices of every layer below.

Flags come in groups (`define_*`, each taking the `FlagValues` to define into).
Each tool defines exactly the groups it reads, so `--helpfull` lists nothing
it ignores: `distill_flags()` for the pipeline, and `define_*_tool_flags()`
for `bin/augment`, `bin/export`, `bin/benchmark` and `bin/pretokenize`.

Lists of choices come from the modules that own them (strategies, stages,
export formats, loss terms, task names); `--loss_terms`, `--export_formats`
and `--task` are checked when the typed configs are built, because a term,
format or task registered by user code is as valid as ours.
"""
from __future__ import annotations

import weakref
from typing import Any

from absl import flags

from tinybert_tf.distill.terms import ALIASES, TERMS
from tinybert_tf.export.formats import FORMATS
from tinybert_tf.export.parity import DEFAULT_FORMATS
from tinybert_tf.pipeline.autosize import DEFAULT_CANDIDATES
from tinybert_tf.pipeline.run.context import STAGES
from tinybert_tf.pipeline.run.lock import DEFAULT_STALE_MINUTES
from tinybert_tf.pipeline.settings.configs import AUTO_PRECISION, INPUT_SHARDING, PRECISIONS
from tinybert_tf.pipeline.settings.precision import TEACHER_PRECISIONS
from tinybert_tf.pipeline.training.phases import PHASE_KINDS
from tinybert_tf.pipeline.training.recipes import RECIPES
from tinybert_tf.pipeline.training.strategy import DEFAULT_PEER_TIMEOUT, STRATEGIES
from tinybert_tf.tasks.catalog import task_names

FLAGS = flags.FLAGS

# Flags that existed once: the message names what replaced them.
REMOVED_FLAGS = {
    "shard": "bin/distill augments the whole task; split augmentation across machines with "
             "bin/augment --shard=i/n and pass the concatenated file's folder instead.",
    "model_dir": "--model_dir belongs to bin/export; bin/distill exports OUTPUT/task/model.",
    "output": "--output belongs to bin/augment and bin/pretokenize.",
    "vocab": "--vocab belongs to bin/augment and bin/pretokenize; bin/distill uses the "
             "teacher's vocab.txt.",
    "vector_cache": "--vector_cache belongs to bin/augment; bin/distill caches word vectors "
                    "in OUTPUT/augment/vectors.",
    "intermediate": "--task_phases lists the task stage's phases in order; "
                    "--task_phases=prediction skips the intermediate-layer phase.",
}


# Flags only --student_config=auto reads: set with a fixed student, they would be ignored.
AUTO_STUDENT_FLAGS = ("latency_budget_ms", "latency_table", "latency_runtime",
                      "latency_seq_len", "latency_batch", "latency_candidates")


def ignored_auto_student_flags(fv: flags.FlagValues) -> list[str]:
    """The `AUTO_STUDENT_FLAGS` given (on the command line or in a flagfile) with a value
    other than their default while --student_config is not auto, as `--name`."""
    if fv["student_config"].value == "auto":
        return []
    return [f"--{name}" for name in AUTO_STUDENT_FLAGS
            if fv[name].present and fv[name].value != fv[name].default]


def _terms_help() -> str:
    aliases = "; ".join(f"{a} = {','.join(v)}" for a, v in ALIASES.items())
    return f"any of {', '.join(sorted(TERMS))} ({aliases})"


# --- groups -------------------------------------------------------------------------

# FlagValues -> names of the groups and tools already defined into it.
_defined: "weakref.WeakKeyDictionary[flags.FlagValues, set[str]]" = weakref.WeakKeyDictionary()


def _group(define):
    """A group goes into a FlagValues once, whichever tools ask for it (tests load
    several bin/ scripts into one process, all defining into absl's FLAGS)."""
    def wrapped(fv: flags.FlagValues, *args: Any) -> None:
        if _first_time(fv, define.__name__):
            define(fv, *args)
    wrapped.__name__ = define.__name__
    wrapped.__doc__ = define.__doc__
    return wrapped


@_group
def define_numerics(fv: flags.FlagValues) -> None:
    flags.DEFINE_integer("seed", 42, "Random seed for data order, dropout, augmentation.",
                         flag_values=fv)
    flags.DEFINE_enum("mixed_precision", AUTO_PRECISION, (AUTO_PRECISION, *PRECISIONS),
                      "Keras mixed-precision policy for training; losses stay float32. "
                      "auto: mixed_bfloat16 with --strategy=tpu, none otherwise.",
                      flag_values=fv)
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step (each phase "
                      "compiles once per sequence length: full batches, --length_buckets "
                      "lengths at most).", flag_values=fv)
    flags.DEFINE_bool("run_eagerly", False, "Run each training step eagerly instead of "
                      "tracing it into a graph (keras' run_eagerly): to step through a loss "
                      "term with pdb or print. Same results; slower per step on real models, "
                      "faster only for phases of a few steps on toy models (the tests). "
                      "Excludes --jit_compile.", flag_values=fv)
    flags.DEFINE_integer("length_buckets", 8, "Pad each batch to the smallest of N evenly "
                         "spaced lengths holding its longest row, not --max_seq_len (0), where "
                         "padding does not change the loss (docs/distillation.md).",
                         flag_values=fv)


@_group
def define_distribution(fv: flags.FlagValues) -> None:
    # A string checked by strategy.make_strategy: strategies registered by user code count.
    flags.DEFINE_string("strategy", "default",
                        f"tf.distribute strategy: {', '.join(STRATEGIES)} (see BUILD.md for "
                        "multi_worker and tpu).", flag_values=fv)
    flags.DEFINE_string("tpu", "", "TPU address for --strategy=tpu (e.g. grpc://10.0.0.2:8470).",
                        flag_values=fv)
    flags.DEFINE_float("peer_timeout", DEFAULT_PEER_TIMEOUT,
                       "multi_worker: seconds to wait for every worker to start; after a "
                       "SIGTERM, the longest wait for a step boundary before exiting "
                       "anyway. A worker that dies mid-run is noticed within 10 s.",
                       flag_values=fv)
    flags.DEFINE_enum("input_sharding", "auto", INPUT_SHARDING,
                      "General stage under multi_worker/TPU pods: auto = each worker reads "
                      "only its own corpus files when there are at least as many files as "
                      "workers (else exact); exact = every worker reads the whole corpus "
                      "and keeps its slice of each global batch (the batches of one "
                      "replica).", flag_values=fv)


@_group
def define_task_data(fv: flags.FlagValues) -> None:
    """What the task is and where its data is (`tinybert_tf.tasks.TaskConfig`)."""
    flags.DEFINE_string(
        "task", "polarity",
        f"Task: {', '.join(task_names())} (case-insensitive). GLUE names read --data_dir; "
        "text_classification, text_regression, token_classification, squad1.1 and "
        "squad2.0 read --train_file/--validation_file.", flag_values=fv)
    flags.DEFINE_string("data_dir", "",
                        "GLUE-layout task folder (train.tsv, dev.tsv, ...), 'tfds' to read TFDS "
                        "glue/*, or empty for the embedded demo task (--task=polarity).",
                        flag_values=fv)
    flags.DEFINE_string("tfds_data_dir", "", "TFDS data_dir for tfds sources (prepared offline).",
                        flag_values=fv)
    flags.DEFINE_integer("max_seq_len", 0, "Task sequence length; 0 = the task's default "
                         "(64 single sentences, 128 pairs, 384 SQuAD).", flag_values=fv)
    flags.DEFINE_string("train_file", "", "Your training data: .csv, .tsv, .jsonl (text "
                        "tasks), CoNLL or .jsonl (token_classification), SQuAD .json.",
                        flag_values=fv)
    flags.DEFINE_string("validation_file", "", "Your dev data, same format as --train_file.",
                        flag_values=fv)
    flags.DEFINE_string("test_file", "", "Optional unlabelled test data, same format.",
                        flag_values=fv)
    flags.DEFINE_enum("data_format", "", ["", "csv", "tsv", "jsonl", "conll"],
                      "Format of the own-data files; empty = from the file extension.",
                      flag_values=fv)
    flags.DEFINE_string("text_column", "text", "Column (or JSON key) of the text.",
                        flag_values=fv)
    flags.DEFINE_string("text_pair_column", "", "Column of the second text of a pair task "
                        "(empty: single sentences).", flag_values=fv)
    flags.DEFINE_string("label_column", "label", "Column of the label (or regression target).",
                        flag_values=fv)
    flags.DEFINE_integer("tag_column", -1, "CoNLL: the column holding the tag (-1 = last).",
                         flag_values=fv)
    flags.DEFINE_list("labels", [], "Label names in the order to use (default: sorted names "
                      "of the training file).", flag_values=fv)
    flags.DEFINE_integer("max_query_len", 64, "SQuAD: question pieces kept.", flag_values=fv)
    flags.DEFINE_integer("doc_stride", 128, "SQuAD: step between context windows (pieces).",
                         flag_values=fv)
    flags.DEFINE_integer("n_best_size", 20, "SQuAD: candidate spans kept per question.",
                         flag_values=fv)
    flags.DEFINE_integer("max_answer_len", 30, "SQuAD: longest answer in word pieces.",
                         flag_values=fv)


@_group
def define_augment(fv: flags.FlagValues) -> None:
    """Algorithm 1's settings (the pipeline's augment stage and bin/augment)."""
    flags.DEFINE_string("mlm_model", "",
                        "Model directory with an MLM head for single-piece candidates (Hugging "
                        "Face BertForMaskedLM dir, keras-hub BertMaskedLM preset dir, or ours).",
                        flag_values=fv)
    flags.DEFINE_string("word_vectors", "",
                        "Word vectors for multi-piece words: GloVe .txt, word2vec .txt/.bin, or "
                        "gensim .kv.", flag_values=fv)
    flags.DEFINE_bool("augment_fallback", False,
                      "Allow augmentation without --mlm_model (word vectors serve every word) "
                      "and without --word_vectors (Word2Vec trained on --corpus). The paper's "
                      "Algorithm 1 needs both; the demo sets this.", flag_values=fv)
    flags.DEFINE_integer("num_aug", 20, "N_a: augmented variants per example (paper: 20).",
                         flag_values=fv)
    flags.DEFINE_float("replace_prob", 0.4, "p_t: probability to replace a word (paper: 0.4).",
                       flag_values=fv)
    flags.DEFINE_integer("num_candidates", 15, "K: candidates per word (paper: 15).",
                         flag_values=fv)
    flags.DEFINE_integer("augment_batch_size", 256, "Masked rows per MLM forward pass.",
                         flag_values=fv)
    flags.DEFINE_integer("vector_vocab_limit", 100000, "Neighbours among the first N words of "
                         "the vector file (the reference: 100000 GloVe words); 0 = all.",
                         flag_values=fv)


@_group
def define_corpus(fv: flags.FlagValues, help_text: str = "") -> None:
    flags.DEFINE_string(
        "corpus", "", help_text or
        "General corpus (general distillation; Word2Vec for augmentation): text files/globs "
        "(BERT format, .gz/.bz2), a Wikipedia XML dump (.xml.bz2), TFRecord shards "
        "(.tfrecord), or tfds:NAME. Empty: the Wikipedia sample shipped in gensim.",
        flag_values=fv)


@_group
def define_export(fv: flags.FlagValues) -> None:
    flags.DEFINE_list("export_formats", list(DEFAULT_FORMATS),
                      f"What to export: any of {', '.join(FORMATS)}.", flag_values=fv)
    flags.DEFINE_bool("keras_hub_approximate_gelu", False,
                      "keras_hub format: export a model trained with exact GELU (the "
                      "embedded MiniLM teacher's, and so its students') although keras-hub's "
                      "BERT computes the tanh approximation; parity.json's keras_hub row "
                      "shows the cost (docs/models.md). Without it such an export is refused "
                      "(by --dry_run too).", flag_values=fv)
    flags.DEFINE_integer("representative_examples", 200,
                         "Examples of task text used to calibrate full-integer TFLite.",
                         flag_values=fv)
    flags.DEFINE_integer("export_threads", 0, "TFLite interpreter threads for parity latency "
                         "(0 = all CPU cores).", flag_values=fv)
    flags.DEFINE_integer("export_max_examples", 0, "Dev examples checked for parity (0 = all).",
                         flag_values=fv)
    flags.DEFINE_integer("export_latency_runs", 30, "Batch-1 calls timed per format.",
                         flag_values=fv)


@_group
def define_run(fv: flags.FlagValues) -> None:
    """How the pipeline proceeds: folder, stages, resume, dry run."""
    flags.DEFINE_string("output_dir", None, "Where every stage writes its folder and "
                        "report.json (required).", flag_values=fv)
    flags.DEFINE_list("stages", ["all"], f"Comma list of {', '.join(STAGES)}, or 'all'.",
                      flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Start the named stages over: delete their folders "
                      "(later stages made from them are redone as stale).", flag_values=fv)
    flags.DEFINE_bool("dry_run", False, "Check everything and print the resolved plan as JSON; "
                      "train nothing (exit 0, or 2 with every error).", flag_values=fv)
    flags.DEFINE_list("plugins", [], "Python modules to import first: your own loss terms, "
                      "task types, data sources, export formats or strategies register "
                      "themselves on import (docs/extending.md).", flag_values=fv)
    flags.DEFINE_integer("checkpoint_every", 200, "Save a checkpoint every N steps.",
                         flag_values=fv)
    flags.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept per phase.", flag_values=fv)
    flags.DEFINE_bool("teacher_cache", True, "Compute the teacher's logits (prediction "
                      "phase) or mapped layers (intermediate phase, within "
                      "--teacher_cache_budget_gb) once and reuse them every epoch.",
                      flag_values=fv)
    flags.DEFINE_float("teacher_cache_budget_gb", 8.0, "Most GiB of the teacher's mapped "
                       "layers (bfloat16) cached for an intermediate phase of several epochs "
                       "(0 = never); the plan says whether they fit.", flag_values=fv)
    flags.DEFINE_integer("eval_batch_size", 64, "Batch size of evaluation.", flag_values=fv)
    flags.DEFINE_integer("latency_runs", 100, "Rounds of batch-1 forward passes timed for "
                         "report.json, one call of each model per round.",
                         flag_values=fv)
    flags.DEFINE_float("lock_stale_minutes", DEFAULT_STALE_MINUTES,
                       "A run locks --output_dir (OUTPUT/.lock) and heartbeats; a lock left on "
                       "another host counts as dead, and is taken over, once its heartbeat is "
                       "this old (same host: once its process is gone).", flag_values=fv)


@_group
def define_models(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("teacher", "minilm-l6",
                        "Pre-trained teacher: a model directory (ours, Hugging Face, keras-hub "
                        "preset) or a short name (minilm-l6 = the embedded teacher).",
                        flag_values=fv)
    flags.DEFINE_string("task_teacher", "",
                        "Fine-tuned teacher with a task head. Empty: the finetune_teacher stage "
                        "fine-tunes --teacher on the task.", flag_values=fv)
    flags.DEFINE_list("teacher_label_order", [],
                      "The task teacher's label names in its output order, when its directory "
                      "does not name them (e.g. LABEL_0, LABEL_1, ...).", flag_values=fv)
    flags.DEFINE_string("student_config", "tinybert_4l_312d",
                        "Student shape: a preset name, a config JSON file, or 'auto': the "
                        "shape within --latency_budget_ms with the most transformer-layer "
                        "parameters (docs/pipeline.md).", flag_values=fv)
    flags.DEFINE_float("latency_budget_ms", 0.0, "--student_config=auto: the most one call "
                       "of the student may take on --latency_runtime.", flag_values=fv)
    flags.DEFINE_enum("latency_runtime", "tflite_float32",
                      ["tflite_float32", "tflite_dynamic_int8", "tflite_int8", "saved_model"],
                      "--student_config=auto: the runtime the student ships on, which each "
                      "candidate is exported to and timed in.", flag_values=fv)
    flags.DEFINE_integer("latency_seq_len", 128, "--student_config=auto: tokens per call "
                         "timed.", flag_values=fv)
    flags.DEFINE_integer("latency_batch", 1, "--student_config=auto: sequences per call "
                         "timed.", flag_values=fv)
    flags.DEFINE_string("latency_table", "",
                        "--student_config=auto: a CSV of latencies measured on the target "
                        "device (layers,hidden,heads,intermediate,latency_ms) instead of "
                        "measuring here (docs/pipeline.md).", flag_values=fv)
    flags.DEFINE_list("latency_candidates", list(DEFAULT_CANDIDATES),
                      "--student_config=auto: the shapes measured, LAYERSxHIDDEN[xHEADS[xFFN]] "
                      "(default: the 24 BERT miniatures of Turc et al. 2019; H/64 heads, 4H "
                      "feed-forward; the teacher's heads, H rounded to a multiple of them, "
                      "when --loss_terms or --recipe compares heads one to one).",
                      flag_values=fv)
    flags.DEFINE_bool("init_from_teacher", False,
                      "General stage: start the student from the teacher's embeddings and "
                      "its mapped layers (--layer_mapping) instead of random weights, as "
                      "DistilBERT does; needs the teacher's width, FFN size and head count.",
                      flag_values=fv)
    flags.DEFINE_string("general_model", "",
                        "Student to start task distillation from: a model directory, 'none' "
                        "(random init, as --student_init=random), or empty for "
                        "OUTPUT/general.", flag_values=fv)
    flags.DEFINE_enum("student_init", "general", ["general", "random"],
                      "Where the task stage's student starts: general (--general_model, or "
                      "OUTPUT/general) or random (no general distillation: the paper's "
                      "'w/o GD'; --general_model is then not read).", flag_values=fv)
    # A string checked when the task is resolved: task types registered by user code
    # may bring their own head styles.
    flags.DEFINE_string("classifier_head", "pooler",
                        "The student's head for sentence tasks: pooler (BERT's: dropout and "
                        "a dense layer on the pooled [CLS] output) or pre_classifier "
                        "(DistilBERT's: dense, ReLU, dropout 0.2, dense on the [CLS] "
                        "state, no pooler). Teachers keep their own head.", flag_values=fv)


@_group
def define_general(fv: flags.FlagValues) -> None:
    # A string checked by preflight: recipes registered by user code count.
    flags.DEFINE_string("recipe", "tinybert",
                        "Recipe of the general stage: " + "; ".join(
                            f"{name} = {r.summary}" for name, r in sorted(RECIPES.items()))
                        + " (pipeline/training/recipes.py).", flag_values=fv)
    flags.DEFINE_integer("general_max_seq_len", 128, "Sequence length of general distillation.",
                         flag_values=fv)
    flags.DEFINE_integer("general_batch_size", 256, "Effective global batch of general "
                         "distillation (one optimizer update; --grad_accum_steps splits it).",
                         flag_values=fv)
    flags.DEFINE_float("general_epochs", 3, "Epochs over the corpus in general distillation.",
                       flag_values=fv)
    flags.DEFINE_integer("general_max_steps", 0, "Stop general distillation after this many "
                         "steps (0 = no limit).", flag_values=fv)
    flags.DEFINE_float("general_lr", 1e-4, "Peak learning rate of general distillation.",
                       flag_values=fv)
    flags.DEFINE_float("general_warmup", 0.1, "Warm-up fraction of general distillation.",
                       flag_values=fv)
    flags.DEFINE_string("general_holdout", "auto",
                        "Articles left out of the general corpus, by title (Wikipedia dumps, "
                        "tfds:wikipedia): auto = the task's own hold-out (wiki_pairs: its dev "
                        "articles; other tasks: none), none, or a registered hold-out name.",
                        flag_values=fv)
    # DistilBERT recipe.
    flags.DEFINE_float("alpha_ce", 5.0, "DistilBERT: weight of the soft-target loss.",
                       flag_values=fv)
    flags.DEFINE_float("alpha_mlm", 2.0, "DistilBERT: weight of the MLM loss.", flag_values=fv)
    flags.DEFINE_float("alpha_cos", 1.0, "DistilBERT: weight of the cosine loss.",
                       flag_values=fv)
    flags.DEFINE_float("distil_temperature", 2.0, "DistilBERT: softmax temperature.",
                       flag_values=fv)
    flags.DEFINE_bool("restrict_ce_to_mask", False,
                      "DistilBERT: soft targets at the masked positions only (the DistilBERT "
                      "code's default is every real token).", flag_values=fv)


@_group
def define_finetune(fv: flags.FlagValues) -> None:
    flags.DEFINE_float("teacher_epochs", 3, "Epochs of teacher fine-tuning.", flag_values=fv)
    flags.DEFINE_float("teacher_lr", 2e-5, "Peak learning rate of teacher fine-tuning.",
                       flag_values=fv)
    flags.DEFINE_integer("teacher_batch_size", 32, "Batch size of teacher fine-tuning.",
                         flag_values=fv)
    flags.DEFINE_integer("teacher_max_steps", 0, "Stop teacher fine-tuning after this many "
                         "steps (0 = no limit): bounds its time on a large training file.",
                         flag_values=fv)


@_group
def define_task_distillation(fv: flags.FlagValues) -> None:
    flags.DEFINE_bool("use_augmented", True, "Task distillation on the augmented data "
                      "(else the original training set).", flag_values=fv)
    flags.DEFINE_string("augmented_file", "",
                        "A finished augmented training file (bin/augment's output, or another "
                        "run's OUTPUT/augment/<file>) to distil on instead of running this "
                        "run's augment stage; empty: OUTPUT/augment.", flag_values=fv)
    flags.DEFINE_list("task_phases", ["intermediate", "prediction"],
                      f"Phases of the task stage, in order: {', '.join(PHASE_KINDS)} (and "
                      "phases registered by --plugins). The last one trains the head and "
                      "keeps its best dev checkpoint.", flag_values=fv)
    flags.DEFINE_float("intermediate_epochs", 20, "Epochs of the intermediate phase.",
                       flag_values=fv)
    flags.DEFINE_float("intermediate_lr", 5e-5, "Learning rate of the intermediate phase.",
                       flag_values=fv)
    flags.DEFINE_float("pred_epochs", 3, "Epochs of the prediction-layer phase.",
                       flag_values=fv)
    flags.DEFINE_float("pred_lr", 3e-5, "Learning rate of the prediction-layer phase.",
                       flag_values=fv)
    flags.DEFINE_float("finetune_epochs", 3, "Epochs of the finetune phase (ground-truth "
                       "labels, no teacher; on the augmented set with --use_augmented, as "
                       "the prediction phase).", flag_values=fv)
    flags.DEFINE_float("finetune_lr", 3e-5, "Learning rate of the finetune phase.",
                       flag_values=fv)
    flags.DEFINE_list("pred_grid", [], "BATCH:LR cells (e.g. 16:1e-5,32:3e-5): the last "
                      "task phase runs once per cell from one run of the phases before it; "
                      "the cell best on dev is kept (the paper's {16,32} x {1e-5,2e-5,3e-5}).",
                      flag_values=fv)
    flags.DEFINE_integer("task_batch_size", 32, "Global batch size of task distillation.",
                         flag_values=fv)
    flags.DEFINE_integer("task_max_steps", 0, "Cap on steps per task phase (0 = none).",
                         flag_values=fv)
    flags.DEFINE_float("pkd_epochs", 4, "Epochs of the pkd phase (Patient KD; its code's "
                       "default 4).", flag_values=fv)
    flags.DEFINE_float("pkd_lr", 1e-5, "Learning rate of the pkd phase (the PKD code's "
                       "patient-KD setting).", flag_values=fv)
    flags.DEFINE_integer("eval_every", 0, "Evaluate on dev every N steps in the last task "
                         "phase (0 = once per epoch); the best checkpoint is kept. The "
                         "reference evaluates every 100 steps (the task configs' value).",
                         flag_values=fv)
    flags.DEFINE_enum("teacher_precision", "auto", TEACHER_PRECISIONS, "dtype of the frozen "
                      "task-stage teacher. auto: bfloat16 on TPUs, Ampere+ GPUs and CPUs with "
                      "AVX512-BF16/AMX, else float32; the plan says why.", flag_values=fv)


@_group
def define_quantize(fv: flags.FlagValues) -> None:
    """The quantize stage (quantisation-aware distillation to a full-integer student)."""
    flags.DEFINE_bool("quantize", True, "Run the quantize stage when --export_formats has "
                      "int8: the float task student teaches its int8 fake-quantised copy, "
                      "and the int8 TFLite flavour is converted from it with its learnt "
                      "ranges (--noquantize: int8 is calibrated after training).",
                      flag_values=fv)
    flags.DEFINE_integer("quantize_steps", 300, "Optimizer steps of quantisation-aware "
                         "distillation (0 = calibrate the ranges only).", flag_values=fv)
    flags.DEFINE_float("quantize_lr", 2e-5, "Peak learning rate of the quantize stage "
                       "(linear warm-up over --warmup_proportion, then decay); 0: the "
                       "int8 copy keeps the float student's weights and its steps only "
                       "move the activation ranges (forward passes, no gradients).",
                       flag_values=fv)
    flags.DEFINE_integer("quantize_batch_size", 32, "Global batch size of the quantize "
                         "stage.", flag_values=fv)
    flags.DEFINE_list("quantize_loss_terms", ["pred"], "Loss terms of the quantize stage, "
                      "the float student teaching: pred (soft cross-entropy, or MSE for a "
                      "score), and any of embd, attn, hidn (identity projections).",
                      flag_values=fv)
    flags.DEFINE_integer("quantize_calibration_examples", 256, "Training rows (a seeded "
                         "sample) whose float activations set the int8 ranges before "
                         "training.", flag_values=fv)
    flags.DEFINE_integer("quantize_eval_every", 50, "Every N steps of the quantize stage "
                         "(and at its end), measure on dev how many of the float student's "
                         "answers its int8 copy keeps (label agreement) and keep the "
                         "checkpoint that keeps most (the earlier on a tie); 0: keep the "
                         "last weights. Regression, with no answers to keep, keeps the "
                         "last.", flag_values=fv)


def define_evaluation(fv: flags.FlagValues) -> None:
    flags.DEFINE_bool("glue_test_predictions", False,
                      "Evaluate stage: also write the student's predictions on the GLUE test "
                      "split(s) as OUTPUT/evaluate/glue_submission/<Task>.tsv, the GLUE "
                      "server's files (MNLI: MNLI-m, MNLI-mm and AX).", flag_values=fv)


@_group
def define_losses(fv: flags.FlagValues) -> None:
    flags.DEFINE_list("loss_terms", ["embd", "attn", "hidn"],
                      f"Intermediate loss terms: {_terms_help()}.", flag_values=fv)
    flags.DEFINE_float("temperature", 1.0, "Temperature t of the prediction loss.",
                       flag_values=fv)
    flags.DEFINE_float("pkd_alpha", 0.7, "Patient KD: weight alpha of the soft targets "
                       "(1 - alpha weighs the ground truth); T is --temperature.",
                       flag_values=fv)
    flags.DEFINE_float("pkd_beta", 500.0, "Patient KD: weight beta of the patient loss on "
                       "the normalised [CLS] states of the mapped layers.", flag_values=fv)
    flags.DEFINE_float("hard_label_weight", 0.0, "Weight of the ground-truth loss mixed into "
                       "the prediction phase (0 = the paper).", flag_values=fv)
    flags.DEFINE_string("layer_mapping", "uniform",
                        "Student->teacher layer map: uniform, top, bottom, or a comma list "
                        "of teacher layers (1-based) for student layers 1..M.", flag_values=fv)
    flags.DEFINE_list("layer_weights", [], "lambda_m per student layer 0..M+1 (default all 1).",
                      flag_values=fv)
    flags.DEFINE_bool("share_hidden_projection", True,
                      "One W_h for all layers (reference code) instead of one per layer.",
                      flag_values=fv)
    flags.DEFINE_integer("minilm_relation_heads", 48,
                         "MiniLMv2 (minilm_rel): relation heads the concatenated Q, K and V "
                         "of both models are split into; must divide both attention widths "
                         "(paper: 48 for base-size teachers).", flag_values=fv)
    flags.DEFINE_integer("minilm_teacher_layer", 0,
                         "MiniLMv2 (minilm_rel): the teacher layer (1-based) whose relations "
                         "the student's last layer learns; 0 = the teacher's last layer (the "
                         "paper's choice for base-size teachers; an upper-middle layer for "
                         "large ones).", flag_values=fv)
    flags.DEFINE_bool("mask_padding", False,
                      "Restrict intermediate losses to real tokens (a deviation from the "
                      "reference; see docs).", flag_values=fv)


@_group
def define_optimizer(fv: flags.FlagValues) -> None:
    flags.DEFINE_float("weight_decay", 0.01, "AdamW weight decay (not on LayerNorm or biases).",
                       flag_values=fv)
    flags.DEFINE_float("warmup_proportion", 0.1, "Linear warm-up fraction of task phases.",
                       flag_values=fv)
    flags.DEFINE_float("clip_norm", 1.0, "Global-norm gradient clipping (0 = off).",
                       flag_values=fv)
    flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per update: each global batch "
                         "is split into this many (memory), the update is the same.",
                         flag_values=fv)


# --- tools ---------------------------------------------------------------------------

def _loose(define, name: str, *args, fv: flags.FlagValues, **kwargs) -> None:
    """Define a tool's own flag unless another tool loaded in this process did."""
    if name not in fv:
        define(name, *args, flag_values=fv, **kwargs)


def _first_time(fv: flags.FlagValues, what: str) -> bool:
    """True the first time `what` (a group or a tool) is defined into `fv` (a test may
    load a bin/ script twice, and several scripts into one process)."""
    done = _defined.setdefault(fv, set())
    if what in done:
        return False
    done.add(what)
    return True


DISTILL_GROUPS = (define_run, define_numerics, define_distribution, define_task_data,
                  define_models, define_general, define_finetune, define_augment,
                  define_task_distillation, define_losses, define_optimizer, define_quantize,
                  define_evaluation,
                  define_export)


def distill_flags() -> flags.FlagValues:
    """A fresh FlagValues with every flag of `bin/distill` (the pipeline)."""
    fv = flags.FlagValues()
    for define in DISTILL_GROUPS:
        define(fv)
    define_corpus(fv)
    return fv


# bin/reproduce's own flags (besides bin/distill's, which pass through to every run).
REPRODUCE_FLAGS = ("table", "tasks", "cells", "seeds", "glue_dir", "squad_dir",
                   "bert_small_model")


def reproduce_flags() -> flags.FlagValues:
    """A fresh FlagValues for `bin/reproduce`: every flag of bin/distill (passed to each
    run) and its own."""
    fv = distill_flags()
    flags.DEFINE_integer("table", None, "The paper's table to reproduce, 1-7 "
                         "(tinybert_tf/paper/tables.py).", flag_values=fv)
    flags.DEFINE_list("tasks", [], "Tasks to run each cell on (--task names); default: the "
                      "table's tasks.", flag_values=fv)
    flags.DEFINE_list("cells", [], "Only these cells of the table (default: every cell but "
                      "the teacher's row, whose score every cell's report holds).",
                      flag_values=fv)
    flags.DEFINE_list("seeds", [], "Run the table once per seed (--seed=N of every run, "
                      "whatever --seed says), "
                      "in DIR/seed-N/, and write DIR/table<N>.* with each cell's mean, "
                      "standard deviation and paired difference to the table's first row "
                      "over the seeds; default: one run with --seed, in DIR.", flag_values=fv)
    flags.DEFINE_string("glue_dir", "", "Folder of the GLUE download (CoLA/, MNLI/, ...): "
                        "each GLUE task gets --data_dir=GLUE_DIR/<Task>.", flag_values=fv)
    flags.DEFINE_string("squad_dir", "", "Folder holding train-v1.1.json, dev-v1.1.json, "
                        "train-v2.0.json and dev-v2.0.json for the SQuAD tasks.",
                        flag_values=fv)
    flags.DEFINE_string("bert_small_model", "",
                        "Table 1's BERT-Small cell: the pre-trained 4 x 512 checkpoint it "
                        "fine-tunes (Turc et al. 2019, Google's uncased_L-4_H-512_A-8 as a "
                        "model directory; docs/models.md). --general_model is a General "
                        "TinyBERT and starts only the cells that start from one.",
                        flag_values=fv)
    flags.mark_flag_as_required("table", flag_values=fv)
    return fv


def define_augment_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/augment`: Algorithm 1 on one task, shardable."""
    if not _first_time(fv, "augment"):
        return
    define_task_data(fv)
    define_augment(fv)
    define_corpus(fv, "Corpus for the Word2Vec fallback (--augment_fallback without "
                  "--word_vectors); empty: the Wikipedia sample shipped in gensim.")
    s = flags.DEFINE_string
    _loose(flags.DEFINE_integer, "seed", 42, "Random seed of the replacements.", fv=fv)
    _loose(s, "shard", "", "i/n: augment only the i-th of n slices of the task (0-based), for "
           "splitting work across machines.", fv=fv)
    _loose(s, "output", "", "The file to write; name it as the task's augmented file "
           "(train_aug.tsv for GLUE layout), in its own folder.", fv=fv)
    _loose(s, "vocab", "", "The task tokenizer's vocab.txt (the model trained on the output); "
           "checked against --mlm_model's vocab. Empty: no check.", fv=fv)
    _loose(s, "vector_cache", "", "Folder caching Word2Vec trained on --corpus. Empty: "
           "'vectors' next to --output.", fv=fv)


def define_export_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/export`: SavedModel, TFLite, ... and parity from a model directory."""
    if not _first_time(fv, "export"):
        return
    define_task_data(fv)
    define_export(fv)
    _loose(flags.DEFINE_string, "model_dir", None, "The task model directory to export "
           "(config.json + vocab.txt + weights, with a task head).", fv=fv)
    _loose(flags.DEFINE_string, "quantized_model_dir", "", "The quantize stage's int8 "
           "student of --model_dir (OUTPUT/quantize/model): int8 is converted from it with "
           "its learnt ranges, int8_ptq (post-training int8) beside it.", fv=fv)
    _loose(flags.DEFINE_string, "output_dir", None, "Where to write: OUTPUT/export/.", fv=fv)
    _loose(flags.DEFINE_string, "serving_model_name", "", "TF Serving model name written to "
           "OUTPUT/export/serving/models.config (empty: the task name).", fv=fv)
    _loose(flags.DEFINE_integer, "serving_version", 0, "Publish the SavedModel as this "
           "version folder, 1 to 2**63 - 1 (TF Serving's int64). Unset: the next free one. "
           "0 and an existing version are errors: served versions are never rewritten.",
           fv=fv)


def define_benchmark_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/benchmark`: the paper's Table 1 efficiency columns on this machine."""
    if not _first_time(fv, "benchmark"):
        return
    lst, i = flags.DEFINE_list, flags.DEFINE_integer
    _loose(lst, "benchmark_models", ["bert_base_uncased", "tinybert_4l_312d"],
           "Two config presets (or config JSON files): teacher, then student.", fv=fv)
    _loose(i, "benchmark_seq_len", 128, "Sequence length.", fv=fv)
    _loose(lst, "benchmark_batch_sizes", ["1", "32"], "Batch sizes to time.", fv=fv)
    _loose(lst, "benchmark_formats", ["keras", "saved_model", "float32", "float16",
                                      "dynamic_int8", "int8"],
           "Runtimes to time: keras and the timed export formats.", fv=fv)
    _loose(i, "benchmark_runs", 20, "Timed calls per measurement (median).", fv=fv)
    _loose(flags.DEFINE_float, "benchmark_seconds", 10.0, "Time budget per measurement; "
           "stops early (after at least 3 calls) once spent.", fv=fv)
    _loose(i, "benchmark_threads", 0, "TFLite interpreter threads (0 = all CPU cores).", fv=fv)
    _loose(flags.DEFINE_string, "benchmark_output", "benchmark_out",
           "Folder for benchmark.json and benchmark.png.", fv=fv)
    _loose(flags.DEFINE_bool, "quick", False, "Smoke test: tiny configs, seq 16, 2 runs "
           "(refused with explicit --benchmark_models).", fv=fv)


def define_pretokenize_tool_flags(fv: flags.FlagValues = FLAGS) -> None:
    """`bin/pretokenize`: a general corpus -> packed TFRecord shards."""
    if not _first_time(fv, "pretokenize"):
        return
    define_corpus(fv, "Corpus to pre-tokenise: text files/globs (BERT format, .gz/.bz2), a "
                  "Wikipedia XML dump (.xml.bz2), or tfds:NAME. Empty: the Wikipedia sample "
                  "shipped in gensim.")
    s, i, e = flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_enum
    _loose(s, "vocab", "", "WordPiece vocab.txt, or a model directory holding one (the "
           "student's vocab, i.e. the teacher's).", fv=fv)
    _loose(s, "output", "", "Shard prefix: writes PREFIX-00000-of-0000N.tfrecord ... and "
           "PREFIX.json.", fv=fv)
    _loose(s, "tfds_data_dir", "", "TFDS data_dir for tfds sources (prepared offline).", fv=fv)
    _loose(i, "max_seq_len", 128, "Packed sequence length.", fv=fv)
    _loose(e, "corpus_format", "auto", ["auto", "text", "wiki", "tfds"],
           "How to read --corpus; auto decides from the name.", fv=fv)
    _loose(e, "pack", "pair", ["pair", "single"], "pair: [CLS] A [SEP] B [SEP] (TinyBERT); "
           "single: one segment (DistilBERT).", fv=fv)
    _loose(i, "num_shards", 8, "TFRecord shards to write (documents are dealt round-robin; "
           "more shards than workers balances the load).", fv=fv)
    _loose(i, "num_workers", 0, "Worker processes (0 = all CPU cores).", fv=fv)
    _loose(flags.DEFINE_bool, "lower_case", True, "Lower-case and strip accents (uncased "
           "vocab).", fv=fv)
