"""Progress lines for the testbeds' long steps (builds, `up`): a start line, a heartbeat while the step runs,
and an end line with its elapsed time, so that a cold build that takes most of an hour never looks hung."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HEARTBEAT_S = 60.0  # a line at least this often while a step runs

Log = Callable[[str], object]


@dataclass
class Elapsed:
    """The seconds a step took (set when it ends)."""

    seconds: float = 0.0


@contextmanager
def timed_step(log: Log, text: str, detail: str = "", heartbeat_s: float = HEARTBEAT_S) -> Iterator[Elapsed]:
    """Log `<text> (started[; detail])`, then `<text>: still running after N s` every `heartbeat_s` seconds, and at
    the end `<text>: done in N s` (or `failed after N s`); `heartbeat_s` 0: no heartbeat (for a step whose inner
    steps log their own). Yields an `Elapsed` that holds the step's seconds once it ends."""
    log(f"{text} (started{'; ' + detail if detail else ''})")
    began, elapsed, ended = time.perf_counter(), Elapsed(), threading.Event()

    def beat() -> None:
        while not ended.wait(heartbeat_s):
            log(f"{text}: still running after {seconds(time.perf_counter() - began)}")

    thread = threading.Thread(target=beat, daemon=True, name="heartbeat")
    if heartbeat_s > 0:
        thread.start()
    failed = True
    try:
        yield elapsed
        failed = False
    finally:
        ended.set()
        if thread.is_alive():
            thread.join()
        elapsed.seconds = time.perf_counter() - began
        log(f"{text}: {'failed after' if failed else 'done in'} {seconds(elapsed.seconds)}")


def seconds(s: float) -> str:
    """Elapsed seconds as a progress line gives them: whole seconds from 10 s on, tenths below."""
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
