"""An aborted sequence's last output releases what its text stream held back (text that may be a
stop string's start), with those tokens' ids and records: over its outputs the records number
its kept tokens, and the reply is the one max_tokens would have cut at as many tokens."""

import dataclasses

from batchproof.engine.sampling.params import SamplingParams

NEVER = "@@never@@"  # ends the stop string: it never matches, so the text it spells is held back


def _reply(outs) -> tuple[str, list[int], list[float]]:
    return "".join(o.text for o in outs), [t for o in outs for t in o.token_ids], [r.logprob for o in outs
                                                                                   for r in o.records]


def test_an_abort_releases_the_held_text_as_a_length_cut_would(engine):
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Name three colors of the rainbow."}])
    params = SamplingParams(max_tokens=24, ignore_eos=True, top_logprobs=1, temperature=0)
    spelled = _reply(engine.generate({"spelled": (prompt, params)})["spelled"])[0]
    engine.add_request("held", prompt, dataclasses.replace(params, max_tokens=200, stop=(spelled + NEVER,)))
    outs = []
    while max((len(s.output_ids) for s in engine.scheduler.running), default=0) < 4:
        outs += engine.step()
    assert outs and not any(o.text or o.records for o in outs)  # every token held back
    engine.abort("held")
    outs += engine.reap()  # as the async engine does at once (no step runs while paused in keep mode)
    last = outs[-1]
    assert last.finish_reason == "abort" and not engine.has_work()
    text, token_ids, logprobs = _reply(outs)
    assert len(logprobs) == len(token_ids) == last.num_kept_tokens == last.num_output_tokens >= 4
    assert spelled.startswith(text) and text
    cut = engine.generate({"cut": (prompt, dataclasses.replace(params, max_tokens=last.num_output_tokens))})["cut"]
    assert _reply(cut) == (text, token_ids, logprobs)
    engine.take_batch_summary()
