"""Schemas of the JSON files inferlearn reads: a value checked against a dataclass field's annotation.

A file read (``config.json``, a protocol, a ``--reuse`` results.json) is checked before it is used, so a hand-edited
or damaged file ends in one line naming the file, the key and what it should hold (``ValueError``), never a
``TypeError`` traceback from deep inside.
"""
from __future__ import annotations

import dataclasses

#: JSON types a dataclass field's annotation accepts (a bool is no number)
JSON_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,),
              "Mapping": (dict,), "tuple": (list,), "list": (list,), "Budget": (dict,), "None": (type(None),)}
_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object {...}",
          list: "a list [...]", type(None): "null"}


def json_kind(value) -> str:
    """What a JSON value is, in words (``a list [...]``, ``a string``, ...)."""
    return next((name for t, name in _NAMES.items() if type(value) is t), type(value).__name__)


def fits(value, annotation) -> bool:
    """Whether a JSON value fits a field's annotation (``"Budget | None"``, ``"float"``, ...)."""
    names = [t.strip() for t in str(annotation).split("|")]
    if isinstance(value, bool) and "bool" not in names:
        return False
    return any(isinstance(value, JSON_TYPES.get(name, (object,))) for name in names)


def expect(annotation) -> str:
    """A field's annotation in words (``"float | None"`` → ``a number or null``)."""
    kinds = [_NAMES[JSON_TYPES[name.strip()][-1]] for name in str(annotation).split("|") if name.strip() in JSON_TYPES]
    return " or ".join(dict.fromkeys(kinds)) or str(annotation)


def check_object(data, cls, file: str, where: str, fix: str) -> None:
    """Raise ``ValueError`` (naming ``file`` and the key) unless ``data`` is an object whose keys that are fields of
    the dataclass ``cls`` hold values of their types (unknown keys are the loader's to refuse)."""
    if not isinstance(data, dict):
        raise ValueError(f"{file}: {where or 'the file'} holds {json_kind(data)}, not an object {{...}} of "
                         f"{cls.__name__} keys; {fix}")
    for f in dataclasses.fields(cls):
        if f.name in data and not fits(data[f.name], f.type):
            raise ValueError(f"{file}: {where}{f.name!r} is {json_kind(data[f.name])} ({str(data[f.name])[:60]!r}), "
                             f"not {expect(f.type)}; {fix}")
