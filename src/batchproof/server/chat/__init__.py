"""POST /v1/chat/completions: its request (protocol.py), its route (route.py), its plan (plan.py:
messages and tools to prompt ids, and what the engine runs; the Responses API plans through it
too), the messages into the chat template (messages.py), prompts sent as ids and continued turns
(token_space.py) and its formatter (formatter.py)."""
