"""exit_job: a job's driver ends with its code, its output and atexit handlers intact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from rmq_spark.process_exit import HOSTED_ENV, can_skip_teardown


def run_script(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_exit_job_keeps_the_code_the_output_and_the_atexit_handlers() -> None:
    completed = run_script(
        """
        import atexit, logging, sys
        from rmq_spark.process_exit import exit_job
        logging.basicConfig(stream=sys.stderr, level=logging.INFO)
        atexit.register(lambda: print("atexit ran", flush=False))
        print("buffered line", end="")
        logging.getLogger("job").info("logged line")
        exit_job(3)
        """
    )
    assert completed.returncode == 3
    assert completed.stdout == "buffered lineatexit ran\n"
    assert "logged line" in completed.stderr


def test_exit_job_waits_for_a_running_non_daemon_thread() -> None:
    completed = run_script(
        """
        import threading, time
        from rmq_spark.process_exit import exit_job
        def late():
            time.sleep(0.5)
            print("thread finished", flush=True)
        threading.Thread(target=late).start()
        exit_job(1)
        """
    )
    assert completed.returncode == 1
    assert completed.stdout == "thread finished\n"


def test_teardown_is_kept_in_a_hosted_driver() -> None:
    main = threading.main_thread()
    assert can_skip_teardown({}, [main], main)
    assert not can_skip_teardown({HOSTED_ENV: "15.4"}, [main], main)


def test_daemon_and_finished_threads_do_not_keep_the_teardown() -> None:
    main = threading.main_thread()
    finished = threading.Thread(target=lambda: None)
    finished.start()
    finished.join()
    stop = threading.Event()
    daemon = threading.Thread(target=stop.wait, daemon=True)
    daemon.start()
    try:
        assert can_skip_teardown({}, [main, finished, daemon], main)
        running = threading.Thread(target=stop.wait)
        running.start()
        assert not can_skip_teardown({}, [main, running], main)
    finally:
        stop.set()
