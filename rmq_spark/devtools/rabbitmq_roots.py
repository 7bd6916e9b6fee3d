"""Debian roots holding newer RabbitMQ releases than the host's, built and cached.

Why this exists: the host is Debian bookworm, whose rabbitmq-server is 3.10.8. The
RabbitMQ that operators run today (4.x) is packaged only in Debian's newer suites, and
those packages cannot be installed on the host (they need a newer libc and would
remove libssl3 from under the machine's other services). They run unchanged from a
Debian root under ``chroot``: ``local_brokers`` starts nodes from the roots built here.

| version | suite  | rabbitmq-server | Erlang |
|---------|--------|-----------------|--------|
| 4.0     | trixie | 4.0.5           | 27     |
| 4.3     | forky  | 4.3.6           | 29     |

How a root is built (``ensure_root``), and the traps it avoids:

* ``mmdebstrap --variant=apt --include=rabbitmq-server SUITE DIR "deb MIRROR SUITE main"``;
  MIRROR is the Debian mirror the host's own apt sources name, read at run time, so
  the build uses whatever mirror (or proxy) this machine is set up for. forky's
  indices here are past their Valid-Until date, so its build tells apt not to check it.
* Roots are cached per version under ``~/.cache/rmq-spark/roots/<version>``
  (``$XDG_CACHE_HOME`` is honoured; ``RMQ_SPARK_ROOTS_DIR`` overrides the directory),
  so a fresh clone on the same machine finds them again. A root is built in a
  temporary sibling directory and renamed into place only when complete (with its
  ``rmq-spark-root.json`` naming the exact package versions installed), so an
  interrupted build never leaves a root that looks usable. A lock file serialises
  builders of one version across processes; the second waits and reuses the first's.
* A leftover temporary directory from an interrupted build is deleted before the next
  build, but only once nothing is mounted under it (mmdebstrap mounts /proc and /dev
  in its target while it runs; deleting through a bind-mounted /dev would delete the
  host's device nodes).
* After the build the host's ``/etc/hosts`` is copied in (forky's root has none, and a
  node resolving ``localhost`` without it dies with ``nxdomain``), and the mount point
  ``/rmq-spark/node`` is made for the node directory ``local_brokers`` binds there.

Nothing is built or read at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmq_spark.errors import RmqSparkError

logger = logging.getLogger(__name__)

#: Overrides the directory holding one root per version.
ROOTS_DIR_ENV = "RMQ_SPARK_ROOTS_DIR"
#: The host's own rabbitmq-server (Debian bookworm's package), run without a root.
HOST_VERSION = "3.10"
#: Written into a root when its build is complete; its absence means "not built".
ROOT_INFO_FILE = "rmq-spark-root.json"
#: Where ``local_brokers`` bind-mounts a node's own directory inside the root.
NODE_MOUNT_POINT = "/rmq-spark/node"
#: A build downloads ~60 MB and unpacks ~240 MB; 16-31 s measured on this box.
BUILD_TIMEOUT_SECONDS = 900.0
_APT_SOURCES = Path("/etc/apt")


class RabbitMQRootError(RmqSparkError):
    """A RabbitMQ root could not be built or is unusable (names the version and path)."""


@dataclass(frozen=True)
class RootSpec:
    """Where one RabbitMQ version comes from."""

    version: str
    suite: str
    #: False for suites whose Release files are past Valid-Until on this mirror.
    check_valid_until: bool


#: The versions the harness can run from a root, by the name users pass (``--rabbitmq``).
ROOT_SPECS: dict[str, RootSpec] = {
    "4.0": RootSpec(version="4.0", suite="trixie", check_valid_until=True),
    "4.3": RootSpec(version="4.3", suite="forky", check_valid_until=False),
}
#: Every version the harness knows, the host's first.
VERSIONS: tuple[str, ...] = (HOST_VERSION, *ROOT_SPECS)


@dataclass(frozen=True)
class RabbitMQRoot:
    """A built root: where it is and exactly what it holds."""

    version: str
    path: Path
    suite: str
    mirror: str
    #: Debian package versions, e.g. ``4.3.6-1`` and ``1:29.1.1+dfsg-1``.
    rabbitmq_package: str
    erlang_package: str
    build_seconds: float

    @property
    def rabbitmq_version(self) -> str:
        """The upstream RabbitMQ version, e.g. ``4.3.6`` (no epoch, no Debian revision)."""
        return upstream_version(self.rabbitmq_package)

    @property
    def bin_dir(self) -> Path:
        """The real RabbitMQ scripts, as seen from inside the root."""
        return Path("/usr/lib/rabbitmq/bin")

    def rabbitmq_ids(self) -> tuple[int, int]:
        """uid and gid of the root's own ``rabbitmq`` user (not the host's: they differ)."""
        return rabbitmq_ids(self.path, self.version)


@functools.cache
def rabbitmq_ids(fs_root: Path, version: str) -> tuple[int, int]:
    """uid and gid of the ``rabbitmq`` user in the root at ``fs_root``, from its passwd."""
    passwd = fs_root / "etc" / "passwd"
    try:
        for line in passwd.read_text(encoding="utf-8").splitlines():
            fields = line.split(":")
            if len(fields) >= 4 and fields[0] == "rabbitmq":
                return int(fields[2]), int(fields[3])
    except (OSError, ValueError) as exc:
        raise RabbitMQRootError(f"RabbitMQ {version} root {fs_root}: {exc}") from exc
    raise RabbitMQRootError(f"RabbitMQ {version} root {fs_root}: no rabbitmq user in {passwd}")


def upstream_version(package_version: str) -> str:
    """``1:4.3.6-1+b1`` -> ``4.3.6``: Debian's epoch and revision dropped."""
    version = package_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def roots_dir() -> Path:
    """The cache directory holding one root per version (see the module docstring)."""
    override = os.environ.get(ROOTS_DIR_ENV)
    if override:
        return Path(override).absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rmq-spark" / "roots"


