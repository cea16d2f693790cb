"""Config validation (schema.py): the strict pydantic base every YAML config model derives from, and the one
translation of a pydantic :class:`~pydantic.ValidationError` into ropekit's one-line error.

Configs are written by hand, so the base refuses what a lenient parser would guess at: unknown keys (a typo
would otherwise be ignored silently), ``"yes"`` or ``1`` for a bool, ``1.5`` for a whole number. The error
names the key path as a user writes it (``train.lr``, ``stages[1].seq_len``), the problem, and an example.
A field may carry its example as ``Field(..., examples=[VALUE])``; the first one is used in the fix.

Validators raise :class:`ConfigProblem`: its ``key`` names a key below the one being validated (a check of a
whole section that blames one of its keys), and ``sentence`` writes the key as the subject of the problem
(``variants is missing or empty``) instead of in front of it (``variants: must be a list``).

:data:`Number`, :data:`WholeNumber` and :data:`Name` are the field types hand-written YAML needs beyond the
strict base: ``2e-5`` (read by YAML as a string) as a number, ``1.0e+4`` as a whole number, names stripped.
"""

from __future__ import annotations

import difflib
import math
import typing
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    FiniteFloat,
    StringConstraints,
    ValidationError,
)

from ..errors import RopekitError

__all__ = ["ConfigProblem", "Name", "Number", "StrictModel", "WholeNumber", "config_error", "key_path", "validate"]

M = TypeVar("M", bound=BaseModel)


class ConfigProblem(ValueError):
    """Raised by a validator: the problem and its fix; :func:`config_error` puts the key path in front.
    (A ValueError, because pydantic wraps only those with the location of the failing value.)

    ``key``: the key the problem is about, relative to the value being validated (``"params.factor"`` from a
    check of a whole ``method:`` section, ``"[1].name"`` from a check of a list). ``sentence``: the key is the
    subject of ``problem`` (``KEY is missing``), not written in front of it (``KEY: PROBLEM``)."""

    def __init__(self, problem: str, fix: str | None = None, *, key: str | None = None, sentence: bool = False):
        super().__init__(problem)
        self.problem, self.fix, self.key, self.sentence = problem, fix, key, sentence


class StrictModel(BaseModel):
    """Base of every config section: unknown keys forbidden, no type coercion (``strict``)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _number_from_yaml(value: Any) -> Any:
    """YAML 1.1 reads an exponent without a dot (``2e-5``) as a string: such a string is the number it spells."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _whole_from_float(value: Any) -> Any:
    """A float without a fractional part (``1.0e+4``) is the whole number it spells."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


#: A finite number; ``2e-5`` written without a dot (a string to YAML) included.
Number = Annotated[FiniteFloat, BeforeValidator(_number_from_yaml)]
#: A whole number; a float without a fractional part (``1.0e+4``) included, ``true`` and ``1.5`` not.
WholeNumber = Annotated[int, BeforeValidator(_whole_from_float)]
#: A non-empty string, surrounding blanks removed.
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def validate(model: type[M], raw: Any, *, prefix: str = "", error_cls: type[RopekitError] = RopekitError) -> M:
    """``model.model_validate(raw)``, its first problem raised as one :func:`config_error` line."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise config_error(err, model, prefix=prefix, error_cls=error_cls) from None


def key_path(loc: tuple[Any, ...], prefix: str = "") -> str:
    """``('stages', 1, 'seq_len')`` → ``stages[1].seq_len`` (after ``prefix``, itself a key path)."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class a field's annotation holds (through Optional, list[...], dict[..., ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, Any]:
    """The model that owns the last key of ``loc`` and that key's FieldInfo (None where it is not a field)."""
    owner: type[BaseModel] | None = model
    info = None
    keys = [part for part in loc if not isinstance(part, int)]
    for i, part in enumerate(keys):
        if owner is None:
            return None, None
        info = owner.model_fields.get(part)
        if info is None:
            return owner, None
        if i < len(keys) - 1:
            owner = _model_in(info.annotation)
    return owner, info


