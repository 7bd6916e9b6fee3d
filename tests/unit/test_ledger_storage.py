"""Which delta-rs storage options a ledger path gets (pure: mounts are given)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.ledger.storage import file_system_of, mounts, needs_unsafe_rename, storage_options

MOUNTED = [
    ("/", "overlay"),
    ("/data", "ext4"),
    ("/data/blob", "fuse.blobfuse2"),
    ("/mnt/s3", "fuse.s3fs"),
    ("/mnt/nfs", "nfs4"),
    ("/mnt/with space", "fuse"),
]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/data/ledger", "ext4"),
        ("/data/blob/ledger", "fuse.blobfuse2"),
        ("/data/blobby", "ext4"),  # a name that starts like a mount point is not under it
        ("/mnt/with space/l", "fuse"),
        ("/srv/ledger", "overlay"),
    ],
)
def test_the_longest_mount_point_above_a_path_decides(path: str, expected: str) -> None:
    assert file_system_of(path, MOUNTED) == expected


@pytest.mark.parametrize(
    "path",
    ["/Volumes/ops/rmq/ledger", "/dbfs/rmq/ledger", "/data/blob/ledger", "/mnt/s3/l"],
)
def test_fuse_and_databricks_storage_commit_with_unsafe_rename(path: str) -> None:
    assert needs_unsafe_rename(path, MOUNTED)
    assert storage_options(path, MOUNTED) == {"allow_unsafe_rename": "true"}


@pytest.mark.parametrize("path", ["/data/ledger", "/mnt/nfs/ledger", "/Volumesque/l", "/srv/l"])
def test_other_storage_keeps_delta_rs_safe_commits(path: str) -> None:
    assert storage_options(path, MOUNTED) == {}


def test_mountinfo_is_parsed_with_escaped_spaces(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - overlay overlay rw\n"
        "40 22 0:35 / /mnt/with\\040space rw,nosuid - fuse.s3fs s3fs rw,user_id=0\n"
        "41 22 0:36 / /proc rw - proc proc rw\n"
    )
    assert mounts(str(info)) == [
        ("/", "overlay"),
        ("/mnt/with space", "fuse.s3fs"),
        ("/proc", "proc"),
    ]


def test_no_mountinfo_means_no_mounts(tmp_path: Path) -> None:
    assert mounts(str(tmp_path / "missing")) == []