def host_mirror(apt_dir: Path = _APT_SOURCES) -> str:
    """The Debian mirror the host's apt sources use for its main suite.

    Reads ``sources.list`` (one-line ``deb URI SUITE ...``) and ``sources.list.d``
    (``*.list`` and deb822 ``*.sources``); the security archive and entries for
    suites with a ``-`` (``bookworm-updates``) are passed over, since a suite's main
    archive is what a newer suite also lives on.
    """
    candidates: list[tuple[str, list[str]]] = []
    list_files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in list_files:
        with contextlib.suppress(OSError):
            for line in path.read_text(encoding="utf-8").splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    candidates.append((words[1], [words[2]]))
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8")
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                suites = fields.get("suites", "").split()
                candidates.extend((uri, suites) for uri in fields.get("uris", "").split())
    for uri, suites in candidates:
        if "security" in uri or not uri.startswith(("http://", "https://")):
            continue
        if any("-" not in suite and "/" not in suite for suite in suites):
            return uri.rstrip("/")
    raise RabbitMQRootError(
        f"no Debian mirror found in the host's apt sources under {apt_dir} "
        "(expected a 'deb' entry for the host's main suite)"
    )


def root_path(version: str, cache_dir: Path | None = None) -> Path:
    """Where the root of ``version`` is (or would be) cached."""
    spec_for(version)
    return (cache_dir or roots_dir()) / version


def spec_for(version: str) -> RootSpec:
    """The spec of a root version; a clear error for the host's or an unknown version."""
    try:
        return ROOT_SPECS[version]
    except KeyError:
        raise RabbitMQRootError(
            f"no RabbitMQ root for version {version!r}: expected one of "
            f"{', '.join(ROOT_SPECS)} ({HOST_VERSION} is the host's own package)"
        ) from None


