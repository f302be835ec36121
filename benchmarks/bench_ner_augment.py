"""Does tag-preserving augmentation help token classification? Entity F1 with and without.

TinyBERT's Algorithm 1 is defined for sentence tasks. For token tasks we keep the
tag sequence valid by replacing words one for one and copying the tags
(docs/data.md); this script measures what that buys on the news-style NER
fixture (tests/fixtures/own_data/news_ner_{train,dev}.conll: 150 / 60 sentences
from CoNLL-2003-like templates; half of the dev entities are names never seen
in training, `--write_fixture` regenerates them).

Protocol, all on the embedded default (no network): teacher = all-MiniLM-L6-v2
fine-tuned once on the training file (10 epochs); student = 1 x 384
(minilm_1l_384d) after one shared general distillation (the demo's: initialised
from the teacher, 60 steps on the Wikipedia sample); then for each seed, task
distillation (intermediate 2 epochs, prediction 10, the same epochs in both
arms as in the paper) on the original file and on the augmented file (N_a = 4,
p_t = 0.4, K = 15; word vectors trained on the Wikipedia sample: MiniLM has no
MLM head), and the dev entity F1 of each student.

  .venv/bin/python benchmarks/bench_ner_augment.py --output_dir=/tmp/ner_aug [--seeds=3]

Prints one row per run and the mean per arm. Takes ~40 minutes on 2 cores.
"""
import argparse
import json
import os
import random
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

FIXTURE = os.path.join(REPO, "tests", "fixtures", "own_data")
TRAIN, DEV = "news_ner_train.conll", "news_ner_dev.conll"

# Entity names: the first part of each list is used in training, the rest only in dev.
PER = [["Peter", "Blackburn"], ["Angela", "Merkel"], ["John", "Major"], ["Boris", "Yeltsin"],
       ["Nelson", "Mandela"], ["Helmut", "Kohl"], ["Jacques", "Chirac"], ["Bill", "Clinton"],
       ["Romano", "Prodi"], ["Steffi", "Graf"], ["Pete", "Sampras"], ["Tony", "Blair"],
       ["Yasser", "Arafat"], ["Benjamin", "Netanyahu"], ["Kofi", "Annan"],
       ["Carlos", "Menem"], ["Jose", "Aznar"], ["Alan", "Greenspan"], ["Martina", "Hingis"],
       ["Michael", "Schumacher"], ["Gerhard", "Berger"], ["Ernesto", "Zedillo"]]
LOC = [["London"], ["Paris"], ["Germany"], ["Moscow"], ["Brussels"], ["Tokyo"], ["Bonn"],
       ["New", "York"], ["Hong", "Kong"], ["France"], ["Britain"], ["Russia"], ["Japan"],
       ["Madrid"], ["Rome"], ["Chicago"], ["Sydney"], ["Beijing"], ["Cairo"], ["Vienna"],
       ["South", "Africa"], ["Buenos", "Aires"]]
ORG = [["European", "Commission"], ["Deutsche", "Bank"], ["Reuters"], ["NATO"],
       ["General", "Motors"], ["Bundesbank"], ["United", "Nations"], ["Microsoft"],
       ["Barclays"], ["Sony"], ["Fiat"], ["IBM"], ["World", "Bank"], ["Siemens"],
       ["Nestle"], ["Boeing"], ["Ford"], ["Interfax"], ["Lufthansa"], ["Renault"],
       ["Standard", "Chartered"], ["Air", "France"]]
MISC = [["German"], ["British"], ["French"], ["Russian"], ["Japanese"], ["European"],
        ["American"], ["Italian"], ["Spanish"], ["Chinese"], ["Dutch"], ["Australian"],
        ["Swiss"], ["Canadian"], ["Polish"], ["Brazilian"], ["Mexican"], ["Swedish"],
        ["Egyptian"], ["Turkish"], ["World", "Cup"], ["Davis", "Cup"]]
TRAIN_SHARE = 14  # names 0..13 appear in training; 14.. only in dev
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TEMPLATES = [
    "{PER} , the chief executive of {ORG} , said on {DAY} that the company would cut {NUM} jobs .",
    "{ORG} shares fell {NUM} percent in {LOC} on {DAY} after weak results .",
    "{MISC} officials met {PER} in {LOC} to discuss the trade dispute .",
    "The {MISC} government said {ORG} would open a new plant near {LOC} .",
    "{PER} beat {PER} {NUM} - {NUM} in the final in {LOC} .",
    "Police in {LOC} arrested {NUM} people after protests against {ORG} .",
    "{ORG} said its profit rose to {NUM} million dollars in the first half .",
    "{PER} arrived in {LOC} on {DAY} for talks with {MISC} leaders .",
    "A spokesman for {ORG} in {LOC} declined to comment on the report .",
    "{MISC} troops left {LOC} on {DAY} , the {ORG} said .",
    "{PER} told {ORG} that prices in {LOC} would rise next year .",
    "Fans in {LOC} cheered as {PER} won the {MISC} title .",
    "{ORG} and {ORG} agreed to merge their {MISC} operations .",
    "The talks between {PER} and {PER} ended without agreement in {LOC} .",
    "{MISC} exports to {LOC} grew by {NUM} percent last year , {ORG} said .",
]


