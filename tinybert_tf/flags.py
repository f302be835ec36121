"""Every command-line flag of the `bin/` tools, defined here and only here.

Flags come in groups; each tool defines the groups it needs (`define_*`), so
the pipeline's augment stage and `bin/augment` read the very same flags.
Defining a group twice is a no-op (the pipeline and a test may both ask).
"""
from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS
_defined: set[str] = set()

TASK_FORMATS = ("saved_model", "float32", "float16", "dynamic_int8", "int8")
STAGES = ("general", "finetune_teacher", "augment", "task", "evaluate", "export")
LOSS_TERMS = ("embd", "attn", "hidn", "pred")


def _once(group: str) -> bool:
    if group in _defined:
        return False
    _defined.add(group)
    return True


def define_common_flags() -> None:
    if not _once("common"):
        return
    flags.DEFINE_integer("seed", 42, "Random seed for data order, dropout, augmentation.")
    flags.DEFINE_string("strategy", "default",
                        "tf.distribute strategy: default, one_device, mirrored, multi_worker, tpu.")
    flags.DEFINE_string("tpu", "", "TPU address for --strategy=tpu (e.g. grpc://10.0.0.2:8470).")
    flags.DEFINE_enum("mixed_precision", "none", ["none", "mixed_float16", "mixed_bfloat16"],
                      "Keras mixed-precision policy for training; losses stay float32.")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step.")


def define_task_flags() -> None:
    if not _once("task"):
        return
    flags.DEFINE_string("task", "polarity",
                        "Task name: a GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, "
                        "WNLI) or 'polarity' (the embedded demo task). Case-insensitive.")
    flags.DEFINE_string("data_dir", "",
                        "Task data directory in GLUE layout (train.tsv, dev.tsv, ...), "
                        "'tfds' to read TFDS glue/*, or empty for the embedded demo task.")
    flags.DEFINE_string("tfds_data_dir", "", "TFDS data_dir for tfds sources (prepared offline).")
    flags.DEFINE_integer("max_seq_len", 0,
                         "Task sequence length; 0 = 64 for single-sentence tasks, 128 for pairs.")


def define_augment_flags() -> None:
    if not _once("augment"):
        return
    flags.DEFINE_string("mlm_model", "",
                        "Model directory with an MLM head for single-piece candidates (Hugging "
                        "Face BertForMaskedLM dir, keras-hub BertMaskedLM preset dir, or ours). "
                        "Empty: word vectors serve every word.")
    flags.DEFINE_string("word_vectors", "",
                        "Word vectors for multi-piece words: GloVe .txt, word2vec .txt/.bin, or "
                        "gensim .kv. Empty: train Word2Vec on the general corpus and cache it.")
    flags.DEFINE_integer("num_aug", 20, "N_a: augmented variants per example (paper: 20).")
    flags.DEFINE_float("replace_prob", 0.4, "p_t: probability to replace a word (paper: 0.4).")
    flags.DEFINE_integer("num_candidates", 15, "K: candidates per word (paper: 15).")
    flags.DEFINE_string("shard", "", "i/n: augment only the i-th of n slices of the task "
                        "(0-based), for splitting work across machines.")
    flags.DEFINE_integer("augment_batch_size", 256, "Masked rows per MLM forward pass.")
    flags.DEFINE_string("output", "", "bin/augment: the file to write; name it train_aug.tsv "
                        "(in its own folder) to load it as the task's split 'train_aug'.")
    flags.DEFINE_string("vocab", "", "The task tokenizer's vocab.txt (the model trained on the "
                        "output); checked against --mlm_model's vocab. Empty: no check.")
    flags.DEFINE_string("vector_cache", "", "Folder caching Word2Vec trained on --corpus. Empty: "
                        "'vectors' next to --output.")
    flags.DEFINE_integer("vector_vocab_limit", 100000, "Neighbours among the first N words of "
                         "the vector file (the reference: 100000 GloVe words); 0 = all.")
    flags.DEFINE_string("corpus", "",
                        "General corpus (general distillation; Word2Vec for augmentation): text "
                        "files/globs (BERT format, .gz/.bz2), a Wikipedia XML dump (.xml.bz2), "
                        "TFRecord shards (.tfrecord), or tfds:NAME. "
                        "Empty: the Wikipedia sample shipped in gensim.")


def define_export_flags() -> None:
    if not _once("export"):
        return
    flags.DEFINE_list("export_formats", list(TASK_FORMATS),
                      f"What to export: any of {', '.join(TASK_FORMATS)}.")
    flags.DEFINE_integer("representative_examples", 200,
                         "Examples of task text used to calibrate full-integer TFLite.")
    # bin/export (standalone). --output_dir is also the pipeline's flag: defined
    # here with allow_override so either definition order works.
    flags.DEFINE_string("model_dir", None, "bin/export: the task model directory to export "
                        "(config.json + vocab.txt + weights, with a classifier/regressor head).")
    flags.DEFINE_string("output_dir", None, "Where to write (bin/export: OUTPUT/export/).",
                        allow_override=True)
    flags.DEFINE_integer("export_threads", 0, "TFLite interpreter threads for parity latency "
                         "(0 = all CPU cores).")
    flags.DEFINE_integer("export_max_examples", 0, "Dev examples checked for parity (0 = all).")
    flags.DEFINE_integer("export_latency_runs", 30, "Batch-1 calls timed per format.")