def load_root(version: str, cache_dir: Path | None = None) -> RabbitMQRoot | None:
    """The cached root of ``version``, or None when it has not been built (completely)."""
    path = root_path(version, cache_dir)
    info_file = path / ROOT_INFO_FILE
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RabbitMQRootError(f"RabbitMQ {version} root: cannot read {info_file}: {exc}") from exc
    try:
        return RabbitMQRoot(
            version=version,
            path=path,
            suite=str(info["suite"]),
            mirror=str(info["mirror"]),
            rabbitmq_package=str(info["rabbitmq_server"]),
            erlang_package=str(info["erlang_base"]),
            build_seconds=float(info["build_seconds"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RabbitMQRootError(
            f"RabbitMQ {version} root: {info_file} is malformed: {exc!r}"
        ) from exc


def ensure_root(
    version: str, *, cache_dir: Path | None = None, mirror: str | None = None
) -> RabbitMQRoot:
    """The root of ``version``, built first when it is not cached (idempotent).

    Example: ``ensure_root("4.3").rabbitmq_version == "4.3.6"``.
    """
    spec = spec_for(version)
    root = load_root(version, cache_dir)
    if root is not None:
        return root
    parent = (cache_dir or roots_dir()).absolute()
    parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(parent, version):
        root = load_root(version, cache_dir)  # another process built it while we waited
        if root is not None:
            return root
        return _build(spec, parent, mirror or host_mirror())


@contextlib.contextmanager
def _build_lock(parent: Path, version: str) -> Iterator[None]:
    """An exclusive lock on ``parent/.<version>.lock`` held while building."""
    with open(parent / f".{version}.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace (deepest first)."""
    prefix = str(path.resolve())
    found: list[str] = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            # /proc/mounts escapes blanks in paths as octal (\040).
            mount_point = line.split()[1].encode().decode("unicode_escape")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(mount_point)
    return sorted(found, key=len, reverse=True)


def _remove_stale(path: Path) -> None:
    """Delete an interrupted build's directory, unmounting what it left mounted first."""
    for mount_point in _mounts_under(path):
        subprocess.run(["umount", "--lazy", mount_point], check=False, timeout=60)
    left = _mounts_under(path)
    if left:
        raise RabbitMQRootError(
            f"cannot remove the interrupted root build {path}: still mounted: {', '.join(left)}"
        )
    shutil.rmtree(path)


def _build(spec: RootSpec, parent: Path, mirror: str) -> RabbitMQRoot:
    """Build the root of ``spec`` in a temp dir under ``parent``, then rename it into place."""
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise RabbitMQRootError(
            f"building the RabbitMQ {spec.version} root needs mmdebstrap, which is not "
            "installed (make setup installs it: apt-get install mmdebstrap)"
        )
    for stale in parent.glob(f".{spec.version}.build-*"):
        logger.warning(
            "removing an interrupted build of the RabbitMQ %s root: %s", spec.version, stale
        )
        _remove_stale(stale)
    target = parent / spec.version
    if target.exists():
        # A root without its info file is an incomplete one from an older layout.
        _remove_stale(target)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.version}.build-", dir=parent))
    fs_root = work / "root"
    cmd = [mmdebstrap, "--variant=apt", "--include=rabbitmq-server", "--quiet"]
    if not spec.check_valid_until:
        cmd.append('--aptopt=Acquire::Check-Valid-Until "false"')
    cmd += [spec.suite, str(fs_root), f"deb {mirror} {spec.suite} main"]
    logger.info(
        "building the RabbitMQ %s root (Debian %s from %s) in %s",
        spec.version,
        spec.suite,
        mirror,
        fs_root,
    )
    t0 = time.monotonic()
    try:
        try:
            res = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RabbitMQRootError(
                f"building the RabbitMQ {spec.version} root (Debian {spec.suite} from "
                f"{mirror}) did not finish within {BUILD_TIMEOUT_SECONDS:.0f} s"
            ) from exc
        if res.returncode != 0:
            tail = "\n  ".join((res.stderr or res.stdout).strip().splitlines()[-15:])
            raise RabbitMQRootError(
                f"building the RabbitMQ {spec.version} root (Debian {spec.suite} from "
                f"{mirror}): mmdebstrap exited {res.returncode}:\n  {tail}"
            )
        rabbitmq_package = _package_version(fs_root, "rabbitmq-server", spec)
        erlang_package = _package_version(fs_root, "erlang-base", spec)
        _finish(fs_root)
        build_seconds = round(time.monotonic() - t0, 1)
        info = {
            "version": spec.version,
            "suite": spec.suite,
            "mirror": mirror,
            "rabbitmq_server": rabbitmq_package,
            "erlang_base": erlang_package,
            "build_seconds": build_seconds,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (fs_root / ROOT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        os.rename(fs_root, target)
    finally:
        _remove_stale(work)
    logger.info(
        "RabbitMQ %s root ready in %.1f s: rabbitmq-server %s, erlang-base %s (%s)",
        spec.version,
        build_seconds,
        rabbitmq_package,
        erlang_package,
        target,
    )
    root = load_root(spec.version, parent)
    assert root is not None  # just written
    return root


def _package_version(fs_root: Path, package: str, spec: RootSpec) -> str:
    """The installed version of ``package`` in the root, read from its dpkg database."""
    res = subprocess.run(
        ["dpkg-query", f"--admindir={fs_root / 'var/lib/dpkg'}", "-W", "-f=${Version}", package],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if res.returncode != 0 or not res.stdout.strip():
        raise RabbitMQRootError(
            f"RabbitMQ {spec.version} root {fs_root}: {package} is not installed "
            f"({res.stderr.strip() or 'dpkg-query found no version'})"
        )
    return res.stdout.strip()


def _finish(fs_root: Path) -> None:
    """What a node needs in the root beyond the packages: /etc/hosts and the node mount point.

    The root directory itself must be traversable by the root's rabbitmq user.
    """
    fs_root.chmod(0o755)
    refresh_hosts(fs_root)
    mount_point = fs_root / NODE_MOUNT_POINT.lstrip("/")
    mount_point.mkdir(parents=True, exist_ok=True)
    mount_point.parent.chmod(0o755)


def refresh_hosts(fs_root: Path) -> None:
    """Copy the host's /etc/hosts into the root when it differs (atomic replace)."""
    host = Path("/etc/hosts").read_bytes()
    target = fs_root / "etc" / "hosts"
    with contextlib.suppress(OSError):
        if target.read_bytes() == host:
            return
    tmp = target.with_name(f".hosts.{os.getpid()}.tmp")
    tmp.write_bytes(host)
    tmp.chmod(0o644)
    os.replace(tmp, target)


def main(argv: Sequence[str] | None = None) -> int:
    """``build VERSION...``: build the roots that are missing; ``show``: list the cache."""
    parser = argparse.ArgumentParser(
        prog="python -m rmq_spark.devtools.rabbitmq_roots",
        description="Build and cache the Debian roots that hold RabbitMQ 4.x.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build the roots of VERSIONs unless cached")
    p_build.add_argument(
        "versions", nargs="*", default=list(ROOT_SPECS), help=", ".join(ROOT_SPECS)
    )
    sub.add_parser("show", help="print the cached roots and what they hold")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        versions = args.versions if args.command == "build" else list(ROOT_SPECS)
        for version in versions:
            root = ensure_root(version) if args.command == "build" else load_root(version)
            if root is None:
                print(f"{version}: not built ({root_path(version)})")
                continue
            print(
                f"{version}: rabbitmq-server {root.rabbitmq_package}, erlang-base "
                f"{root.erlang_package}, Debian {root.suite}, built in "
                f"{root.build_seconds:.1f} s, {root.path}"
            )
    except RmqSparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
