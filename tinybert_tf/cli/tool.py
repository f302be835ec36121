"""How every `bin/` tool starts and ends: help, flag parsing, one-line errors, exit codes.

Exit codes, the same for `bin/distill`, `bin/export`, `bin/augment`, `bin/benchmark`
and `bin/pretokenize` (and any tool built on `run_tool`):

  0    done
  2    an error of the command or its environment: a flag, a file, the data, a folder
       in use, a full disk, a read-only folder, a plugin's code; printed as one line
       `TOOL: error: ...` naming the flag or file and the fix
  1    an internal error (a bug): one line naming a file that holds the traceback
  130  interrupted (Ctrl-C; one Python drops is raised again: cli/interrupts.py)
  an error carrying an int `exit_code` attribute ends with that code (75: preempted)

`--help`, `-h`, `--helpshort` and `--helpfull` print the tool's usage and flags and
exit 0, as absl's `app.run` does: `--help` lists the tool's own flags, `--helpfull`
every flag the process defines (absl's logging flags included).

A traceback that passes through a `--plugins` module's file is the plugin's error,
not ours: it is reported as a user error naming the plugin, its file and line.
"""
from __future__ import annotations

import collections
import errno
import os
import re
import sys
import tempfile
import traceback
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
from absl import flags

from tinybert_tf import plugins
from tinybert_tf.cli.flagfiles import expand_flagfiles
from tinybert_tf.cli.interrupts import ctrl_c_always_stops
from tinybert_tf.files import os_fix

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_INTERRUPTED = 130

HELP_FLAGS = {"--help": "short", "-help": "short", "-h": "short", "-?": "short",
              "--helpshort": "short", "-helpshort": "short", "--helpfull": "full",
              "-helpfull": "full"}
FLAGS_MODULE = "tinybert_tf.pipeline.flags"

# What a re-run after a failure or Ctrl-C does (`guard`'s `rerun`): bin/distill and
# bin/augment resume; the other tools say what they do instead.
RESUMES = "re-run the same command: it resumes where it stopped"


def repeated(values: Sequence[Any]) -> list[str]:
    """The items of a comma-list flag given more than once, as text, sorted: a tool that
    would do the work (or print the row) twice refuses them, naming these."""
    return sorted(str(v) for v, n in collections.Counter(values).items() if n > 1)


def help_request(argv: Sequence[str]) -> Optional[str]:
    """"short" or "full" when argv asks for help (before any other parsing), else None."""
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg in HELP_FLAGS:
            return HELP_FLAGS[arg]
    return None


def help_text(fv: flags.FlagValues, usage: str, kind: str) -> str:
    """The tool's usage (its module docstring) and flags: its own ("short"), or every
    flag defined in `fv` ("full")."""
    if kind == "full":
        listing = fv.get_help()
    else:
        listing = fv.module_help(FLAGS_MODULE) or fv.get_help()
    return f"{usage.strip()}\n\nflags:\n{listing}\n"


def parse(fv: flags.FlagValues, argv: Sequence[str]) -> list[str]:
    """Parse argv into `fv`; a bad flag raises UsageError (one line). Returns the rest."""
    try:
        return fv(list(argv))
    except flags.Error as e:
        raise UsageError(str(e).removeprefix("ERROR:: ")) from None


class UsageError(ValueError):
    """Bad command line (unknown or removed flag, stray argument, missing required flag)."""


def run_tool(tool: str, body: Callable[[list[str]], Optional[int]], argv: Sequence[str],
             fv: flags.FlagValues, usage: str) -> int:
    """The whole life of a tool: help, flags, `body(rest_of_argv)`, its exit code.

    body returns an int exit code (anything else: 0); its errors become one line and a
    code (module doc).
    """
    kind = help_request(argv)
    if kind is not None:
        sys.stdout.write(help_text(fv, usage, kind))
        return EXIT_OK

    def parsed_then_body():
        # Flagfiles are expanded here (nested ones relative to the including file), not
        # by absl, whose --flagfile resolves against the current folder.
        rest = parse(fv, expand_flagfiles(argv))
        if len(rest) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(rest[1:])}; use --flag=value "
                             "(see --help).")
        return body(rest)
    return guard(tool, parsed_then_body)


