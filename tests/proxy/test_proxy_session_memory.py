"""The proxy keeps one id buffer per chain: a session's memory grows with its distinct tokens, not
with calls x context, and every call still extends from exactly its own ids and digest."""

from __future__ import annotations

from trajectory_helpers import long_chain, reusing, session

from polar_env.proxy.sessions import Session
from polar_env.trajectory.records import ids_digest


def test_a_chain_shares_one_buffer_and_a_branch_gets_its_own():
    records = long_chain(40)
    state = Session(info=session("s1"))
    for record in records:
        state.remember(record, eos_ids=set())
    buffers = {id(c.buffer) for c in state.calls}
    last = records[-1]
    assert len(buffers) == 1 and len({id(c.mirror) for c in state.calls}) == 1
    assert len(state.calls[0].buffer) == len(last.prompt_ids) + len(last.sampled_ids)  # the distinct tokens
    for record, call in zip(records, state.calls, strict=True):  # the list of ids, read in any order
        assert call.token_ids() == record.prompt_ids + record.sampled_ids
        assert state.calls[-1 - call.call_index].token_ids() == (
            records[-1 - call.call_index].prompt_ids + records[-1 - call.call_index].sampled_ids
        )
        assert call.digest.hexdigest() == ids_digest(call.token_ids()).hexdigest()
    # a retry of call 20 (a second child of call 19) cannot append to the shared buffer: it copies
    retry = reusing(
        records[20].model_copy(update={"call_index": 40, "call_id": "c40", "sampled_ids": [7, 8]}),
        records[19],
    )
    state.remember(retry, eos_ids=set())
    branch = state.by_index[40]
    assert id(branch.buffer) not in buffers and branch.mirror is not state.calls[0].mirror
    assert branch.token_ids() == retry.prompt_ids + [7, 8]
    assert state.calls[-2].token_ids() == last.prompt_ids + last.sampled_ids  # the chain is untouched
