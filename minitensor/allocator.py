"""Keep freed memory in the process for the next training step.

A training step allocates and frees the same large activation arrays every step.
glibc's malloc gives freed memory at the top of its heap back to the OS as soon as
more than a threshold is free (a threshold it sets to about twice the largest array
freed recently), so the next step must fault fresh zeroed pages in again. On a small
GPT that page faulting is 10-25% of the step. Raising the two thresholds keeps the
memory mapped for reuse: the job PyTorch's caching allocator does on a GPU.
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters from glibc's <malloc.h>
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit: larger arrays are always mmapped


def keep_freed_memory(trim_threshold=1 << 30):
    """Serve arrays up to 32 MiB from the heap and keep up to `trim_threshold` bytes of
    freed heap instead of returning it to the OS. Process-wide; call once at start-up.

    Returns True if applied, False where the C library has no `mallopt` (not glibc).
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
