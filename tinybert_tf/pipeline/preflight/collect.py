"""The collector of what the checks before training find, and the one error that lists
it all."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from tinybert_tf.config import ConfigError
from tinybert_tf.data.examples import DataError
from tinybert_tf.models.checkpoint import CheckpointError
from tinybert_tf.pipeline.stages import Findings


class PreflightError(ValueError):
    """Checks failed before training; the message lists each with its flag and fix."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(dict.fromkeys(errors))  # each message once, in order
        super().__init__(self.errors[0] if len(self.errors) == 1 else
                         f"{len(self.errors)} problems:\n  - " + "\n  - ".join(self.errors))


@dataclasses.dataclass
class Checks(Findings):
    """`Findings` that drop the echoes of an out-of-range flag: once a flag's value is
    refused, later errors about it would only repeat it."""

    range_errors: set = dataclasses.field(default_factory=set)

    def run(self, fn: Callable[[], Any], prefix: str = "") -> Any:
        """fn(), recording its error (ours are ValueErrors naming the flag) instead of raising."""
        try:
            return fn()
        except PreflightError as e:
            self.errors.extend(prefix + m for m in e.errors)
        except (ValueError, ConfigError, CheckpointError, DataError, OSError) as e:
            self.errors.append(prefix + str(e))
        return None

    def final(self) -> list[str]:
        """The errors, each once, without echoes of an out-of-range flag: errors that
        start with the flag, or quote its refused value as a library check words it
        (`name=value`, or the name's last words: `max_seq_len=-1` for
        --general_max_seq_len=-1)."""
        refused = []
        for m in filter(None, (re.match(r"--([a-z_]+)=([^:\s]+):", e)
                               for e in self.range_errors)):
            words = m.group(1).split("_")
            refused += ["_".join(words[i:]) + "=" + m.group(2) for i in range(len(words))]
        out = []
        for e in self.errors:
            if e in self.range_errors:
                out.append(e)
                continue
            m = re.match(r"(?:[a-z_ ]+: )?(--[a-z_]+)\b", e)
            if m and m.group(1) in self.bad_flags:
                continue
            if any(re.search(rf"(?<![\w-]){re.escape(r)}(?![\w.])", e) for r in refused):
                continue
            out.append(e)
        return list(dict.fromkeys(out))

    def range_error(self, flag: str, message: str) -> None:
        self.bad_flags.add(flag)
        self.range_errors.add(message)
        self.errors.append(message)
