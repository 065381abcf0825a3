"""Dependencies: compatible ranges in pyproject.toml for users, the exact set CI
tests in constraints.txt, and the two consistent with each other and with what
is installed here."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, Version]:
    lines = (ln.strip() for ln in (ROOT / "constraints.txt").read_text().splitlines())
    pairs = (ln.split("==") for ln in lines if ln and not ln.startswith("#"))
    return {canonicalize_name(name): Version(version) for name, version in pairs}


def test_runtime_dependencies_are_ranges_not_pins():
    for spec in PROJECT["dependencies"]:
        req = Requirement(spec)
        assert not any(s.operator in ("==", "===") for s in req.specifier), spec
        assert any(s.operator in ("<", "<=", "~=") for s in req.specifier), f"{spec}: no upper bound"


def test_the_constraints_pin_every_dependency_within_its_range():
    pins = _pins()
    for spec in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt pins {name}=={pins[name]}, outside {spec}"


def test_ci_installs_the_constraints_torch_first():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("-c constraints.txt torch==2.13.0") < ci.index("-c constraints.txt -e '.[test]'")
    assert _pins()["torch"] == Version("2.13.0")


def test_this_environment_is_the_tested_set():
    """Where CI ran .ci/run, what is installed is what constraints.txt says (local labels such as +cpu aside)."""
    pins = _pins()
    for dist in ("sqlalchemy", "optuna", "fastapi", "pydantic", "typer", "rich"):
        assert Version(metadata.version(dist)) == pins[canonicalize_name(dist)], dist
