"""The deltas of a request's choices, as one stream of (choice index, delta) in arrival order."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from batchproof.engine.outputs import RequestOutput

_DONE = object()


async def merge(streams: dict[int, AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Every stream read at once; an exception in one ends the whole (closing the others, which
    aborts their sequences), as does closing this iterator."""
    if len(streams) == 1:  # the common case, without tasks
        ((index, stream),) = streams.items()
        async with contextlib.aclosing(stream):
            async for out in stream:
                yield index, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    queue.put_nowait((index, out))
        except Exception as error:  # handed to the reader, which raises it
            queue.put_nowait((index, error))
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in streams.items()]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
