"""Validation of the files a benchmark reads: a protocol JSON and a ``--reuse`` results.json.

Each is checked against its schema before it is used, so a hand-edited or damaged file ends in one line
naming the file, the key and what it should hold (``ValueError``), never a ``TypeError`` traceback.
"""
from __future__ import annotations

from ..schema import check_object, expect, fits, json_kind


def check_protocol_data(data, file: str, Protocol: type, Variant: type, Reference: type, Budget: type) -> None:
    """Check a protocol file's JSON against the schema of :class:`~inferlearn.benchmark.protocols.Protocol` (the
    protocol itself, each variant, reference and budget: the dataclasses given, whose fields are the schema)."""
    fix = "correct it in the file (see `inferlearn benchmark --list` for the built-in protocols)"
    check_object(data, Protocol, file, "", fix)
    for key, cls in (("variants", Variant), ("references", Reference)):
        for i, item in enumerate(data.get(key) or []):
            check_object(item, cls, file, f"{key}[{i}] ", fix)
    for key in ("cpu", "smoke"):
        if isinstance(data.get(key), dict):
            check_object({"name": key, **data[key]}, Budget, file, f"{key} ", fix)


#: the keys of a results.json row that ``--reuse`` reads, and their types
ROW_TYPES = {"variant": "str", "rule": "str", "options": "dict", "search": "list", "chosen": "dict | None",
             "finals": "list"}
SEARCH_TYPES = {"point": "dict", "val_acc": "list"}
FINAL_TYPES = {"seed": "int"}


def check_reuse_rows(rows, file: str) -> None:
    """Check the rows (``variants``) of a ``--reuse`` results.json: each an object with the keys :data:`ROW_TYPES`,
    its search points and final runs objects of :data:`SEARCH_TYPES` and :data:`FINAL_TYPES`."""
    fix = "give the results.json that `inferlearn benchmark` wrote (restore it, e.g. from git)"

    def check(item, types: dict, where: str) -> None:
        if not isinstance(item, dict):
            raise ValueError(f"--reuse {file}: {where} holds {json_kind(item)}, not an object {{...}}; {fix}")
        for key, annotation in types.items():
            if key not in item or not fits(item[key], annotation):
                got = "lacks it" if key not in item else f"holds {json_kind(item[key])}"
                raise ValueError(f"--reuse {file}: {where} key {key!r} must be {expect(annotation)} ({got}); {fix}")

    if not isinstance(rows, list):
        raise ValueError(f"--reuse {file}: 'variants' holds {json_kind(rows)}, not a list of rows; {fix}")
    for i, row in enumerate(rows):
        check(row, ROW_TYPES, f"variants[{i}]")
        for j, point in enumerate(row["search"]):
            check(point, SEARCH_TYPES, f"variants[{i}].search[{j}]")
            if not all(v is None or fits(v, "float") for v in point["val_acc"]):
                raise ValueError(f"--reuse {file}: variants[{i}].search[{j}] key 'val_acc' must hold numbers or "
                                 f"null; {fix}")
        for j, final in enumerate(row["finals"]):
            check(final, FINAL_TYPES, f"variants[{i}].finals[{j}]")
