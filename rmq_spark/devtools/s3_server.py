"""A local S3 API server for an object-store ledger: moto's S3 app, served by waitress.

Why moto: Ceph's radosgw in Debian (16.2) needs a monitor and OSDs even on one node
(its cluster-less "dbstore" backend came later and is experimental), minutes of set-up
and memory this 2-core machine shares with RabbitMQ and Spark; MinIO is in neither
Debian nor PyPI. moto (PyPI, maintained, used by boto3's own users for S3 tests) runs
the S3 API as one Python process, starts in about a second, checks SigV4 signatures
against IAM keys when asked to, and speaks the conditional PUTs delta-rs commits with.

It runs from a virtualenv of its own (`requirements-s3-server.lock`, built once under
~/.cache/rmq-spark), since boto3 pins python-dateutil below the project's lock.

The server checks credentials: the first requests (NO_AUTH_SETUP_REQUESTS) are free,
and `start` spends them creating an IAM user with an S3 policy, its access key and
the bucket, so every later request must be signed with that key.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rmq_spark.devtools.ports import free_port

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements-s3-server.lock"
CACHE = Path(os.environ.get("RMQ_SPARK_CACHE", Path.home() / ".cache" / "rmq-spark"))
REGION = "us-east-1"
# create_user, put_user_policy, create_access_key, create_bucket (`_SETUP`).
NO_AUTH_SETUP_REQUESTS = 4
START_TIMEOUT_SECONDS = 60.0

# moto's app under waitress. moto's own `moto_server` runs it on werkzeug's development
# server, which closes the connection after every response: behind the bench's delay
# proxy each request then paid a new TCP handshake too, ~66 ms a PUT and ~90 ms a read
# for a 20 ms round trip, where a bucket's endpoint keeps connections open. waitress
# keeps them open. The access log keeps werkzeug's format, the path decoded (the bench
# and the tests count requests in it), and adds the client (its user agent's first word):
# `ADDRESS - - [date] "METHOD PATH HTTP/1.1" STATUS - "CLIENT"`.
_SERVE = """
import os, sys, threading, time
import waitress
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from waitress.parser import HTTPRequestParser
# pyarrow's empty PUTs (directory markers) say "Expect: 100-continue" with no body:
# waitress 3.0.2 answers 100 Continue, then waits for a body forever. None will come.
parse_header = HTTPRequestParser.parse_header
def parse_header_without_empty_expect(self, header_plus):
    parse_header(self, header_plus)
    if not self.chunked and self.content_length == 0:
        self.expect_continue = False
HTTPRequestParser.parse_header = parse_header_without_empty_expect
host, port = sys.argv[1], sys.argv[2]
os.environ.setdefault("MOTO_PORT", port)
moto = DomainDispatcherApplication(create_backend_app)
logging_lock = threading.Lock()
def logged(environ, start_response):
    # moto checks signatures over the raw path (werkzeug's RAW_URI; waitress's REQUEST_URI).
    environ.setdefault("RAW_URI", environ.get("REQUEST_URI", ""))
    path = environ.get("PATH_INFO", "")
    if environ.get("QUERY_STRING"):
        path += "?" + environ["QUERY_STRING"]
    def start(status, headers, exc_info=None):
        stamp = time.strftime("%d/%b/%Y %H:%M:%S")
        line = '%s - - [%s] "%s %s %s" %s - "%s"' % (
            environ.get("REMOTE_ADDR", "-"), stamp, environ["REQUEST_METHOD"], path,
            environ.get("SERVER_PROTOCOL", "HTTP/1.1"), status.split(" ", 1)[0],
            environ.get("HTTP_USER_AGENT", "-").split(" ", 1)[0])
        with logging_lock:  # eight threads: one whole line at a time
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()
        return start_response(status, headers, exc_info)
    return moto(environ, start)
waitress.serve(logged, host=host, port=int(port), threads=8, ident=None, _quiet=True)
"""

_SETUP = """
import json, sys
import boto3
endpoint, bucket = sys.argv[1], sys.argv[2]
kw = dict(endpoint_url=endpoint, region_name="us-east-1",
          aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="rmq-spark-ledger")
policy = {"Version": "2012-10-17",
          "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_user_policy(UserName="rmq-spark-ledger", PolicyName="s3",
                    PolicyDocument=json.dumps(policy))
key = iam.create_access_key(UserName="rmq-spark-ledger")["AccessKey"]
boto3.client("s3", **kw).create_bucket(Bucket=bucket)
print(json.dumps({"access_key_id": key["AccessKeyId"],
                  "secret_access_key": key["SecretAccessKey"]}))
"""


@dataclass(frozen=True)
class S3Server:
    """A running server: its endpoint, bucket and the one key it accepts."""

    endpoint: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def __repr__(self) -> str:
        return f"S3Server(endpoint={self.endpoint!r}, bucket={self.bucket!r})"


def server_venv() -> Path:
    """moto's virtualenv, built from the lock when missing (~40 s, once)."""
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    venv = CACHE / f"s3-server-{digest}"
    if (venv / ".installed").exists():
        return venv
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-r", str(LOCK)], check=True
    )
    (venv / ".installed").touch()
    return venv


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def start(base: Path, bucket: str = "rmq-spark-ledger") -> S3Server:
    """Start a server on a free loopback port with `bucket` and one IAM key."""
    venv = server_venv()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    base.mkdir(parents=True, exist_ok=True)
    log_path = base / "s3-server.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(NO_AUTH_SETUP_REQUESTS)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(venv / "bin" / "python"), "-c", _SERVE, "127.0.0.1", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not _answers(endpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not start; see {log_path}")
            time.sleep(0.1)
        made = subprocess.run(
            [str(venv / "bin" / "python"), "-c", _SETUP, endpoint, bucket],
            check=True,
            capture_output=True,
        )
        key = json.loads(made.stdout)
    except BaseException:
        process.terminate()
        process.wait(timeout=30)
        raise
    return S3Server(
        endpoint, bucket, key["access_key_id"], key["secret_access_key"], process, log_path
    )


def stop(server: S3Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
