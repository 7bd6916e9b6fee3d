"""The image builder's keys and pins (no podman: what decides whether to rebuild)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from rmq_spark.devtools.image import IMAGE_INPUTS, ImageError, base_key, image_key, pinned

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the image's inputs."""
    for name in IMAGE_INPUTS:
        source = REPO / name
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def test_the_image_key_follows_its_inputs_and_its_base(checkout: Path) -> None:
    key = image_key(checkout, "base:a")
    assert image_key(checkout, "base:a") == key
    assert image_key(checkout, "base:b") != key

    (checkout / "jobs" / "transfer.py").write_text("# changed\n")
    changed = image_key(checkout, "base:a")
    assert changed != key
    # Bytecode caches are not inputs.
    (checkout / "rmq_spark" / "__pycache__").mkdir(exist_ok=True)
    (checkout / "rmq_spark" / "__pycache__" / "x.pyc").write_bytes(b"x")
    assert image_key(checkout, "base:a") == changed


def test_the_base_key_follows_the_mirror() -> None:
    assert base_key("http://deb.debian.org/debian") == base_key("http://deb.debian.org/debian")
    assert base_key("http://deb.debian.org/debian") != base_key("http://mirror.example/debian")


def test_spark_is_pinned_as_the_submitter_installs_it() -> None:
    # The image takes pyspark from requirements.lock; the submitting side installs the
    # `spark` extra. Compared as pins, not with the running pyspark: `make test-dbr`
    # runs these tests on another Spark on purpose.
    extra = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]["spark"]
    assert pinned("pyspark", REPO / "requirements.lock") in extra
    assert pinned("PY4J", REPO / "requirements.lock").startswith("py4j==")


def test_a_missing_pin_is_named(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("pika==1.4.4\n")
    with pytest.raises(ImageError, match=r"requirements.lock does not pin pyspark"):
        pinned("pyspark", lock)
