"""tinybert_tf: TinyBERT / DistilBERT distillation for Keras 3 on TensorFlow."""
import os as _os

_os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from tinybert_tf.config import PRESETS, BertConfig, get_config  # noqa: E402

__version__ = "0.1.0"
__all__ = ["BertConfig", "PRESETS", "get_config", "load_model", "load_tokenizer", "save_model"]


def __getattr__(name):
    # Checkpoint I/O imports TensorFlow; load it on first use only.
    if name in ("load_model", "load_tokenizer", "save_model"):
        from tinybert_tf.models import checkpoint
        return getattr(checkpoint, name)
    raise AttributeError(name)
