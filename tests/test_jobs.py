"""The local pool behind `run_jobs`: its workers end with the driver that started them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dl2.distributed.jobs import run_jobs

DRIVER = """
import sys, time
from pathlib import Path
from dl2.distributed.jobs import run_jobs

def record_and_wait(folder, index):
    import os
    (Path(folder) / f"{index}.pid").write_text(str(os.getpid()))
    time.sleep(600)

if __name__ == "__main__":
    list(run_jobs(record_and_wait, [(sys.argv[1], 0), (sys.argv[1], 1)], workers=2))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_jobs_in_a_pool_return_in_job_order():
    assert list(run_jobs(pow, [(2, 3), (3, 2), (5, 1)], workers=2)) == [(0, 8), (1, 9), (2, 5)]


def test_a_killed_driver_takes_its_pool_workers_with_it(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path)
    try:
        assert _wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, 120), "both jobs started"
        workers = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        assert all(_alive(pid) for pid in workers)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert _wait_for(lambda: not any(_alive(pid) for pid in workers), 30), "no worker outlives its driver"
    finally:
        driver.kill()
        for p in tmp_path.glob("*.pid"):
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
