"""Flags typed on the command line that no stage of the run reads, named in a warning.

A setting's `stages` and `read_by` (configs.py) are the stages that read it. Under `--stages=all` a
switch skips a stage (--noquantize, --task_teacher, --general_model,
--augmented_file, --nouse_augmented, --export_formats without int8), and that
stage's own settings are then read by nothing: `--noquantize --quantize_steps=50`
trained no int8 student and said nothing of the 50.

The same holds within a stage for the flags only some registered objects read: a
phase kind's `epochs_flag` and `lr_flag` (`--pkd_lr` without a pkd phase in
--task_phases) and a general recipe's `own_flags` (`--alpha_ce` under
--recipe=tinybert); and for a setting declared `when=(flag, value)` while that flag
has another value (`--tpu` without --strategy=tpu).

A warning, not a refusal: one command line often serves several flagfiles (the
paper's cells take the same `--mlm_model` and `--word_vectors`, and the no-DA
ablation reads neither). Only flags given on the command line itself are named: a
flagfile sets a stage's settings for whoever turns the stage off after it, as the
documented `--flagfile=configs/demo.cfg --noquantize` does. With an explicit
`--stages` nothing is named: a re-run of one stage repeats the whole command.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Collection, Iterable, Iterator, Sequence

from absl import flags

from tinybert_tf import fields
from tinybert_tf.pipeline.settings.configs import PART_TYPES, PipelineConfig
from tinybert_tf.pipeline.stages import get_stage, stage_names
from tinybert_tf.pipeline.training.phases import PHASE_KINDS
from tinybert_tf.pipeline.training.recipes import RECIPES


def unread_flag_warnings(config: PipelineConfig, given: Collection[str],
                         fv: flags.FlagValues) -> list[str]:
    """One warning per flag in `given` (names typed on the command line) set to other than
    its default that this run does not read: its `when=` flag has another value; or,
    under --stages=all, every stage reading it is skipped, or only unlisted phase kinds
    or another recipe read it."""
    given = sorted(n for n in given if _set(fv, n))
    warnings = _condition_warnings(given, fv)
    if tuple(config.run.stages) != ("all",) or not given:
        return warnings
    skipped = {s: _switches(config, s, fv) for s in stage_names()
               if get_stage(s).skipped(config)}
    readers = _readers()
    unread = [n for n in given if readers.get(n) and readers[n] <= set(skipped)]
    return (warnings + _skipped_stage_warnings(skipped, unread, readers, fv)
            + _unused_owner_warnings(config, [n for n in given if n not in unread]))


def _condition_warnings(given: Sequence[str], fv: flags.FlagValues) -> list[str]:
    """Flags in `given` declared `when=(flag, value)` while that flag has another value."""
    warnings = []
    for _, f in _fields():
        name, when = fields.flag_name(f), f.metadata.get("when")
        if name in given and when and fv[when[0]].value != when[1]:
            needed = _spelled_as(when[0], when[1])
            warnings.append(f"--{name}: read only with {needed}, and this run has "
                            f"{_spelled(fv, when[0])}, so it is ignored: drop it, or give "
                            f"{needed}.")
    return warnings


def _unused_owner_warnings(config: PipelineConfig, given: Sequence[str]) -> list[str]:
    """Flags in `given` that only phase kinds --task_phases does not list, or only recipes
    other than --recipe, read."""
    phases = config.distill.task_phases
    by_kind = _owners((k.name, (k.epochs_flag, k.lr_flag)) for k in PHASE_KINDS.values())
    by_recipe = _owners((r.name, r.own_flags) for r in RECIPES.values())
    warnings = []
    for name in given:
        kinds = sorted(by_kind.get(name, ()))
        if kinds and not set(kinds) & set(phases):
            warnings.append(
                f"--{name}: only the {' and '.join(kinds)} phase of the task stage reads it, "
                f"and --task_phases={','.join(phases)} has none, so it is ignored: drop it, "
                f"or add {kinds[0]} to --task_phases.")
        recipes = sorted(by_recipe.get(name, ()))
        if recipes and config.general.recipe not in recipes:
            warnings.append(
                f"--{name}: only --recipe={' or '.join(recipes)} reads it, and this run's "
                f"general stage has --recipe={config.general.recipe}, so it is ignored: drop "
                "it, or change --recipe.")
    return warnings


def _owners(members: Iterable[tuple[str, Iterable[str]]]) -> dict[str, set[str]]:
    """flag -> the names of the registered objects that read it."""
    out: dict[str, set[str]] = {}
    for owner, flag_names in members:
        for flag_name in flag_names:
            if flag_name:
                out.setdefault(flag_name.removeprefix("--"), set()).add(owner)
    return out


def _skipped_stage_warnings(skipped: dict[str, set[str]], unread: Sequence[str],
                            readers: dict[str, set[str]], fv: flags.FlagValues) -> list[str]:
    """For each flag in `unread` (only skipped stages read it), a warning naming the
    flags that skip them."""
    warnings = []
    for name in unread:
        stages = readers[name]
        if any(name in skipped[s] for s in stages):  # the switch itself
            continue
        ordered = [s for s in stage_names() if s in stages]
        switches = " and ".join(_spelled(fv, w) for w in
                                sorted({w for s in ordered for w in skipped[s]}))
        it = "that stage" if len(ordered) == 1 else "those stages"
        warnings.append(
            f"--{name}: only the {' and '.join(ordered)} stage{'s' * (len(ordered) > 1)} "
            f"read{'s' * (len(ordered) == 1)} it, and this run skips {it}"
            f"{f' ({switches})' if switches else ''}, so it is ignored: drop it, or drop "
            f"{switches or f'the flag that skips {it}'}.")
    return warnings


def _fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(config part, field) of every field of the pipeline's configs."""
    for part, cls in PART_TYPES.items():
        for f in dataclasses.fields(cls):
            yield part, f


