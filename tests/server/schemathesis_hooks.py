"""Schemathesis hooks (for the pytest runs and, through SCHEMATHESIS_HOOKS, the
command line): drop generated path and query values that cannot be sent as
generated, so that the request arriving is the one the generator meant.

On the wire a path or a query string is text: the string "8" for an integer
parameter, or "true" for a boolean, is the valid value itself; None, or a list
of nothing but None, vanishes from the URL. The negative-data check would
otherwise blame the server for accepting the valid request it received."""

from __future__ import annotations

import re
from typing import Any

import schemathesis

_SENT_AS = {"integer": re.compile(r"-?[0-9]+"), "number": re.compile(r"-?[0-9]+(\.[0-9]+)?"), "boolean": re.compile(r"true|false")}


def _sendable(ctx: Any, location: str, values: Any) -> bool:
    values = getattr(values, "value", values)  # negative cases come wrapped with their metadata
    if not values:
        return True
    declared = {p.name: p.definition.get("schema", {}).get("type") for p in getattr(ctx.operation, location, ())}
    for name, value in values.items():
        if value is None or (isinstance(value, list) and all(v is None for v in value)):
            return False
        pattern = _SENT_AS.get(declared.get(name))
        if isinstance(value, str) and pattern is not None and pattern.fullmatch(value):
            return False
    return True


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    return _sendable(ctx, "query", query)


@schemathesis.hook
def filter_path_parameters(ctx: Any, path_parameters: Any) -> bool:
    return _sendable(ctx, "path_parameters", path_parameters)
