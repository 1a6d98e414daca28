"""A chain's prompt ids are encoded once each for the backend, and the body sent is byte for byte
the one a whole ``orjson.dumps`` gives: a hit on the chain's stored prefix, a branch or a foreign
list falling back to the full encode, and a real proxy's requests to a vLLM-shaped server."""

from __future__ import annotations

import random
from array import array

import aiohttp
import orjson
from aiohttp import web
from http_double import serve
from proxy_client import ledger_calls, post, running_proxy

from polar_env import fastjson
from polar_env.backends.ids_json import ChainJson, ChainPrompt, dumps_body
from polar_env.backends.registry import make_backend
from polar_env.backends.vllm import completion_choice


def grow(chain: array, json: ChainJson, new: list[int], sampled: list[int]) -> ChainPrompt:
    """A call that extends the chain's tip by ``new`` (its prompt) and then samples ``sampled``."""
    prompt = ChainPrompt(chain.tolist(), json, len(chain))
    prompt += new
    chain.extend(new + sampled)
    return prompt


def test_a_chain_is_encoded_once_per_id_and_each_body_is_the_whole_encode():
    rng = random.Random(5)
    chain: array = array("i")
    json = ChainJson(chain)
    first = [rng.randrange(200_000) for _ in range(40)]
    chain.extend(first + [7])
    for turn in range(30):
        new = [rng.randrange(200_000) for _ in range(rng.randrange(0, 60))]  # 0: a call adding no id
        prompt = grow(chain, json, new, [rng.randrange(200_000) for _ in range(rng.randrange(1, 9))])
        body = {"prompt": prompt, "max_tokens": 64, "temperature": 1.0, "stop_token_ids": [2], "seed": turn}
        assert prompt.encoded() == orjson.dumps(list(prompt))
        assert dumps_body(body, "prompt") == fastjson.dumps({**body, "prompt": list(prompt)})
    assert json.count == prompt.known  # the last call's parent: the tip when it was sent
    assert bytes(json.data) == orjson.dumps(chain[: json.count].tolist())[1:-1]  # each id once


def test_a_prompt_whose_prefix_is_not_at_hand_is_encoded_whole():
    chain = array("i", range(100, 200))
    json = ChainJson(chain)
    tip = ChainPrompt(chain.tolist(), json, 100) + [1]  # list + list: a plain list, no prefix claim
    assert type(tip) is list and dumps_body({"prompt": tip}, "prompt") == orjson.dumps({"prompt": tip})
    assert ChainPrompt(chain.tolist(), json, 100).encoded() == orjson.dumps(chain.tolist())
    # a branch from a call inside the stretch just encoded (a retry of an earlier call): no stored end
    branch = ChainPrompt(chain[:60].tolist(), json, 60)
    branch += [5, 6]
    assert branch.encoded() is None
    assert dumps_body({"prompt": branch, "n": 1}, "prompt") == orjson.dumps({"prompt": list(branch), "n": 1})
    # a list that does not start with the chain's ids it claims is not trusted
    wrong = ChainPrompt([*chain[:99].tolist(), 9], json, 100)
    assert wrong.encoded() is None and dumps_body({"prompt": wrong}, "prompt") == orjson.dumps(
        {"prompt": wrong}
    )
    # a body orjson refuses elsewhere (a seed past 64 bits) still goes the standard library's way
    body = {"prompt": ChainPrompt(chain.tolist(), json, 100), "seed": 2**70}
    assert orjson.loads(dumps_body(body, "prompt")) == {"prompt": chain.tolist(), "seed": 2**70}
    # the empty chain and no known prefix
    assert ChainPrompt([1, 2], ChainJson(array("i")), 0).encoded() is None


async def test_the_proxy_sends_vllm_the_whole_encode_of_each_prompt(renderer, tmp_path):
    bodies: list[bytes] = []

    async def completions(request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw)
        if body["max_tokens"] != 1:  # not the proxy's one-token probe of the logprobs mode
            bodies.append(raw)
        answer = renderer.tokenizer.encode(f"Answer {len(bodies)}.", add_special_tokens=False)
        ids = [*answer, *renderer.eos_token_ids[:1]]
        return web.json_response(
            {
                "choices": [completion_choice(body, ids, [-0.5] * len(ids), "stop")],
                "usage": {"prompt_tokens": len(body["prompt"])},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    async with serve(app) as url:
        backend = make_backend("vllm", url=url)
        async with running_proxy(renderer, backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
            sid, key = proxy.create_session("ids", sampling={"max_tokens": 16})
            chat = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
            for turn in range(4):
                status, reply = await post(http, chat, {"model": "m", "messages": messages}, key)
                assert status == 200, reply
                messages += [reply["choices"][0]["message"], {"role": "user", "content": f"Next {turn}."}]
            status, _ = await post(http, chat, {"model": "m", "messages": messages[:4]}, key)  # a branch
            assert status == 200
            calls = await ledger_calls(http, proxy, sid)
            chain = proxy.registry.get(sid).by_index[2].ids_json
            await backend.aclose()
    assert [c["parent_call_index"] for c in calls] == [None, 0, 1, 2, 0]
    assert set(chain.ends) == {
        0,
        *(len(c["prompt_ids"]) + len(c["sampled_ids"]) for c in calls[:3]),
    }  # stored
    for call, raw in zip(calls, bodies, strict=True):
        sent = orjson.loads(raw)
        assert sent["prompt"] == call["prompt_ids"]  # token-exact
        assert raw == orjson.dumps(sent)  # the bytes a whole encode gives
