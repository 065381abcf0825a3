"""``ws-tune new FILE``: a kernel file to start from (template_kernel.py, a plain
TileLang kernel with every part of the contract; docs/kernel-files.md explains it)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import _fail, app, err, handles_errors, out

TEMPLATE = Path(__file__).with_name("template_kernel.py")


@app.command()
@handles_errors
def new(
    file: Path = typer.Argument(..., help="The kernel file to write, e.g. my_kernel.py (its stem is the kernel's name)"),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists"),
) -> None:
    """Write a kernel file to start from: a linear layer's GEMM with every part of the contract, ready to tune."""
    if file.suffix != ".py" or not file.stem.isidentifier():
        raise _fail(f"{file}: a kernel file is a Python module: name it like my_kernel.py")
    if file.exists() and not force:
        raise _fail(f"{file} exists; choose another name or pass --force")
    if not file.parent.is_dir():
        raise _fail(f"directory {file.parent} does not exist")
    text = TEMPLATE.read_text().replace("NAME:", f"{file.stem}:", 1).replace("FILE", str(file))
    file.write_text(text)
    out.print(f"wrote {file}")
    err.print(f"next: ws-tune space {file} --shape M=4096,N=4096,K=4096   (then tune it; see docs/kernel-files.md)")
