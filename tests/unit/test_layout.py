"""The package's shape, kept by a test: modules and engine classes stay small enough to read.

Issue 14 set the limits: no module in the package over ~600 lines, no class in the engine
(transfer/) over ~300; issue 28 holds every class in the package to the same ~300. A
module or class that grows past them is a sign a concept wants its own home.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rmq_spark"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_modules_to_measure() -> None:
    assert len(modules()) > 20, f"found only {len(modules())} modules under {PACKAGE}"


@pytest.mark.parametrize("module", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_the_limit(module: Path) -> None:
    lines = len(module.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{module.relative_to(PACKAGE.parent)} has {lines} lines; the limit is "
        f"{MAX_MODULE_LINES}: split it along its concepts"
    )


def classes(root: Path) -> list[tuple[str, int]]:
    found = []
    for module in sorted(root.rglob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((f"{module.relative_to(PACKAGE.parent)}:{node.name}", length))
    return found


def test_no_engine_class_is_longer_than_the_limit() -> None:
    engine = classes(PACKAGE / "transfer")
    assert engine, "no classes found under rmq_spark/transfer"
    too_long = {name: length for name, length in engine if length > MAX_CLASS_LINES}
    assert not too_long, f"engine classes over {MAX_CLASS_LINES} lines: {too_long}"


def test_no_class_in_the_package_is_longer_than_the_limit() -> None:
    """Issue 28: the limit holds for every class, not only the engine's."""
    found = classes(PACKAGE)
    assert len(found) > 100, f"found only {len(found)} classes under {PACKAGE}"
    too_long = {name: length for name, length in found if length > MAX_CLASS_LINES}
    assert not too_long, f"classes over {MAX_CLASS_LINES} lines: {too_long}"


TESTS = PACKAGE.parent / "tests"


def test_tests_import_shared_helpers_only_from_tests_support() -> None:
    """A helper two test modules share lives in tests/support/ (issue 28), so a test
    module can be moved, renamed or deleted without breaking another."""
    reaching: list[str] = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            reaching += [
                f"{path.relative_to(TESTS.parent)}:{node.lineno} imports {name}"
                for name in names
                if name.startswith("tests.") and not name.startswith("tests.support")
            ]
    assert len(list(TESTS.rglob("test_*.py"))) > 50
    assert not reaching, "test modules import from other test modules: " + "; ".join(reaching)
