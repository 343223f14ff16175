"""TextStream with the real tokenizer: streamed deltas against the one-shot decode and cut."""

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.text.text_stream import TextDelta, TextStream

# Tokens of the real vocabulary that carry only part of a UTF-8 character, and whole ones.
PARTIAL_IDS = [10813, 232, 227, 235, 119, 173, 247, 114, 23274, 115, 31752, 321, 231, 15107, 244, 218]
WHOLE_IDS = [81, 82, 504, 3575, 282, 28, 30, 2756, 40993, 216]


@pytest.fixture(scope="module")
def tokenizer(engine):
    return engine.tokenizer


def record(i: int, token_id: int) -> TokenRecord:
    return TokenRecord(step=i, token_id=token_id, logprob=-float(i), top=())


def feed(tokenizer, ids: list[int], stop: tuple[str, ...] = ()) -> tuple[TextStream, list[TextDelta], int]:
    """Feeds ids until the stream stops -> (stream, deltas including finish's, tokens fed)."""
    stream = TextStream(tokenizer, stop)
    deltas = []
    fed = 0
    for i, token_id in enumerate(ids):
        deltas.append(stream.add(token_id, record(i, token_id)))
        fed += 1
        if stream.is_stopped:
            break
    deltas.append(stream.finish())
    return stream, deltas, fed


def prefix_texts(tokenizer, ids: list[int]) -> list[str]:
    """The complete characters after each token, decoded from scratch (no TextStream)."""
    out = []
    for n in range(len(ids) + 1):
        raw = b"".join(tokenizer.decode_bytes(i) for i in ids[:n])
        out.append(codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw))
    return out


def expected_cut(tokenizer, ids: list[int], stop: tuple[str, ...]) -> tuple[str, int, list[int]]:
    """The reference: stop at the first token after which a stop string is present, cut at its
    earliest occurrence -> (text, tokens fed, indices of the kept tokens)."""
    texts = prefix_texts(tokenizer, ids)
    for n in range(1, len(ids) + 1):
        found = [i for s in stop if (i := texts[n].find(s)) >= 0]
        if found:
            cut = min(found)
            kept = [t for t in range(n) if len(texts[t]) < cut]  # the token's text starts before the cut
            return texts[n][:cut], n, kept
    return tokenizer.decode(ids), len(ids), list(range(len(ids)))


def test_an_emoji_split_over_three_tokens_is_released_whole_with_its_records(tokenizer) -> None:
    ids = tokenizer.encode("a🎉b")
    assert len(ids) == 5 and [len(tokenizer.decode_bytes(i)) for i in ids[1:4]] == [2, 1, 1]
    _, deltas, _ = feed(tokenizer, ids)
    assert [d.text for d in deltas] == ["a", "", "", "🎉", "b", ""]
    assert [[r.step for r in d.records] for d in deltas] == [[0], [], [], [1, 2, 3], [4], []]


def test_cjk_and_a_zwj_sequence_stream_like_the_one_shot_decode(tokenizer) -> None:
    text = "日本語のテキスト 👩‍💻 ❤️‍🔥 done"
    ids = tokenizer.encode(text)
    stream, deltas, _ = feed(tokenizer, ids)
    assert "".join(d.text for d in deltas) == text == tokenizer.decode(ids)
    assert [r.step for d in deltas for r in d.records] == list(range(len(ids)))
    assert all(d.text or not d.records for d in deltas[:-1]), "records ride only on chunks that carry text"
    assert stream.num_kept_tokens == len(ids)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.sampled_from(PARTIAL_IDS + WHOLE_IDS), max_size=14))
def test_deltas_concatenate_to_the_decode_and_release_each_record_once_on_time(tokenizer, ids: list[int]) -> None:
    _, deltas, _ = feed(tokenizer, ids)
    assert "".join(d.text for d in deltas) == tokenizer.decode(ids)
    assert [r.step for d in deltas for r in d.records] == list(range(len(ids)))
    # Without stop strings, a token's record goes out on the first chunk at or after it that carries text.
    texts = prefix_texts(tokenizer, ids)
    for i in range(len(ids)):
        released_on = next(j for j, d in enumerate(deltas) if any(r.step == i for r in d.records))
        carrying = [j for j in range(i, len(ids)) if len(texts[j + 1]) > len(texts[j])]
        assert released_on == (carrying[0] if carrying else len(ids)), (i, released_on, carrying)


