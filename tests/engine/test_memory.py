"""Memory handed back to the OS: a freed slot's keys and values, and the model file's pages
once the weights are copied out (Linux, where madvise(MADV_DONTNEED) is what frees them)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from batchproof.common.proc_status import status_mb
from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.cache.prefix_cache import KEPT_SHARE, Block, PrefixCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.gguf.file import read_model_file
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor
from batchproof.engine.sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise semantics are Linux's")


def resident_kib_of(path: Path) -> int:
    """This process's resident KiB of every mapping of `path` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_a_released_slot_gives_its_pages_back_and_the_others_keep_theirs():
    cache = KVCache(2, 3, 2, 4096, 64, torch.device("cpu"), torch.float32)
    cache.k.fill_(1.0)
    cache.v.fill_(2.0)
    cache.release(1)
    # Dropped pages read as zeros: the slot holds nothing now, as a fresh one.
    assert not cache.k[:, 1].any() and not cache.v[:, 1].any()
    assert bool((cache.k[:, [0, 2]] == 1.0).all()) and bool((cache.v[:, [0, 2]] == 2.0).all())


def test_a_finished_request_leaves_its_slot_empty():
    engine = Engine(EngineConfig(max_batch=2, max_model_len=1024))
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Tell me about the sea. " * 20}])
    params = SamplingParams(max_tokens=8, temperature=0.0)
    first = engine.generate({"first": (prompt, params)})["first"]
    kv = engine.caches.kv
    assert engine.num_free_slots == 2 and not kv.k[:, 0].any() and not kv.v[:, 0].any()
    # The next request takes that slot (its prompt from the prefix cache) and gets the same answer.
    engine.add_request("again", prompt, params)
    again = engine.step()
    assert [seq.slot for seq in engine.scheduler.running] == [0]
    while engine.has_work():
        again += engine.step()
    engine.take_batch_summary()
    assert again[-1].num_cached_tokens > 0
    assert [(o.text, o.records) for o in again] == [(o.text, o.records) for o in first]


@pytest.mark.skipif(not kernels.available(), reason="native weights need the kernels")
def test_the_model_file_s_pages_leave_the_resident_set_and_the_weights_stay_readable():
    path = resolve_model(None)
    model_file = read_model_file(path, kernels.runs_natively)
    raws = [t for t in model_file.tensors.values() if isinstance(t, RawTensor)]
    checksum = sum(int(t.data.sum(dtype=np.uint64)) for t in raws)  # touches every page
    assert resident_kib_of(path) > 50_000
    model_file.drop_resident_pages()
    assert resident_kib_of(path) < 1_000
    assert sum(int(t.data.sum(dtype=np.uint64)) for t in raws) == checksum


def test_blocks_the_prefix_cache_evicts_leave_the_resident_set():
    kv = KVCache(30, 1, 3, 2048, 64, torch.device("cpu"), torch.float32)  # the default model's shape
    kv.k.fill_(1.0)
    kv.v.fill_(2.0)
    count = 100  # 16-token blocks of 737 KB
    cache = PrefixCache(16, 80 * 2**20, "m")  # room for all 100 (74 MB)
    cache.insert(cache.keys(list(range(16 * count)), count),
                 {i: Block(*kv.read_block(0, 16 * i, 16), None) for i in range(count)})
    assert len(cache) == count
    kv.release(0)
    held = cache.nbytes
    before = status_mb("self", "RssAnon")
    cache.make_room(cache.budget_bytes)  # the running sequences need all of it: the cache keeps a quarter
    assert cache.nbytes <= cache.budget_bytes // KEPT_SHARE
    evicted = held - cache.nbytes
    assert evicted > 0.5 * held
    assert (before - status_mb("self", "RssAnon")) * 2**20 > 0.9 * evicted
