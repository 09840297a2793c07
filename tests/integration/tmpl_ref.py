#!/usr/bin/env python3
"""Second reference for tests/unit/test_tmpl_ref.c: Python Jinja2 configured the way
transformers renders chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception, strftime_now).

Renders the real templates found in the @huggingface/jinja reference file (REF_JSON, written
by tmpl_ref.mjs) with every conversation, plus the feature snippets, and writes the same
format. Errors that are not raise_exception are marked "PY:" (any template error matches).

    python3 tmpl_ref.py REF_JSON CONVERSATIONS_JSON SNIPPETS_JSON OUT_JSON
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    ref_path, conv_path, snip_path, out_path = sys.argv[1:5]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, jinja2.ext.do])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)

    ref = json.load(open(ref_path, encoding="utf-8"))
    conv = json.load(open(conv_path, encoding="utf-8"))
    snips = json.load(open(snip_path, encoding="utf-8"))
    templates, cases = dict(ref["templates"]), []

    def render(name, src, ctx, label):
        entry = {"name": label, "model": name, "context": ctx}
        try:
            entry["output"] = env.from_string(src).render(**ctx)
        except TemplateError as e:
            entry["error"] = str(e)
        except Exception as e:  # noqa: BLE001 - any other failure is "a template error"
            entry["error"] = "PY:%s: %s" % (type(e).__name__, e)
        cases.append(entry)

    # the conversations, with the special tokens each model's case carries in the HF reference
    specials = {}
    for c in ref["cases"]:
        specials.setdefault(c["model"], {k: c["context"][k] for k in ("bos_token", "eos_token") if k in c["context"]})
    for c in conv["cases"]:
        for model in c["models"]:
            ctx = dict(specials.get(model, {}), **c["context"])
            render(model, templates[model], ctx, "python %s: %s" % (model, c["name"]))
    for i, src in enumerate(snips["snippets"]):
        name = "snippet%d" % i
        templates[name] = src
        render(name, src, snips["context"], "python snippet %d: %r" % (i, src[:50]))
    json.dump({"templates": templates, "cases": cases}, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)
    print("%d Python Jinja2 %s renderings (%d errors) -> %s" % (len(cases), jinja2.__version__, sum("error" in c for c in cases), out_path))


if __name__ == "__main__":
    main()
