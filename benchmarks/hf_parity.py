"""Our models against Hugging Face transformers itself: the same token ids, the same
outputs.

For each model given, this loads it with `tinybert_tf.load_model` and runs it on a set
of texts chosen to stress the tokenizer (accents, CJK, emoji, control whitespace,
punctuation, a text longer than the sequence), then hands the same texts to
transformers in another Python (`--hf_python`, which has torch and transformers):
`AutoTokenizer.from_pretrained(dir)` must give the same ids, and the `AutoModelFor...`
class its config.json names must give the same last hidden state and head outputs
(logits; a span head's start and end logits). A model directory of ours is first
written as a Hugging Face directory with `hf_io.export_hf` (the `hf` export format);
a Hugging Face directory (`minilm-l6`, the embedded teacher, or any BERT one) is read
by both sides as it is. It prints one row per model and exits 1 when any ids differ
or an output differs by more than --tolerance.

  python3.11 -m venv /tmp/hf-venv
  /tmp/hf-venv/bin/pip install torch transformers numpy   # a CPU build of torch will do
  .venv/bin/python benchmarks/hf_parity.py --hf_python=/tmp/hf-venv/bin/python \
      --models=minilm-l6,runs/demo/task/model,runs/demo/finetune_teacher/model

It needs no network beyond those installs; about 30 s for the demo's models.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()

import numpy as np  # noqa: E402

from tinybert_tf.models.checkpoint import (  # noqa: E402
    detect_format,
    load_model,
    load_tokenizer,
    resolve,
)
from tinybert_tf.models.hf_io import export_hf  # noqa: E402

# Texts on which the two tokenizers must agree: ASCII, accented Latin, CJK, Hangul,
# whitespace and punctuation, a text longer than the sequence.
TEXTS = [
    "TinyBERT distils BERT into small, fast students.",
    "a gripping, beautifully shot film ... but far too long!",
    "Café déjà vu: a naïve façade, Ångström, Œuvre, São Paulo",
    "東京 is the capital of 日本; 서울 of 한국",
    "unbelievably\tweird   spacing\n here\r\nand\u00a0there",
    "emoji 😀👍🏽 and © ® symbols",
    "Mr. O'Neill's 3.14-km run (at 5:30am) cost $1,234.56 & 20%!",
    "UPPER lower MiXeD antidisestablishmentarianism",
    "word " * 200,
]
# Texts with compatibility characters, where tensorflow-text's normaliser folds what
# BERT's keeps (docs/models.md): printed side by side, not counted as failures (an
# export_hf directory's tokenizer.json folds them as ours does; BERT's does not).
COMPAT_TEXTS = [
    "wait for it… the Straße costs ½ of 10™ (x² + y³)",
    "ＦＵＬＬ　ｗｉｄｔｈ！（全角）",
    "ΟΔΥΣΣΕΥΣ and ᾳ",
]

# Runs in --hf_python. Request: {"texts", "max_seq_len", "models": [{"dir", "ids",
# "mask"}], "tokenize": [texts]}. Answer per model: its tokenizer's ids for "texts" and
# its outputs on our ids; and the first model's tokenizer's ids for "tokenize".
CLIENT = r"""
import json, sys
import numpy as np, torch, transformers
from transformers import AutoConfig, AutoModel, AutoTokenizer
req = json.load(sys.stdin)
out = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__},
       "models": []}
for m in req["models"]:
    tok = AutoTokenizer.from_pretrained(m["dir"])
    enc = tok(req["texts"], padding="max_length", truncation=True,
              max_length=req["max_seq_len"], return_tensors="np")
    config = AutoConfig.from_pretrained(m["dir"])
    arch = (config.architectures or ["BertModel"])[0]
    cls = getattr(transformers, arch) if arch != "BertModel" else AutoModel
    model = cls.from_pretrained(m["dir"]).eval()
    ids, mask = torch.tensor(m["ids"]), torch.tensor(m["mask"])
    with torch.no_grad():
        r = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                  output_hidden_states=True)
    head = None
    if getattr(r, "logits", None) is not None:
        head = r.logits.numpy()
    elif getattr(r, "start_logits", None) is not None:
        head = np.stack([r.start_logits.numpy(), r.end_logits.numpy()], -1)
    out["models"].append({"tokenizer": type(tok).__name__, "architecture": arch,
                          "ids": enc["input_ids"].tolist(),
                          "last_hidden": r.hidden_states[-1].numpy().tolist(),
                          "head": None if head is None else head.tolist(),
                          "id2label": {str(k): v for k, v in config.id2label.items()}})
