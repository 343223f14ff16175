"""One module per endpoint family: a thin router that parses, plans, submits and formats."""
