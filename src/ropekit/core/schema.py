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

__all__ = ["MAX_POSITIONS", "ConfigProblem", "Name", "Number", "StrictModel", "WholeNumber", "config_error", "key_path", "load_yaml",
           "read_yaml_file", "validate"]

M = TypeVar("M", bound=BaseModel)

#: Largest window (position count) a method may declare and a config may ask for: 2^24, the last integer float32
#: holds exactly. transformers computes the rotary angles as ``position_ids.float() @ inv_freq`` (each family's
#: rotary embedding), so past it neighbouring positions share one angle.
MAX_POSITIONS = 1 << 24


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


# ---- the one YAML reader of every config ----------------------------------------------------------------------
#: Most nodes a document may hold once its aliases are expanded. Hand-written configs hold hundreds; the
#: "billion laughs" document (nine nested aliases of ten) holds 10⁹ and takes gigabytes to walk.
ALIAS_BUDGET = 100_000
#: Largest config file read (bytes): a config is a page of keys, not data.
MAX_CONFIG_BYTES = 1 << 20


def _yaml_loader(any_tag: bool = False):
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader refusing duplicate keys (YAML 1.2 §3.2.1.1: keys are unique; PyYAML keeps the last one)."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeLoader's own error names it
                        continue
                    if first is not None:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark)
                    seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    if any_tag:  # lm-eval's task files tag values (`!function utils.process_docs`): read them as plain values
        def tagged(loader, suffix, node):
            if isinstance(node, yaml.ScalarNode):
                return loader.construct_scalar(node)
            if isinstance(node, yaml.SequenceNode):
                return loader.construct_sequence(node)
            return loader.construct_mapping(node)

        Loader.add_multi_constructor("!", tagged)
    return Loader


def _expanded_size(root) -> int:
    """Nodes of the document with every alias expanded, counted without expanding (shared nodes memoised)."""
    import yaml

    def children(node) -> list:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:  # post-order without recursion: a deep document must not overflow Python's stack
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        if ready:
            sizes[id(node)] = 1 + sum(sizes.get(id(c), 1) for c in children(node))  # a cycle's back edge counts 1
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]


def load_yaml(text: str | bytes, source: str, *, error_cls: type[RopekitError] = RopekitError,
              any_tag: bool = False) -> Any:
    """Parse one hand-written YAML config; every problem is one ``error_cls`` line naming ``source``.

    Refused: bytes that are not UTF-8, a YAML syntax error (with its line and column), a key given twice in one
    mapping (with both lines: PyYAML would silently keep the last), and aliases that expand past
    :data:`ALIAS_BUDGET` nodes (checked on the parsed node graph, before any value is built). ``any_tag``: read
    any ``!tag`` as the plain value it tags (lm-eval task files) instead of refusing it."""
    import yaml

    fix = "fix the YAML syntax"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error_cls(f"{source} is not UTF-8 text (byte {err.start})", "pass a YAML config file") from None
    if "\x00" in text:
        raise error_cls(f"{source} is not text (it holds NUL bytes)", "pass a YAML config file")
    loader = _yaml_loader(any_tag)(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        size = _expanded_size(root)
        if size > ALIAS_BUDGET:
            raise error_cls(f"{source}: its aliases expand to {size:.3g} values, more than the {ALIAS_BUDGET:,} a "
                            "config may hold", "write the values out, or use fewer nested aliases (*name)")
        return loader.construct_document(root)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise error_cls(f"{source} is not valid YAML ({problem}{where})", fix) from None
    except RecursionError:
        raise error_cls(f"{source} nests too deeply", "write a flatter config") from None
    finally:
        loader.dispose()


def read_yaml_file(path, source: str | None = None, *, error_cls: type[RopekitError] = RopekitError,
                   any_tag: bool = False) -> Any:
    """:func:`load_yaml` of a file (its size bounded by :data:`MAX_CONFIG_BYTES`); ``source`` names it."""
    from pathlib import Path

    path = Path(path)
    source = source or f"'{path}'"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise error_cls(f"{source} is {size:,} bytes, not a config (at most {MAX_CONFIG_BYTES:,})",
                            "pass a YAML config file")
        data = path.read_bytes()
    except OSError as err:
        raise error_cls(f"cannot read {source}: {err.strerror}", "pass a readable YAML file") from None
    return load_yaml(data, source, error_cls=error_cls, any_tag=any_tag)
