"""test-dbr's venv: its dependencies built once per machine, the clone's part in seconds.

`make test-dbr` runs the unit and Spark suites on Databricks Runtime 17.3's versions
(requirements-dbr.lock in place of requirements.lock's). Installing that closure took
about four minutes, in every fresh clone. Its inputs are two lock files and the Python
that runs it, so it is built once per set of inputs, under
``~/.cache/rmq-spark/venv-dbr/<key>`` (``$XDG_CACHE_HOME`` honoured), as the RabbitMQ
roots are: the key hashes the two lock files, the recipe's version and the
interpreter (its path and ``sys.version``). The shared venv holds no rmq-spark: a
venv cannot be moved (its scripts name its path) and an editable install names one
clone.

The clone's ``.venv-dbr`` is a venv without pip whose site-packages names the shared
one (a ``.pth`` calling ``site.addsitedir``, so the shared directory's own ``.pth``
files count), with rmq-spark installed editable into it and ``pip check`` run over
both, as before. A lock file serialises builders of one key across processes; a
shared venv counts as built only once its ``.installed`` marker exists, so an
interrupted build is redone.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Bump when the way the shared venv is built changes: its key changes with it.
RECIPE_VERSION = "1"
LOCKS = ("requirements.lock", "requirements-dbr.lock")
_PINNED = re.compile(r"^([A-Za-z0-9_.-]+)==", re.MULTILINE)


def cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rmq-spark" / "venv-dbr"


def interpreter(python: str) -> str:
    """The interpreter's real path and full version: what the shared venv is built with."""
    found = shutil.which(python) or python
    version = subprocess.run(
        [found, "-c", "import sys; print(sys.version)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return f"{os.path.realpath(found)}\n{version}"


def key(repo: Path, python_identity: str) -> str:
    digest = hashlib.sha256(f"{RECIPE_VERSION}\n{python_identity}\n".encode())
    for name in LOCKS:
        digest.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def requirements(repo: Path) -> str:
    """requirements.lock with the runtime's pins (requirements-dbr.lock) in place of ours."""
    dbr = (repo / "requirements-dbr.lock").read_text(encoding="utf-8")
    replaced = {name.lower() for name in _PINNED.findall(dbr)}
    ours = [
        line
        for line in (repo / "requirements.lock").read_text(encoding="utf-8").splitlines()
        if not ((m := _PINNED.match(line)) and m.group(1).lower() in replaced)
    ]
    return "\n".join(ours) + "\n" + dbr


def shared_venv(repo: Path, python: str) -> Path:
    """The shared venv for these inputs, built now if it is not there yet."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / key(repo, interpreter(python))
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".installed").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        (venv / "requirements.txt").write_text(requirements(repo), encoding="utf-8")
        subprocess.run([*pip, "--no-deps", "-r", str(venv / "requirements.txt")], check=True)
        (venv / ".installed").touch()
    return venv


def site_packages(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


def clone_venv(repo: Path, target: Path, shared: Path) -> None:
    """The clone's venv over the shared one, with this clone's rmq-spark editable in it."""
    shutil.rmtree(target, ignore_errors=True)
    base = (shared / "bin" / "python").resolve()
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    shared_site = site_packages(shared / "bin" / "python")
    (site_packages(python) / "rmq-spark-dbr-shared.pth").write_text(
        f"import site; site.addsitedir({str(shared_site)!r})\n", encoding="utf-8"
    )
    pip = [str(python), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-deps", "-e", str(repo)], check=True)
    subprocess.run([*pip, "check"], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmq_spark.devtools.dbr_venv")
    parser.add_argument("target", type=Path, help="the clone's venv (.venv-dbr)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to use")
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    clone_venv(repo, args.target.absolute(), shared_venv(repo, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
