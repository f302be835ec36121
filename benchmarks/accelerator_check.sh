#!/usr/bin/env bash
# Accelerator check: on a machine with an NVIDIA GPU, measure in under 10 minutes
#   1. the distillation step (benchmarks/bench_distill.py: BERT-base-shaped teacher,
#      TinyBERT4 student, seq 128) in fp32, bf16 and fp16, each without and with XLA;
#   2. a two-GPU mirrored run (bf16 and bf16+xla) when at least two GPUs are visible;
#   3. the inference benchmark (bin/benchmark: Keras and SavedModel, batch 1/32/256);
# printing examples/s and MFU against the device's dense 16-bit peak (a table of
# known GPUs below; PEAK_TFLOPS=... overrides it). On a machine without a GPU it
# says so and exits 0.
#
#   benchmarks/accelerator_check.sh            # everything (< 10 minutes)
#   STEPS=5 BATCH=64 benchmarks/accelerator_check.sh
#
# Exit codes: 0 measured (or no GPU here), 1 a GPU is present but TensorFlow cannot
# use it, or a measurement failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
STEPS=${STEPS:-10}
BATCH=${BATCH:-64}
# Per-part time limits (seconds), together under 10 minutes.
LIMIT_STEP=${LIMIT_STEP:-300}
LIMIT_MIRRORED=${LIMIT_MIRRORED:-120}
LIMIT_INFER=${LIMIT_INFER:-150}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "accelerator_check: no NVIDIA GPU on this machine (nvidia-smi finds none);" \
         "nothing to measure here. Run it on a GPU machine; exiting 0."
    exit 0
fi
GPUS=$(nvidia-smi -L | grep -c '^GPU')
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
# TensorFlow loaded as the bin/ tools load it (tinybert_tf/startup.py: a faster start).
if ! "$PY" -c "import sys; from tinybert_tf.startup import import_tensorflow as load
sys.exit(0 if load().config.list_physical_devices('GPU') else 3)" >/dev/null 2>&1; then
    echo "accelerator_check: nvidia-smi sees $GPUS x $NAME but TensorFlow finds no GPU:" \
         "install the CUDA build (pip install 'tensorflow[and-cuda]') and check" \
         "LD_LIBRARY_PATH / the driver version (nvidia-smi)." >&2
    exit 1
fi

# Dense (no sparsity) bf16/fp16 tensor-core peaks in TFLOP/s, from the vendors' data sheets.
peak_for() {
    case "$1" in
        *H200*|*H100*SXM*|*"H100 80GB HBM3"*) echo 989 ;;
        *H100*NVL*) echo 835 ;;
        *H100*) echo 756 ;;          # PCIe
        *A100*) echo 312 ;;
        *L40S*) echo 362 ;;
        *L40*) echo 181 ;;
        *L4*) echo 121 ;;
        *A10G*) echo 70 ;;
        *A10*) echo 125 ;;
        *V100*) echo 125 ;;          # fp16 only
        *T4*) echo 65 ;;             # fp16 only
        *) echo 0 ;;
    esac
}
PEAK=${PEAK_TFLOPS:-$(peak_for "$NAME")}
echo "== accelerator_check: $GPUS x $NAME, dense 16-bit peak ${PEAK} TFLOP/s per GPU" \
     "($( [ "$PEAK" = 0 ] && echo 'unknown: MFU against the measured matmul peak; set PEAK_TFLOPS' \
          || echo 'PEAK_TFLOPS overrides' ))"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
status=0

echo
echo "== 1. distillation step, one GPU: fp32 / bf16 / fp16, without and with XLA"
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout "$LIMIT_STEP" "$PY" \
    benchmarks/bench_distill.py --batch "$BATCH" --steps "$STEPS" \
    --runs fp32,fp32+xla,bf16,bf16+xla,fp16,fp16+xla --peak_tflops "$PEAK" || status=1

if [ "$GPUS" -ge 2 ]; then
    echo
    echo "== 2. distillation step, two GPUs mirrored (global batch $((2 * BATCH)))"
    CUDA_VISIBLE_DEVICES=0,1 timeout "$LIMIT_MIRRORED" "$PY" benchmarks/bench_distill.py \
        --strategy mirrored --batch "$BATCH" --steps "$STEPS" --runs bf16,bf16+xla \
        --peak_tflops "$PEAK" || status=1
else
    echo
    echo "== 2. two-GPU mirrored run skipped: $GPUS GPU visible"
fi

echo
echo "== 3. inference (bin/benchmark: bert_base_uncased vs tinybert_4l_312d, seq 128)"
OUT=$(mktemp -d)
if CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout "$LIMIT_INFER" "$PY" bin/benchmark \
        --benchmark_formats=keras,saved_model --benchmark_batch_sizes=1,32,256 \
        --benchmark_runs=20 --benchmark_seconds=5 --benchmark_output="$OUT"; then
    "$PY" - "$OUT/benchmark.json" "$PEAK" <<'EOF'
import json, sys
report, peak = json.load(open(sys.argv[1])), float(sys.argv[2])
print(f"{'model':<20}{'runtime':<13}{'batch':>6}{'ex/s':>11}{'TFLOP/s':>9}{'MFU':>8}")
for m in report["models"]:
    for rt, r in m["runtimes"].items():
        for b, eps in r["throughput"].items():
            tflops = eps * m["flops"] / 1e12
            mfu = f"{tflops / peak:.1%}" if peak else "-"
            print(f"{m['name']:<20}{rt:<13}{b:>6}{eps:>11.1f}{tflops:>9.2f}{mfu:>8}")
EOF
else
    status=1
fi
rm -rf "$OUT"
exit $status