STOP_ALPHABET = "ab 🎉é\n"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=STOP_ALPHABET, max_size=16),
    stop=st.lists(st.text(alphabet=STOP_ALPHABET, min_size=1, max_size=4), max_size=3).map(tuple),
)
def test_stop_strings_cut_at_the_earliest_occurrence_and_keep_straddling_records(tokenizer, text: str,
                                                                                stop: tuple[str, ...]) -> None:
    ids = tokenizer.encode(text)
    stream, deltas, fed = feed(tokenizer, ids, stop)
    want_text, want_fed, kept = expected_cut(tokenizer, ids, stop)
    assert "".join(d.text for d in deltas) == want_text
    assert fed == want_fed
    assert stream.is_stopped == (want_fed < len(ids) or any(s in tokenizer.decode(ids) for s in stop))
    assert [r.step for d in deltas for r in d.records] == kept
    assert stream.num_kept_tokens == len(kept)
    # Records ride only on chunks that carry text, except the last chunk (the stopping one, or finish's).
    last = fed - 1 if stream.is_stopped else fed
    for d in deltas[:last]:
        assert d.text or not d.records
    assert all(not d.text and not d.records for d in deltas[last + 1:])


def test_a_held_stop_prefix_is_released_once_it_cannot_become_the_stop(tokenizer) -> None:
    ids = tokenizer.encode("The capital is Paris. Yes")
    pieces = [tokenizer.decode_bytes(i).decode() for i in ids]
    paris = pieces.index(" Paris")
    stream = TextStream(tokenizer, ("Paris!",))
    released = ""
    for i, token_id in enumerate(ids):
        delta = stream.add(token_id, record(i, token_id))
        released += delta.text
        if i == paris:
            assert released == "The capital is ", "'Paris' could still become 'Paris!': held"
            assert [r.step for r in delta.records] == [], "the straddling ' Paris' waits for its text"
        if i == paris + 1:
            assert delta.text == "Paris."
            assert [r.step for r in delta.records] == [paris, paris + 1]
    released += stream.finish().text
    assert released == "The capital is Paris. Yes" and not stream.is_stopped


def test_a_stop_inside_a_token_keeps_that_token_and_drops_the_rest(tokenizer) -> None:
    ids = tokenizer.encode("The capital of France")
    stream, deltas, fed = feed(tokenizer, ids + tokenizer.encode(" is Paris."), stop=("pita", "of F"))
    assert "".join(d.text for d in deltas) == "The ca"
    assert [r.step for d in deltas for r in d.records] == [0, 1]
    assert fed == 2 and stream.num_kept_tokens == 2


def test_the_earlier_of_two_stops_completed_by_one_token_wins_even_when_listed_second(tokenizer) -> None:
    ids = tokenizer.encode("one two three four")
    assert tokenizer.decode_bytes(ids[2]) == b" three", "one token completes both stop strings"
    _, deltas, _ = feed(tokenizer, ids, stop=("ree", "thr"))
    assert "".join(d.text for d in deltas) == "one two "
    assert [r.step for d in deltas for r in d.records] == [0, 1, 2], "' three' straddles the cut: kept"
    _, deltas, _ = feed(tokenizer, ids, stop=("four", " two"))
    assert "".join(d.text for d in deltas) == "one"
    assert [r.step for d in deltas for r in d.records] == [0], "' two' starts at the cut: wholly after it"


def test_an_unfinished_character_at_the_end_is_flushed_as_a_replacement(tokenizer) -> None:
    ids = tokenizer.encode("ok🎉")[:-1]
    _, deltas, _ = feed(tokenizer, ids)
    assert "".join(d.text for d in deltas) == tokenizer.decode(ids) == "ok\ufffd"
    assert [r.step for r in deltas[-1].records] == [len(ids) - 2, len(ids) - 1]
