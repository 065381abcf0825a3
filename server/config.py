"""Service settings (pydantic-settings): defaults < a TOML file < environment < arguments.

Every field can be set from the environment with the ``WS_TUNE_`` prefix
(``WS_TUNE_DB``, ``WS_TUNE_HEARTBEAT_INTERVAL``, ...) or from a TOML file named
by ``WS_TUNE_CONFIG`` (see ``configs/service.toml``). ``kernel_dirs`` takes a
comma-separated list in the environment. A name this file does not know, in
the TOML file or as a ``WS_TUNE_*`` variable, is an error naming the nearest
setting: a typo must not silently leave a default in force.
"""

from __future__ import annotations

import difflib
import math
import os
import string
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..database_url import check_db_url
from ..store.guard import DbTimeouts
from .security import is_loopback

ENV_PREFIX = "WS_TUNE_"
CONFIG_ENV = "WS_TUNE_CONFIG"
# WS_TUNE_* variables that are not settings: read by the CLI (`ws-tune jobs` its URL and
# token), by docker/compose.yaml (the env file), or by the test suite.
OTHER_VARIABLES = frozenset({CONFIG_ENV, "WS_TUNE_DEBUG", "WS_TUNE_URL", "WS_TUNE_TOKEN", "WS_TUNE_ENV_FILE",
                             "WS_TUNE_FUZZ_EXAMPLES", "WS_TUNE_SLOW", "WS_TUNE_SPACE_SAMPLES"})  # fmt: skip
TEST_PREFIX = "WS_TUNE_TEST_"
MIB = 1024 * 1024
MIN_TOKEN_LENGTH = 24
MIN_TOKEN_BITS = 100  # as estimated by token_bits(); secrets.token_urlsafe(32) scores about 240
_ALPHABETS = (string.digits, "0123456789abcdef", string.ascii_lowercase, string.ascii_letters + string.digits,
              string.ascii_letters + string.digits + "-_", string.printable.strip())  # fmt: skip


