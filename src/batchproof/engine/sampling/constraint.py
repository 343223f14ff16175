"""What the engine enforces on one request's reply. It travels with SamplingParams (to a fleet's
replica too), so it is plain text: each engine builds its own matcher from it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Constraint:
    kind: str  # json_schema, json_object, regex, grammar, choice (or tool_call): what the reply's label names
    grammar: str  # llguidance's grammar (JSON text), as compile.py makes it
