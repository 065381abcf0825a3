"""API tokens: how they look, how they are hashed, what their scopes allow.

A token is ``wst_`` + 43 url-safe random characters (256 bits). Only its
sha256 is stored; a presented token is hashed and looked up by that hash
(constant-time compared), so neither the database nor the logs ever hold one.
Uploading kernel source is its own scope: it is code the workers will run.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass

TOKEN_PREFIX = "wst_"
READ, JOBS_WRITE, KERNELS_UPLOAD, ADMIN = "read", "jobs:write", "kernels:upload", "admin"
SCOPES = (READ, JOBS_WRITE, KERNELS_UPLOAD, ADMIN)
DEFAULT_SCOPES = (READ, JOBS_WRITE)


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def display_prefix(token: str) -> str:
    """What listings show of a token: enough to tell tokens apart, useless to an attacker."""
    return token[: len(TOKEN_PREFIX) + 6]


def parse_scopes(values: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``["jobs:write,kernels:upload", "read"]`` -> validated, de-duplicated scopes."""
    scopes: list[str] = []
    for value in values or DEFAULT_SCOPES:
        for scope in filter(None, (s.strip() for s in value.split(","))):
            if scope not in SCOPES:
                raise ValueError(f"unknown scope {scope!r}; choose from {', '.join(SCOPES)}")
            if scope not in scopes:
                scopes.append(scope)
    return tuple(scopes)


@dataclass(frozen=True)
class Principal:
    """Who made a request: a stored token (id) or the bootstrap token (id None)."""

    token_id: int | None
    name: str
    scopes: tuple[str, ...]

    def allows(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that resolves who knows where: treat as exposed
