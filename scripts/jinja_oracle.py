#!/usr/bin/env python3
"""Oracle for the C++ Jinja renderer (src/jinja/): renders with the real jinja2 the way
transformers' apply_chat_template does, and writes the expected outputs the C++ tests compare
against byte for byte.

Writes, under tests/data/chat_templates/:
  <family>.expected  for each <family>.jinja: JSON {case: {"output": str} | {"error": str}} for
                     each conversation of conversations.json, with add_generation_prompt off
                     and on (case "<conversation>|gen=0" / "|gen=1");
  features.json      the feature cases below with their jinja2 output or error.

strftime_now sees a fixed clock (2024-07-26 10:30:00 local), as the C++ tests inject it.
Usage: python3 scripts/jinja_oracle.py  (needs transformers and jinja2 >= 3.1.6)
"""
import datetime as _dt
import glob
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DIR = os.path.join(ROOT, "tests", "data", "chat_templates")
BOS, EOS = "<s>", "</s>"


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2024, 7, 26, 10, 30, 0)


# transformers' strftime_now reads the module global `datetime` when it runs.
ctu.datetime = _FixedDatetime


def env_like_transformers(trim_blocks, lstrip_blocks):
    """transformers' environment with other whitespace flags (tojson, namespace and friends)."""
    base = ctu._cached_compile_jinja_template("").environment
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = base.filters["tojson"]
    for name in ("raise_exception", "strftime_now", "dict", "namespace"):
        env.globals[name] = base.globals[name]
    return env


def render_feature(template, context, trim, lstrip):
    try:
        if trim and lstrip:
            tpl = ctu._cached_compile_jinja_template(template)
        else:
            tpl = env_like_transformers(trim, lstrip).from_string(template)
        return {"output": tpl.render(**context)}
    except Exception as e:  # the C++ renderer must fail too; the message is for the reader
        return {"error": f"{type(e).__name__}: {e}"}


def render_chat(template, conv, gen):
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=template,
            add_generation_prompt=gen, bos_token=BOS, eos_token=EOS, **conv.get("extra", {}))
        return {"output": rendered[0]}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