def token_bits(secret: str) -> float:
    """A rough lower estimate of a token's entropy: its distinct three-character
    runs, each worth the bits of the smallest alphabet that spells the token.
    Repetition ("changethis" three times) and placeholders score low; random
    strings of 24 or more url-safe characters score well above MIN_TOKEN_BITS."""
    alphabet = next((a for a in _ALPHABETS if set(secret) <= set(a)), None)
    size = len(alphabet) if alphabet else 256
    runs = {secret[i : i + 3] for i in range(max(len(secret) - 2, 0))}
    return len(runs) * math.log2(size)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # --- where results live --------------------------------------------------
    db: str | None = Field(None, description="Database URL or SQLite path; None: ~/.cache/ws-tune/ws-tune.db")

    # --- the HTTP server -----------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    http_workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes")
    workers: int | None = Field(
        None, ge=0, le=64, description="embedded tuning workers started by `ws-tune serve` (None: 1 on SQLite, 0 otherwise)"
    )
    kernel_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="directories whose *.py kernel files are registered by name at start-up"
    )
    bootstrap_token: SecretStr | None = Field(
        None, description="an admin token given by the environment (e.g. a compose secret), accepted besides the stored ones"
    )
    public_reads: bool = Field(
        True, description="GET endpoints need no token (mutations always do); only on a loopback host: beyond it, reads need a token"
    )
    max_body_bytes: int = Field(1 * MIB, ge=1024, description="larger request bodies get 413")
    body_timeout: float = Field(30.0, gt=0, description="seconds a client has to send a request's body (then 408)")
    upload_check_workers: int = Field(2, ge=1, le=16, description="processes that check uploaded sources' syntax")
    upload_check_timeout: float = Field(10.0, gt=0, description="seconds an uploaded source may take to parse")
    upload_check_memory: int = Field(1024 * MIB, ge=64 * MIB, description="bytes of memory one check may use")
    max_budget: int = Field(100_000, ge=1)
    best_cache_ttl: float = Field(1.0, ge=0, description="seconds a best-schedule answer is served from memory")
    workload_directory_ttl: float = Field(
        1.0, ge=0, description="seconds the list of existing workloads is trusted (a lookup of an absent key makes no query); 0: ask each time"
    )
    auth_cache_ttl: float = Field(2.0, ge=0, description="seconds a token check is remembered (revocation delay)")
    log_level: str = "info"
    access_log: bool = Field(False, description="log every request (uvicorn's access log; about a quarter more CPU per request)")
    threads: int = Field(
        40, ge=1, le=1000, description="threads that run blocking route code; the database pool holds as many connections"
    )

    db_timeout: float = Field(
        15.0, gt=0, le=600, description="seconds one database call may take (statements, locks, a silent connection)"
    )

    # --- workers and leases --------------------------------------------------
    heartbeat_interval: float = Field(5.0, gt=0)
    grace_period: float | None = Field(None, gt=0, description="stale after this many seconds; None: 3 x heartbeat")
    max_retry: int = Field(2, ge=0, description="re-runs of a candidate whose worker was lost, before quarantine")
    drain_timeout: float = Field(600.0, ge=0, description="on SIGTERM, seconds to finish the candidates in flight")
    poll_interval: float = Field(1.0, gt=0, description="seconds between looks for work when idle")
    kernel_cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "ws-tune" / "kernels")

    @field_validator("db")
    @classmethod
    def _check_db(cls, value: str | None) -> str | None:
        return check_db_url(value, "db") if value else None

    @field_validator("kernel_dirs", mode="before")
    @classmethod
    def _split_dirs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [Path(p.strip()) for p in value.replace(os.pathsep, ",").split(",") if p.strip()]
        return value

    @field_validator("bootstrap_token")
    @classmethod
    def _no_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        secret = value.get_secret_value()
        if len(secret) < MIN_TOKEN_LENGTH or token_bits(secret) < MIN_TOKEN_BITS:
            raise ValueError(
                f"WS_TUNE_BOOTSTRAP_TOKEN must be a random string of at least {MIN_TOKEN_LENGTH} characters, "
                "not a word or a repeated pattern (e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        return value

    @property
    def reads_need_token(self) -> bool:
        """Reads are public only when allowed and the server listens on loopback alone."""
        return not (self.public_reads and is_loopback(self.host))

    @property
    def db_timeouts(self) -> DbTimeouts:
        return DbTimeouts.within(self.db_timeout)

    @property
    def grace(self) -> float:
        return self.grace_period if self.grace_period is not None else 3 * self.heartbeat_interval

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        _check_variables(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, dotenv_settings]
        config = os.environ.get(CONFIG_ENV)
        if config:
            if not Path(config).is_file():
                raise ValueError(f"{CONFIG_ENV}={config}: no such file")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config)))
        return (*sources, file_secret_settings)


def _nearest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _check_variables(settings_cls: type[BaseSettings]) -> None:
    """Every WS_TUNE_* variable in the environment must be one ws-tune reads."""
    known = [ENV_PREFIX + name.upper() for name in settings_cls.model_fields] + sorted(OTHER_VARIABLES)
    for name in sorted(os.environ):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in known and not upper.startswith(TEST_PREFIX):
            raise ValueError(f"unknown environment variable {name}{_nearest(upper, known)}")


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and config file, with explicit overrides
    (command-line options) on top; None values are not overrides."""
    from pydantic import ValidationError

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        if first.get("type") == "extra_forbidden":
            name = ".".join(str(p) for p in first.get("loc", ()))
            source = f" in {os.environ[CONFIG_ENV]}" if os.environ.get(CONFIG_ENV) else ""
            raise ValueError(f"unknown setting {name!r}{source}{_nearest(name, list(Settings.model_fields))}") from None
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise ValueError(f"invalid setting {where}: {message}") from None
