"""The harness's per-version wiring, without starting a node: commands, env, saved state."""

from __future__ import annotations

from pathlib import Path

from rmq_spark.devtools.local_brokers import (
    LocalNode,
    _base_env,
    _script_command,
    _server_env,
    load_nodes,
    save_nodes,
)


def _node(tmp_path: Path, *, root: Path | None) -> LocalNode:
    return LocalNode(
        label="dr",
        node_name="rmqspark-dr-abc123@localhost",
        amqp_port=40001,
        management_port=40002,
        dist_port=40003,
        base_dir=tmp_path / "dr-abc123",
        username="admin",
        password="secret",
        version="3.10" if root is None else "4.3",
        root=root,
        epmd_port=None if root is None else 40004,
    )


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "roots" / "4.3"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nrabbitmq:x:101:102::/var/lib/rabbitmq:/usr/sbin/nologin\n"
    )
    return root


def test_a_root_node_runs_its_scripts_chrooted_in_a_mount_namespace_of_its_own(
    tmp_path: Path,
) -> None:
    root = _fake_root(tmp_path)
    node = _node(tmp_path, root=root)
    cmd = _script_command(node, "rabbitmqctl", ["-n", node.node_name, "status"])
    assert cmd[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = cmd[6]
    assert 'mount --bind "$node_dir" "$root/rmq-spark/node"' in script
    assert 'exec chroot --userspec="$uid:$gid"' in script
    # root, node dir, and the root's own rabbitmq ids (not the host's), then the script
    assert cmd[8:13] == [
        str(root),
        str(node.base_dir),
        "101",
        "102",
        "/usr/lib/rabbitmq/bin/rabbitmqctl",
    ]
    assert cmd[13:] == ["-n", node.node_name, "status"]


def test_a_root_node_sees_its_dir_at_the_mount_point_and_has_its_own_epmd(tmp_path: Path) -> None:
    node = _node(tmp_path, root=_fake_root(tmp_path))
    env = _server_env(node)
    assert env["RABBITMQ_MNESIA_BASE"] == "/rmq-spark/node/mnesia"
    assert env["HOME"] == "/rmq-spark/node/home"
    assert env["ERL_EPMD_PORT"] == "40004"
    assert env["RMQ_SPARK_LOCAL_EPMD"] == "40004"
    assert env["RMQ_SPARK_LOCAL_NODE"] == node.node_name
    assert _base_env(node)["ERL_EPMD_PORT"] == "40004"  # rabbitmqctl finds the same epmd


def test_a_host_node_keeps_host_paths_and_the_system_epmd(tmp_path: Path) -> None:
    node = _node(tmp_path, root=None)
    env = _server_env(node)
    assert env["RABBITMQ_MNESIA_BASE"] == str(node.base_dir / "mnesia")
    assert "ERL_EPMD_PORT" not in env
    assert "RMQ_SPARK_LOCAL_EPMD" not in env


def test_nodes_json_keeps_version_root_and_epmd_port(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, root=_fake_root(tmp_path)), _node(tmp_path / "h", root=None)]
    nodes[1] = LocalNode(**{**nodes[1].__dict__, "label": "main"})
    save_nodes(nodes, tmp_path / "state")
    assert load_nodes(tmp_path / "state") == nodes