first = AutoTokenizer.from_pretrained(req["models"][0]["dir"])
out["tokenized"] = first(req["tokenize"], add_special_tokens=False)["input_ids"]
json.dump(out, sys.stdout)
"""


def ours(path: str, texts: list[str], max_seq_len: int, workdir: str) -> dict:
    """Our ids and outputs for `texts`, and the Hugging Face directory to compare
    (exported here when the model is ours)."""
    model = load_model(path)
    tokenizer = load_tokenizer(model, max_seq_len)
    batch = tokenizer(texts)
    out = model(batch, training=False)
    hf_dir = resolve(path)
    if detect_format(hf_dir) != "hf":
        hf_dir = export_hf(model, os.path.join(workdir, f"hf_{len(os.listdir(workdir))}"))
    head = out.get("logits")
    return {"dir": hf_dir, "ids": np.asarray(batch["input_word_ids"]).tolist(),
            "mask": np.asarray(batch["input_mask"]).tolist(),
            "sequence": np.asarray(out["sequence_output"], np.float32),
            "head": None if head is None else np.asarray(head, np.float32),
            "label_names": model.label_names, "vocab": model.vocab, "tokenizer": tokenizer}


def our_pieces(tokenizer, texts: list[str], chunk: int = 4096) -> list[list[int]]:
    """Our ids of each text without [CLS], [SEP] and padding."""
    rows = []
    for i in range(0, len(texts), chunk):
        batch = tokenizer(texts[i:i + chunk])
        for ids, mask in zip(np.asarray(batch["input_word_ids"]),
                             np.asarray(batch["input_mask"])):
            rows.append([int(t) for t, m in zip(ids, mask) if m][1:-1])
    return rows


def code_point_texts() -> tuple[list[int], list[str]]:
    """Every assigned code point from U+0020 on (no surrogates or private use), each as
    'x<char>y', so that both a character's own pieces and its effect on word
    boundaries show."""
    points = [c for c in range(0x20, 0x30000)
              if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    return points, [f"x{chr(c)}y" for c in points]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf_python", required=True,
                        help="A Python with torch and transformers installed.")
    parser.add_argument("--models", default="minilm-l6",
                        help="Comma list of model directories (ours or Hugging Face BERT) "
                             "or short names.")
    parser.add_argument("--max_seq_len", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="Largest |difference| of an output allowed.")
    parser.add_argument("--code_points", action="store_true",
                        help="Also tokenise every assigned code point with the first "
                             "model's tokenizer both ways and count the differences.")
    args = parser.parse_args()
    paths = args.models.split(",")
    points, sweep = code_point_texts() if args.code_points else ([], [])
    with tempfile.TemporaryDirectory() as workdir:
        models = [ours(p, TEXTS, args.max_seq_len, workdir) for p in paths]
        request = {"texts": TEXTS, "max_seq_len": args.max_seq_len,
                   "models": [{k: m[k] for k in ("dir", "ids", "mask")} for m in models],
                   "tokenize": COMPAT_TEXTS + sweep}
        proc = subprocess.run([args.hf_python, "-c", CLIENT], input=json.dumps(request),
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 2
    answer = json.loads(proc.stdout)
    print(f"transformers {answer['versions']['transformers']}, "
          f"torch {answer['versions']['torch']}; {len(TEXTS)} texts at {args.max_seq_len} "
          "pieces, outputs compared on our ids at real positions")
    print(f"{'model':48} {'HF class':36} {'ids equal':>10} {'max|Δ| hidden':>14} "
          f"{'max|Δ| head':>12}  labels")
    ok = True
    for path, mine, theirs in zip(paths, models, answer["models"]):
        same = [a == b for a, b in zip(mine["ids"], theirs["ids"])]
        real = np.asarray(mine["mask"])[..., None] > 0  # padded positions are not compared
        hidden = float(np.abs(np.where(
            real, mine["sequence"] - np.asarray(theirs["last_hidden"]), 0)).max())
        head = "-"
        if mine["head"] is not None and theirs["head"] is not None:
            diff = mine["head"] - np.asarray(theirs["head"])
            if diff.ndim == 3:  # per-position outputs: real positions only
                diff = np.where(real, diff, 0)
            head = float(np.abs(diff).max())
        labels = "-"
        if mine["label_names"]:
            theirs_names = [theirs["id2label"][str(i)] for i in range(len(mine["label_names"]))]
            labels = "same" if theirs_names == list(mine["label_names"]) else \
                f"differ: {theirs_names}"
        good = all(same) and hidden <= args.tolerance and (
            head == "-" or head <= args.tolerance) and not labels.startswith("differ")
        ok &= good
        print(f"{path[-48:]:48} {theirs['architecture']:36} {sum(same):>4}/{len(same):<5} "
              f"{hidden:>14.2e} {head if head == '-' else f'{head:.2e}':>12}  {labels}"
              f"{'' if good else '  <- MISMATCH'}")
        for text, a, b in zip(TEXTS, mine["ids"], theirs["ids"]):
            if a != b:
                vocab = mine["vocab"]
                print(f"  {text[:50]!r}\n    ours: {' '.join(vocab[i] for i in a if i)}\n"
                      f"    HF:   {' '.join(vocab[i] for i in b if i)}")
    first, tokenized = models[0], answer["tokenized"]
    vocab = first["vocab"]
    print("\nCompatibility characters (tensorflow-text and export_hf's tokenizer.json fold "
          "them, BERT's own tokenizer keeps them):")
    for text, a, b in zip(COMPAT_TEXTS, our_pieces(first["tokenizer"], COMPAT_TEXTS),
                          tokenized):
        print(f"  {text!r}\n    ours: {' '.join(vocab[i] for i in a)}\n"
              f"    HF:   {' '.join(vocab[i] for i in b)}")
    if sweep:
        mine = our_pieces(first["tokenizer"], sweep)
        differ = [c for c, a, b in zip(points, mine, tokenized[len(COMPAT_TEXTS):]) if a != b]
        kinds = collections.Counter(unicodedata.category(chr(c)) for c in differ)
        print(f"\nCode points tokenised differently: {len(differ)} of {len(points)} assigned "
              f"(U+0020-U+2FFFF); by category: {dict(kinds.most_common())}; below U+0250: "
              + " ".join(f"U+{c:04X}" for c in differ if c < 0x250))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
