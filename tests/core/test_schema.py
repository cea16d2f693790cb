"""The strict config base and the one translation of pydantic's errors into ropekit's one-line errors."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field, ValidationError, field_validator, model_validator

from ropekit.core.schema import (
    ConfigProblem,
    Name,
    Number,
    StrictModel,
    WholeNumber,
    config_error,
    key_path,
    validate,
)
from ropekit.errors import RopekitError


class Stage(StrictModel):
    seq_len: int = Field(ge=2, examples=[4096])
    reset: bool = False


class Section(StrictModel):
    lr: float = Field(default=2e-5, gt=0, le=1, examples=["2.0e-5"])
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    name: str = Field(default="x", min_length=1)
    stages: list[Stage] = Field(default_factory=list, min_length=1)
    extra: Stage | None = None

    @field_validator("name")
    @classmethod
    def _no_spaces(cls, value: str) -> str:
        if " " in value:
            raise ValueError("must not contain spaces")
        return value


class MyError(RopekitError):
    pass


def line(raw, prefix="train", error_cls=RopekitError) -> str:
    with pytest.raises(ValidationError) as info:
        Section.model_validate(raw)
    err = config_error(info.value, Section, prefix=prefix, error_cls=error_cls)
    assert isinstance(err, error_cls)
    assert "\n" not in str(err)
    return str(err)


@pytest.mark.parametrize("raw, expected", [
    ({"lrr": 1e-4}, "train.lrr: unknown key. did you mean 'lr'? known keys: lr, schedule, name, stages, extra."),
    ({"stages": [{"seq_len": 8, "rset": True}]},
     "train.stages[0].rset: unknown key. did you mean 'reset'? known keys: seq_len, reset."),
    ({"lr": "fast"}, "train.lr: must be a number, got 'fast'. write e.g. lr: 2.0e-5."),
    ({"lr": 0}, "train.lr: must be > 0, got 0. write e.g. lr: 2.0e-5."),
    ({"lr": 2}, "train.lr: must be ≤ 1, got 2. write e.g. lr: 2.0e-5."),
    ({"stages": [{"seq_len": 8}, {"seq_len": 1.5}]},
     "train.stages[1].seq_len: must be a whole number, got 1.5. write e.g. seq_len: 4096."),
    ({"stages": [{"seq_len": 1}]}, "train.stages[0].seq_len: must be ≥ 2, got 1. write e.g. seq_len: 4096."),
    ({"stages": [{}]}, "train.stages[0].seq_len: missing. add e.g. seq_len: 4096."),
    ({"stages": [{"seq_len": 8, "reset": "yes"}]},
     "train.stages[0].reset: must be true or false, got 'yes'. write reset: true or false."),
    ({"stages": [{"seq_len": 8, "reset": 1}]},
     "train.stages[0].reset: must be true or false, got 1. write reset: true or false."),
    ({"stages": [{"seq_len": True}]},
     "train.stages[0].seq_len: must be a whole number, got True. write e.g. seq_len: 4096."),
    ({"schedule": "cosin"}, "train.schedule: must be one of constant, linear, cosine, got 'cosin'. write e.g. schedule: constant."),
    ({"extra": 5}, "train.extra: must be a mapping of keys to values, got 5. write it as `extra:` with indented keys."),
    ({"name": ""}, "train.name: must be a non-empty string, got ''. write e.g. name: NAME."),
    ({"name": "a b"}, "train.name: must not contain spaces."),
    ({"stages": []}, "train.stages: must have at least 1 item(s), got []. write e.g. stages: [ ... ]."),
    ({"stages": [5]},
     "train.stages[0]: must be a mapping of keys to values, got 5. write each item of `stages:` as indented keys (`- key: value`)."),
])
def test_one_line_messages(raw, expected):
    assert line(raw) == expected


def test_without_prefix_and_own_error_class():
    assert line({"lrr": 1}, prefix="", error_cls=MyError).startswith("lrr: unknown key.")


def test_strict_base_keeps_exact_types():
    stage = Stage.model_validate({"seq_len": 8, "reset": True})
    assert stage.seq_len == 8 and type(stage.seq_len) is int and stage.reset is True
    assert Section.model_validate({"lr": 1}).lr == 1.0  # an int is a valid number


def test_key_path():
    assert key_path(("stages", 1, "seq_len")) == "stages[1].seq_len"
    assert key_path(("variants", 0, "method"), prefix="") == "variants[0].method"
    assert key_path(("lr",), prefix="train") == "train.lr"
    assert key_path((), prefix="train") == "train"


class Yaml(StrictModel):
    lr: Number = Field(default=1.0, gt=0, examples=["2.0e-5"])
    steps: WholeNumber = Field(default=1, ge=1, examples=[1000])
    name: Name = "x"


@pytest.mark.parametrize("raw, parsed", [
    ({"lr": "2e-5"}, {"lr": 2e-5}),  # YAML reads an exponent without a dot as a string
    ({"lr": 3}, {"lr": 3.0}),
    ({"steps": 1.0e4}, {"steps": 10000}),
    ({"name": "  tiny "}, {"name": "tiny"}),
])
def test_yaml_types_accept_what_yaml_writes(raw, parsed):
    model = Yaml.model_validate(raw)
    for key, value in parsed.items():
        assert getattr(model, key) == value and type(getattr(model, key)) is type(value)


@pytest.mark.parametrize("raw, expected", [
    ({"lr": "fast"}, "lr: must be a number, got 'fast'"),
    ({"lr": "inf"}, "lr: must be a number, got inf"),
    ({"lr": float("nan")}, "lr: must be a number, got nan"),
    ({"lr": True}, "lr: must be a number, got True"),
    ({"steps": 2.5}, "steps: must be a whole number, got 2.5"),
    ({"steps": True}, "steps: must be a whole number, got True"),
    ({"steps": "10"}, "steps: must be a whole number, got '10'"),
    ({"name": "  "}, "name: must be a non-empty string"),
])
def test_yaml_types_refuse_the_rest(raw, expected):
    with pytest.raises(RopekitError) as info:
        validate(Yaml, raw)
    assert str(info.value).startswith(expected)


class Study(StrictModel):
    window: int = 1
    target: int = 2
    items: list[Stage] = Field(default_factory=list)

    @field_validator("items")
    @classmethod
    def _distinct(cls, items):
        if len(items) > 1 and items[0].seq_len == items[1].seq_len:
            raise ConfigProblem("repeats the first length", "give every stage its own", key="[1].seq_len")
        return items

    @model_validator(mode="after")
    def _beyond(self):
        if self.target <= self.window:
            raise ConfigProblem(f"{self.target} is not beyond the window {self.window}", "raise it", key="target",
                                sentence=True)
        return self


def test_a_validator_names_a_key_below_its_own():
    with pytest.raises(RopekitError) as info:
        validate(Study, {"window": 4, "target": 3})
    assert str(info.value) == "target 3 is not beyond the window 4. raise it."
    with pytest.raises(RopekitError) as info:
        validate(Study, {"items": [{"seq_len": 8}, {"seq_len": 8}]}, prefix="study", error_cls=MyError)
    assert isinstance(info.value, MyError)
    assert str(info.value) == "study.items[1].seq_len: repeats the first length. give every stage its own."
