"""A setting is one typed field of a config dataclass, declared once with `setting`.

The field's metadata holds everything else that is said about it: its help text,
the flag it is read from (its own name unless `flag=` says otherwise), the range
its value must lie in (`check=`), the stages whose output it shapes (`stages=`),
the enum `choices`, and the `group` of flags that defines it. From those fields,
`define_flags` defines the absl flags (the DEFINE_* follows the field's type),
`range_checks` lists the preflight's range checks and `stage_fields` picks the
settings a stage's reuse fingerprint holds.

This module knows no other module of the package: stage names are plain strings
here (`STAGES`), and the task config, the pipeline's configs and its flags all
build on it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from absl import flags

# Every stage whose output a setting may shape, in pipeline order.
STAGES = ("general", "finetune_teacher", "augment", "task", "quantize", "evaluate", "export")
# Those that read the task (all but general distillation): the task's data shapes each.
TASK_STAGES = STAGES[1:]

Help = Union[str, Callable[[], str], None]

# Flags are attributed to the module calling `define_flags` (for --helpfull's
# per-module listing and key flags), not to this one.
flags.disclaim_key_flags()


@dataclasses.dataclass(frozen=True)
class Check:
    """An allowed range: `ok(value)`, and `allowed`, what the error says it must be."""

    ok: Callable[[Any], bool]
    allowed: str


def _note(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


def positive(note: str = "") -> Check:
    """> 0 (`note`, e.g. "seconds", follows the bound without parentheses)."""
    return Check(lambda v: v > 0, f"> 0 {note}" if note else "> 0")


def non_negative(note: str = "") -> Check:
    """>= 0, with what 0 means in parentheses."""
    return Check(lambda v: v >= 0, _note(">= 0", note))


def at_least(low: int, note: str = "") -> Check:
    return Check(lambda v: v >= low, _note(f">= {low}", note))


def within(low: float, high: float, text: str = "") -> Check:
    """low <= v <= high."""
    return Check(lambda v: low <= v <= high, text or f"in [{low}, {high}]")


FRACTION = within(0, 1)


def above_zero_fraction(note: str) -> Check:
    """0 < v <= 1, with why 0 is refused in parentheses."""
    return Check(lambda v: 0 < v <= 1, _note("in (0, 1]", note))


def setting(default: Any, help: Help = None, *, flag: Optional[str] = None,
            check: Optional[Check] = None, stages: Sequence[str] = (),
            choices: Optional[Sequence[str]] = None, kind: Optional[str] = None,
            group: Optional[str] = None, when: Optional[tuple[str, Any]] = None,
            read_by: Sequence[str] = ()) -> Any:
    """A config field that is a flag: its default, help and everything derived from it.

    help: the flag's help, or a function returning it when it lists registered
    names (called when the flag is defined); None when the module defining the
    flag gives it (its list lives in a module that imports the configs).
    flag: the flag's name when it is not the field's.
    check: the range the value must lie in (preflight's range errors).
    stages: the stages whose output the value shapes: their reuse fingerprint holds it.
    choices: an enum flag's values. kind: the DEFINE_* when the field's type does
    not say it ("bool", "integer", "float", "string", "list", "enum").
    group: the `define_*` group of flags.py defining it, when not its class's.
    when: (flag, value): the setting is read only while that flag has that value
    (--tpu only with --strategy=tpu); typed otherwise, it gets a warning.
    read_by: stages that read the value without it shaping their output (how a stage
    runs: --augment_batch_size); typed while they are all skipped, it gets a warning.
    """
    _check_stages(stages)
    _check_stages(read_by)
    meta = {"declared": True, "help": help, "check": check, "stages": tuple(stages),
            "read_by": tuple(read_by),
            "choices": tuple(choices) if choices is not None else None, "kind": kind,
            "group": group, "flag_default": default, "when": when}
    if flag:
        meta["flag"] = flag
    value = tuple(default) if isinstance(default, list) else default
    return dataclasses.field(default=value, metadata=meta)


def flag(name: str, *, stages: Sequence[str] = ()) -> Any:
    """A field read from flag `name`, which another field declares (e.g. the resolved
    and the requested value of one flag)."""
    _check_stages(stages)
    return dataclasses.field(default=None, metadata={"flag": name, "stages": tuple(stages)})


def _check_stages(stages: Sequence[str]) -> None:
    unknown = [s for s in stages if s not in STAGES]
    if unknown or isinstance(stages, str):
        raise ValueError(f"stages={stages!r}: each must be one of {', '.join(STAGES)}.")


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", f.name)


def declared(cls: type, group: Optional[str] = None) -> Iterator[dataclasses.Field]:
    """The fields of `cls` declared with `setting` in `group` (None: the class's own)."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("declared") and f.metadata["group"] == group:
            yield f


_KINDS = {"bool": "bool", "int": "integer", "float": "float", "str": "string",
          "Optional[str]": "string", "tuple[str, ...]": "list"}


def define_flags(fv: flags.FlagValues, cls: type, group: Optional[str] = None,
                 helps: Optional[dict[str, str]] = None) -> None:
    """Define into `fv` the flag of every field of `cls` declared in `group`.

    helps: {flag: help} for the flags whose help the caller gives (see `setting`).
    """
    helps = helps or {}
    for f in declared(cls, group):
        name, meta = flag_name(f), f.metadata
        text = helps.get(name, meta["help"])
        text = text() if callable(text) else text
        if text is None:
            raise ValueError(f"flag --{name} ({cls.__name__}.{f.name}) has no help text.")
        default = meta["flag_default"]
        kind = meta["kind"] or ("enum" if meta["choices"] is not None else _KINDS[str(f.type)])
        if kind == "enum":
            flags.DEFINE_enum(name, default, list(meta["choices"]), text, flag_values=fv)
        elif kind == "list":
            flags.DEFINE_list(name, list(default) if default is not None else None, text,
                              flag_values=fv)
        else:
            getattr(flags, f"DEFINE_{kind}")(name, default, text, flag_values=fv)


def from_flags(cls: type, values: Any) -> Any:
    """An instance of `cls` read from parsed flags (any object with the flags as
    attributes); lists become tuples, as the frozen configs hold them."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = getattr(values, flag_name(f))
        kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def range_error(flag: str, value: Any, allowed: str) -> str:
    """The one line a value outside its range gets: `--flag=value: must be ...`."""
    return f"{flag}={value}: must be {allowed}."


def _range_of(f: dataclasses.Field, value: Any) -> Optional[Check]:
    """The range `value` of field `f` must lie in: its `check`, or, for a float given
    as inf or nan (absl's float flags take both: `--pred_lr=inf` passed "> 0"), none at
    all; None when the field has no range."""
    check = f.metadata.get("check")
    if f.metadata.get("declared") and isinstance(value, float) and not math.isfinite(value):
        return Check(lambda v: False, f"a finite number {check.allowed}" if check is not None
                     else "a finite number")
    return check


def range_checks(part: Any) -> Iterator[tuple[str, Any, Callable[[Any], bool], str]]:
    """(--flag, value, ok, what is allowed) for each field of `part` with a range, and for
    every float field given as inf or nan (`_range_of`)."""
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        check = _range_of(f, value)
        if check is not None:
            yield f"--{flag_name(f)}", value, check.ok, check.allowed


def flag_range_errors(fv: flags.FlagValues, classes: Sequence[type]) -> list[str]:
    """`range_error` for each flag of `fv` defined from a field of `classes` with a range
    whose value lies outside it: the range checks of the tools that read their flags
    without building a config (bin/distill's preflight checks the config's
    `range_checks`, in the same words)."""
    errors = []
    for cls in classes:
        for f in dataclasses.fields(cls):
            name = flag_name(f)
            if name not in fv or not f.metadata.get("declared"):
                continue
            value = fv[name].value
            check = _range_of(f, value)
            if check is not None and not check.ok(value):
                errors.append(range_error(f"--{name}", value, check.allowed))
    return errors


def stage_fields(part: Any, stage: str) -> Iterator[tuple[str, Any]]:
    """(flag, value) of each field of `part` whose `stages` name `stage`."""
    for f in dataclasses.fields(part):
        if stage in f.metadata.get("stages", ()):
            yield flag_name(f), getattr(part, f.name)
