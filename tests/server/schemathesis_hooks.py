"""Schemathesis hooks (for the pytest runs and, through SCHEMATHESIS_HOOKS, the
command line): drop generated path and query values that cannot be sent as
generated, so that the request arriving is the one the generator meant.

On the wire a path or a query string is text, which the server percent-decodes:
for an integer parameter the string "8", its escape "%38" or the list [8] (sent
as "8") is the valid value itself, as "true" is for a boolean; None, or a list
of nothing but None, vanishes from the URL. The negative-data check would
otherwise blame the server for accepting the valid request it received."""

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


def _sendable(ctx: Any, location: str, values: Any) -> bool:
    values = getattr(values, "value", values)  # negative cases come wrapped with their metadata
    if not values:
        return True
    declared = {p.name: p.definition.get("schema", {}).get("type") for p in getattr(ctx.operation, location, ())}
    for name, value in values.items():
        if value is None or (isinstance(value, list) and all(v is None for v in value)):
            return False
        pattern, native = _VALID.get(declared.get(name), (None, ()))
        if pattern is not None and type(value) not in native and pattern.fullmatch(_wire(value)):  # "8", "%38", [8]
            return False
    return True


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    return _sendable(ctx, "query", query)


@schemathesis.hook
def filter_path_parameters(ctx: Any, path_parameters: Any) -> bool:
    return _sendable(ctx, "path_parameters", path_parameters)
