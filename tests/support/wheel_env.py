"""A fresh venv holding what a user installs: the wheel and its runtime lock, no Spark.

Built as a user would, from the checkout's `make wheel`: the wheel alone, then
requirements-runtime.lock (the runtime closure, without pyspark) and the wheel's
`[notebook]` extra, constrained to the tested versions. Nothing of the checkout is on
its path: the wheel excludes the dev harness, and commands run outside the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class WheelEnv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def rmq_spark(self) -> Path:
        return self.root / "bin" / "rmq-spark"

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The caller's environment without anything pointing into the checkout or at
        another interpreter."""
        dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
        environ = {k: v for k, v in os.environ.items() if k not in dropped}
        environ["PATH"] = f"{self.root / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
        return {**environ, **(extra or {})}


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def build_wheel_env(base: Path) -> WheelEnv:
    dist = base / "dist"
    run(["make", "-s", "wheel", f"DIST={dist}", f"PYTHON={sys.executable}"], cwd=REPO)
    (wheel,) = dist.glob("rmq_spark-*.whl")
    env = WheelEnv(base / "venv")
    run([sys.executable, "-m", "venv", str(env.root)])
    # --no-compile: the commands import a fraction of what is installed.
    pip = [
        str(env.python),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-compile",
    ]
    run([*pip, "--no-deps", "-r", str(REPO / "requirements-runtime.lock"), str(wheel)])
    run([*pip, "-c", str(REPO / "requirements.lock"), f"{wheel}[notebook]"])
    return env