def _readers() -> dict[str, set[str]]:
    """flag -> the stages that read it, over every config that declares or reads it: those
    its value shapes (`stages=`) and those it only steers (`read_by=`)."""
    out: dict[str, set[str]] = {}
    for _, f in _fields():
        out.setdefault(fields.flag_name(f), set()).update(
            f.metadata.get("stages", ()), f.metadata.get("read_by", ()))
    return out


def _set(fv: flags.FlagValues, name: str) -> bool:
    return name in fv and fv[name].present and fv[name].value != fv[name].default


def _switches(config: PipelineConfig, stage: str, fv: flags.FlagValues) -> set[str]:
    """The flags set to other than their default that skip `stage`: each that alone, on
    the defaults, skips it (--noquantize, and --export_formats without int8, each do);
    else each without which it would run."""
    skipped = get_stage(stage).skipped
    defaults = {name: default for name, default in _declared_defaults() if _set(fv, name)}
    plain = config
    for name, default in defaults.items():
        plain = _with_value(plain, name, default)
    if not skipped(plain):
        alone = {name for name in defaults
                 if skipped(_with_value(plain, name, _value(config, name)))}
        if alone:
            return alone
    return {name for name, default in defaults.items()
            if not skipped(_with_value(config, name, default))}


def _declared_defaults() -> Iterator[tuple[str, Any]]:
    """(flag, default) of every setting that declares a flag."""
    return ((fields.flag_name(f), f.default) for _, f in _fields()
            if f.metadata.get("declared"))


def _value(config: PipelineConfig, name: str) -> Any:
    """The value `config` holds for flag `name`."""
    return next(getattr(getattr(config, part), f.name) for part, f in _fields()
                if fields.flag_name(f) == name)


def _with_value(config: PipelineConfig, name: str, value: Any) -> PipelineConfig:
    """`config` with every field read from flag `name` set to `value`."""
    changed: dict[str, dict[str, Any]] = {}
    for part, f in _fields():
        if fields.flag_name(f) == name:
            changed.setdefault(part, {})[f.name] = value
    return dataclasses.replace(config, **{
        part: dataclasses.replace(getattr(config, part), **values)
        for part, values in changed.items()})


def _spelled(fv: flags.FlagValues, name: str) -> str:
    """A flag as the command line gives it: --name / --noname for a bool."""
    return _spelled_as(name, fv[name].value)


def _spelled_as(name: str, value: Any) -> str:
    """--name=value, or --name / --noname for a bool."""
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no{name}"
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"--{name}={value}"
