"""What a server says about itself before the run: /v1/server_info and the model it serves."""

from typing import Any

import httpx


async def get_json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON at `path`, or None; only a refused connection is raised."""
    try:
        response = await client.get(path)
        return response.json() if response.is_success else None
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise
    except (httpx.HTTPError, ValueError):
        return None


async def first_model(client: httpx.AsyncClient) -> str | None:
    """The served model's id from /v1/models, so servers that check `model` accept us."""
    try:
        doc = await get_json(client, "/v1/models")
    except httpx.HTTPError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    return first["id"] if isinstance(first, dict) and isinstance(first.get("id"), str) else None
