"""GPU leases inside a Slurm job: the allocation decides, the lease files take no part.

The Slurm variables are the input here (what slurmd exports into a job), so they are set in
the environment of a real process; tests/integration/test_slurm.py reads them from a real
allocation.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from cellbench.runtime.leases import LEASE_FILES, PORT_SPAN, allocated_gpus, gpu_lease, under_slurm
from support.docker_env import PYTHON, WORKFLOW

# What slurmd exported into a job given two GPUs on tests/integration/test_slurm.py's cluster,
# with node
# indices that differ from the visible-devices numbering (a ConstrainDevices node).
ALLOCATION = {
    "SLURM_JOB_ID": "41",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "ROCR_VISIBLE_DEVICES": "0,1",
    "SLURM_JOB_GPUS": "4,5",
}


@pytest.mark.parametrize(
    ("vendor", "for_container", "expected", "source"),
    [
        ("amd", False, (0, 1), "ROCR_VISIBLE_DEVICES"),
        ("nvidia", False, (0, 1), "CUDA_VISIBLE_DEVICES"),
        # A container started by the node's Docker daemon lives outside the job's cgroup and
        # needs the node's own indices.
        ("amd", True, (4, 5), "SLURM_JOB_GPUS"),
    ],
)
def test_the_allocation_names_the_gpus(vendor, for_container, expected, source):
    assert allocated_gpus(2, ALLOCATION, vendor=vendor, for_container=for_container) == (
        expected,
        source,
    )


def test_step_gpus_win_over_job_gpus_and_nodevfiles_is_skipped():
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_STEP_GPUS": "3"}
    env["SLURM_JOB_GPUS"] = "2,3"
    assert allocated_gpus(1, env, vendor="nvidia") == ((3,), "SLURM_STEP_GPUS")


def test_a_larger_allocation_gives_its_first_gpus_and_says_so():
    gpus, source = allocated_gpus(1, ALLOCATION, vendor="amd")
    assert gpus == (0,) and source == "ROCR_VISIBLE_DEVICES (first 1 of 2)"


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SLURM_JOB_ID": "9", "ROCR_VISIBLE_DEVICES": "2"}, r"names 1 GPU.*needs 2.*gpu=2"),
        ({"SLURM_JOB_ID": "9"}, r"names no GPUs.*gpu=2"),
        ({"SLURM_JOB_ID": "9", "CUDA_VISIBLE_DEVICES": "GPU-1a2b,GPU-3c4d"}, r"not a list"),
    ],
)
def test_an_allocation_that_cannot_serve_the_job_is_refused(env, match):
    with pytest.raises(ValueError, match=match):
        allocated_gpus(2, env, vendor="nvidia")


def test_under_slurm_the_lease_files_are_not_used(tmp_path):
    lease_dir = tmp_path / "leases"
    # total=0: the host's configured count is not consulted under Slurm.
    with gpu_lease(2, 0, lease_dir, vendor="amd", env=ALLOCATION) as first:
        # A second job of the same node holding the same indices is Slurm's business (it
        # never hands one GPU to two jobs); no lock file stands in for that across nodes.
        with gpu_lease(2, 0, lease_dir, vendor="amd", env=ALLOCATION) as second:
            assert first.gpu_indices == second.gpu_indices == (0, 1)
            assert first.gpu_source == "ROCR_VISIBLE_DEVICES"
            assert first.port != second.port  # ports stay exclusive on the node
    assert not lease_dir.exists() or not list(lease_dir.glob("gpu*"))
    assert not under_slurm({"CUDA_VISIBLE_DEVICES": "0"})
    with gpu_lease(1, 2, lease_dir, env={}) as local:
        assert local.gpu_source == LEASE_FILES and (lease_dir / "gpu0.lock").exists()


def test_a_host_step_under_slurm_keeps_the_allocations_devices(tmp_path):
    # A real step process in a job's environment: the command sees the allocation's own
    # ROCR_VISIBLE_DEVICES, no HIP_VISIBLE_DEVICES laid over it, and the log says who decided.
    env = {**os.environ, "PYTHONPATH": str(WORKFLOW), **ALLOCATION}
    env.pop("HIP_VISIBLE_DEVICES", None)
    show = "import os; print(os.getenv('ROCR_VISIBLE_DEVICES'), os.getenv('HIP_VISIBLE_DEVICES'))"
    proc = subprocess.run(
        [PYTHON, "-m", "cellbench.runtime.steps", "--runtime", "local", "--gpu-vendor", "amd"]
        + ["--gpus", "2", "--total-gpus", "0", "--lease-dir", str(tmp_path / "leases")]
        + ["--log", "step.log", "--", PYTHON, "-c", show],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "step.log").read_text()
    assert "GPUs [0, 1] decided by ROCR_VISIBLE_DEVICES" in log
    assert "0,1 None" in log


def test_jobs_of_one_node_search_for_ports_from_different_places(tmp_path):
    # Two jobs that start at the same moment must not both try the span's first free port:
    # another user's job locks its ports in its own folder, so only the bind check would
    # stand between them.
    ports = []
    for job_id in ("100", "101"):
        env = {"SLURM_JOB_ID": job_id}
        with gpu_lease(0, 0, tmp_path / "unused", port_base=20100, env=env) as lease:
            ports.append(lease.port)
    assert len(set(ports)) == 2 and all(20100 <= p < 20100 + PORT_SPAN for p in ports)
