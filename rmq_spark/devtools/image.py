"""The rmq-spark container image, built on this machine with podman and no registry.

Why this exists: no image registry is reachable here, so the image's base cannot be
pulled. The base is made instead: a Debian bookworm root from ``mmdebstrap`` (from the
mirror the host's apt sources name), imported with ``podman import``. ``docker/Dockerfile``
is then built ``FROM`` it with ``podman build`` (``--network host`` for apt).

How (``ensure_image``), and what it avoids:

* Python packages come as wheels from a wheelhouse staged on the host by pip (from
  its cache; pyspark is published as a source archive and is built once there), bind-
  mounted into the build: no PyPI inside the build, no wheelhouse left in a layer.
* Both images are tagged with a key over their inputs (base: suite, mirror, options;
  image: the Dockerfile, entrypoint, locks, package sources, jobs, log4j config and the
  base's key), so a second build with the same inputs finds them and returns at once;
  older keys are removed after a build. A lock file serialises builders across processes.
* podman runs with ``--runtime runc``: crun refuses this machine's hybrid cgroups.

Nothing is built or read at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmq_spark.devtools.rabbitmq_roots import host_mirror, roots_dir
from rmq_spark.errors import RmqSparkError

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
#: podman with the OCI runtime that works on this kernel (crun fails on hybrid cgroups).
PODMAN: tuple[str, ...] = ("podman", "--runtime", "runc")
BASE_REPOSITORY = "localhost/rmq-spark-base"
IMAGE_REPOSITORY = "localhost/rmq-spark"
SUITE = "bookworm"
#: Documentation, manuals and translations are left out of every package (also the
#: ones the Dockerfile installs: the rule lands in the root's /etc/dpkg/dpkg.cfg.d).
_MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
)
#: The files whose content decides the image (besides the base); directories recurse.
IMAGE_INPUTS = (
    "docker/Dockerfile",
    "docker/entrypoint.sh",
    "requirements-runtime.lock",
    "requirements.lock",
    "pyproject.toml",
    "rmq_spark",
    "jobs",
    "conf/log4j2.properties",
)
#: The packages pip installs besides the runtime lock, at requirements.lock's pins.
SPARK_PACKAGES = ("pyspark", "py4j")
BUILD_TIMEOUT_SECONDS = 1800.0


class ImageError(RmqSparkError):
    """The image could not be built (names the step and shows its output's tail)."""


@dataclass(frozen=True)
class Image:
    """A built image: its tag, size and how long its build took (0 when it was cached)."""

    tag: str
    size_bytes: int
    build_seconds: float


def cache_dir() -> Path:
    """Where the base root's tarball and the lock live: beside the RabbitMQ roots."""
    return roots_dir().parent / "image"


def _run(step: str, cmd: Sequence[str], timeout: float = BUILD_TIMEOUT_SECONDS) -> str:
    try:
        res = subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{step}: did not finish within {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise ImageError(
            f"{step}: {cmd[0]} is not installed (make setup installs podman, runc and mmdebstrap)"
        ) from exc
    if res.returncode != 0:
        tail = "\n  ".join(res.stdout.strip().splitlines()[-30:])
        raise ImageError(f"{step}: {cmd[0]} exited {res.returncode}:\n  {tail}")
    return res.stdout


def image_exists(tag: str) -> bool:
    """Whether podman's local storage holds ``tag``."""
    return subprocess.run([*PODMAN, "image", "exists", tag], check=False).returncode == 0


def image_size(tag: str) -> int:
    """The size podman reports for ``tag``, in bytes."""
    return int(_run("podman image inspect", [*PODMAN, "image", "inspect", "-f", "{{.Size}}", tag]))


def pinned(package: str, lock: Path) -> str:
    """``package==VERSION`` as ``lock`` pins it."""
    prefix = f"{package.lower()}=="
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line.lower().startswith(prefix):
            return line.strip()
    raise ImageError(f"{lock} does not pin {package}")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def base_key(mirror: str) -> str:
    """The base image's key: everything that decides what mmdebstrap puts in it."""
    return _digest(SUITE, mirror, *_MMDEBSTRAP_OPTIONS)


def image_key(repo: Path, base_tag: str) -> str:
    """The image's key: the content of its inputs (paths included) and its base's tag."""
    sha = hashlib.sha256(base_tag.encode())
    for name in IMAGE_INPUTS:
        top = repo / name
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                sha.update(str(path.relative_to(repo)).encode() + b"\0")
                sha.update(hashlib.sha256(path.read_bytes()).digest())
    return sha.hexdigest()[:16]


@contextlib.contextmanager
def _lock(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".image.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_base(directory: Path, mirror: str) -> str:
    """The base image's tag, imported from a fresh mmdebstrap root when missing."""
    key = base_key(mirror)
    tag = f"{BASE_REPOSITORY}:{SUITE}-{key}"
    if image_exists(tag):
        return tag
    tarball = directory / f"base-{SUITE}-{key}.tar"
    if not tarball.is_file():
        for stale in directory.glob("base-*.tar*"):
            stale.unlink()
        partial = directory / f".base-{SUITE}-{key}.{os.getpid()}.tar"
        logger.info("building the image's Debian %s root from %s", SUITE, mirror)
        sources = [f"deb {mirror} {SUITE} main", f"deb {mirror} {SUITE}-updates main"]
        try:
            _run(
                "mmdebstrap (the image's base root)",
                ["mmdebstrap", "--quiet", *_MMDEBSTRAP_OPTIONS, SUITE, str(partial), *sources],
            )
            os.replace(partial, tarball)
        finally:
            partial.unlink(missing_ok=True)
    _run("podman import", [*PODMAN, "import", "--change", 'CMD ["/bin/bash"]', str(tarball), tag])
    return tag


def _stage_context(repo: Path, context: Path) -> None:
    """The build context the Dockerfile reads: wheelhouse, jobs, log4j config, entrypoint."""
    wheelhouse = context / "wheelhouse"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheelhouse)]
    spark = [pinned(name, repo / "requirements.lock") for name in SPARK_PACKAGES]
    _run(
        "pip wheel (the runtime lock and Spark)",
        [*pip, "-r", str(repo / "requirements-runtime.lock"), *spark],
    )
    source = context / "source"  # the package built from a copy: no build/ in the checkout
    shutil.copytree(
        repo, source, ignore=shutil.ignore_patterns(".*", "dist", "build", "tests", "__pycache__")
    )
    _run("pip wheel (rmq_spark)", [*pip, str(source)])
    shutil.rmtree(source)
    shutil.copytree(repo / "jobs", context / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    (context / "conf").mkdir()
    shutil.copy2(repo / "conf" / "log4j2.properties", context / "conf")
    shutil.copy2(repo / "docker" / "entrypoint.sh", context / "entrypoint.sh")


def _remove_older(repository: str, *keep: str) -> None:
    """Remove the images of ``repository`` other than ``keep`` (earlier inputs)."""
    listed = _run(
        "podman images",
        [*PODMAN, "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
    )
    for tag in listed.split():
        if tag not in keep and tag.startswith(f"{repository}:"):
            subprocess.run([*PODMAN, "rmi", "--force", tag], capture_output=True, check=False)


def ensure_image(repo: Path = REPO, *, mirror: str | None = None) -> Image:
    """The image of this checkout, built first when its inputs changed (idempotent).

    Example: ``ensure_image().tag == "localhost/rmq-spark:0.1.0-<key>"``.
    """
    directory = cache_dir()
    with _lock(directory):
        base = ensure_base(directory, mirror or host_mirror())
        version = _package_version(repo)
        key = image_key(repo, base)
        tag = f"{IMAGE_REPOSITORY}:{version}-{key}"
        if image_exists(tag):
            _run("podman tag", [*PODMAN, "tag", tag, f"{IMAGE_REPOSITORY}:{version}"])
            return Image(tag=tag, size_bytes=image_size(tag), build_seconds=0.0)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rmq-spark-image-") as context:
            _stage_context(repo, Path(context))
            logger.info("building %s FROM %s", tag, base)
            _run(
                "podman build",
                [
                    *PODMAN,
                    "build",
                    "--network",
                    "host",
                    "--build-arg",
                    f"BASE_IMAGE={base}",
                    "--build-arg",
                    f"INPUTS_KEY={key}",
                    "--file",
                    str(repo / "docker" / "Dockerfile"),
                    "--tag",
                    tag,
                    context,
                ],
            )
        _run("podman tag", [*PODMAN, "tag", tag, f"{IMAGE_REPOSITORY}:{version}"])
        _remove_older(IMAGE_REPOSITORY, tag, f"{IMAGE_REPOSITORY}:{version}")
        _remove_older(BASE_REPOSITORY, base)
        _run("podman image prune", [*PODMAN, "image", "prune", "--force"])
        return Image(
            tag=tag, size_bytes=image_size(tag), build_seconds=round(time.monotonic() - started, 1)
        )


def _package_version(repo: Path) -> str:
    for line in (repo / "rmq_spark" / "__init__.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise ImageError(f"no __version__ in {repo / 'rmq_spark' / '__init__.py'}")


def main(argv: Sequence[str] | None = None) -> int:
    """``build``: build the image unless its inputs are unchanged; print tag and size."""
    parser = argparse.ArgumentParser(
        prog="python -m rmq_spark.devtools.image",
        description="Build the rmq-spark image with podman (base root from mmdebstrap).",
    )
    parser.add_argument("command", choices=["build"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        image = ensure_image()
    except RmqSparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = f"built in {image.build_seconds:.0f} s" if image.build_seconds else "up to date"
    print(json.dumps({"tag": image.tag, "size_bytes": image.size_bytes}), state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
