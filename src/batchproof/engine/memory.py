"""Handing memory back to the OS: pages the engine has finished with leave its resident set.

Resident memory is what a small machine runs out of, so two things that would otherwise
stay resident are dropped: a freed batch slot's keys and values (the pages of the longest
sequence the slot ever held), and the model file's pages once the weights are copied out
of the mapping (else the file and its copy are both resident at the load's peak)."""

import ctypes
import mmap
import sys

import numpy as np

PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4  # Linux: anonymous pages read as zeros when next touched


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


_MADVISE = _madvise()


def drop_pages(address: int, nbytes: int) -> None:
    """The whole pages inside [address, address + nbytes) leave the resident set; their
    contents are gone (zeros when next read), so only memory nothing will read again."""
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    if _MADVISE is not None and end > start:
        _MADVISE(start, end - start, MADV_DONTNEED)


def drop_mapped_file_pages(array: np.ndarray) -> None:
    """The pages of the file mapping under `array` leave the resident set; the page cache
    keeps them and a later read maps them again, so the array stays valid."""
    base = array  # views of views of np.frombuffer(mapping), whose base is a memoryview
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if base is not None and hasattr(base, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)
