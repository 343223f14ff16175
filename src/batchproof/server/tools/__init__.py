"""Tool calling: the tool-call formats models write, and how their replies become OpenAI `tool_calls`."""
