"""An executor whose Python cannot start: from Spark's failure text to one clear line.

When the executors' interpreter does not exist on a node (no archive shipped and no
python3 there, or a venv-pack archive whose ``bin/python`` links to the builder's
interpreter), the probe task never runs Python: the JVM fails to start the process and
the job dies with Spark's stage failure, which PySpark surfaces as a Py4JJavaError (a
Spark Connect client gets the same text in its own exception). The executor pre-flight
turns that into an ExecutorEnvironmentError, exit 2, naming the interpreter and the
cause. Pure text matching: no Spark is imported here.
"""

from __future__ import annotations

import re

from rmq_spark.errors import ExecutorEnvironmentError

RELOCATABLE_HINT = (
    "ship the executor archive, which carries its own Python: make package, then "
    "./spark-submit.sh --env-archive dist/rmq-spark-executor-env-*.tar.gz ..."
)
# java.io.IOException: Cannot run program "./environment/bin/python" (in directory
# "/work/app-1/0"): error=2, No such file or directory
_CANNOT_RUN = re.compile(
    r'Cannot run program "(?P<python>[^"]+)"(?: \(in directory "[^"]*"\))?: '
    r"error=(?P<errno>\d+), (?P<cause>[^\r\n]+)"
)
# The dynamic loader of a Python that exists but whose libraries do not (rc 127).
_LOADER = re.compile(
    r"(?P<python>\S*python[\w.]*): error while loading shared libraries: (?P<cause>[^\r\n]+)"
)
# Lost task 0.3 in stage 0.0 (TID 3) (10.0.0.7 executor 2): ...
_WHERE = re.compile(
    r"Lost task \S+ in stage \S+ \(TID \d+\) \((?P<host>\S+) executor (?P<id>[^)]+)\)"
)


def python_start_error(failure: BaseException | str) -> ExecutorEnvironmentError | None:
    """One line for a failure whose cause is an executor Python that cannot start, or
    None when the failure is something else (then it is not ours to classify).

    Example: the text of a stage failure with ``Cannot run program "python3": error=2,
    No such file or directory`` gives "the executors' Python python3 cannot start on
    host 10.0.0.7 (executor 2): No such file or directory (error=2); ship the ...".
    """
    text = str(failure)
    found = _CANNOT_RUN.search(text)
    if found:
        cause = f"{found['cause'].strip()} (error={found['errno']})"
    else:
        found = _LOADER.search(text)
        if not found:
            return None
        cause = f"error while loading shared libraries: {found['cause'].strip()}"
    where = _WHERE.search(text)
    on = f" on host {where['host']} (executor {where['id']})" if where else ""
    return ExecutorEnvironmentError(
        f"the executors' Python {found['python']} cannot start{on}: {cause}; {RELOCATABLE_HINT}"
    )
