"""A relocatable CPython 3.11 for the executors, and the environment archives built on it.

Why: a venv-pack archive carries libraries, not Python. Its ``bin/python`` is a symlink
to the interpreter that built it (a pyenv install under the builder's home here), so
on a node without that path, which is every YARN node, ``./environment/bin/python``
does not start. The archives built here carry CPython itself: a node needs only glibc.

Where the interpreter comes from: Debian bookworm's own ``python3.11`` binary packages
(python3.11-minimal, libpython3.11-minimal, libpython3.11-stdlib) and the libraries its
extension modules link (OpenSSL, libffi, zlib, expat, xz, bzip2, SQLite, libuuid),
fetched with ``apt-get download`` from the host's apt sources and unpacked with
``dpkg -x``. They are laid out as one prefix (``bin/python3.11``, ``lib/python3.11``,
``lib/*.so.N``) and patched with ``patchelf`` so that every ELF file looks for its
libraries next to itself (``$ORIGIN``); CPython finds its standard library from where
its binary is. Chosen over compiling CPython from Debian's source package in an older
Debian root (a lower glibc floor) because it takes seconds instead of minutes of a
2-core CI box, needs no compiler, and is the build Debian tests and patches; the cost
is the glibc floor, measured by ``glibc_floor`` and stated in docs/deploying/index.md (2.36: Debian
12, Ubuntu 24.04; not RHEL 9's 2.34).

The prefix is cached under ``~/.cache/rmq-spark/python/<Debian version>-<arch>`` (built
in a temporary sibling, renamed into place when complete), so a second ``make package``
reuses it. Nothing is built at import time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rmq_spark.errors import RmqSparkError

logger = logging.getLogger(__name__)

PYTHON_VERSION = "3.11"
#: Debian's CPython and the libraries its binary and extension modules link.
PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libssl3",
    "libffi8",
    "zlib1g",
    "libexpat1",
    "liblzma5",
    "libbz2-1.0",
    "libsqlite3-0",
    "libuuid1",
)
#: Extension modules left out: their libraries (curses, readline, Berkeley DB, NIS,
#: libcrypt) are not shipped, no executor uses them, and CPython's own test modules.
DROPPED_MODULES = (
    "_curses",
    "_curses_panel",
    "readline",
    "_dbm",
    "nis",
    "_crypt",
    "ossaudiodev",
    "_ctypes_test",
    "_testbuffer",
    "_testcapi",
    "_testclinic",
    "_testimportmultiple",
    "_testinternalcapi",
    "_testmultiphase",
    "_xxtestfuzz",
    "xxlimited",
    "xxlimited_35",
)
#: Imported by the smoke check of every prefix: the modules that need a bundled library.
STDLIB_SMOKE = ("ssl", "hashlib", "ctypes", "lzma", "bz2", "sqlite3", "zlib", "pyexpat", "uuid")
#: glibc's own libraries: the only ones a node provides.
GLIBC_LIBRARIES = re.compile(r"^(libc|libm|libpthread|libdl|librt|libutil|ld-linux[-\w]*)\.so")
#: Where packages go: a directory Debian's site.py puts on sys.path for this prefix.
SITE_DIR = f"lib/python{PYTHON_VERSION}/dist-packages"
INFO_FILE = "rmq-spark-python.json"
#: Left out of archives: headers and test suites nothing imports at run time.
PRUNED = ("pyarrow/include", "pyarrow/tests", "pyarrow/src", "numpy/_core/tests")
TIMEOUT_SECONDS = 600.0


class ExecutorEnvError(RmqSparkError):
    """The relocatable Python or an archive could not be built (names the step)."""


@dataclass(frozen=True)
class PortablePython:
    """A built prefix: where it is, which Debian python3.11 it holds, its glibc floor."""

    path: Path
    debian_version: str
    glibc_floor: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / f"python{PYTHON_VERSION}"


def cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rmq-spark" / "python"


def _run(cmd: Sequence[str | Path], step: str, cwd: Path | None = None) -> str:
    res = subprocess.run(
        [str(part) for part in cmd],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
        cwd=cwd,
    )
    if res.returncode != 0:
        tail = "\n  ".join((res.stderr or res.stdout).strip().splitlines()[-10:])
        program = Path(str(cmd[0])).name
        raise ExecutorEnvError(f"{step}: {program} exited {res.returncode}:\n  {tail}")
    return res.stdout


def candidate_version() -> str:
    """The python3.11-minimal version apt would fetch (the cache key)."""
    out = _run(["apt-cache", "policy", "python3.11-minimal"], "apt-cache policy")
    match = re.search(r"Candidate:\s*(\S+)", out)
    if not match or match.group(1) == "(none)":
        raise ExecutorEnvError("apt knows no python3.11-minimal (run apt-get update)")
    return match.group(1)


def ensure_python() -> PortablePython:
    """The cached relocatable prefix of the current Debian python3.11, built when missing."""
    version = candidate_version()
    arch = _run(["dpkg", "--print-architecture"], "dpkg").strip()
    target = cache_dir() / f"{version}-{arch}"
    info = target / INFO_FILE
    if info.is_file():
        data = json.loads(info.read_text(encoding="utf-8"))
        return PortablePython(target, str(data["debian_version"]), str(data["glibc_floor"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}.build-", dir=target.parent))
    try:
        t0 = time.monotonic()
        prefix = _assemble(work, version)
        floor = glibc_floor(prefix)
        data = {
            "debian_version": version,
            "glibc_floor": floor,
            "build_seconds": round(time.monotonic() - t0, 1),
        }
        (prefix / INFO_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(prefix, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("relocatable Python %s (glibc >= %s) in %s", version, floor, target)
    return PortablePython(target, version, floor)


def _assemble(work: Path, version: str) -> Path:
    debs, unpacked, prefix = work / "debs", work / "unpacked", work / "prefix"
    debs.mkdir()
    pins = [f"{PACKAGES[0]}={version}", *PACKAGES[1:]]
    _run(["apt-get", "download", "-q", *pins], "apt-get download", cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", deb, unpacked], f"dpkg-deb -x {deb.name}")
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(unpacked / "usr/bin" / f"python{PYTHON_VERSION}", prefix / "bin")
    for alias in ("python3", "python"):
        (prefix / "bin" / alias).symlink_to(f"python{PYTHON_VERSION}")
    stdlib = prefix / "lib" / f"python{PYTHON_VERSION}"
    shutil.copytree(unpacked / "usr/lib" / f"python{PYTHON_VERSION}", stdlib, symlinks=True)
    for module in DROPPED_MODULES:
        for path in (stdlib / "lib-dynload").glob(f"{module}.cpython-*.so"):
            path.unlink()
    # usrmerge: some packages put their libraries in /lib, others in /usr/lib.
    for lib_dir in (unpacked / "lib", unpacked / "usr/lib"):
        for library in sorted((lib_dir / _multiarch(unpacked)).glob("*.so.*")):
            shutil.copy2(library, prefix / "lib", follow_symlinks=False)
    _run(
        ["patchelf", "--set-rpath", "$ORIGIN/../lib", prefix / "bin" / f"python{PYTHON_VERSION}"],
        "patchelf",
    )
    for extension in (stdlib / "lib-dynload").glob("*.so"):
        _run(["patchelf", "--set-rpath", "$ORIGIN/../..", extension], "patchelf")
    for library in (prefix / "lib").glob("*.so.*"):
        if not library.is_symlink():
            _run(["patchelf", "--set-rpath", "$ORIGIN", library], "patchelf")
    check_prefix(prefix)
    return prefix


def _multiarch(unpacked: Path) -> str:
    (found,) = {p.name for p in (unpacked / "usr/lib").glob("*-linux-gnu*")}
    return found


def check_prefix(prefix: Path) -> None:
    """The prefix starts with no environment and loads only glibc from outside itself."""
    python = prefix / "bin" / f"python{PYTHON_VERSION}"
    code = f"import sys, {', '.join(STDLIB_SMOKE)}; print(sys.prefix)"
    seen = _run(["env", "-i", python, "-c", code], f"smoke test of {python}").strip()
    if Path(seen).resolve() != prefix.resolve():
        raise ExecutorEnvError(f"{python} found its prefix at {seen}, not {prefix}")
    for elf in _elf_files(prefix):
        for line in _run(["ldd", elf], f"ldd {elf}").splitlines():
            name, _, where = line.strip().partition(" => ")
            where = where.split(" (")[0]
            outside = where and not Path(where).resolve().is_relative_to(prefix.resolve())
            if "not found" in where or (outside and not GLIBC_LIBRARIES.match(name)):
                raise ExecutorEnvError(f"{elf} links {name} from {where}: not bundled")


def _elf_files(prefix: Path) -> list[Path]:
    candidates = [prefix / "bin" / f"python{PYTHON_VERSION}"]
    candidates += sorted((prefix / "lib").glob("*.so.*"))
    candidates += sorted((prefix / "lib" / f"python{PYTHON_VERSION}" / "lib-dynload").glob("*.so"))
    return [path for path in candidates if not path.is_symlink()]


def glibc_floor(prefix: Path) -> str:
    """The newest GLIBC_x.y symbol version any ELF file of the prefix needs."""
    needed: set[tuple[int, ...]] = set()
    for elf in _elf_files(prefix):
        for found in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", _run(["objdump", "-T", elf], "objdump")):
            needed.add(tuple(int(part) for part in found.split(".")))
    return ".".join(map(str, max(needed)))


def build_archive(
    python: PortablePython, requirements: Path, wheel: Path, out: Path, imports: Sequence[str]
) -> Path:
    """The prefix plus `requirements` and `wheel` (no dependencies resolved: the lock is
    the closure), byte-compiled, checked to import `imports` with no environment, tarred.
    """
    with tempfile.TemporaryDirectory(prefix=".env-", dir=out.parent) as scratch:
        staging = Path(scratch) / "env"
        shutil.copytree(python.path, staging, symlinks=True)
        (staging / INFO_FILE).unlink()
        site = staging / SITE_DIR
        pip: list[str | Path] = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            site,
        ]
        _run([*pip, "-r", requirements, wheel], f"pip install -r {requirements}")
        for pruned in PRUNED:
            shutil.rmtree(site / pruned, ignore_errors=True)
        shutil.rmtree(site / "bin", ignore_errors=True)  # entry scripts name the builder's python
        interpreter = staging / "bin" / f"python{PYTHON_VERSION}"
        stdlib = staging / "lib" / f"python{PYTHON_VERSION}"
        _run([interpreter, "-m", "compileall", "-q", "-j0", stdlib], "compileall")
        code = f"import {', '.join(imports)}"
        # From the scratch directory: sys.path[0] must not be a checkout's rmq_spark.
        check = f"import check ({code}) of {requirements}"
        _run(["env", "-i", interpreter, "-c", code], check, cwd=Path(scratch))
        partial = out.with_name(out.name + ".part")
        _run(
            [
                "tar",
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-czf",
                partial,
                "-C",
                staging,
                ".",
            ],
            f"tar {out.name}",
        )
        partial.chmod(0o644)
        os.replace(partial, out)
    return out


def archive_name(stem: str, version: str) -> str:
    arch = os.uname().machine
    return f"{stem}-{version}-cp{PYTHON_VERSION.replace('.', '')}-linux_{arch}.tar.gz"


def main(argv: Sequence[str] | None = None) -> int:
    """``archive``: build one archive into --dist; ``python``: build/show the cached prefix."""
    parser = argparse.ArgumentParser(prog="python -m rmq_spark.devtools.executor_env")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("python", help="the cached relocatable Python (built when missing)")
    p_archive = sub.add_parser("archive", help="build an environment archive into DIST")
    p_archive.add_argument("--stem", required=True, help="e.g. rmq-spark-executor-env")
    p_archive.add_argument("--requirements", type=Path, required=True)
    p_archive.add_argument("--wheel", type=Path, required=True)
    p_archive.add_argument("--dist", type=Path, required=True)
    p_archive.add_argument("--imports", required=True, help="comma-separated modules to check")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        python = ensure_python()
        if args.command == "python":
            print(
                f"{python.python} (Debian {python.debian_version}, glibc >= {python.glibc_floor})"
            )
            return 0
        version = args.wheel.name.split("-")[1]
        out = args.dist.absolute() / archive_name(args.stem, version)
        t0 = time.monotonic()
        imports = [name for name in args.imports.split(",") if name]
        build_archive(python, args.requirements, args.wheel, out, imports)
        size = out.stat().st_size / 1e6
        took = time.monotonic() - t0
        print(f"{out} ({size:.0f} MB, built in {took:.0f} s, glibc >= {python.glibc_floor})")
    except (RmqSparkError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
