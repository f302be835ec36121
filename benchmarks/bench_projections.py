"""What carrying W_e/W_h from general into task distillation changes, on the embedded default.

For each seed, the demo (configs/demo.cfg: the embedded MiniLM-L6 teacher, the polarity
task, the 1-layer student) runs general distillation, teacher fine-tuning and
augmentation once; then the task stage and evaluation run twice from the same
general model, teacher and augmented set, in two folders:

  carried  the general model as the general stage saved it, with its projections;
  new      the same model without them (as a General TinyBERT imported from elsewhere):
           the intermediate phase starts from randomly initialised projections.

Printed per seed and arm, and as mean and spread over seeds: the intermediate phase's
first-step loss and its first-epoch mean loss (Keras' running mean at the epoch's last
step, from task/intermediate/history.jsonl), and the student's dev accuracy
(report.json). Results also go to OUTPUT/projections.json.

Usage (on a quiet machine; about 15 minutes a seed on 2 cores):
  python benchmarks/bench_projections.py --seeds 42,1,2 --output bench_projections_out
  python benchmarks/bench_projections.py --quick     # a smoke run at tiny sizes (~3 min)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This checkout's package, not one installed elsewhere (as bin/distill does).
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

from tinybert_tf.pipeline.main import run_argv  # noqa: E402

DEMO = os.path.join(REPO, "configs", "demo.cfg")
# Tiny sizes for --quick: a few steps of each stage, to check the script end to end.
QUICK = ["--general_max_steps=4", "--teacher_epochs=1", "--num_aug=1",
         "--task_max_steps=6", "--latency_runs=1", "--checkpoint_every=1000"]


def _run(argv: list[str]) -> dict:
    return run_argv(["bin/distill", f"--flagfile={DEMO}", *argv])


def _strip_projections(src: str, dst: str) -> str:
    """A copy of the general model without its projections (file and config entry)."""
    shutil.copytree(src, dst)
    os.remove(os.path.join(dst, "projections.safetensors"))
    path = os.path.join(dst, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config.pop("attachments", None)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return dst


def _arm(base: str, out: str, general: str, seed: int, extra: list[str]) -> dict:
    """The task and evaluate stages in `out`, from `general`, the base run's fine-tuned
    teacher and its augmented set (both copied in, done records and all, so the stage
    check finds them made with this command's settings). No quantize stage: evaluate
    reports the float student."""
    os.makedirs(out, exist_ok=True)
    for stage in ("finetune_teacher", "augment"):
        shutil.copytree(os.path.join(base, stage), os.path.join(out, stage))
    _run([f"--output_dir={out}", "--stages=task,evaluate", f"--seed={seed}",
          f"--general_model={general}", "--noquantize", *extra])
    with open(os.path.join(out, "task", "intermediate", "history.jsonl"),
              encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, "task", "intermediate", "phase_done.json"),
              encoding="utf-8") as f:
        steps = json.load(f)["steps"]
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    with open(os.path.join(out, "run_config.json"), encoding="utf-8") as f:
        epochs = float(json.load(f)["intermediate_epochs"])
    # The first epoch ends at step ceil(steps / epochs) (the whole phase for the demo's one
    # epoch, or for a phase cut short by --task_max_steps).
    first_epoch = [r for r in rows if r["step"] <= -(-steps // max(1.0, epochs))]
    return {"first_step_loss": rows[0]["loss"], "first_epoch_loss": first_epoch[-1]["loss"],
            "dev_accuracy": report["student"]["dev"]["accuracy"],
            "teacher_dev_accuracy": report["teacher"]["dev"]["accuracy"], "steps": steps}


def _summary(values: list[float]) -> str:
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {spread:.4f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--output", default="bench_projections_out")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one seed")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    extra = QUICK if args.quick else []
    results: dict[str, dict[int, dict]] = {"carried": {}, "new": {}}
    for seed in seeds:
        root = os.path.join(os.path.abspath(args.output), f"seed{seed}")
        base = os.path.join(root, "base")
        _run([f"--output_dir={base}", "--stages=general,finetune_teacher,augment",
              f"--seed={seed}", *extra])
        general = os.path.join(base, "general", "model")
        bare = os.path.join(root, "general_without_projections")
        if not os.path.isdir(bare):
            _strip_projections(general, bare)
        for arm, model in (("carried", general), ("new", bare)):
            out = os.path.join(root, arm)
            if os.path.isdir(out):
                shutil.rmtree(out)
            results[arm][seed] = _arm(base, out, model, seed, extra)
            print(f"seed {seed} {arm}: {results[arm][seed]}", flush=True)
    print(f"\nseeds {seeds}; demo config{' (--quick sizes)' if args.quick else ''}")
    print("| projections | first-step intermediate loss | first-epoch intermediate loss "
          "| student dev accuracy |")
    print("|---|---|---|---|")
    for arm in ("carried", "new"):
        runs = [results[arm][s] for s in seeds]
        print(f"| {arm} | " + " | ".join(_summary([r[k] for r in runs]) for k in
              ("first_step_loss", "first_epoch_loss", "dev_accuracy")) + " |")
    with open(os.path.join(os.path.abspath(args.output), "projections.json"), "w",
              encoding="utf-8") as f:
        json.dump({"seeds": seeds, "quick": args.quick, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
