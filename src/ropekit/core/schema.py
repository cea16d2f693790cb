"""Config validation (schema.py): the strict pydantic base every YAML config model derives from, and the one
translation of a pydantic :class:`~pydantic.ValidationError` into ropekit's one-line error.

Configs are written by hand, so the base refuses what a lenient parser would guess at: unknown keys (a typo
would otherwise be ignored silently), ``"yes"`` or ``1`` for a bool, ``1.5`` for a whole number. The error
names the key path as a user writes it (``train.lr``, ``stages[1].seq_len``), the problem, and an example.
A field may carry its example as ``Field(..., examples=[VALUE])``; the first one is used in the fix.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import RopekitError

__all__ = ["ConfigProblem", "StrictModel", "config_error", "key_path"]


class ConfigProblem(ValueError):
    """Raised by a model validator: the problem and its fix; :func:`config_error` puts the key path in front.
    (A ValueError, because pydantic wraps only those with the location of the failing value.)"""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


class StrictModel(BaseModel):
    """Base of every config section: unknown keys forbidden, no type coercion (``strict``)."""

    model_config = ConfigDict(extra="forbid", strict=True)


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
        return error_cls(f"{key}: must be a mapping of keys to values, got {value!r}",
                         f"write it as `{leaf}:` with indented keys")
    if kind == "too_short":
        return error_cls(f"{key}: must have at least {ctx.get('min_length', 1)} item(s), got {value!r}",
                         write or f"write e.g. {leaf}: [ ... ]")
    if kind in ("list_type", "tuple_type", "too_long"):
        return error_cls(f"{key}: must be a list, got {value!r}", write or f"write e.g. {leaf}: [ ... ]")
    if kind == "value_error":
        # A validator's own message already reads "PROBLEM — FIX" or is a full problem sentence.
        cause = ctx.get("error")
        if isinstance(cause, ConfigProblem):
            return error_cls(f"{key}: {cause.problem}", cause.fix)
        return error_cls(f"{key}: {str(cause or first['msg']).removeprefix('Value error, ')}", write)
    return error_cls(f"{key}: {first['msg']}", write)
