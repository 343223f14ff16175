"""A chat message as the probe sends it (role and content): the single prompt of a request, or a
turn of `--cache`'s conversations."""

Message = dict[str, str]
