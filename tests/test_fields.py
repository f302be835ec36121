"""A setting is one config field: its flag, range check and stage record come from it."""
from __future__ import annotations

import dataclasses

import pytest
from absl import flags

from tinybert_tf import fields
from tinybert_tf.fields import at_least, flag, non_negative, setting


@dataclasses.dataclass(frozen=True)
class Toy:
    steps: int = setting(3, "Steps.", check=non_negative("0 = none"), stages=("task",))
    rate: float = setting(1, "Rate.", flag="toy_rate", stages=("general", "task"))
    on: bool = setting(True, "On.")
    name: str = setting("a", lambda: "Name: " + ", ".join(("a", "b")) + ".")
    mode: str = setting("x", "Mode.", choices=("x", "y"), stages=("export",))
    terms: tuple[str, ...] = setting(["p", "q"], "Terms.")
    runs: int = setting(2, "Runs.", check=at_least(1))
    late: str = setting("", group="other")
    again: int = flag("steps", stages=("augment",))


def test_define_flags_picks_each_flags_type_from_its_field():
    fv = flags.FlagValues()
    fields.define_flags(fv, Toy)
    assert sorted(fv) == ["mode", "name", "on", "runs", "steps", "terms", "toy_rate"]
    assert fv["steps"].default == 3 and isinstance(fv["steps"].parser, flags.IntegerParser)
    assert isinstance(fv["toy_rate"].parser, flags.FloatParser)
    assert fv["on"].boolean and fv["name"].help == "Name: a, b."
    assert fv["mode"].parser.enum_values == ["x", "y"] and fv["terms"].default == ["p", "q"]


def test_a_group_defines_its_own_fields_and_a_caller_may_give_the_help():
    fv = flags.FlagValues()
    fields.define_flags(fv, Toy, "other", {"late": "Late."})
    assert list(fv) == ["late"] and fv["late"].help == "Late."
    with pytest.raises(ValueError, match="--late .*no help"):
        fields.define_flags(flags.FlagValues(), Toy, "other")


def test_a_config_reads_its_flags_and_lists_become_tuples():
    fv = flags.FlagValues()
    fields.define_flags(fv, Toy)
    fields.define_flags(fv, Toy, "other", {"late": "Late."})
    fv(["prog", "--steps=-2", "--toy_rate=0.5", "--terms=r"])
    toy = fields.from_flags(Toy, fv)
    assert (toy.steps, toy.rate, toy.terms, toy.again) == (-2, 0.5, ("r",), -2)


def test_range_checks_and_stage_fields_come_from_the_metadata():
    toy = Toy(steps=-1)
    checks = {name: (value, ok(value), allowed)
              for name, value, ok, allowed in fields.range_checks(toy)}
    assert checks == {"--steps": (-1, False, ">= 0 (0 = none)"), "--runs": (2, True, ">= 1")}
    assert dict(fields.stage_fields(toy, "task")) == {"steps": -1, "toy_rate": 1}
    assert dict(fields.stage_fields(toy, "augment")) == {"steps": None}
    assert dict(fields.stage_fields(toy, "evaluate")) == {}


def test_an_unknown_stage_is_refused_where_the_setting_is_declared():
    with pytest.raises(ValueError, match="stages=.*'tsak'"):
        setting(1, "One.", stages=("tsak",))


def test_every_stage_records_exactly_the_fields_that_name_it():
    from tinybert_tf.pipeline.settings.configs import PipelineConfig

    from pipeline_helpers import flag_values
    config = PipelineConfig.from_flags(flag_values(output_dir="o"))
    for stage in fields.STAGES:
        named = {fields.flag_name(f) for part in config.parts() for f in dataclasses.fields(part)
                 if stage in f.metadata.get("stages", ())}
        assert set(config.stage_settings(stage)) == named, stage
    assert not any(f.metadata.get("stages") for f in dataclasses.fields(config.run))


def test_the_stage_names_settings_may_name_are_the_built_in_stages():
    """fields.STAGES (below the stage registry, for the typo check where a setting is
    declared) cannot drift from the registered built-ins."""
    from tinybert_tf.pipeline.stages import BUILT_IN
    assert fields.STAGES == tuple(module.NAME for module in BUILT_IN)


def test_a_float_flag_given_as_inf_or_nan_is_out_of_range_with_or_without_a_check():
    """absl's float flags take inf and nan: `--pred_lr=inf` passed "> 0", and a float
    without a range took either."""
    @dataclasses.dataclass(frozen=True)
    class Rates:
        lr: float = setting(1e-3, "Lr.", check=fields.positive())
        weight: float = setting(0.5, "Weight.")

    checks = {name: (ok(value), allowed) for name, value, ok, allowed
              in fields.range_checks(Rates(lr=float("inf"), weight=float("nan")))}
    assert checks == {"--lr": (False, "a finite number > 0"),
                      "--weight": (False, "a finite number")}
    assert [(name, ok(value)) for name, value, ok, _ in fields.range_checks(Rates())] == [
        ("--lr", True)]
    fv = flags.FlagValues()
    fields.define_flags(fv, Rates)
    fv(["prog", "--lr=-inf", "--weight=nan"])
    assert fields.flag_range_errors(fv, [Rates]) == [
        "--lr=-inf: must be a finite number > 0.", "--weight=nan: must be a finite number."]