def define_benchmark_flags() -> None:
    """`bin/benchmark`: the paper's Table 1 efficiency columns on this machine."""
    if not _once("benchmark"):
        return
    flags.DEFINE_list("benchmark_models", ["bert_base_uncased", "tinybert_4l_312d"],
                      "Two config presets (or config JSON files): teacher, then student.")
    flags.DEFINE_integer("benchmark_seq_len", 128, "Sequence length.")
    flags.DEFINE_list("benchmark_batch_sizes", ["1", "32"], "Batch sizes to time.")
    flags.DEFINE_list("benchmark_formats", ["keras", "saved_model", "float32", "float16",
                                            "dynamic_int8", "int8"],
                      "Runtimes to time: keras, saved_model and TFLite flavours.")
    flags.DEFINE_integer("benchmark_runs", 20, "Timed calls per measurement (median).")
    flags.DEFINE_float("benchmark_seconds", 10.0, "Time budget per measurement; stops early "
                       "(after at least 3 calls) once spent.")
    flags.DEFINE_integer("benchmark_threads", 0,
                         "TFLite interpreter threads (0 = all CPU cores).")
    flags.DEFINE_string("benchmark_output", "benchmark_out",
                        "Folder for benchmark.json and benchmark.png.")
    flags.DEFINE_bool("quick", False, "Smoke test: tiny configs, seq 16, 2 runs.")


def define_pretokenize_flags() -> None:
    """`bin/pretokenize`: a general corpus -> packed TFRecord shards.

    --corpus, --vocab, --output, --max_seq_len and --tfds_data_dir are shared
    with other groups: defined here only when absent, with allow_override so a
    group defined later may take them over.
    """
    if not _once("pretokenize"):
        return
    shared = {
        "corpus": ("", "Corpus to pre-tokenise: text files/globs (BERT format, .gz/.bz2), a "
                   "Wikipedia XML dump (.xml.bz2), or tfds:NAME. Empty: the Wikipedia sample "
                   "shipped in gensim."),
        "vocab": ("", "WordPiece vocab.txt, or a model directory holding one (the student's "
                  "vocab, i.e. the teacher's)."),
        "output": ("", "Shard prefix: writes PREFIX-00000-of-0000N.tfrecord ... and "
                   "PREFIX.json."),
        "tfds_data_dir": ("", "TFDS data_dir for tfds sources (prepared offline)."),
    }
    for name, (default, help_text) in shared.items():
        if name not in FLAGS:
            flags.DEFINE_string(name, default, help_text, allow_override=True)
    if "max_seq_len" not in FLAGS:
        flags.DEFINE_integer("max_seq_len", 128, "Packed sequence length (0 = 128).",
                             allow_override=True)
    flags.DEFINE_enum("corpus_format", "auto", ["auto", "text", "wiki", "tfds"],
                      "How to read --corpus; auto decides from the name.")
    flags.DEFINE_enum("pack", "pair", ["pair", "single"],
                      "pair: [CLS] A [SEP] B [SEP] (TinyBERT); single: one segment (DistilBERT).")
    flags.DEFINE_integer("num_shards", 8, "TFRecord shards to write (documents are dealt "
                         "round-robin; more shards than workers balances the load).")
    flags.DEFINE_integer("num_workers", 0, "Worker processes (0 = all CPU cores).")
    flags.DEFINE_bool("lower_case", True, "Lower-case and strip accents (uncased vocab).")


