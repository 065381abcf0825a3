"""``ws-tune new`` and docs/kernel-files.md: the template a newcomer starts from
loads, has every part of the contract, yields a space, and compiles; the guide
names real commands and the whole contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_cli import assert_one_line_error, ws_tune
from ws_tuner.kernel import REQUIRED, load_kernel

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "kernel-files.md"
SMALL = "M=1024,N=1024,K=1024"


@pytest.fixture
def template(tmp_path: Path) -> Path:
    file = tmp_path / "my_linear.py"
    proc = ws_tune("new", str(file))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {file}" and f"ws-tune space {file}" in proc.stderr
    return file


def test_the_template_has_the_whole_contract(template: Path):
    spec = load_kernel(template)
    assert spec.name == "my_linear" and set(REQUIRED) <= set(vars(spec.module))
    assert all(hasattr(spec.module, name) for name in ("CHOICES", "OUTPUTS", "TOLERANCE", "check", "vendors"))
    assert template.read_text().startswith('"""my_linear: ') and f"ws-tune space {template}" in template.read_text()
    assert spec.check(spec.parse_problem("M=1000,N=1024,K=1024"), {"block_M": 64, "block_N": 128, "block_K": 64, "num_stages": 2}) \
        == "M=1000 is not a multiple of block_M=64"  # fmt: skip


def test_new_refuses_to_overwrite_or_a_name_that_is_no_module(template: Path, tmp_path: Path):
    before = template.read_text()
    assert_one_line_error(ws_tune("new", str(template)), "exists; choose another name or pass --force")
    assert template.read_text() == before
    assert_one_line_error(ws_tune("new", str(tmp_path / "my-kernel.txt")), "name it like my_kernel.py")
    assert_one_line_error(ws_tune("new", str(tmp_path / "nowhere" / "k.py")), "does not exist")


def test_the_template_yields_a_schedule_space(template: Path):
    proc = ws_tune("space", str(template), "--shape", SMALL)
    assert proc.returncode == 0, proc.stderr
    before, after = (int(n.replace(",", "")) for n in re.search(r"candidates: ([\d,]+) before pruning, ([\d,]+) after", proc.stdout).groups())
    assert before > after > 0


@pytest.mark.slow
def test_the_template_compiles(template: Path, tmp_path: Path):
    """Compile-only (nvcc): the seed baseline and one searched candidate build."""
    proc = ws_tune(str(template), "--shape", SMALL, "--budget", "1", "--jobs", "1", "--compile-only", "--db", str(tmp_path / "r.db"),
                   "--param", "block_M=128,block_N=128,num_stages=3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = re.search(r"built\s*│\s*(\d+)", proc.stdout)
    assert row and int(row.group(1)) >= 1, proc.stdout


def test_the_guide_names_real_commands_and_the_whole_contract():
    from typer.main import get_command

    from ws_tuner.cli import app

    text = GUIDE.read_text()
    commands = set(get_command(app).commands)
    for command in re.findall(r"^\s+ws-tune (\S+)", text, re.M):
        assert command in commands or command.endswith(".py"), f"the guide runs `ws-tune {command}`"
    for name in (*REQUIRED, "CHOICES", "OUTPUTS", "TOLERANCE", "check", "vendors", "bytes_moved", "PASS_CONFIGS"):
        assert f"`{name}" in text, f"the guide does not explain {name}"
    assert "ws-tune new my_linear.py" in text
