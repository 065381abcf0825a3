"""Schemathesis hooks (for the pytest runs and, through SCHEMATHESIS_HOOKS, the
command line): drop generated path and query values that cannot be sent as
generated, so that the request arriving is the one the generator meant.

On the wire a path or a query string is text, which the server percent-decodes:
for an integer parameter the string "8", its escape "%38" or the list [8] (sent
as "8") is the valid value itself, as "true" is for a boolean; None, or a list
of nothing but None, vanishes from the URL. The negative-data check would
otherwise blame the server for accepting the valid request it received.

The coverage phase runs no filter hook: a value it means as wrongly typed (a
random string or list for an integer id) may read as a valid one all the same.
Before such a call the value is given its valid form, which sends the same text,
and schemathesis re-checks the case against the schema and labels it for what it
is."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

import schemathesis

# Per declared type: the text of a valid value, and the Python types the generator gives valid values
# (``type``, not isinstance: True is no integer here).
_VALID = {"integer": (re.compile(r"-?[0-9]+"), (int,)), "number": (re.compile(r"-?[0-9]+(\.[0-9]+)?"), (int, float)),
          "boolean": (re.compile(r"true|false"), (bool,))}  # fmt: skip


def _wire(value: Any) -> str:
    """The text the server reads: percent-decoded; a list in the simple/form style (items joined by commas)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_wire(v) for v in value)
    return unquote(value) if isinstance(value, str) else str(value)


def _declared(operation: Any, location: str) -> dict[str, Any]:
    return {p.name: p.definition.get("schema", {}).get("type") for p in getattr(operation, location, ())}


def _read_as_valid(kind: Any, value: Any) -> Any:
    """The valid value the server reads ``value`` as ("8", "%38", [8]: 8), else None."""
    pattern, native = _VALID.get(kind, (None, ()))
    if pattern is None or type(value) in native or not pattern.fullmatch(text := _wire(value)):
        return None
    return {"integer": int, "number": float, "boolean": lambda t: t == "true"}[kind](text)


def _sendable(ctx: Any, location: str, values: Any) -> bool:
    values = getattr(values, "value", values)  # negative cases come wrapped with their metadata
    if not values:
        return True
    declared = _declared(ctx.operation, location)
    for name, value in values.items():
        if value is None or (isinstance(value, list) and all(v is None for v in value)):
            return False
        if _read_as_valid(declared.get(name), value) is not None:
            return False
    return True


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    return _sendable(ctx, "query", query)


@schemathesis.hook
def filter_path_parameters(ctx: Any, path_parameters: Any) -> bool:
    return _sendable(ctx, "path_parameters", path_parameters)


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: Any) -> None:
    if case.meta is None or not case.meta.generation.mode.is_negative:
        return
    # Setting a container has schemathesis validate it again; the others keep their labels.
    # Numbers only: a bool would go out as Python writes it ("False"), which the server refuses.
    for location in ("path_parameters", "query"):
        values, declared = getattr(case, location) or {}, _declared(case.operation, location)  # None: nothing sent
        read = {name: _read_as_valid(declared.get(name), value) if declared.get(name) != "boolean" else None for name, value in values.items()}
        setattr(case, location, {name: value if read[name] is None else read[name] for name, value in values.items()})
