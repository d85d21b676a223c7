"""keep_freed_memory: freed arrays stay mapped in the process (checked in a fresh process)."""
import subprocess
import sys

import pytest

SCRIPT = """
import numpy as np
from minitensor.allocator import keep_freed_memory

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20

def kept_after_free():
    arrays = [np.ones(1 << 20, np.float32) for _ in range(50)]  # 50 arrays of 4 MiB
    peak = resident_mib()
    del arrays
    return peak - resident_mib() < 50  # at most 50 of the 200 MiB handed back

print(kept_after_free(), keep_freed_memory(), kept_after_free())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm; mallopt is glibc's")
def test_after_keep_freed_memory_freed_arrays_stay_resident():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
