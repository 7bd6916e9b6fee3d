"""rmq-spark: move RabbitMQ messages in bulk with PySpark, and prove nothing was lost."""

from __future__ import annotations

# The one place the version is written: pyproject reads it (setuptools' dynamic
# version), and `rmq-spark --version` prints it even where the package runs from a
# --py-files zip without installed metadata.
__version__ = "0.1.0"
