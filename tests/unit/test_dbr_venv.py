"""test-dbr's shared venv: what it installs and what its cache key covers (no pip run)."""

from __future__ import annotations

from pathlib import Path

from rmq_spark.devtools import dbr_venv


def locks(tmp_path: Path, ours: str, dbr: str) -> Path:
    (tmp_path / "requirements.lock").write_text(ours, encoding="utf-8")
    (tmp_path / "requirements-dbr.lock").write_text(dbr, encoding="utf-8")
    return tmp_path


def test_the_runtime_pins_replace_ours_and_the_rest_is_kept(tmp_path: Path) -> None:
    repo = locks(
        tmp_path,
        "# comment\npika==1.3.2\npyspark==4.1.0\nPyArrow==26.0.0\n    # via x\n",
        "pyspark==4.0.5\npyarrow==19.0.1\n",
    )

    lines = dbr_venv.requirements(repo).splitlines()

    assert "pika==1.3.2" in lines
    assert "pyspark==4.0.5" in lines
    assert "pyarrow==19.0.1" in lines
    assert not [line for line in lines if line.startswith(("pyspark==4.1", "PyArrow=="))]


def test_the_key_changes_with_either_lock_and_with_the_interpreter(tmp_path: Path) -> None:
    repo = locks(tmp_path, "pika==1.3.2\n", "pyspark==4.0.5\n")
    first = dbr_venv.key(repo, "/usr/bin/python3.12\n3.12.1")

    assert dbr_venv.key(repo, "/usr/bin/python3.12\n3.12.1") == first
    assert dbr_venv.key(repo, "/usr/bin/python3.12\n3.12.2") != first
    (repo / "requirements-dbr.lock").write_text("pyspark==4.0.6\n", encoding="utf-8")
    assert dbr_venv.key(repo, "/usr/bin/python3.12\n3.12.1") != first
    (repo / "requirements-dbr.lock").write_text("pyspark==4.0.5\n", encoding="utf-8")
    (repo / "requirements.lock").write_text("pika==1.3.3\n", encoding="utf-8")
    assert dbr_venv.key(repo, "/usr/bin/python3.12\n3.12.1") != first
