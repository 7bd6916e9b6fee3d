"""bench/process_memory.py: which role a process plays, and a real child's peak."""

from __future__ import annotations

import subprocess
import sys

from bench.process_memory import TreeMemory, role_of

HELD_MIB = 64
# Allocates and touches HELD_MIB, says so, then holds it until its stdin closes.
HOLDER = (
    f"import sys; block = bytearray({HELD_MIB} << 20); block[::4096] = b'x' * len(block[::4096]);"
    " print('held', flush=True); sys.stdin.read()"
)


def test_roles_come_from_the_command_line() -> None:
    assert role_of(["/usr/lib/jvm/bin/java", "-cp", "x", "SparkSubmit"]) == "jvm"
    assert role_of(["/venv/bin/python", "-m", "pyspark.daemon"]) == "executor_python"
    assert role_of(["python3.11", "jobs/transfer.py", "--config", "c.yaml"]) == "driver_python"
    assert role_of(["bash", "./spark-submit.sh"]) is None
    assert role_of([]) is None


def test_a_grandchilds_peak_is_seen_through_its_parent_shell() -> None:
    # The shell is the root, as spark-submit.sh is; the interpreter is its descendant.
    with subprocess.Popen(
        # "; exit $?": a shell may exec a lone command in place of itself.
        ["sh", "-c", f'"{sys.executable}" -c "{HOLDER}"; exit $?'],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as shell:
        assert shell.stdout is not None
        assert shell.stdin is not None
        assert shell.stdout.readline().strip() == "held"
        memory = TreeMemory(shell.pid)
        memory.sample()
        shell.stdin.close()
        shell.wait(30)
    peaks = memory.to_json()
    assert peaks["driver_python"]["processes_seen"] == 1
    assert peaks["driver_python"]["largest_process_mib"] >= HELD_MIB
    assert peaks["driver_python"]["largest_total_mib"] >= HELD_MIB
    assert peaks["jvm"]["processes_seen"] == 0
