#!/usr/bin/env python3
# Writes tests/golden/chat/golden.json, what tests/unit/test_chat_golden.cpp checks `data tokenize`'s Jinja
# renderer against: for every template in tests/golden/chat/templates/ and every conversation below, with
# enable_thinking true / false / not passed (and, for a template that reads preserve_thinking, once more with
# preserve_thinking=True: `data tokenize --template-var preserve_thinking=true`), the text Hugging Face
# `apply_chat_template` renders, the ids the
# golden tokenizer (tests/golden/tokenizer/tokenizer.json through PreTrainedTokenizerFast) gives for it, and the
# assistant loss mask computed as SpecForge's GeneralParser computes it for its "qwen" template. A conversation
# the template refuses (raise_exception, a type error) is stored with the error instead.
#
# On the GPU machine (transformers 5.x, no network needed):
#     python3 tests/golden/make_chat_golden.py tests/golden/chat/golden.json
# Locally, without transformers, `--jinja-only OUT` renders the same cases with plain jinja2 in the environment
# transformers builds (chat_template_utils._compile_jinja_template) and writes only texts, to check the C++
# renderer's text before the real golden exists; those files are never committed.
import argparse
import json
import os
import re
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "chat", "templates")
TOKENIZER = os.path.join(HERE, "tokenizer", "tokenizer.json")

# SpecForge a6b6b023 specforge/data/template.py, "qwen": the loss covers what follows each assistant header up
# to and including the next end-of-turn token (or the end of the text).
ASSISTANT_HEADER = "<|im_start|>assistant\n"
END_OF_TURN = "<|im_end|>\n"

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city (°C).",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 東京"},
        "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web: \"quotes\", back\\slashes\nand newlines.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "number"}}}}}


def call(name, arguments, with_id=True):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if with_id:
        c["id"] = "call_" + name
    return c


