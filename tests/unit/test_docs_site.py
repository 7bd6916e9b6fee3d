"""The docs site's hook (rmq_spark/devtools/docs_site.py), in a real `mkdocs build --strict`
of a small project: repository files the pages link to are served under _repo/, and a link
to a file that does not exist still fails the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parents[2] / "rmq_spark" / "devtools" / "docs_site.py"


def _project(root: Path, page: str) -> Path:
    (root / "docs" / "guide").mkdir(parents=True)
    (root / "conf").mkdir()
    (root / "conf" / "example.yaml").write_text("max_active: 4\n", encoding="utf-8")
    (root / "NOTES.md").write_text("# Notes\n\nSee [the guide](docs/guide/run.md).\n")
    (root / "docs" / "index.md").write_text("# Home\n", encoding="utf-8")
    (root / "docs" / "guide" / "run.md").write_text(page, encoding="utf-8")
    (root / "mkdocs.yml").write_text(
        "site_name: t\nstrict: true\nnot_in_nav: |\n  /_repo/\n"
        f"hooks:\n  - {HOOK}\nnav:\n  - index.md\n  - guide/run.md\n",
        encoding="utf-8",
    )
    return root


def _build(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_linked_repository_files_are_served_and_links_point_at_them(tmp_path: Path) -> None:
    page = (
        "# Run\n\nThe [example](../../conf/example.yaml) and [notes](../../NOTES.md).\n\n"
        "```\n[not a link](../../conf/missing.yaml)\n```\n"
    )
    root = _project(tmp_path, page)
    built = _build(root)
    assert built.returncode == 0, built.stderr
    site = root / "site"
    assert (site / "_repo" / "conf" / "example.yaml").read_text() == "max_active: 4\n"
    html = (site / "guide" / "run" / "index.html").read_text(encoding="utf-8")
    assert 'href="../../_repo/conf/example.yaml"' in html
    assert 'href="../../_repo/NOTES/"' in html
    # The linked Markdown file is a page, and its own link back into docs/ works.
    notes = (site / "_repo" / "NOTES" / "index.html").read_text(encoding="utf-8")
    assert 'href="../../guide/run/"' in notes


def test_a_link_to_a_missing_repository_file_fails_the_strict_build(tmp_path: Path) -> None:
    root = _project(tmp_path, "# Run\n\nThe [config](../../conf/missing.yaml).\n")
    built = _build(root)
    assert built.returncode != 0
    assert "conf/missing.yaml" in built.stderr
