"""MkDocs hook (mkdocs.yml `hooks:`): repository files the docs link to, served by the site.

The pages under docs/ link to files outside it the way GitHub renders them
(`../conf/example.yaml`, `../bench/results/...png`), so the same Markdown reads right in
a checkout and on GitHub. MkDocs only knows docs/, and `--strict` fails on such links.
This hook copies each linked repository file into the site under `_repo/` and points the
link there; Markdown files linked this way become pages of their own (not in the nav),
and their links are followed the same way. A link to a file that does not exist is left
as written, so `mkdocs build --strict` still fails on it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# [text](target) and ![alt](target); target without spaces, an optional #anchor.
_LINK = re.compile(r"(\]\()(?P<target>[^)\s#:]+)(?P<anchor>#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~)")
REPO_PREFIX = "_repo"


def _links(markdown: str) -> list[str]:
    """Relative link targets outside fenced code blocks."""
    targets: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            targets.extend(match.group("target") for match in _LINK.finditer(line))
    return targets


def _outside_target(source: Path, target: str, docs: Path, repo: Path) -> Path | None:
    """The repository file a link from `source` names, when it lies outside docs/."""
    resolved = (source.parent / target).resolve()
    if resolved.is_relative_to(docs) or not resolved.is_relative_to(repo):
        return None
    return resolved if resolved.is_file() else None


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    pending = [Path(page.abs_src_path) for page in files.documentation_pages() if page.abs_src_path]
    seen: set[Path] = set()
    while pending:
        source = pending.pop()
        for target in _links(source.read_text(encoding="utf-8")):
            outside = _outside_target(source, target, docs, repo)
            if outside is None or outside in seen:
                continue
            seen.add(outside)
            src_uri = f"{REPO_PREFIX}/{outside.relative_to(repo).as_posix()}"
            files.append(File.generated(config, src_uri, abs_src_path=str(outside)))
            if outside.suffix == ".md":
                pending.append(outside)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links at where the linked files sit in the site (see the module's doc)."""
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    source = Path(page.file.abs_src_path)
    # Where the page sits in the site's source tree; for a page under docs/, its own dir.
    site_dir = (docs / page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target, anchor = match.group("target"), match.group("anchor") or ""
        resolved = (source.parent / target).resolve()
        if resolved.is_relative_to(docs):
            place = resolved
        elif _outside_target(source, target, docs, repo) is not None:
            place = docs / REPO_PREFIX / resolved.relative_to(repo)
        else:
            return match.group(0)
        return f"{match.group(1)}{Path(os.path.relpath(place, site_dir)).as_posix()}{anchor})"

    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            out.append(line)
        else:
            out.append(line if fenced else _LINK.sub(rewrite, line))
    return "\n".join(out)
