# Runs tests/test_slurm.py's scancel test on the work dir its fixture already finished
# (the fixture's full run passed its three tests in this session's pytest run).
import sys
import time
from pathlib import Path

sys.path.insert(0, "/work/main/tests")
import test_slurm as t

work = Path("/tmp/slurm-test/tmp/slurm0/work")
partition, why = t._cluster()
assert partition, why
flags = t.slurm_overrides(partition)
t0 = time.monotonic()
t.test_scancel_mid_benchmark_then_the_rerun_redoes_only_that_job({"work": work, "flags": flags})
print(f"scancel test passed in {time.monotonic() - t0:.0f} s")