def define_distill_flags() -> None:
    """The pipeline (`bin/distill`): stages, models, schedules, losses."""
    if not _once("distill"):
        return
    define_common_flags()
    define_task_flags()
    define_augment_flags()
    define_export_flags()
    flags.DEFINE_string("output_dir", None, "Where every stage writes its folder and report.json.")
    flags.DEFINE_list("stages", ["all"], f"Comma list of {', '.join(STAGES)}, or 'all'.")
    flags.DEFINE_bool("overwrite", False, "Start over: delete --output_dir's stage folders first.")
    flags.DEFINE_enum("recipe", "tinybert", ["tinybert", "distilbert"],
                      "Distillation recipe for the general stage.")
    # Models.
    flags.DEFINE_string("teacher", "minilm-l6",
                        "Pre-trained teacher: a model directory (ours, Hugging Face, keras-hub "
                        "preset) or a short name (minilm-l6 = the embedded teacher).")
    flags.DEFINE_string("task_teacher", "",
                        "Fine-tuned teacher with a task head. Empty: the finetune_teacher stage "
                        "fine-tunes --teacher on the task.")
    flags.DEFINE_string("student_config", "tinybert_4l_312d",
                        "Student shape: a preset name or a config JSON file.")
    flags.DEFINE_bool("init_from_teacher", False,
                      "General stage: start the student from the teacher's embeddings and "
                      "its mapped layers (--layer_mapping) instead of random weights, as "
                      "DistilBERT does; needs the teacher's width, FFN size and head count.")
    flags.DEFINE_string("general_model", "",
                        "Student to start task distillation from: a model directory, 'none' "
                        "(random init: the paper's 'no GD' ablation), or empty for "
                        "OUTPUT/general.")
    # General distillation.
    # --corpus is defined with the augment flags (Word2Vec trains on it too).
    flags.DEFINE_integer("general_max_seq_len", 128, "Sequence length of general distillation.")
    flags.DEFINE_integer("general_batch_size", 256, "Global batch size of general distillation.")
    flags.DEFINE_float("general_epochs", 3, "Epochs over the corpus in general distillation.")
    flags.DEFINE_integer("general_max_steps", 0, "Stop general distillation after this many "
                         "steps (0 = no limit).")
    flags.DEFINE_float("general_lr", 1e-4, "Peak learning rate of general distillation.")
    flags.DEFINE_float("general_warmup", 0.1, "Warm-up fraction of general distillation.")
    # Teacher fine-tuning.
    flags.DEFINE_float("teacher_epochs", 3, "Epochs of teacher fine-tuning.")
    flags.DEFINE_float("teacher_lr", 2e-5, "Peak learning rate of teacher fine-tuning.")
    flags.DEFINE_integer("teacher_batch_size", 32, "Batch size of teacher fine-tuning.")
    # Task distillation.
    flags.DEFINE_bool("use_augmented", True, "Task distillation on train_aug (else train).")
    flags.DEFINE_bool("intermediate", True, "Run the intermediate-layer phase of task distillation.")
    flags.DEFINE_float("intermediate_epochs", 20, "Epochs of the intermediate phase.")
    flags.DEFINE_float("intermediate_lr", 5e-5, "Learning rate of the intermediate phase.")
    flags.DEFINE_float("pred_epochs", 3, "Epochs of the prediction-layer phase.")
    flags.DEFINE_float("pred_lr", 3e-5, "Learning rate of the prediction-layer phase.")
    flags.DEFINE_integer("task_batch_size", 32, "Global batch size of task distillation.")
    flags.DEFINE_integer("task_max_steps", 0, "Cap on steps per task phase (0 = none).")
    flags.DEFINE_float("temperature", 1.0, "Temperature t of the prediction loss.")
    flags.DEFINE_integer("eval_every", 0, "Evaluate on dev every N steps in the prediction "
                         "phase (0 = once per epoch); the best checkpoint is kept.")
    # Loss definition and ablations.
    flags.DEFINE_list("loss_terms", ["embd", "attn", "hidn"],
                      "Intermediate loss terms: any of embd, attn, hidn ('trm' = attn,hidn).")
    flags.DEFINE_string("layer_mapping", "uniform",
                        "Student->teacher layer map: uniform, top, bottom, or a comma list "
                        "of teacher layers (1-based) for student layers 1..M.")
    flags.DEFINE_list("layer_weights", [], "lambda_m per student layer 0..M+1 (default all 1).")
    flags.DEFINE_bool("share_hidden_projection", True,
                      "One W_h for all layers (reference code) instead of one per layer.")
    flags.DEFINE_bool("mask_padding", False,
                      "Restrict intermediate losses to real tokens (a deviation from the "
                      "reference; see docs).")
    # Optimisation.
    flags.DEFINE_float("weight_decay", 0.01, "AdamW weight decay (not on LayerNorm or biases).")
    flags.DEFINE_float("warmup_proportion", 0.1, "Linear warm-up fraction of task phases.")
    flags.DEFINE_float("clip_norm", 1.0, "Global-norm gradient clipping (0 = off).")
    flags.DEFINE_integer("grad_accum_steps", 1, "Gradient accumulation steps.")
    # DistilBERT recipe.
    flags.DEFINE_float("alpha_ce", 5.0, "DistilBERT: weight of the soft-target loss.")
    flags.DEFINE_float("alpha_mlm", 2.0, "DistilBERT: weight of the MLM loss.")
    flags.DEFINE_float("alpha_cos", 1.0, "DistilBERT: weight of the cosine loss.")
    flags.DEFINE_float("distil_temperature", 2.0, "DistilBERT: softmax temperature.")
    # Checkpoints, logging.
    flags.DEFINE_integer("checkpoint_every", 200, "Save a checkpoint every N steps.")
    flags.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept per stage.")
    flags.DEFINE_integer("eval_batch_size", 64, "Batch size of evaluation.")
    flags.DEFINE_integer("latency_runs", 30, "Batch-1 forward passes timed for report.json.")
