#!/usr/bin/env python3
"""Talks to thetaserve's OpenAI-compatible HTTP API with the official `openai` package
(`thetaserve serve --http-port 8000 ...`; pip install -r requirements-openai.txt):

    python3 examples/python/openai_client.py --base-url http://localhost:8000/v1 \
        --prompt "Name three colours."

It lists the served model, then streams a chat completion. With --check it also runs the
calls tests/python/openai_client_test.sh relies on and fails loudly if any answer is off.
"""
import argparse
import json
import sys
from typing import Annotated, Optional

import openai
import pydantic


def check(client, model):
    # A whole completion, greedy, with usage and log-probabilities.
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                  temperature=0, logprobs=2)
    text = c.choices[0].text
    assert "Paris" in text, text
    assert c.usage.completion_tokens == len(c.choices[0].logprobs.tokens), c.usage
    assert c.choices[0].finish_reason in ("stop", "length"), c.choices[0].finish_reason
    # The same request streamed gives the same text.
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True) if ch.choices)
    assert streamed == text, (streamed, text)
    # Chat, streamed with usage at the end.
    parts, usage = [], None
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16,
            temperature=0, stream=True, stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    whole = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16,
        temperature=0)
    assert "".join(parts) == whole.choices[0].message.content, (parts, whole)
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    # n completions of one prompt, sampled with seeds 7, 8, 9: three indexed choices.
    three = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8,
        temperature=1.0, seed=7, n=3, logprobs=True)
    assert [ch.index for ch in three.choices] == [0, 1, 2], three
    assert three.usage.completion_tokens == sum(
        len(ch.logprobs.content) for ch in three.choices), three.usage
    # The prompt scored without generating (echo, logprobs, max_tokens=0: how evaluation
    # harnesses compute log-likelihoods through a completions API).
    scored = client.completions.create(model=model, prompt="The capital of France is",
                                       echo=True, logprobs=1, max_tokens=0)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == "The capital of France is", scored
    assert len(lp.tokens) == scored.usage.prompt_tokens and lp.token_logprobs[0] is None, lp
    assert all(x <= 0 for x in lp.token_logprobs[1:]), lp
    # Structured outputs: the SDK's parse() sends a pydantic model as a strict JSON schema
    # (response_format json_schema) and reads the answer back into the model.
    class Step(pydantic.BaseModel):
        explanation: str
        output: str

    class Solution(pydantic.BaseModel):
        steps: list[Step]
        final_answer: str
        confidence: Optional[int]

    chat = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    solved = chat(model=model, messages=[{"role": "user", "content": "Solve 2x = 4."}],
                  response_format=Solution, temperature=0, max_tokens=300)
    assert solved.choices[0].finish_reason == "stop", solved
    assert isinstance(solved.choices[0].message.parsed, Solution), solved
    # A model that holds itself (a tree of parts): pydantic writes a $ref back to its own
    # definition, which the server guides through the schema's grammar, to any depth.
    class Part(pydantic.BaseModel):
        title: Annotated[str, pydantic.Field(max_length=40)]
        subsections: Annotated[list["Part"], pydantic.Field(max_length=3)]

    Part.model_rebuild()
    tree = chat(model=model,
                messages=[{"role": "user", "content": "List the parts of a car as a tree."}],
                response_format=Part, temperature=0, max_tokens=300)
    assert tree.choices[0].finish_reason == "stop", tree
    parsed = tree.choices[0].message.parsed
    assert isinstance(parsed, Part) and parsed.subsections and parsed.subsections[0].subsections, tree
    # vLLM's extensions go in extra_body, as vLLM's docs send them: here a GBNF grammar.
    graded = client.completions.create(
        model=model, prompt="Is the sky blue? Answer:", max_tokens=8, temperature=0,
        extra_body={"guided_grammar": 'root ::= " " ("yes" | "no") "."'})
    assert graded.choices[0].text in (" yes.", " no."), graded
    assert graded.choices[0].finish_reason == "stop", graded
    # Tools: a function named in tool_choice is called (its arguments guided to its
    # parameters' schema), streamed or not alike; "required" calls one or more; the result goes
    # back as a role "tool" message.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}]
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    called = client.chat.completions.create(model=model, messages=question, tools=tools,
                                            tool_choice=named, temperature=0, max_tokens=100)
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_"), call
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit"), args
    streamed_args = "".join(
        ch.choices[0].delta.tool_calls[0].function.arguments or ""
        for ch in client.chat.completions.create(
            model=model, messages=question, tools=tools, tool_choice=named, temperature=0,
            max_tokens=100, stream=True)
        if ch.choices and ch.choices[0].delta.tool_calls)
    assert streamed_args == call.function.arguments, (streamed_args, call.function.arguments)
    required = client.chat.completions.create(model=model, messages=question, tools=tools,
                                              tool_choice="required", temperature=0,
                                              max_tokens=100)
    assert required.choices[0].finish_reason == "tool_calls", required
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather", required
    answer = client.chat.completions.create(
        model=model, temperature=0, max_tokens=16,
        messages=question + [called.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}])
    assert answer.choices[0].message.content, answer
    # Errors arrive as the client's exception types, with the server's message.
    try:
        client.completions.create(model=model, prompt="x", best_of=3)
        raise AssertionError("best_of=3 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "best_of is not supported" in str(e), e
    try:
        client.completions.create(model="no-such-model", prompt="x")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e
    print("openai client checks: passed")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://localhost:8000/v1")
    p.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    p.add_argument("--prompt", default="Name three colours.")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--check", action="store_true", help="run the checks the test uses")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    model = client.models.list().data[0].id
    print(f"model: {model}", file=sys.stderr)
    if args.check:
        check(client, model)
        return
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": args.prompt}],
            max_tokens=args.max_tokens, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            print(ch.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
