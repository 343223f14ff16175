"""Prompt lookup: the next tokens guessed by finding the sequence's last few tokens earlier in
its prompt or reply and reading what followed them there (no draft model)."""

# Longest first: a 3-token match names the place being copied more surely than a 2-token one.
# One token alone matches everywhere in free text (every "the"), costing rows that are rejected.
NGRAM_SIZES = (3, 2)


class NgramIndex:
    """For each n in NGRAM_SIZES, the most recent place each n-gram of the tokens occurred with a
    token after it, kept as tokens arrive (one dict update per size per token), so a lookup is a
    dict get however long the context."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids: list[int] = []
        self._follower: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it
        self.extend(token_ids)

    def extend(self, token_ids: list[int]) -> None:
        tokens = self.token_ids
        for token_id in token_ids:
            end = len(tokens)  # the new token's index: each n-gram ending just before it now has a follower
            for n in NGRAM_SIZES:
                if end >= n:
                    self._follower[tuple(tokens[end - n:end])] = end
            tokens.append(token_id)

    def draft(self, max_len: int) -> list[int]:
        """Up to max_len tokens that followed the longest recent match of the tail, or []."""
        tokens = self.token_ids
        for n in NGRAM_SIZES:
            if len(tokens) > n:
                at = self._follower.get(tuple(tokens[-n:]))
                if at is not None:
                    return _continue(tokens, at, max_len)
        return []


def _continue(tokens: list[int], at: int, max_len: int) -> list[int]:
    """What followed position `at`, as the tail's continuation: a match close to the end runs
    into the tail itself, and then the guess repeats with the period of the match (a list, a
    loop), instead of stopping short."""
    draft = tokens[at:at + max_len]
    period = len(tokens) - at
    while len(draft) < max_len:
        draft.append(draft[len(draft) - period])
    return draft