# Each record is a JSONL line as `data tokenize` reads it (OpenAI messages, optional per-record tools).
CASES = [
    ("single_turn", {"messages": [{"role": "user", "content": "What is 2+2?"},
                                  {"role": "assistant", "content": "4"}]}),
    ("system_multi_turn", {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "11"}]}),
    ("reasoning_every_turn", {"messages": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No: 91 = 7 × 13.", "reasoning_content": "Try 7: 7*13 = 91."},
        {"role": "user", "content": "And 97?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "\nNo divisor up to 9.\n\n"}]}),
    ("reasoning_last_only", {"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Sum 1..10?"},
        {"role": "assistant", "content": "55", "reasoning_content": "n(n+1)/2 = 55"}]}),
    ("inline_think", {"messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."},
        {"role": "user", "content": "Of Italy?"},
        {"role": "assistant", "content": "<think>Rome, surely.</think>Rome."}]}),
    ("tool_calls", {"tools": [WEATHER_TOOL, SEARCH_TOOL], "messages": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Tokyo and Paris?"},
        {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two calls.",
         "tool_calls": [call("get_weather", {"city": "Tokyo"}),
                        call("get_weather", {"city": "Paris", "days": 2})]},
        {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"temp\": 14}"},
        {"role": "assistant", "content": "Tokyo 21°C, Paris 14°C.", "reasoning_content": "Both answered."}]}),
    ("tool_call_no_content", {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Oslo"}, False)]},
        {"role": "tool", "content": "-3"},
        {"role": "assistant", "content": "It is -3°C in Oslo."}]}),
    ("multi_step_tools", {"tools": [SEARCH_TOOL], "messages": [
        {"role": "user", "content": "Who wrote Dune, and when was he born?"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"q": "Dune author", "k": 3})]},
        {"role": "tool", "content": "Frank Herbert"},
        {"role": "assistant", "content": "", "reasoning_content": "Now the birth date.",
         "tool_calls": [call("search", {"q": "Frank Herbert born", "k": 1.5})]},
        {"role": "tool", "content": "October 8, 1920"},
        {"role": "assistant", "content": "Frank Herbert, born 8 October 1920."}]}),
    ("tool_argument_types", {"tools": [SEARCH_TOOL], "messages": [
        {"role": "user", "content": "Edge cases please."},
        {"role": "assistant", "content": "Calling.", "tool_calls": [call("search", {
            "q": "quote \" backslash \\ newline \n tab \t bell \u0007 ünï 😀", "k": 10, "f": 0.1, "g": 1e-07,
            "h": 100.0, "big": 12345678901234, "neg": -2, "t": True, "n": None, "l": [1, "two", [3.5]],
            "o": {"z": 1, "a": [True, False]}})]},
        {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "Done."}]}),
    ("string_arguments", {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "{\"city\": \"Rome\"}")]},
        {"role": "tool", "content": "25"}, {"role": "assistant", "content": "25°C."}]}),
    ("empty_contents", {"messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": ""},
        {"role": "assistant", "content": ""}, {"role": "user", "content": "?"},
        {"role": "assistant", "content": "", "reasoning_content": ""}]}),
    ("unicode", {"messages": [
        {"role": "system", "content": "Réponds en français.\u3000"},
        {"role": "user", "content": "我们在训练一个草稿模型 👩‍💻🇩🇪 — “quotes” e\u0301 \u200b العربية"},
        {"role": "assistant", "content": "\u00a0D'accord : ✓ naïve café Ω≈ç√∫ \U0001F600\u3000",
         "reasoning_content": "  Unicode whitespace\u2003around\u3000"}]}),
    ("content_parts", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Both parts seen."}]}]}),
    ("tool_response_in_user_turn", {"messages": [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "Working.", "reasoning_content": "step 1"},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
        {"role": "assistant", "content": "The tool said 42.", "reasoning_content": "step 2"}]}),
    ("ends_with_user", {"messages": [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me a joke."}]}),
    ("no_user_message", {"messages": [
        {"role": "system", "content": "System only."}, {"role": "assistant", "content": "Hello?"}]}),
    ("system_not_first", {"messages": [
        {"role": "user", "content": "Hi"}, {"role": "system", "content": "Late system."},
        {"role": "assistant", "content": "Hello."}]}),
    ("tools_without_system", {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Just chat."}, {"role": "assistant", "content": "Sure."}]}),
]

# Rendered with add_generation_prompt: what `data tokenize --add-generation-prompt` writes for prompt files.
PROMPT_CASES = ["ends_with_user", "system_multi_turn_prompt", "tool_prompt"]
EXTRA_PROMPTS = [
    ("system_multi_turn_prompt", {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7", "reasoning_content": "small"},
        {"role": "user", "content": "Another?"}]}),
    ("tool_prompt", {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Lima?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Lima"})]},
        {"role": "tool", "content": "18"}]}),
]


def transformers_environment():
    """The jinja2 environment transformers' chat_template_utils._compile_jinja_template builds (minus its
    {% generation %} extension, which these templates do not use)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def specforge_mask(text, ids, encode):
    """SpecForge GeneralParser.parse: regex over the text, token positions from the lengths of prefix encodings."""
    pattern = re.escape(ASSISTANT_HEADER) + r"([\s\S]*?(?:" + re.escape(END_OF_TURN) + "|$))"
    mask = [0] * len(ids)
    for m in re.finditer(pattern, text, re.DOTALL):
        start, end = len(encode(text[:m.start(1)])), len(encode(text[:m.end(1)]))
        for i in range(min(start, len(ids)), min(end, len(ids))):
            mask[i] = 1
    return mask


def variants(source):
    """(case name, record, enable_thinking or None, add_generation_prompt, more template variables)."""
    cases = dict(CASES + EXTRA_PROMPTS)
    for name, _ in CASES:
        for thinking in (True, False, None):
            yield name, cases[name], thinking, False, {}
    for name in PROMPT_CASES:
        for thinking in (True, False, None):
            yield name, cases[name], thinking, True, {}
    if "preserve_thinking" in source:
        for name, _ in CASES:
            yield name, cases[name], None, False, {"preserve_thinking": True}
        for name in PROMPT_CASES:
            yield name, cases[name], None, True, {"preserve_thinking": True}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jinja-only", action="store_true", help="texts only, plain jinja2 (no transformers)")
    args = ap.parse_args()
    templates = sorted(f for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
    if args.jinja_only:
        env = transformers_environment()
        versions = {"jinja2": __import__("jinja2").__version__}
    else:
        import jinja2
        import transformers
        try:
            from transformers import PreTrainedTokenizerFast
            tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER)
        except ImportError:  # a transformers without the name: its auto class reads the same tokenizer.json
            tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(TOKENIZER))
        versions = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
                    "tokenizers": __import__("tokenizers").__version__}

        def encode(s):
            return tok(s, add_special_tokens=False)["input_ids"]
    out_cases = []
    mismatches = 0
    for tname in templates:
        with open(os.path.join(TEMPLATES, tname), encoding="utf-8") as f:
            source = f.read()
        for name, record, thinking, agp, template_vars in variants(source):
            entry = {"template": tname, "case": name, "record": record, "add_generation_prompt": agp}
            kwargs = dict(template_vars)
            if thinking is not None:
                kwargs["enable_thinking"] = thinking
                entry["enable_thinking"] = thinking
            if template_vars:
                entry["template_vars"] = template_vars
            try:
                if args.jinja_only:
                    text = env.from_string(source).render(messages=record["messages"], tools=record.get("tools"),
                                                          documents=None, add_generation_prompt=agp, **kwargs)
                else:
                    text = tok.apply_chat_template(record["messages"], tools=record.get("tools"), tokenize=False,
                                                   add_generation_prompt=agp, chat_template=source, **kwargs)
            except Exception as e:  # the template refused the conversation: the C++ renderer must refuse it too
                entry["error"] = f"{type(e).__name__}: {e}"
                out_cases.append(entry)
                continue
            entry["text"] = text
            if not args.jinja_only:
                ids = encode(text)
                direct = tok.apply_chat_template(record["messages"], tools=record.get("tools"), tokenize=True,
                                                 add_generation_prompt=agp, chat_template=source, **kwargs)
                if hasattr(direct, "keys"):
                    direct = direct["input_ids"]
                entry["ids"] = ids
                if list(direct) != ids:  # kept for a look; `data tokenize` encodes the rendered text, as `ids`
                    entry["ids_apply_chat_template"] = list(direct)
                    mismatches += 1
                if not agp:
                    entry["mask"] = specforge_mask(text, ids, encode)
            out_cases.append(entry)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"versions": versions, "templates": templates, "cases": out_cases}, f, ensure_ascii=False,
                  separators=(",", ":"))
        f.write("\n")
    errors = sum("error" in c for c in out_cases)
    print(f"wrote {args.out}: {len(out_cases)} cases over {len(templates)} templates ({errors} refused), {versions}")
    if mismatches:
        print(f"note: in {mismatches} cases apply_chat_template(tokenize=True) gave other ids than encoding its text")


if __name__ == "__main__":
    sys.exit(main())
