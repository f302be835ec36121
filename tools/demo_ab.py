"""The demo's dev scores under task-distillation variants, over seeds.

Per seed, the demo's general and finetune_teacher stages run once
(OUT/seed<S>/base, configs/demo.cfg with --seed=S); then each variant runs
augment, task and evaluate in OUT/seed<S>/<variant> from that seed's general
model and fine-tuned teacher (--general_model, --task_teacher; augmentation is
a function of the seed and the same inputs), so variants of one seed differ in
task distillation only. Finished stages are reused, so an interrupted
measurement resumes where it stopped.

Variants (--variants, any of):
  reference      the default: the intermediate phase padded, the reference's
                 losses (padded positions counted)
  mask           --mask_padding --length_buckets=0: the losses over real tokens,
                 batches still padded (the change of objective alone)
  mask_bucketed  --mask_padding: the losses over real tokens, length-bucketed
                 batches (what masking enables)
  bf16_teacher   --teacher_precision=bfloat16 (the frozen teacher in bfloat16)

Prints the student's dev metric per seed and variant, the mean and standard
deviation over seeds, and each variant's paired difference to `reference`.

Usage (the demo's dev set is 40 sentences: one sentence is 2.5 points):
  python tools/demo_ab.py --output_dir runs/demo_ab --seeds 42,1,2,3,4,5,6,7
  python tools/demo_ab.py --output_dir /tmp/ab --seeds 1 --quick   # a smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "reference": [],
    "mask": ["--mask_padding", "--length_buckets=0"],
    "mask_bucketed": ["--mask_padding"],
    "bf16_teacher": ["--teacher_precision=bfloat16"],
}
# --quick: every stage a few steps (checks the script, measures nothing).
QUICK = ["--general_max_steps=2", "--teacher_epochs=1", "--num_aug=1", "--task_max_steps=3",
         "--latency_runs=2"]


def distill(output_dir: str, seed: int, stages: str, extra: list[str]) -> None:
    cmd = [sys.executable, os.path.join(REPO, "bin", "distill"),
           f"--flagfile={os.path.join(REPO, 'configs', 'demo.cfg')}",
           f"--output_dir={output_dir}", f"--seed={seed}", f"--stages={stages}", *extra]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    if done.returncode:
        raise SystemExit(f"bin/distill failed ({done.returncode}): {' '.join(cmd)}")


def dev(output_dir: str) -> tuple[float, float]:
    """(student, teacher) primary dev metric from report.json."""
    with open(os.path.join(output_dir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    metric = report["primary_metric"]
    return report["student"]["dev"][metric], report["teacher"]["dev"][metric]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="a few steps per stage")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; use any of {', '.join(VARIANTS)}.")
    if "reference" not in names:
        names.insert(0, "reference")
    quick = QUICK if args.quick else []
    scores: dict[str, list[float]] = {v: [] for v in names}
    teachers = []
    for seed in seeds:
        base = os.path.join(args.output_dir, f"seed{seed}", "base")
        distill(base, seed, "general,finetune_teacher", quick)
        for name in names:
            out = os.path.join(args.output_dir, f"seed{seed}", name)
            if not os.path.isfile(os.path.join(out, "report.json")):
                # The float student's dev score: no quantize stage (the demo's
                # evaluate would otherwise read its int8 student).
                distill(out, seed, "augment,task,evaluate", quick + VARIANTS[name] + [
                    "--noquantize", f"--general_model={os.path.join(base, 'general', 'model')}",
                    f"--task_teacher={os.path.join(base, 'finetune_teacher', 'model')}"])
            student, teacher = dev(out)
            scores[name].append(student)
        teachers.append(teacher)
    print(f"\nseeds {seeds}; teacher dev {' / '.join(f'{t:.3f}' for t in teachers)}")
    print(f"{'variant':<16}{'student dev per seed':<{8 * len(seeds) + 2}}{'mean':>7}{'sd':>7}"
          f"{'vs reference (paired)':>26}")
    ref = np.asarray(scores["reference"])
    for name in names:
        s = np.asarray(scores[name])
        diff = s - ref
        paired = (f"{diff.mean():+.3f} ± {diff.std(ddof=1) if len(diff) > 1 else 0:.3f}"
                  if name != "reference" else "")
        print(f"{name:<16}{' '.join(f'{v:.3f}'.ljust(7) for v in s):<{8 * len(seeds) + 2}}"
              f"{s.mean():>7.3f}{s.std(ddof=1) if len(s) > 1 else 0:>7.3f}{paired:>26}")


if __name__ == "__main__":
    main()
