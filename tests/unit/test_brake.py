"""The brake the interrupting tests put on an engine (tests/support/brake.py), on a busy loop."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.support.brake import Brake
from tests.support.waiting import eventually_sync

BUSY = "while True: pass"


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_a_braked_process_runs_a_small_share_and_stops_while_held() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    process = psutil.Process(proc.pid)
    try:
        with Brake([proc.pid]) as brake:
            began, cpu = time.monotonic(), _cpu_s(process)
            time.sleep(2)
            share = (_cpu_s(process) - cpu) / (time.monotonic() - began)
            assert share < 0.5, share  # about 0.1 (running 0.03 s in 0.28)
            with brake.hold():
                eventually_sync(lambda: process.status() == psutil.STATUS_STOPPED, "stopped")
                cpu = _cpu_s(process)
                time.sleep(0.5)  # past any turn of the brake's cycle
                assert _cpu_s(process) == cpu
            brake.release()
            eventually_sync(lambda: process.status() != psutil.STATUS_STOPPED, "running again")
            cpu = _cpu_s(process)
            eventually_sync(lambda: _cpu_s(process) > cpu + 0.2, "running at full speed", 2)
    finally:
        proc.kill()
        proc.wait()
