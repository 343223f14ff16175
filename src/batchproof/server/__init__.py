"""The OpenAI-compatible HTTP server: app, protocol, routes, formatting, metrics.

It talks to the engine through `EngineClient` (engine_client.py), never the other way.
"""
