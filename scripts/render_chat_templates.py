#!/usr/bin/env python3
"""Regenerates tests/data/chat_templates/expected.json.

Renders every template in tests/data/chat_templates/*.jinja for a fixed set of
conversations with Python's jinja2, set up exactly as transformers'
apply_chat_template does (ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True, the loopcontrols extension, HF's tojson
filter, raise_exception and strftime_now globals). strftime_now uses a fixed
time so the renders are deterministic; the C++ test passes the same time via
the context key "__loom_now_epoch".

Needs python3-jinja2 (scripts/install-deps.sh); the C++ tests only read the
JSON this writes.

Usage: scripts/render_chat_templates.py [--check]
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")
NOW_EPOCH = 1736937000  # 2025-01-15 10:30:00 UTC
NOW_KEY = "__loom_now_epoch"

# bos/eos as in each model's tokenizer_config.json.
TOKENS = {
    "llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
    "qwen3": ("", "<|im_end|>"),
    "gpt-oss": ("<|startoftext|>", "<|return|>"),
    "llama3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma3": ("<bos>", "<eos>"),
    "mistral-instruct": ("<s>", "</s>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "Temperature unit",
                    "default": "celsius",
                },
                "days": {"type": "integer", "description": "Days ahead"},
            },
            "required": ["city"],
        },
    },
}

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "  Hello! What's 2+2?  "},
]
MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke about \"quotes\" & ünïcödé ✓."},
]
USER_ONLY = [{"role": "user", "content": "Just a user message.\nWith two lines."}]
ENDS_WITH_ASSISTANT = [
    {"role": "user", "content": "Say yes."},
    {"role": "assistant", "content": "Yes."},
]
TOOL_CALL = [
    {"role": "system", "content": "You can check the weather."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Paris", "unit": "celsius"},
                },
            }
        ],
    },
    {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
]
QWEN_THINKING = [
    {"role": "user", "content": "What is 3*7?"},
    {
        "role": "assistant",
        "content": "<think>\n3 times 7 is 21.\n</think>\n\nIt is 21.",
    },
    {"role": "user", "content": "And 4*6?"},
]
GPT_OSS_THINKING = [
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "thinking": "User greets.", "content": "Bonjour !"},
]
GPT_OSS_TOOL = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "thinking": "Need the weather tool.",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                },
            }
        ],
    },
    {"role": "tool", "content": "{\"temperature\": 21.5}"},
]


def cases():
    """(template, case name, context) triples."""
    out = []
    for t in TOKENS:
        bos, eos = TOKENS[t]
        base = {"bos_token": bos, "eos_token": eos, NOW_KEY: NOW_EPOCH}

        def add(name, messages, gen, **extra):
            ctx = dict(base)
            ctx["messages"] = messages
            ctx["add_generation_prompt"] = gen
            ctx.update(extra)
            out.append((t, name, ctx))

        add("system_user_gen", SYSTEM_USER, True)
        add("system_user_nogen", SYSTEM_USER, False)
        add("multi_turn_gen", MULTI_TURN, True)
        add("user_only_gen", USER_ONLY, True)
        add("ends_with_assistant_nogen", ENDS_WITH_ASSISTANT, False)
        if t == "qwen3":
            add("tool_call_gen", TOOL_CALL, True, tools=[WEATHER_TOOL])
            add("thinking_gen", QWEN_THINKING, True)
            add("enable_thinking_false", USER_ONLY, True, enable_thinking=False)
        if t == "gpt-oss":
            add("tools_gen", SYSTEM_USER, True, tools=[WEATHER_TOOL])
            add("thinking_nogen", GPT_OSS_THINKING, False)
            add("tool_call_gen", GPT_OSS_TOOL, True, tools=[WEATHER_TOOL],
                reasoning_effort="high")
            add("builtin_tools", USER_ONLY, True,
                builtin_tools=["browser", "python"],
                model_identity="You are Loom.")
            add("raise_channel_tags",
                [{"role": "user", "content": "x"},
                 {"role": "assistant",
                  "content": "<|channel|>final<|message|>hi"}], False)
        if t == "llama3.1":
            add("tool_call_gen", TOOL_CALL, True, tools=[WEATHER_TOOL])
            add("tools_in_system", SYSTEM_USER, True, tools=[WEATHER_TOOL],
                tools_in_user_message=False, date_string="01 Jan 2025")
            add("builtin_tools_call",
                [{"role": "user", "content": "Search cats"},
                 {"role": "assistant", "tool_calls": [
                     {"function": {"name": "brave_search",
                                   "arguments": {"query": "cats"}}}]}],
                False, builtin_tools=["brave_search", "code_interpreter"])
        if t == "gemma3":
            add("multimodal_content",
                [{"role": "system",
                  "content": [{"type": "text", "text": "Describe."}]},
                 {"role": "user",
                  "content": [{"type": "image"},
                              {"type": "text", "text": " What is this? "}]}],
                True)
        if t == "mistral-instruct":
            add("alternating_three_turns",
                [{"role": "user", "content": "A"},
                 {"role": "assistant", "content": "B"},
                 {"role": "user", "content": "C"}], True)
    return out


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False):
        # As transformers defines it (no HTML escaping).
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(
            NOW_EPOCH, tz=datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = make_env()
    result = {"generator": "scripts/render_chat_templates.py",
              "jinja2_version": jinja2.__version__,
              "now_epoch": NOW_EPOCH,
              "cases": []}
    for t, name, ctx in cases():
        with open(os.path.join(DATA, t + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        template = env.from_string(source)
        case = {"template": t + ".jinja", "name": name, "context": ctx}
        render_ctx = {k: v for k, v in ctx.items() if k != NOW_KEY}
        try:
            case["expected"] = template.render(**render_ctx)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        result["cases"].append(case)
    text = json.dumps(result, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(DATA, "expected.json")
    if "--check" in sys.argv:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print("expected.json is out of date", file=sys.stderr)
                return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {len(result['cases'])} cases to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
