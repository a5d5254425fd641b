#!/usr/bin/env python3
"""Renders chat templates the way transformers' apply_chat_template does (jinja2's sandbox with trim_blocks and
lstrip_blocks, the tojson filter, raise_exception and strftime_now), as the reference for npusim's chat template
tests. Needs python3-jinja2 (scripts/setup.sh installs it).

Usage: python3 tests/python/render_chat_template.py INPUT.json
  INPUT: [{"template": "...", "messages": [{"role": ..., "content": ...}], "add_generation_prompt": true,
           "kwargs": {"bos_token": ..., "date_string": ..., ...}}, ...]
  prints the rendered prompts as a JSON array of strings.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(date_format):
    return datetime.now().strftime(date_format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = environment()
    prompts = []
    for index, case in enumerate(cases):
        try:
            template = env.from_string(case["template"])
            prompts.append(template.render(messages=case["messages"], tools=None, documents=None,
                                           add_generation_prompt=case.get("add_generation_prompt", False),
                                           **case.get("kwargs", {})))
        except jinja2.exceptions.TemplateError as error:
            sys.exit("case %d: %s" % (index, error))
    json.dump(prompts, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
