"""The records the wire fills and the judges read: a streamed reply (`reply.py`), its logprob
entries, what its arrival times show, and a chat message. Imports neither room."""
