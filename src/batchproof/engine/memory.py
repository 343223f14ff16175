"""Handing memory back to the OS: pages the engine has finished with leave its resident set.

Resident memory is what a small machine runs out of, so what would otherwise stay
resident is dropped: a freed batch slot's keys and values (the pages of the longest
sequence the slot ever held), the model file's pages once the weights are copied out of
the mapping (else the file and its copy are both resident at the load's peak), and the
blocks the prefix cache evicts (glibc would keep them in its heap)."""

import ctypes
import mmap
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4  # Linux: anonymous pages read as zeros when next touched


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


_MADVISE = _madvise()


def _glibc(name: str):
    """glibc's function `name`, or None (not Linux, or a libc without it, as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except AttributeError:
        return None


_MALLOC_TRIM = _glibc("malloc_trim")


_MALLOPT = _glibc("mallopt")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_BLOCK_BYTES = 2**20  # 128 KB (glibc's start) peaked the same, with more mappings made and dropped
HEAP_BLOCK_BYTES = 32 * 2**20  # the most glibc takes for M_MMAP_THRESHOLD on 64-bit hosts


def hand_back_large_blocks() -> None:
    """Blocks of LARGE_BLOCK_BYTES or more are mapped on their own, so freeing one hands its pages
    straight back. glibc's default raises that threshold to the largest block freed so far (up to
    32 MB), after which a prefill's activations and a step's 262,144-wide logits live in the heap,
    whose free top it keeps up to twice that: Gemma 3's server peaked ~55 MB higher on the same
    requests. What this costs, a page fault per 4 KB of a large block, the engine avoids where it
    would recur: the decode logits are one buffer (runner.py), a prefill runs in prefill_heap."""
    if _MALLOPT is not None:
        _MALLOPT(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


@contextmanager
def prefill_heap() -> Iterator[None]:
    """A prefill's activations (tens of MB a layer, made anew layer after layer) come from the
    heap, reused from one layer to the next, and the heap's free pages go back at the end: each
    mapped on its own they cost a 654-token prompt 250,000 page faults (~10% of its time)."""
    if _MALLOPT is None:
        yield
        return
    _MALLOPT(M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)
    try:
        yield
    finally:
        _MALLOPT(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)
        trim_heap()


def trim_heap() -> None:
    """The heap's free memory goes back to the OS. Loading a large vocabulary builds and drops
    ~40 MB of Python objects (Gemma 3's 262,144 tokens and their merges) that glibc would
    otherwise keep resident for the life of the server."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def drop_pages(address: int, nbytes: int) -> None:
    """The whole pages inside [address, address + nbytes) leave the resident set; their
    contents are gone (zeros when next read), so only memory nothing will read again."""
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    if _MADVISE is not None and end > start:
        _MADVISE(start, end - start, MADV_DONTNEED)


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The file mapping `array` is a view of, if any (views of views of np.frombuffer(mapping),
    whose base is a memoryview)."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return base


def drop_mapped_file_pages(array: np.ndarray) -> None:
    """The pages of the file mapping under `array` leave the resident set; the page cache
    keeps them and a later read maps them again, so the array stays valid."""
    base = _mapping(array)
    if base is not None and hasattr(base, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)


def drop_mapped_range(array: np.ndarray) -> None:
    """The file pages under `array` alone leave the resident set, as above; nothing happens
    to an array that is not a view of a file mapping (its pages are its only copy)."""
    if _mapping(array) is not None and array.flags.c_contiguous:
        drop_pages(array.ctypes.data, array.nbytes)


def copy_to_own_pages(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of `t` in a private mapping of its own, unmapped when the copy is freed.

    For the prefix cache's blocks: from the heap, an evicted block's memory would stay in
    glibc's free lists (it raises its mapping threshold past a block's size after the
    first large free), and the resident set would keep the cache's high-water mark."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags or t.nbytes == 0:
        return t.clone()
    out = torch.frombuffer(mmap.mmap(-1, t.nbytes, flags=flags), dtype=t.dtype).view(t.shape)
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16
        out.copy_(t)
    else:  # numpy's copy is one thread (see KVCache.write_block)
        np.copyto(out.numpy(), t.numpy())
    return out
