"""GPU/port leases: disjoint between concurrent jobs, waited for, released however a job ends."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from cellbench.runtime.leases import gpu_lease
from support.docker_env import PYTHON, WORKFLOW

HOLDER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {workflow!r})
    from cellbench.runtime.leases import gpu_lease
    with gpu_lease({count}, {total}, {lease_dir!r}) as lease:
        print(",".join(map(str, lease.gpu_indices)), lease.port, flush=True)
        time.sleep(120)
    """
)


def _holder(lease_dir, count, total):
    """A separate process holding a lease until killed; returns (proc, indices, port)."""
    code = HOLDER.format(workflow=str(WORKFLOW), count=count, total=total, lease_dir=str(lease_dir))
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    indices = tuple(int(i) for i in line[0].split(",") if i) if line else None
    return proc, indices, int(line[1])


def test_concurrent_processes_get_disjoint_gpus_and_ports(tmp_path):
    procs = []
    try:
        a = _holder(tmp_path, 2, 4)
        procs.append(a[0])
        b = _holder(tmp_path, 2, 4)
        procs.append(b[0])
        assert len(a[1]) == 2 and len(b[1]) == 2
        assert set(a[1]).isdisjoint(b[1])
        assert set(a[1]) | set(b[1]) == {0, 1, 2, 3}
        assert a[2] != b[2]
        # This process now finds the host full.
        with pytest.raises(TimeoutError, match="held: gpu"):
            with gpu_lease(1, 4, tmp_path, timeout_s=0.5, poll_s=0.1, out=None):
                pass
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_lease_released_when_holder_is_killed(tmp_path):
    proc, indices, _ = _holder(tmp_path, 2, 2)
    assert indices == (0, 1)
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up code runs: the kernel drops the locks
    proc.wait()
    with gpu_lease(2, 2, tmp_path, timeout_s=5, out=None) as lease:
        assert lease.gpu_indices == (0, 1)


def test_waits_with_a_message_then_gets_the_gpus(tmp_path):
    out = io.StringIO()
    got = {}
    first = gpu_lease(1, 1, tmp_path, out=None)
    held = first.__enter__()

    def second():
        with gpu_lease(1, 1, tmp_path, poll_s=0.05, out=out) as lease:
            got["lease"] = lease

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.5)
    assert "lease" not in got
    assert "waiting for 1 of 1 GPUs" in out.getvalue()
    first.__exit__(None, None, None)
    t.join(timeout=10)
    assert got["lease"].gpu_indices == held.gpu_indices == (0,)
    assert "got GPUs [0]" in out.getvalue()


def test_released_on_exception_and_ports_distinct_in_one_process(tmp_path):
    with pytest.raises(RuntimeError, match="job failed"):
        with gpu_lease(1, 1, tmp_path, out=None):
            raise RuntimeError("job failed")
    with gpu_lease(1, 1, tmp_path, timeout_s=1, out=None) as a:
        with gpu_lease(0, 1, tmp_path, out=None) as b:
            assert a.port != b.port and b.gpu_indices == ()
    assert not list(tmp_path.glob("*.owner"))


def test_port_in_use_on_the_host_is_skipped(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with gpu_lease(0, 0, tmp_path, port_base=busy, out=None) as lease:
            assert lease.port == busy + 1


@pytest.mark.parametrize(
    ("count", "total", "match"),
    [(3, 2, "3 GPUs asked for but the host has gpus=2"), (-1, 2, "must be >= 0")],
)
def test_impossible_requests_fail_at_once(tmp_path, count, total, match):
    with pytest.raises(ValueError, match=match):
        with gpu_lease(count, total, tmp_path, out=None):
            pass


def test_module_has_no_docker_dependency():
    # Leases are used by host-side local runs too; importing them must not need the engine.
    code = "import sys; import cellbench.runtime.leases; print('docker' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(WORKFLOW)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