def guard(tool: str, body: Callable[[], Any], user_errors: tuple = (),
          rerun: str = RESUMES) -> int:
    """Run body(); every error becomes one message on stderr and an exit code (module doc).
    `user_errors`: error types of the tool that are user errors besides ValueError's.
    `rerun`: what re-running the command does, said after a full disk or Ctrl-C."""
    try:
        with ctrl_c_always_stops():
            code = body()
    except (ValueError, FileNotFoundError, *user_errors) as e:
        # Our errors are ValueErrors that name the file/flag and the fix.
        return fail(tool, plugin_message(e) or str(e).rstrip())
    except OSError as e:
        return fail(tool, environment_message(e, rerun))
    except tf.errors.OpError as e:
        message = plugin_message(e) or tf_environment_message(e, rerun)
        if message is None:
            return internal_error(tool, e)
        return fail(tool, message)
    except KeyboardInterrupt:
        print(f"{tool}: interrupted; {rerun}.", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as e:
        code = exit_code_of(e)
        if code is not None:
            # An error that knows its exit status (e.g. a preempted run): its message.
            print(f"{tool}: {str(e).rstrip()}", file=sys.stderr, flush=True)
            return code
        message = plugin_message(e)
        if message is not None:
            return fail(tool, message)
        return internal_error(tool, e)  # a bug: one line here, the traceback in a file
    # body's result is an exit code only when it is an int (run() may return its summary).
    return int(code) if isinstance(code, int) and not isinstance(code, bool) else EXIT_OK


def exit_code_of(e: BaseException) -> Optional[int]:
    """The int exit status an error carries (`exit_code`: a preempted run's 75), or None."""
    code = getattr(e, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def fail(tool: str, message: str) -> int:
    print(f"{tool}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USER


def environment_message(e: OSError, rerun: str = RESUMES) -> str:
    """An OSError from the file system as one line: the path, the reason, the fix."""
    where = f"{e.filename}: " if e.filename else ""
    reason = e.strerror or str(e)
    return f"{where}{reason}; {os_fix(e)}; then {rerun}."


_TF_OP_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]")


def tf_environment_message(e: tf.errors.OpError, rerun: str = RESUMES) -> Optional[str]:
    """A TensorFlow I/O error (checkpoints, summaries) caused by the environment, as one
    line; None for other TensorFlow errors."""
    # Without the op TensorFlow names first ("{{function_node __wrapped__SaveV2_...}} ")
    # and last (" [Op:SaveV2]"): the path and the reason are what the user acts on.
    text = " ".join(_TF_OP_NOISE.sub("", e.message or str(e)).split())
    for marker, code in (("No space left", errno.ENOSPC), ("Disk quota", errno.EDQUOT),
                         ("Read-only file system", errno.EROFS),
                         ("Permission denied", errno.EACCES)):
        if marker in text or (isinstance(e, tf.errors.PermissionDeniedError)
                              and code == errno.EACCES):
            fix = os_fix(OSError(code, marker))
            return f"{text[:300]}; {fix}; then {rerun}."
    return None


def plugin_message(e: BaseException) -> Optional[str]:
    """The error as a plugin's ("--plugins=NAME (FILE, line N, in FUNC): Type: text"),
    when the innermost frame of its traceback inside a plugin module lies in one;
    None when no plugin code is involved."""
    frame = plugins.innermost_plugin_frame(e)
    if frame is None:
        return None
    name, filename, line, function = frame
    text = " ".join(str(e).split())[:400]
    return (f"--plugins={name} ({filename}, line {line}, in {function}): "
            f"{type(e).__name__}: {text}; fix the plugin (this error is raised by its code).")


def internal_error(tool: str, e: BaseException) -> int:
    """One line naming the error and a file with its traceback (exit code 1)."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        fd, path = tempfile.mkstemp(prefix=f"{os.path.basename(tool)}-error-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(" ".join(sys.argv) + "\n\n" + text)
        where = f"the traceback is in {path}"
    except OSError:
        where = "no traceback file could be written"
    first = " ".join(str(e).split())[:300]
    print(f"{tool}: internal error: {type(e).__name__}: {first} ({where}; please report it). "
          "Re-running the same command resumes from the last checkpoint.",
          file=sys.stderr, flush=True)
    return EXIT_INTERNAL
