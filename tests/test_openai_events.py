"""Every event shape OpenAI-compatible servers stream, one table row each, through the pure function
:func:`labkit.serving.openai_api.openai_event` (chapter 02). The same shapes run end to end through
the backend in test_stream_shapes.py."""

import json

import pytest

from labkit.serving.openai_api import OpenAIEvent, openai_event
from labkit.serving.records import ServerTiming
from labkit.serving.sse import SSEEvent


def chat(delta=None, finish=None, usage=None, **extra):
    obj = {"id": "c", "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj | extra)


def tool(name=None, args=None):
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    return {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}]}


USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
LLAMACPP_TIMINGS = {"prompt_n": 5, "prompt_ms": 10.0, "predicted_n": 3, "predicted_ms": 30.0,
                    "predicted_per_second": 66.7}
LLAMACPP_SERVER: ServerTiming = {
    "eval_count": 3, "prompt_eval_count": 5, "eval_s": 0.03, "prompt_eval_s": 0.01, "load_s": None,
    "total_s": 0.04, "eval_tokens_per_s": 66.7}

# (case, SSE event type, data, expected OpenAIEvent)
CASES = [
    ("role-only first chunk", "message", chat({"role": "assistant", "content": ""}),
     OpenAIEvent(choices=True)),
    ("role chunk, content null", "message", chat({"role": "assistant", "content": None}),
     OpenAIEvent(choices=True)),
    ("empty-content chunk", "message", chat({"content": ""}), OpenAIEvent(choices=True)),
    ("one token", "message", chat({"content": "Hello"}), OpenAIEvent("Hello", choices=True)),
    ("several tokens in one chunk", "message", chat({"content": " big red dog"}),
     OpenAIEvent(" big red dog", choices=True)),
    ("reasoning_content delta", "message", chat({"reasoning_content": "Let me think"}),
     OpenAIEvent("Let me think", choices=True)),
    ("reasoning delta (newer vLLM)", "message", chat({"reasoning": "hmm"}), OpenAIEvent("hmm", choices=True)),
    ("reasoning sent under both names", "message", chat({"reasoning": "hm", "reasoning_content": "hm"}),
     OpenAIEvent("hm", choices=True)),
    ("tool call opens with its name", "message", chat(tool("get_weather", "")),
     OpenAIEvent("get_weather", choices=True)),
    ("tool call arguments delta", "message", chat(tool(args='{"city": "Par')),
     OpenAIEvent('{"city": "Par', choices=True)),
    ("legacy function_call delta", "message", chat({"function_call": {"arguments": "{}"}}),
     OpenAIEvent("{}", choices=True)),
    ("finish chunk, empty delta", "message", chat({}, "stop"), OpenAIEvent(finish="stop", choices=True)),
    ("finish chunk, delta null", "message",
     json.dumps({"choices": [{"index": 0, "delta": None, "finish_reason": "length"}]}),
     OpenAIEvent(finish="length", choices=True)),
    ("last token with finish_reason", "message", chat({"content": "!"}, "length"),
     OpenAIEvent("!", finish="length", choices=True)),
    ("usage on the finish chunk", "message", chat({}, "stop", USAGE),
     OpenAIEvent(tokens=3, finish="stop", choices=True, prompt_tokens=5)),
    ("continuous usage on a token chunk", "message", chat({"content": "a"}, None, USAGE),
     OpenAIEvent("a", 3, choices=True, prompt_tokens=5)),
    ("usage-only last chunk", "message", json.dumps({"choices": [], "usage": USAGE}),
     OpenAIEvent(tokens=3, prompt_tokens=5)),
    ("llama.cpp usage chunk with its timings", "message",
     json.dumps({"choices": [], "usage": USAGE, "timings": LLAMACPP_TIMINGS}),
     OpenAIEvent(tokens=3, prompt_tokens=5, server=LLAMACPP_SERVER)),
    ("usage null", "message", json.dumps({"choices": [{"delta": {"content": "a"}}], "usage": None}),
     OpenAIEvent("a", choices=True)),
    ("completions text chunk", "message",
     json.dumps({"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}),
     OpenAIEvent(" tok", choices=True)),
    ("[DONE]", "message", "[DONE]", OpenAIEvent(done=True)),
    ("[DONE] with spaces", "message", " [DONE] ", OpenAIEvent(done=True)),
    ('"error": null is no error', "message", chat({"content": "x"}, error=None),
     OpenAIEvent("x", choices=True)),
    ("error object after HTTP 200", "message", json.dumps({"error": {"message": "CUDA out of memory",
                                                                     "code": 500}}),
     OpenAIEvent(error="CUDA out of memory")),
    ("error string", "message", json.dumps({"error": "overloaded"}), OpenAIEvent(error="overloaded")),
    ("vLLM error object", "message", json.dumps({"object": "error", "message": "too long", "code": 400}),
     OpenAIEvent(error="too long")),
    ("event: error with a message", "error", json.dumps({"message": "context overflow"}),
     OpenAIEvent(error="context overflow")),
    ("SSE error: field (llama.cpp)", "error", json.dumps({"code": 500, "message": "slot unavailable",
                                                          "type": "server_error"}),
     OpenAIEvent(error="slot unavailable")),
    ("event: error without data", "error", "", OpenAIEvent(error="an error event without a message")),
    ("event: error, plain text", "error", "boom", OpenAIEvent(error="boom")),
]


@pytest.mark.parametrize(("kind", "data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_openai_event_shapes(kind, data, expected):
    assert openai_event(SSEEvent(kind, data)) == expected


def test_plain_data_strings_are_message_events():
    assert openai_event(chat({"content": "hi"})) == OpenAIEvent("hi", choices=True)


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '"text"'])
def test_data_that_is_not_a_json_object_is_a_value_error(data):
    with pytest.raises(ValueError):
        openai_event(data)
