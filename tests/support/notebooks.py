"""Running the analysts' notebook (notebooks/ledger_inspection.ipynb) headless, with a
chosen interpreter, and collecting what its cells printed."""

from __future__ import annotations

from pathlib import Path

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "ledger_inspection.ipynb"
KERNEL_NAME = "rmq-spark-test"
CELL_TIMEOUT_SECONDS = 120


def interpreters_kernel(directory: Path, python: Path) -> KernelManager:
    """A kernel manager starting ipykernel with `python`, whatever other `python3`
    kernelspecs are installed on the machine."""
    kernels = directory / "kernels"
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    write_kernel_spec(
        str(kernels / KERNEL_NAME), overrides={"display_name": KERNEL_NAME, "argv": argv}
    )
    specs = KernelSpecManager(kernel_dirs=[str(kernels)])
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    assert manager.kernel_spec is not None
    assert manager.kernel_spec.argv[0] == str(python)
    return manager


def run_notebook(
    notebook: nbformat.NotebookNode, directory: Path, python: Path, env: dict[str, str]
) -> str:
    """Execute `notebook` in `directory` with `python`'s kernel (any cell error raises
    CellExecutionError); the text its code cells printed or showed."""
    client = NotebookClient(
        notebook,
        km=interpreters_kernel(directory, python),
        timeout=CELL_TIMEOUT_SECONDS,
        resources={"metadata": {"path": str(directory)}},
    )
    client.execute(env=env)
    return "\n".join(
        output.get("text", "") + output.get("data", {}).get("text/plain", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