def config_error(err: ValidationError, model: type[BaseModel], *, prefix: str = "",
                 error_cls: type[RopekitError] = RopekitError) -> RopekitError:
    """The first problem of ``err`` (raised validating ``model``) as one ``error_cls`` line:
    ``KEY: PROBLEM. FIX.``"""
    first = err.errors(include_url=False)[0]
    loc, kind, ctx = tuple(first["loc"]), first["type"], first.get("ctx") or {}
    value = first.get("input")
    key = key_path(loc, prefix) or prefix or "config"
    leaf = next((str(p) for p in reversed(loc) if not isinstance(p, int)), key)
    owner, info = _field_at(model, loc)
    examples = getattr(info, "examples", None) if info is not None else None
    example = examples[0] if examples else None
    write = f"write e.g. {leaf}: {example}" if example is not None else None

    if kind == "extra_forbidden":
        known = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return error_cls(f"{key}: unknown key", f"{hint}known keys: {', '.join(known)}")
    if kind == "missing":
        return error_cls(f"{key}: missing", write.replace("write", "add", 1) if write else f"add `{leaf}:`")
    if kind in ("bool_type", "bool_parsing"):
        return error_cls(f"{key}: must be true or false, got {value!r}", f"write {leaf}: true or false")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return error_cls(f"{key}: must be a whole number, got {value!r}", write or f"write e.g. {leaf}: 1")
    if kind in ("float_type", "float_parsing", "finite_number"):
        return error_cls(f"{key}: must be a number, got {value!r}", write or f"write e.g. {leaf}: 1.0")
    bounds = {"greater_than_equal": ("≥", "ge"), "greater_than": (">", "gt"),
              "less_than_equal": ("≤", "le"), "less_than": ("<", "lt")}
    if kind in bounds:
        op, name = bounds[kind]
        return error_cls(f"{key}: must be {op} {ctx[name]:g}, got {value:g}", write or f"write {leaf} {op} {ctx[name]:g}")
    if kind == "literal_error":
        choices = [c.strip().strip("'") for c in str(ctx.get("expected", "")).replace(" or ", ", ").split(", ")]
        return error_cls(f"{key}: must be one of {', '.join(choices)}, got {value!r}",
                         write or f"write e.g. {leaf}: {choices[0]}")
    if kind in ("string_type", "string_too_short"):
        return error_cls(f"{key}: must be a non-empty string, got {value!r}", write or f"write e.g. {leaf}: NAME")
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        fix = (f"write each item of `{leaf}:` as indented keys (`- key: value`)" if loc and isinstance(loc[-1], int)
               else f"write it as `{leaf}:` with indented keys")
        return error_cls(f"{key}: must be a mapping of keys to values, got {value!r}", fix)
    if kind == "too_short":
        return error_cls(f"{key}: must have at least {ctx.get('min_length', 1)} item(s), got {value!r}",
                         write or f"write e.g. {leaf}: [ ... ]")
    if kind in ("list_type", "tuple_type", "too_long"):
        return error_cls(f"{key}: must be a list, got {value!r}", write or f"write e.g. {leaf}: [ ... ]")
    if kind == "value_error":
        # A validator's own message already reads "PROBLEM — FIX" or is a full problem sentence.
        cause = ctx.get("error")
        if isinstance(cause, ConfigProblem):
            if cause.key:
                base = key_path(loc, prefix)
                key = f"{base}{'' if cause.key.startswith('[') or not base else '.'}{cause.key}"
            return error_cls(f"{key} {cause.problem}" if cause.sentence else f"{key}: {cause.problem}", cause.fix)
        return error_cls(f"{key}: {str(cause or first['msg']).removeprefix('Value error, ')}", write)
    return error_cls(f"{key}: {first['msg']}", write)
