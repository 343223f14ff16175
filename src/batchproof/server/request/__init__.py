"""From a request body to engine inputs, what every generating endpoint shares: the request
models more than one endpoint takes (protocol.py), the sampling fields declared once
(sampling_fields.py), the strict base that refuses unknown and unhonoured fields
(unsupported_fields.py), response formats as grammar constraints (structured.py), and the plan:
the checks that need the model and the limits, one SamplingParams per choice (plan.py). Each
endpoint's own request model is in its room."""
