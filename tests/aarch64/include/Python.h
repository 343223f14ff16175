/* A stand-in for Python's header, for the kernel harness (tests/aarch64/harness.c): of the
 * kernels' C files only attention.c includes Python.h, for its allocator's raw functions
 * (no other API), and module.c, which the harness leaves out. A cross build has no Python
 * headers for its target, so both builds of the harness take the C library's allocator. */
#ifndef BP_HARNESS_PYTHON_H
#define BP_HARNESS_PYTHON_H
#include <stdlib.h>
#define PyMem_RawMalloc malloc
#define PyMem_RawFree free
#endif
