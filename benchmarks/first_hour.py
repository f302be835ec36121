"""A newcomer's first hour, timed: from your own CSV (README, "Your own data") to a
served model answering over gRPC, with nothing but the install.

Steps, each timed (wall clock, this machine):
  install     (only with --install) `make install` in a fresh clone of this repository:
              venv, pinned packages from PyPI, the embedded teacher
  data        the polarity sentences shipped in gensim written as a newcomer's CSV files
              (train 160 / dev 40, labels negative/positive; --rows repeats the training
              rows to N for a timing-only run of a bigger file)
  dry_run     bin/distill --flagfile=configs/quickstart_text_classification.cfg ... --dry_run
  distill     the same without --dry_run: every stage to OUT/export (per-stage seconds
              from the stages' own records)
  serve       the exported TF Serving version folder loaded by a server process and asked
              by examples/serving_client.py over gRPC (TF Serving's PredictionService API):
              `tensorflow_model_server` when on PATH, else a Python stand-in of the same
              gRPC service (tensorflow-serving-api) that loads the version folder
  keras_hub   (only with --keras_hub) bin/export of the student to keras-hub with
              --keras_hub_approximate_gelu: the parity row is the cost of keras-hub's tanh
              GELU for the embedded teacher's exact-GELU student

  .venv/bin/python benchmarks/first_hour.py --output_dir=/tmp/first_hour [--keras_hub]
  .venv/bin/python benchmarks/first_hour.py --output_dir=/tmp/first_hour_big --rows=3000

Prints one line per step and a JSON summary (also OUTPUT/first_hour.json). Run it on a
quiet machine: the seconds are the point. --override passes extra flags to bin/distill
(e.g. toy models to check the script itself).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, REPO)

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

QUICKSTART = "configs/quickstart_text_classification.cfg"
TEXTS = ["a gripping, funny film", "dull and overlong", "Café crème: un film charmant"]

# A server of TF Serving's gRPC PredictionService for one SavedModel version folder,
# for machines without tensorflow_model_server (tensorflow-serving-api's protos).
STAND_IN = r"""
import sys, time
from concurrent import futures
import grpc
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer ops, as tensorflow_model_server links them)
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

name, version_dir, port = sys.argv[1], sys.argv[2], sys.argv[3]
loaded = tf.saved_model.load(version_dir)


class Service(prediction_service_pb2_grpc.PredictionServiceServicer):
    def Predict(self, request, context):
        if request.model_spec.name != name:
            context.abort(grpc.StatusCode.NOT_FOUND, "Servable not found")
        fn = loaded.signatures[request.model_spec.signature_name or "serving_default"]
        out = fn(**{k: tf.make_ndarray(v) for k, v in request.inputs.items()})
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for key, value in out.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
        return response


