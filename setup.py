"""tinybert_tf: TinyBERT and DistilBERT distillation for Keras 3 / TensorFlow."""
from setuptools import find_packages, setup

setup(
    name="tinybert_tf",
    version="0.1.0",
    description="Distil BERT into small students (TinyBERT, DistilBERT) with Keras 3 / TF, "
    "and export them to TF Serving and TFLite.",
    packages=find_packages(include=["tinybert_tf", "tinybert_tf.*"]),
    python_requires=">=3.11,<3.13",
    install_requires=[
        "tensorflow>=2.20,<2.22",
        # tensorflow-text must match TensorFlow's minor version; pip resolves the pair.
        "tensorflow-text>=2.20,<2.22",
        # TF Serving protos (PredictRequest, PredictionLog, ModelServerConfig) for the
        # versioned export with warm-up requests; it declares tensorflow>=its own minor,
        # so 2.20.x installs next to TensorFlow 2.20 without changing it.
        "tensorflow-serving-api>=2.20,<2.22",
        # TensorBoard logs of every training phase (tf.summary needs it at run time):
        # TensorFlow 2.20 installs it, 2.21 no longer does.
        "tensorboard>=2.20",
        "keras>=3.12,<4",
        "keras-hub>=0.22",
        "tensorflow-datasets>=4.9.3",
        "gensim>=4.3",
        "absl-py>=1.4",
        "safetensors>=0.4",
        "numpy>=1.26,<3",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        # TFLite model metadata (the Task Library's tokenizer, inputs and labels),
        # written with code generated from tflite-support's metadata_schema.fbs.
        "flatbuffers>=24.3.25",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3.8", "scikit-learn>=1.3", "scipy>=1.10",
                 "ai-edge-litert>=2.1.3", "seqeval>=1.2", "ruff>=0.6",
                 # Hugging Face's tokenizer runtime (keras-hub needs it too): the HF
                 # export's tokenizer.json is checked against it.
                 "tokenizers>=0.20"],
        "tflite": ["ai-edge-litert>=2.1.3"],
    },
    scripts=["bin/distill", "bin/augment", "bin/export", "bin/benchmark", "bin/pretokenize",
             "bin/reproduce"],
)