# (name, template, context, trim_blocks and lstrip_blocks). Each name is a C++ test.
M = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}]
FEATURES = [
    ("text_only", "plain text\nwith lines\n", {}, True),
    ("trailing_newline_kept_once", "a\n\n", {}, True),
    ("crlf_newlines", "a\r\nb\rc{% if true %}\r\nd{% endif %}", {}, True),
    ("print_values", "{{ 1 }}|{{ 1.5 }}|{{ 'x' }}|{{ none }}|{{ true }}|{{ False }}|{{ [1, 'a', none, 2.0] }}|{{ {'a': (1, 2), 'b': {}} }}|{{ (1,) }}|{{ () }}", {}, True),
    ("float_repr", "{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 2**-1 }} {{ 1.5e3 }} {{ -0.0 }} {{ 123456789.125 }}", {}, True),
    ("string_escapes", r"""{{ 'a\x41\u00e9\d\n\t"' }}{{ "it's" }}{{ 'x' "y" }}""", {}, True),
    ("repr_strings", """{{ ["a'b", 'x"', 'a\\nb', "both'\\"", 'é'] }}""", {}, True),
    ("whitespace_control", "a {%- if true -%} b {%- endif %}  c\n  {{- 'd' -}}  \n e {#- c -#} f", {}, True),
    ("trim_lstrip", "  {% if true %}\n    x\n  {% endif %}\n  {{ 'y' }}\n  {# c #}\n{%+ if true %}z{% endif %}\n  {% if true +%}\nw{% endif %}", {}, True),
    ("no_trim_no_lstrip", "  {% if true %}\n    x\n  {% endif %}\n  {# c #}\nz", {}, False),
    ("comments", "x {# c #}\n  {# c2 #}\ny{# multi\nline #}{{ 1 }}", {}, True),
    ("raw_block", "  {%- raw %}  {{x}} {% if %}\n  {% endraw %}\nafter{% raw -%}   a  {%- endraw %}b", {}, True),
    ("if_elif_else", "{% for x in [1, 2, 3, 0] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x > 2 %}many{% else %}zero{% endif %},{% endfor %}", {}, True),
    ("for_loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]{{ loop.cycle('o', 'e') }}{{ loop.depth }};{% endfor %}", {}, True),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}{{ x }}{% else %}no{% endfor %}", {}, True),
    ("for_if_filter", "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }}{{ loop.last }} {% endfor %}", {}, True),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}{% for a, b in [[1, 2]] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2}}, True),
    ("for_over_dict_string", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for x in undefined_name %}never{% endfor %}", {}, True),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}, True),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}, True),
    ("scoping", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i + 10 %}{{ x }},{% endfor %}{{ x }}{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}, True),
    ("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, %}{{ t }}{% set blk %}in {{ a }}\n{% endset %}[{{ blk }}]{% set up | upper | trim %} shout {% endset %}[{{ up }}]", {}, True),
    ("namespace", "{% set ns = namespace(count=0, found=false, items=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.items = ns.items + [m.content] %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.items }} {{ ns.missing is defined }} {{ ns['count'] }} {{ ns }}", {"messages": M}, True),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}, True),
    ("macros", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet() }}|{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}", {}, True),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}", {}, True),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}{% filter trim | replace('a', 'b') %}  aa  {% endfilter %}", {}, True),
    ("generation_block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}", {"messages": M}, True),
    ("literals", "{{ [1, [2, 3], {'k': 'v'}] }}{{ {'a': 1, 'b': 2}['b'] }}{{ (1, 2)[1] }}{{ True }}{{ None }}{{ 10_000 }}{{ 0.5 }}{{ [1, 2,] }}{{ {'a': 1,} }}", {}, True),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 0.5 }} {{ true + 1 }} {{ 1 + 2.5 }} {{ 3 - 5 }} {{ 2 * 3.0 }} {{ +3 }} {{ -(1) }}", {}, True),
    ("sequence_ops", "{{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ (1,) + (2,) }} {{ 'a' ~ 1 ~ none ~ nope ~ [1] }}", {}, True),
    ("comparisons", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ true == 1 }} {{ none == none }} {{ nope == nope }} {{ nope == none }} {{ [1] == (1,) }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ 2 >= 2 }} {{ 1 <= 0 }}", {}, True),
    ("logic", "{{ true and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ 'a' or 'b' }} {{ not 0 }} {{ not [] and 1 }} {{ none or [] }} {{ 1 if 0 else 2 }} [{{ 1 if false }}] {{ (1 if false) is defined }} {{ 'a' if true else 'b' if true else 'c' }}", {}, True),
    ("membership", "{{ 'b' in {'b': 1} }} {{ 2 in [1, 2] }} {{ 'x' not in 'xyz' }} {{ 'yz' in 'xyz' }} {{ 3 in (1, 2) }} {{ 'q' in nope }} {{ not 'a' in 'abc' }}", {}, True),
    ("attr_and_item", "{{ d.a }} {{ d['a'] }} {{ d.missing is defined }} {{ d.items is defined }} {{ l[0] }} {{ l[-1] }} {{ l[5] is defined }} {{ l.0 }} {{ d.nested.x }} {{ d['nested']['x'] }} {{ none.x is defined }} {{ 'abc'[1] }} {{ 'abc'[-1] }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }}", {"d": {"a": 1, "nested": {"x": "y"}}, "l": [10, 20, 30]}, True),
    ("slicing", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[1:3] }} {{ l[5:] }} {{ l[3:1:-1] }} {{ s[::-1] }} {{ s[1:3] }} {{ s[-2:] }} {{ messages[1:]|length }}", {"l": [0, 1, 2, 3, 4], "s": "héllo", "messages": M}, True),
    ("tests", "{{ x is defined }} {{ nope is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ 1.0 is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ nope is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ {} is sequence }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 1 is equalto 1 }} {{ 1 is eq 1 }} {{ 2 is ne 1 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 1 is in [1] }} {{ none is sameas none }} {{ range is callable }} {{ 'a' is callable }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ x is not none }} {{ not x is none }}", {"x": 1}, True),
    ("method_strings", "{{ ' a '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a  b\tc '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'ab'.startswith('a') }}|{{ 'ab'.endswith(('x', 'b')) }}|{{ 'aaa'.replace('a', 'b') }}|{{ 'aaa'.replace('a', 'b', 1) }}|{{ 'aB'.upper() }}{{ 'aB'.lower() }}|{{ 'hello wORLD o\\'neil 3rd'.title() }}|{{ 'hELLO'.capitalize() }}|{{ '{} and {name} {}'.format(1, 2, name='x') }}{{ '{1}{0}'.format('a', 'b') }}|{{ ', '.join(['a', 'b']) }}|{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}|{{ 'x\\ny'.splitlines() }}|{{ '12'.isdigit() }}|{{ 'abc'.removeprefix('a') }}", {}, True),
    ("method_lists_dicts", "{{ [3, 1, 2].index(1) }} {{ [1, 1].count(1) }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 1, "a": 2}}, True),
    ("percent_format", "{{ '%s-%s' % (1, 'a') }} {{ '%d%%' % 50 }} {{ '%.2f' % 3.14159 }} {{ '%5s|%-5s|' % ('a', 'b') }} {{ '%05d %x %r' % (42, 255, 'q') }} {{ '%(a)s' % {'a': 1} }} {{ '%s' % none }} {{ 'x%sy'|format(1) }}", {}, True),
    ("filters_strings", "{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'ab'|upper }}{{ 'AB'|lower }}|{{ 'hello world-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ 'abc'|reverse }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ '<a&\"\\'>'|e }}|{{ '<x>'|escape }}|{{ '<x>'|safe }}|{{ 'one two  three'|wordcount }}|{{ 'ab'|center(6) }}|{{ 'hello world foo'|truncate(9, leeway=0) }}|{{ 'abc'|first }}{{ 'abc'|last }}", {}, True),
    ("filters_indent", "{{ 'ab\\ncd\\n\\nx'|indent(2) }}|{{ 'ab\\ncd'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('--') }}|{{ 'a\\nb\\n'|indent }}", {}, True),
    ("filters_numbers", "{{ 2.5|round }} {{ 3.5|round }} {{ 3.14159|round(2) }} {{ 2.7|round(method='floor') }} {{ 2.1|round(1, 'ceil') }} {{ 5|round }} {{ -2.5|round }} {{ -3|abs }} {{ -3.5|abs }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '12'|float }} {{ 3|float }} {{ true|int }} {{ ' 42 '|int }} {{ 4.9|int }}", {}, True),
    ("filters_collections", "{{ [1, 2, 3]|length }} {{ 'hé'|length }} {{ {'a': 1}|count }} {{ nope|length }} {{ [1, 2, 3]|sum }} {{ [{'x': 1}, {'x': 3}]|sum(attribute='x') }} {{ [3, 1, 2]|min }} {{ ['b', 'a']|max }} {{ []|first is defined }} {{ [1, 2]|first }} {{ [1, 2]|last }} {{ [1, 2]|reverse|list }} {{ 'ab'|list }} {{ {'a': 1}|list }} {{ {'a': 1}|items|list }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 0)|list }}", {}, True),
    ("filters_join_map", "{{ [1, 2]|join }} {{ [1, 2]|join(', ') }} {{ [{'a': 'x'}, {'a': 'y'}]|join('-', attribute='a') }} {{ [1, 2]|map('string')|join(',') }} {{ [{'a': 1}, {'a': 2}]|map(attribute='a')|list }} {{ [{'a': 1}, {'b': 2}]|map(attribute='a', default=0)|list }} {{ ['a', 'b']|map('upper')|list }} {{ [' a ']|map('trim')|list }} {{ [{'a': {'b': 5}}]|map(attribute='a.b')|list }}", {}, True),
    ("filters_select", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('divisibleby', 2)|list }} {{ [0, 1, '', 'a']|select|list }} {{ [{'a': 1}, {'a': 0}, {}]|selectattr('a')|list }} {{ [{'a': 1}, {'a': 0}]|rejectattr('a', 'equalto', 1)|list }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|select('in', ['user', 'system'])|list }}", {"messages": M}, True),
    ("filters_sort", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n', reverse=true) }} {{ {'b': 1, 'A': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ ['a', 'A', 'b', 'a']|unique|list }} {{ [3, 1, 3]|unique|list }}", {}, True),
    ("filters_default", "{{ nope|default('x') }} {{ none|default('x') }} {{ ''|default('x', true) }} {{ ''|d('y', boolean=true) }} {{ 0|d('z') }} {{ nope|d }}|{{ x|default('unused') }}", {"x": "set"}, True),
    ("filters_string_conversions", "{{ none|string }} {{ 1|string }} {{ [1, 'a']|string }} {{ 1.0|string }} {{ true|string ~ 'x' }}", {}, True),
    ("tojson", "{{ {'a': 1, 'b': [1.0, 'é\"\\n', none, true]}|tojson }}|{{ {'a': 1, 'b': [1, 2], 'c': {}}|tojson(indent=2) }}|{{ 'x<y>&'|tojson }}|{{ [[], {}]|tojson }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ (1, 2)|tojson }}|{{ 1e20|tojson }}|{{ {1: 2}|tojson }}|{{ tools|tojson }}", {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}, True),
    ("tojson_ensure_ascii", "{{ s|tojson(ensure_ascii=true) }}|{{ d|tojson(ensure_ascii=true, indent=2) }}|{{ s|tojson(ensure_ascii=false) }}", {"s": "caf\u00e9 \u4e2d \U0001F600 \"q\"", "d": {"k\u00e9": ["\u00ff"]}}, True),
    ("markup_concat", "{{ 'a'|safe + '<b>\"' + ('x&'|e) + \"'y\" }}|{{ 'p<' + ('<'|safe) }}|{{ ('<'|e) ~ '<' }}|{{ ('<'|e)|e }}|{{ (1|safe) + '>' }}", {}, True),
    ("generator_truthy_iterable", "{% set g = [] | select %}{% if g %}true{% endif %}|{{ ([1, 2, 3] | select('odd') | list) }}|{{ [1, 2] | map('string') | join('-') }}|{% for x in {'a': 1} | items %}{{ x[0] }}{% endfor %}|{{ [3, 1, 3] | unique | first }}|{{ [1] | select is sequence }}|{{ [1] | select is iterable }}", {}, True),
    ("generator_tojson", "{{ [1] | map('string') | tojson }}", {}, True),
    ("generator_length", "{{ [1] | select | length }}", {}, True),
    ("generator_index", "{{ ([1] | select)[0] }}", {}, True),
    ("generator_last", "{{ [1] | select | last }}", {}, True),
    ("filters_on_none", "[{{ none|selectattr('type', 'equalto', 'x')|list }}][{{ none|map(attribute='a')|list }}][{{ none|select|list|length }}][{{ []|rejectattr('a')|list }}][{{ ''|map('upper')|list }}]", {}, True),
    ("tojson_indent_nested", "{{ d|tojson(indent=4) }}", {"d": {"k": [1, {"x": None, "y": [True, False]}], "e": [], "s": "\u00e9\u4e2d\u0001"}}, True),
    ("dict_global_and_range", "{{ dict(a=1, b='x') }} {{ dict({'z': 1}, y=2) }} {{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ range(0)|list }}", {}, True),
    ("undefined_prints_empty", "[{{ nope }}][{{ d.missing }}][{{ nope|upper }}][{{ nope|trim }}]{{ nope|length }}", {"d": {}}, True),
    ("unicode_text", "héllo {{ 'wörld'|upper }} {{ '日本'|length }} {{ '日本語'[1] }} {{ ' \u3000x\u3000 '|trim }}", {}, True),
    ("message_loop", "{% for m in messages %}<{{ m['role'] }}>{{ m.content|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}", {"messages": M}, True),
    # Errors: jinja2 fails on each; the C++ renderer must throw a one-line tessera::Error.
    ("error_undefined_attr", "line one\n{{ nope.attr }}", {}, True),
    ("error_missing_key_chain", "{{ d.missing.x }}", {"d": {}}, True),
    ("error_type_add", "{{ 1 + 'a' }}", {}, True),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}, True),
    ("error_division_by_zero", "{{ 1 / 0 }}", {}, True),
    ("error_compare_types", "{{ 1 < 'a' }}", {}, True),
    ("error_in_non_string", "{{ 1 in 'abc' }}", {}, True),
    ("unknown_filter_in_untaken_if", "{% if false %}{{ x|nosuchfilter }}{% endif %}ok", {}, True),
    ("error_unknown_filter", "{{ x|nosuchfilter }}", {}, True),
    ("error_unknown_filter_taken_if", "{% if true %}{{ x|nosuchfilter }}{% endif %}", {}, True),
    ("error_unknown_test", "{{ x is nosuchtest }}", {}, True),
    ("error_unknown_tag", "{% include 'x.html' %}", {}, True),
    ("error_unclosed_block", "{% if true %}never closed", {}, True),
    ("error_unclosed_tag", "{{ 1 + ", {}, True),
    ("error_bad_token", "{{ 1 $ 2 }}", {}, True),
    ("error_list_append", "{% set l = [] %}{{ l.append(1) }}", {}, True),
    ("error_dict_update", "{% set d = {} %}{{ d.update({'a': 1}) }}", {}, True),
    ("error_not_callable", "{{ 'abc'() }}", {}, True),
    ("error_call_undefined", "{{ nope() }}", {}, True),
    ("error_iterate_none", "{% for x in none %}{% endfor %}", {}, True),
    ("error_range_too_big", "{{ range(100001)|length }}", {}, True),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}, True),
    ("error_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}, True),
    ("error_endfor_mismatch", "{% for x in y %}{% endif %}", {}, True),
    ("error_unexpected_paren", "{{ (1 + 2)) }}", {}, True),
    ("error_tojson_undefined", "{{ nope|tojson }}", {}, True),
    ("error_slice_step_zero", "{{ [1][::0] }}", {}, True),
]


def main():
    with open(os.path.join(DIR, "conversations.json")) as f:
        conversations = json.load(f)
    for path in sorted(glob.glob(os.path.join(DIR, "*.jinja"))):
        template = open(path, encoding="utf-8").read()
        expected = {}
        for conv in conversations:
            for gen in (False, True):
                expected[f"{conv['name']}|gen={int(gen)}"] = render_chat(template, conv, gen)
        out = path[: -len(".jinja")] + ".expected"
        with open(out, "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{os.path.relpath(out, ROOT)}: {len(expected)} cases")
    cases = []
    for name, template, context, trim in FEATURES:
        case = {"name": name, "template": template, "context": context, "trim_lstrip": trim}
        case.update(render_feature(template, context, trim, trim))
        cases.append(case)
    out = os.path.join(DIR, "features.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{os.path.relpath(out, ROOT)}: {len(cases)} cases")


if __name__ == "__main__":
    sys.exit(main())
