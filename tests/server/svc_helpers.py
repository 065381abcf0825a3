"""Helpers shared by the service tests (conftest.py holds the fixtures)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ws_tuner.server.config import Settings

if TYPE_CHECKING:
    from ws_tuner.workload import WorkloadKey

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHAPE = "M=4096,N=4096,K=4096"
HEARTBEAT, GRACE = 0.3, 1.5
# Workers of test doubles (ws_tuner/testing/service.py): in a thread, or as a process
# through the test-only entry point `python -m ws_tuner.testing.worker`.
FAKE = dict(runner="dummy", builder="fake", space="fake")
FAKE_ARGS = ("--runner", "dummy", "--builder", "fake", "--space", "fake")


def fast_settings(db_url: str, tmp: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = dict(
        db=db_url, kernel_dirs=[EXAMPLES], heartbeat_interval=HEARTBEAT, grace_period=GRACE, poll_interval=0.1,
        kernel_cache_dir=tmp / "kernel-cache", best_cache_ttl=0.0, workload_directory_ttl=0.0, auth_cache_ttl=0.0, drain_timeout=30.0,
    )  # fmt: skip
    return Settings(**{**base, **overrides})


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def log_story(log: str, lines: int = 60, tail: int = 1500) -> str:
    """What a failed assertion on a process's log shows: its own timestamped lines
    (faulthandler's stack dumps left out, which otherwise fill a plain tail), the
    last ``lines`` of them, the first stack dump whole (taken while the process was
    late: it names the wait), then the log's last ``tail`` characters."""
    own = [ln for ln in log.splitlines() if ln[:4].isdigit() and ln[4:5] == "-"]
    dump = re.search(r"^Timeout \(.*?(?=^\d{4}-|^Timeout \(|\Z)", log, re.M | re.S)
    first = f"--- first stack dump ---\n{dump.group(0)}" if dump else ""
    return "\n".join(own[-lines:]) + "\n" + first + "--- end of the log ---\n" + log[-tail:]


def fake_key(device: str = "dev") -> "WorkloadKey":
    from ws_tuner.workload import Environment, WorkloadKey

    return WorkloadKey.make("gemm", "ab" * 32, {"M": 1}, Environment("sm_90a", device, "t", "c", "d"))
