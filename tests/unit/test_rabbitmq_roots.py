"""The Debian roots' pure parts: which mirror the host names, which version is which."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rmq_spark.devtools.rabbitmq_roots import (
    RabbitMQRootError,
    host_mirror,
    load_root,
    root_path,
    roots_dir,
    spec_for,
    upstream_version,
)

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def _apt_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_host_mirror_reads_the_main_suite_from_deb822_sources(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, {"sources.list.d/debian.sources": DEB822})
    assert host_mirror(apt) == "http://mirror.example/debian"


def test_host_mirror_passes_over_security_and_update_suites(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path,
        {
            "sources.list": (
                "deb http://sec.example/debian-security bookworm-security main\n"
                "deb [arch=amd64] http://upd.example/debian bookworm-updates main\n"
                "deb http://main.example/debian/ bookworm main # the archive\n"
            )
        },
    )
    assert host_mirror(apt) == "http://main.example/debian"


def test_host_mirror_skips_disabled_stanzas(tmp_path: Path) -> None:
    disabled = "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
    apt = _apt_dir(tmp_path, {"sources.list.d/a.sources": disabled + DEB822})
    assert host_mirror(apt) == "http://mirror.example/debian"


def test_host_mirror_without_sources_names_the_directory(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, {})
    with pytest.raises(RabbitMQRootError, match=re.escape(str(tmp_path))):
        host_mirror(apt)


def test_upstream_version_drops_epoch_and_debian_revision() -> None:
    assert upstream_version("4.3.6-1") == "4.3.6"
    assert upstream_version("4.0.5-6+deb13u2") == "4.0.5"
    assert upstream_version("1:29.1.1+dfsg-1") == "29.1.1+dfsg"
    assert upstream_version("3.10.8") == "3.10.8"


def test_versions_map_to_their_debian_suites() -> None:
    assert spec_for("4.0").suite == "trixie"
    assert spec_for("4.3").suite == "forky"
    assert not spec_for("4.3").check_valid_until


def test_the_host_version_has_no_root() -> None:
    with pytest.raises(RabbitMQRootError, match=r"3\.10 is the host.s own package"):
        spec_for("3.10")


def test_roots_dir_follows_the_override_then_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RMQ_SPARK_ROOTS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert roots_dir() == tmp_path / "xdg" / "rmq-spark" / "roots"
    monkeypatch.setenv("RMQ_SPARK_ROOTS_DIR", str(tmp_path / "mine"))
    assert roots_dir() == tmp_path / "mine"
    assert root_path("4.3") == tmp_path / "mine" / "4.3"


def test_a_root_without_its_info_file_is_not_built(tmp_path: Path) -> None:
    (tmp_path / "4.0" / "usr").mkdir(parents=True)
    assert load_root("4.0", tmp_path) is None


def test_a_built_root_reports_its_exact_versions(tmp_path: Path) -> None:
    (tmp_path / "4.3").mkdir()
    (tmp_path / "4.3" / "rmq-spark-root.json").write_text(
        '{"suite": "forky", "mirror": "http://m/debian", "rabbitmq_server": "4.3.6-1",'
        ' "erlang_base": "1:29.1.1+dfsg-1", "build_seconds": 18.4}',
        encoding="utf-8",
    )
    root = load_root("4.3", tmp_path)
    assert root is not None
    assert (root.rabbitmq_version, root.rabbitmq_package, root.suite) == (
        "4.3.6",
        "4.3.6-1",
        "forky",
    )
