"""tinybert_tf: TinyBERT / DistilBERT distillation for Keras 3 on TensorFlow.

Importing the package imports no TensorFlow: every public name below is loaded on
first use. A `bin/` tool imports `tinybert_tf.startup` first, which loads TensorFlow
its own way (see that module).
"""
import os as _os

_os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"
__all__ = ["BertConfig", "PRESETS", "get_config", "load_model", "load_tokenizer", "save_model"]

# Public name -> the module that holds it (each imports TensorFlow).
_LAZY = {"BertConfig": "config", "PRESETS": "config", "get_config": "config",
         "load_model": "models.checkpoint", "load_tokenizer": "models.checkpoint",
         "save_model": "models.checkpoint"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"tinybert_tf.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tinybert_tf' has no attribute {name!r}")