def make_sentence(rng: random.Random, template: str, unseen: bool):
    words, tags = [], []
    pools = {"PER": PER, "LOC": LOC, "ORG": ORG, "MISC": MISC}
    for token in template.split():
        kind = token.strip("{}") if token.startswith("{") else None
        if kind in pools:
            pool = pools[kind]
            names = pool[TRAIN_SHARE:] if unseen and rng.random() < 0.5 else pool[:TRAIN_SHARE]
            name = rng.choice(names)
            words += name
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
        elif kind == "DAY":
            words.append(rng.choice(DAYS))
            tags.append("O")
        elif kind == "NUM":
            words.append(str(rng.randint(2, 90)))
            tags.append("O")
        else:
            words.append(token)
            tags.append("O")
    return words, tags


def write_fixture(directory: str, train: int = 150, dev: int = 60, seed: int = 1996) -> None:
    rng = random.Random(seed)
    for name, n, unseen in ((TRAIN, train, False), (DEV, dev, True)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write("-DOCSTART- O\n\n")
            for i in range(n):
                words, tags = make_sentence(rng, TEMPLATES[i % len(TEMPLATES)], unseen)
                f.write("".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n")


def distill(argv: list) -> dict:
    from tinybert_tf.startup import start_tensorflow
    start_tensorflow()  # as bin/distill: no CUDA probe error on a machine without a GPU
    from tinybert_tf.pipeline.main import run_argv
    return run_argv(["bin/distill", *argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--num_aug", type=int, default=4)
    parser.add_argument("--teacher_epochs", type=int, default=10)
    parser.add_argument("--pred_epochs", type=int, default=10)
    parser.add_argument("--general_model", default="",
                        help="a General TinyBERT (1 x 384) to reuse; default: distil one")
    parser.add_argument("--write_fixture", action="store_true",
                        help="regenerate the fixture files, then exit")
    args = parser.parse_args()
    if args.write_fixture:
        write_fixture(FIXTURE)
        return
    common = ["--task=token_classification", f"--train_file={os.path.join(FIXTURE, TRAIN)}",
              f"--validation_file={os.path.join(FIXTURE, DEV)}", "--max_seq_len=48",
              "--teacher=minilm-l6", "--student_config=minilm_1l_384d", "--latency_runs=3"]
    general = args.general_model
    start = time.time()
    if not general:
        distill(common + [f"--output_dir={os.path.join(args.output_dir, 'general')}",
                          "--stages=general", "--init_from_teacher",
                          "--general_max_seq_len=64", "--general_batch_size=32",
                          "--general_max_steps=60", "--general_lr=5e-4", "--seed=42"])
        general = os.path.join(args.output_dir, "general", "general", "model")
    teacher_dir = os.path.join(args.output_dir, "teacher")
    distill(common + [f"--output_dir={teacher_dir}", "--stages=finetune_teacher",
                      f"--teacher_epochs={args.teacher_epochs}", "--teacher_lr=1e-4",
                      "--teacher_batch_size=16", "--seed=42"])
    teacher = os.path.join(teacher_dir, "finetune_teacher", "model")
    print(f"general + teacher: {time.time() - start:.0f}s", flush=True)
    rows = []
    for seed in range(args.seeds):
        for arm in ("original", "augmented"):
            out = os.path.join(args.output_dir, f"{arm}_{seed}")
            flags = common + [
                f"--output_dir={out}", f"--seed={seed}",
                f"--general_model={general}", f"--task_teacher={teacher}",
                "--task_batch_size=16", "--intermediate_epochs=2", "--intermediate_lr=5e-4",
                f"--pred_epochs={args.pred_epochs}", "--pred_lr=5e-4", "--stages=" + (
                    "augment,task,evaluate" if arm == "augmented" else "task,evaluate")]
            if arm == "augmented":
                flags += ["--use_augmented", "--augment_fallback", f"--num_aug={args.num_aug}",
                          "--replace_prob=0.4", "--num_candidates=15"]
            else:
                flags += ["--nouse_augmented"]
            start = time.time()
            distill(flags)
            with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
                report = json.load(f)
            row = {"arm": arm, "seed": seed, "seconds": round(time.time() - start),
                   "teacher_f1": report["teacher"]["dev"]["f1"], **report["student"]["dev"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for arm in ("original", "augmented"):
        f1 = [r["f1"] for r in rows if r["arm"] == arm]
        print(f"{arm}: entity F1 mean {sum(f1) / len(f1):.4f} over {len(f1)} seeds: "
              f"{', '.join(f'{v:.4f}' for v in f1)}")


if __name__ == "__main__":
    main()