server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Service(), server)
server.add_insecure_port(f"localhost:{port}")
server.start()
print("SERVING", flush=True)
server.wait_for_termination()
"""


def write_csvs(directory: str, rows: int) -> tuple[str, str]:
    """train.csv / dev.csv (text,label) from the polarity sentences shipped in gensim."""
    sys.path.insert(0, REPO)
    from tinybert_tf.data import polarity

    os.makedirs(directory, exist_ok=True)
    split = polarity.split_rows(polarity.default_path())
    names = ["negative", "positive"]
    paths = []
    for name, items in (("train", split["train"]), ("dev", split["dev"])):
        if name == "train" and rows:
            items = [items[i % len(items)] for i in range(rows)]
        path = os.path.join(directory, f"{name}.csv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for _, text, label in items:
                w.writerow([text, names[label]])
        paths.append(path)
    return paths[0], paths[1]


def timed(name: str, results: dict, fn, *args):
    start = time.time()
    value = fn(*args)
    results["seconds"][name] = round(time.time() - start, 1)
    print(f"== {name}: {results['seconds'][name]:.1f} s", flush=True)
    return value


def run(cmd: list[str], cwd: str, log: str) -> None:
    """Run a command with its output in `log`; fail with its tail."""
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        with open(log, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); log {log}:\n{tail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def serve_and_ask(python: str, export_dir: str, log: str) -> list[dict]:
    """Start a server on the newest version folder and ask it with the example client;
    returns the client's answers (one per text)."""
    root = os.path.join(export_dir, "serving")
    version = str(max(int(v) for v in os.listdir(root) if v.isdigit()))
    port = free_port()
    name = "quickstart"
    binary = shutil.which("tensorflow_model_server")
    if binary:
        cmd = [binary, f"--port={port}", f"--model_name={name}", f"--model_base_path={root}"]
    else:
        cmd = [python, "-c", STAND_IN, name, os.path.join(root, version), str(port)]
    with open(log, "w", encoding="utf-8") as f:
        server = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        client = [python, os.path.join(REPO, "examples", "serving_client.py"),
                  f"--host=localhost:{port}", f"--model={name}"]
        client += [f"--text={t}" for t in TEXTS]
        deadline = time.time() + 600
        while True:
            proc = subprocess.run(client, capture_output=True, text=True)
            if proc.returncode == 0:
                return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"serving failed; server log {log}; client: {proc.stderr[-2000:]}")
            time.sleep(1.0)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output_dir", required=True)
    p.add_argument("--rows", type=int, default=0,
                   help="training rows (the 160 polarity rows repeated); 0 = the 160 as they are")
    p.add_argument("--install", action="store_true",
                   help="time `make install` in a fresh clone (needs PyPI) and use its venv")
    p.add_argument("--keras_hub", action="store_true",
                   help="also export to keras-hub with --keras_hub_approximate_gelu (its cost)")
    p.add_argument("--override", action="append", default=[],
                   help="an extra bin/distill flag (repeatable), e.g. toy models for a check")
    args = p.parse_args()
    out = os.path.abspath(args.output_dir)
    os.makedirs(out, exist_ok=True)
    results: dict = {"seconds": {}, "rows": args.rows or 160, "host": os.uname().nodename,
                     "cpus": os.cpu_count(), "load_average_before": os.getloadavg()}
    repo, python = REPO, sys.executable
    if args.install:
        repo = os.path.join(tempfile.mkdtemp(prefix="first-hour-"), "tinybert_tf")
        subprocess.run(["git", "clone", "-q", REPO, repo], check=True)
        timed("install", results, run, ["make", "install"], repo, os.path.join(out, "install.log"))
        python = os.path.join(repo, ".venv", "bin", "python")
    train, dev = timed("data", results, write_csvs, os.path.join(out, "data"), args.rows)
    run_dir = os.path.join(out, "run")
    distill = [python, "bin/distill", f"--flagfile={QUICKSTART}", f"--train_file={train}",
               f"--validation_file={dev}", f"--output_dir={run_dir}", *args.override]
    timed("dry_run", results, run, distill + ["--dry_run"], repo, os.path.join(out, "dry_run.log"))
    timed("distill", results, run, distill, repo, os.path.join(out, "distill.log"))
    for stage in ("general", "finetune_teacher", "augment", "task", "evaluate", "export"):
        with open(os.path.join(run_dir, stage, "stage_done.json"), encoding="utf-8") as f:
            results["seconds"][f"  {stage}"] = json.load(f).get("seconds")
    answers = timed("serve", results, serve_and_ask, python, os.path.join(run_dir, "export"),
                    os.path.join(out, "serve.log"))
    results["answers"] = answers
    with open(os.path.join(run_dir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    results["dev"] = {who: report[who]["dev"] for who in ("teacher", "student")}
    results["ratios"] = report["ratios"]
    if args.keras_hub:
        export = [python, "bin/export", f"--model_dir={run_dir}/task/model",
                  f"--output_dir={out}/keras_hub", "--task=text_classification",
                  f"--train_file={train}", f"--validation_file={dev}",
                  "--export_formats=keras_hub", "--keras_hub_approximate_gelu"]
        timed("keras_hub", results, run, export, repo, os.path.join(out, "keras_hub.log"))
        with open(os.path.join(out, "keras_hub", "export", "parity.json"), encoding="utf-8") as f:
            results["keras_hub_parity"] = json.load(f)["formats"]
    results["total_seconds"] = round(sum(v for k, v in results["seconds"].items()
                                         if not k.startswith(" ") and v), 1)
    results["load_average_after"] = os.getloadavg()
    with open(os.path.join(out, "first_hour.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
