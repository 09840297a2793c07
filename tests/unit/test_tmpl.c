/* tmpl: the Jinja subset, one feature per check (expected output written by hand from Python
 * Jinja's behaviour), error cases (position in the message, raise_exception, limits), the
 * value-building API and the built-in templates. */
#include "common/cm_err.h"
#include "common/cm_json.h"
#include "text/tmpl.h"
#include "t.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char last_err[512];

/* Renders src with the JSON object ctx (NULL: none). Returns the output (static buffer) or
 * "ERR:<code>" with the message in last_err. */
static const char *render_lim(const char *src, const char *ctx, const tmpl_limits *lim) {
    static char buf[1 << 16];
    tmpl *t;
    last_err[0] = 0;
    int rc = tmpl_compile(src, strlen(src), &t, last_err, sizeof last_err);
    if (rc) { snprintf(buf, sizeof buf, "ERR:%s", cm_err_name(rc)); return buf; }
    tmpl_arena *a = tmpl_arena_create();
    tmpl_value *c = NULL;
    if (ctx) {
        cm_json_doc *d;
        char jerr[128];
        if (cm_json_parse(ctx, strlen(ctx), &d, jerr, sizeof jerr)) { fprintf(stderr, "bad test json: %s\n", jerr); abort(); }
        if (tmpl_from_json(a, cm_json_root(d), &c)) abort();
        cm_json_free(d);
    }
    char *out;
    size_t n;
    rc = tmpl_render(t, c, lim, &out, &n, last_err, sizeof last_err);
    if (rc) snprintf(buf, sizeof buf, "ERR:%s", cm_err_name(rc));
    else {
        snprintf(buf, sizeof buf, "%s", out);
        if (strlen(out) != n) snprintf(buf, sizeof buf, "LEN MISMATCH");
        free(out);
    }
    tmpl_arena_destroy(a);
    tmpl_free(t);
    return buf;
}

static const char *render(const char *src, const char *ctx) { return render_lim(src, ctx, NULL); }

#define R(src, ctx, want) T_EQ_STR(render((src), (ctx)), (want))

static void test_basics(void) {
    R("Hello", NULL, "Hello");
    R("", NULL, "");
    R("a\n", NULL, "a");            /* one trailing newline dropped */
    R("a\n\n", NULL, "a\n");
    R("{{ 'x' }}", NULL, "x");
    R("{{ name }}!", "{\"name\":\"Ann\"}", "Ann!");
    R("[{{ missing }}]", NULL, "[]");
    R("{{ 1 + 2 * 3 }}", NULL, "7");
    R("{{ (1 + 2) * 3 }}", NULL, "9");
    R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", NULL, "3 -4 1 2 3.5 1024");
    R("{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e16 }} {{ 1e-5 }} {{ 3.0 }}", NULL,
      "2.5 0.30000000000000004 1e+20 1e+16 1e-05 3.0");
    R("{{ true }} {{ false }} {{ none }} {{ True }}", NULL, "True False None True");
    R("{{ 'a' ~ 1 ~ none }}", NULL, "a1None");
    R("{{ 'ab' + 'cd' }}", NULL, "abcd");
    R("{{ [1, 'a', none, true] }}", NULL, "[1, 'a', None, True]");
    R("{{ {'k': 'v', 'n': 2} }}", NULL, "{'k': 'v', 'n': 2}");
    R("{{ (1, 2) }} {{ (1,) }} {{ () }}", NULL, "(1, 2) (1,) ()");
    R("{{ \"it's\" }} {{ ['it\\'s'] }}", NULL, "it's [\"it's\"]");
    R("{{ 'a\\tb\\n' }}|{{ '\\u00e9\\x41' }}", NULL, "a\tb\n|\xC3\xA9" "A");
    R("{{ 'con' 'cat' }}", NULL, "concat");
    R("{{ 1 if true else 2 }}{{ 1 if false else 2 }}[{{ 1 if false }}]", NULL, "12[]");
    R("{{ 1 < 2 and 2 < 3 }} {{ not 1 }} {{ 0 or 'x' }} {{ '' and 1 }}", NULL, "True False x ");
    R("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in undefinedvar }}", NULL,
      "True True True True False");
    R("{{ 1 == 1.0 }} {{ 'a' == 'a' }} {{ [1] == [1] }} {{ 'a' != 'b' }} {{ 'b' > 'a' }}", NULL, "True True True True True");
    R("{{ -3 }} {{ - 2 + 5 }} {{ -(2) }}", NULL, "-3 3 -2");
    R("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 < 5 > 2 }}", NULL, "True False True");
    R("{{ '%s-%d' % ('a', 7) }} {{ 'x=%s' % 5 }} {{ '100%%' % () }}", NULL, "a-7 x=5 100%");
    R("{# comment #}x{# multi\nline #}y", NULL, "xy");
    R("{% raw %}{{ not evaluated }}{% endraw %}", NULL, "{{ not evaluated }}");
}

static void test_whitespace(void) {
    R("a  {{- 'b' -}}  c", NULL, "abc");
    R("a\n  {%- if true -%}\n  b\n  {%- endif -%}\n  c", NULL, "abc");
    /* trim_blocks: newline after a block tag dropped; lstrip_blocks: indentation before it */
    R("{% if true %}\n  x\n{% endif %}\ny", NULL, "  x\ny");
    R("<\n    {% if true %}\n    in\n    {% endif %}\n>", NULL, "<\n    in\n>");
    R("a {% if true %}b{% endif %}", NULL, "a b"); /* not at line start: kept */
    R("{{ 'x' }}\ny", NULL, "x\ny");               /* trim_blocks does not apply to {{ }} */
    R("  {%+ if true %}x{% endif %}", NULL, "  x");
    R("{% if true +%}\nx{% endif %}", NULL, "\nx");
    R("a\n{# c #}\nb", NULL, "a\nb");
    R("a  {#- c -#}  b", NULL, "ab");
}

static void test_for(void) {
    const char *ctx = "{\"xs\":[\"a\",\"b\",\"c\"],\"d\":{\"one\":1,\"two\":2},\"e\":[]}";
    R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}{{ loop.revindex }}{{ loop.revindex0 }}"
      "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", ctx,
      "10a32TrueFalse3;21b21FalseFalse3;32c10FalseTrue3;");
    R("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", ctx, "-b,a-c,b-,");
    R("{% for x in xs if x != 'b' %}{{ loop.index }}{{ x }}{{ loop.length }} {% endfor %}", ctx, "1a2 2c2 ");
    R("{% for x in e %}no{% else %}empty{% endfor %}", ctx, "empty");
    R("{% for x in xs if false %}no{% else %}none passed{% endfor %}", ctx, "none passed");
    R("{% for k in d %}{{ k }}{% endfor %}", ctx, "onetwo");
    R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx, "one=1;two=2;");
    R("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", ctx, "one=1;two=2;");
    R("{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", NULL, "37");
    R("{% for c in 'h\xC3\xA9y' %}[{{ c }}]{% endfor %}", NULL, "[h][\xC3\xA9][y]");
    R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      NULL, "0134");
    R("{% for x in range(2) %}{% for y in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}", NULL, "121|122|");
    R("{% for x in xs %}{{ loop.cycle('o', 'e') }}{% endfor %}", ctx, "oeo");
    /* assignments inside a loop stay in the loop */
    R("{% set n = 0 %}{% for x in xs %}{% set n = n + 1 %}{{ n }}{% endfor %}{{ n }}", ctx, "1110");
    R("{{ strftime_now('%Y') | length }} {{ strftime_now('%Y-%m-%d')[4] }}", NULL, "4 -");
    R("{{ range(3) }} {{ range(1, 7, 2) }} {{ range(3, 0, -1) }} {{ range(0) }}", NULL, "[0, 1, 2] [1, 3, 5] [3, 2, 1] []");
    R("{% for x in undefinedthing %}x{% endfor %}ok", NULL, "ok");
}

static void test_if_set_ns(void) {
    R("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}", NULL, "c");
    R("{% if none %}a{% else %}b{% endif %}", NULL, "b");
    R("{% set x = 5 %}{% set y = x * 2 %}{{ y }}", NULL, "10");
    R("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL, "21");
    R("{% set s %}in {{ 1 + 1 }}{% endset %}[{{ s }}]", NULL, "[in 2]");
    R("{% set s | upper %}shout{% endset %}{{ s }}", NULL, "SHOUT");
    R("{% set ns = namespace(found=false, n=0) %}{% for i in range(5) %}{% if i == 3 %}{% set ns.found = true %}{% endif %}"
      "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.found }} {{ ns.n }}", NULL, "True 10");
    R("{% set ns = namespace() %}{% set ns.x = 'y' %}{{ ns.x }}{{ ns['x'] }}", NULL, "yy");
    R("{% set l = [] %}{% for i in range(3) %}{% set _ = l.append(i * i) %}{% endfor %}{{ l }}", NULL, "[0, 1, 4]");
    R("{% set d = {} %}{% do d.update({'a': 1}) %}{{ d }} {{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }}", NULL,
      "{'a': 1} 1 dflt None");
    R("{% set d = dict(a=1, b='x') %}{{ d.b }}{{ d['a'] }}{{ d|length }}", NULL, "x12");
}

static void test_macro_call(void) {
    R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', '?') }}"
      " {{ greet(punct='.', name='Cy') }}", NULL, "Hi Ann! Hi Bo? Hi Cy.");
    R("{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k=4) }}", NULL, "1(2, 3){'k': 4}");
    R("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", NULL,
      "<b>bold</b>");
    R("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
      "{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", NULL, "[1][2]");
    R("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(5) }}", NULL, "120");
    R("{% filter upper %}quiet {{ 'words' }}{% endfilter %}", NULL, "QUIET WORDS");
    R("{% generation %}gen{% endgeneration %}", NULL, "gen");
    R("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}{{ a }}[{{ c }}]", NULL, "211[]");
}

static void test_filters(void) {
    const char *ctx = "{\"users\":[{\"name\":\"b\",\"age\":30,\"on\":true},{\"name\":\"A\",\"age\":20,\"on\":false},"
                      "{\"name\":\"c\",\"age\":25}],\"s\":\"  Hello World  \",\"n\":-3.7,\"obj\":{\"b\":[1,2],\"a\":\"x\\\"y\\u00e9\"}}";
    R("[{{ s | trim }}] [{{ s | length }}] [{{ s | upper }}] [{{ s | lower }}]", ctx,
      "[Hello World] [15] [  HELLO WORLD  ] [  hello world  ]");
    R("{{ 'hello wORLD' | capitalize }}|{{ 'hello wORLD-x y2b' | title }}|{{ 'y2b'.title() }}", NULL, "Hello world|Hello World-X Y2b|Y2B");
    R("{{ users | length }} {{ users | first | attr('name') }} {{ (users | last).name }} {{ 'abc' | first }}{{ 'abc' | last }}", ctx,
      "3 b c ac");
    R("{{ users | map(attribute='name') | join(', ') }}", ctx, "b, A, c");
    R("{{ users | selectattr('on') | map(attribute='name') | list }}", ctx, "['b']");
    R("{{ users | rejectattr('on') | map(attribute='name') | list }}", ctx, "['A', 'c']");
    R("{{ users | selectattr('age', 'gt', 21) | map(attribute='name') | join }}", ctx, "bc");
    R("{{ users | selectattr('name', 'equalto', 'A') | list | length }}", ctx, "1");
    R("{{ users | sort(attribute='age') | map(attribute='name') | join }}", ctx, "Acb");
    R("{{ users | sort(attribute='name') | map(attribute='name') | join }}", ctx, "Abc");
    R("{{ users | sort(attribute='name', case_sensitive=true) | map(attribute='name') | join }}", ctx, "Abc");
    R("{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'a'] | sort | join }}", NULL, "[1, 2, 3] [3, 2, 1] ab");
    R("{{ [1, 2, 2, 'a', 'A'] | unique | list }}", NULL, "[1, 2, 'a']");
    R("{{ [1, 2, 3] | sum }} {{ users | sum(attribute='age') }} {{ [1, 5, 3] | max }} {{ [4, 2] | min }}", ctx, "6 75 5 2");
    R("{{ [1, 2, 3] | select('odd') | list }} {{ [1, 2, 3] | reject('odd') | list }}", NULL, "[1, 3] [2]");
    R("{{ ['a', 'b'] | map('upper') | join('-') }}", NULL, "A-B");
    R("{{ obj | tojson }}", ctx, "{\"b\": [1, 2], \"a\": \"x\\\"y\xC3\xA9\"}");
    R("{{ obj | tojson(indent=2) }}", ctx, "{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": \"x\\\"y\xC3\xA9\"\n}");
    R("{{ obj | tojson(sort_keys=true, ensure_ascii=true) }}", ctx, "{\"a\": \"x\\\"y\\u00e9\", \"b\": [1, 2]}");
    R("{{ obj | tojson(separators=(',', ':')) }}", ctx, "{\"b\":[1,2],\"a\":\"x\\\"y\xC3\xA9\"}");
    R("{{ [1.0, none, true, 'a\\nb\\u0001'] | tojson }} {{ {} | tojson }} {{ [] | tojson(indent=4) }}", NULL,
      "[1.0, null, true, \"a\\nb\\u0001\"] {} []");
    R("{{ obj | items | list }}", ctx, "[('b', [1, 2]), ('a', 'x\"y\xC3\xA9')]");
    R("{{ obj | dictsort }}", ctx, "[('a', 'x\"y\xC3\xA9'), ('b', [1, 2])]");
    R("{{ undefinedthing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('x') }}", NULL,
      "d  d None");
    R("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }}", NULL, "a+b+c bba");
    R("{{ 42 | string }}{{ '42' | int + 1 }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }} {{ '2.5' | float }}", NULL, "4243407 2.5");
    R("{{ n | abs }} {{ n | round }} {{ n | round(0, 'floor') }} {{ 2.567 | round(2) }} {{ n | int }}", ctx, "3.7 -4.0 -4.0 2.57 -3");
    R("{{ 'x' | safe }}{{ '<a href=\"x\">&' | e }}", NULL, "x&lt;a href=&#34;x&#34;&gt;&amp;");
    R("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}", NULL,
      "a\n  b\n\n  c|  a\n  b|a\n  \n  b");
    R("{{ 'a\n\nb\n' | indent(2, blank=true) }}|{{ 'x\n' | indent }}|", NULL, "a\n  \n  b\n  |x\n|");
    R("{{ '%s is %d' | format('x', 3) }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ 'a b  c' | wordcount }}", NULL,
      "x is 3 [2, 1] cba 3");
    R("{{ 'abc' | list }} {{ {'a': 1} | list }}", NULL, "['a', 'b', 'c'] ['a']");
}

static void test_tests_methods(void) {
    const char *ctx = "{\"s\":\"x\",\"n\":1,\"f\":1.5,\"l\":[1],\"d\":{},\"z\":null,\"b\":false}";
    R("{{ s is string }}{{ n is number }}{{ f is float }}{{ n is integer }}{{ l is sequence }}{{ d is mapping }}"
      "{{ l is iterable }}{{ z is none }}{{ b is boolean }}{{ q is defined }}{{ q is undefined }}{{ s is not none }}", ctx,
      "TrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrue");
    R("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 2 is eq(2) }}{{ 1 is in [1] }}"
      "{{ b is false }}{{ 'abc' is lower }}{{ n is sameas 1 }}{{ 3 is gt 2 }}", ctx,
      "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
    R("[{{ '  a b  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '  a'.lstrip() }}][{{ 'a\\n\\n'.rstrip('\\n') }}]", NULL,
      "[a b][a][a][a]");
    R("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}", NULL,
      "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c']");
    R("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.upper() }}{{ 'ABC'.lower() }}{{ 'a b'.title() }}", NULL,
      "TrueTrueABCabcA B");
    R("{{ 'aXbX'.replace('X', '-') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }}", NULL,
      "a-b- 2 2 a-b");
    R("{{ '{} and {}'.format(1, 'x') }} {{ '{0}{0}'.format('r') }} {{ '{name}'.format(name='n') }}", NULL, "1 and x rr n");
    R("{{ 'x</think>y'.split('</think>')[-1] }}{{ 'abc'.removeprefix('a') }}{{ '12'.isdigit() }}", NULL, "ybcTrue");
    R("{{ 'a\\nb\\r\\nc'.splitlines() }}", NULL, "['a', 'b', 'c']");
    R("{% set l = [1, 2, 3] %}{{ l.pop() }}{{ l }}{{ l.index(2) }}{{ l.count(1) }}{% do l.insert(0, 9) %}{{ l }}", NULL,
      "3[1, 2]11[9, 1, 2]");
    R("{{ {'a': 1}.items() | list }} {{ {'a': 1}.keys() }} {{ {'a': 1}.values() }}", NULL, "[('a', 1)] ['a'] [1]");
}

static void test_subscripts(void) {
    const char *ctx = "{\"m\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}],\"s\":\"h\xC3\xA9llo\"}";
    R("{{ m[0].role }} {{ m[0]['content'] }} {{ m[-1].role }} {{ m.0.role }} [{{ m[5] }}] [{{ m[0].nope }}]", ctx,
      "system S user system [] []");
    R("{{ m[1:] | length }} {{ (m[::-1] | first).role }} {{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3, 4][::2] }} {{ [1, 2, 3][-2:] }}", ctx,
      "1 user [2, 3] [1, 3] [2, 3]");
    R("{{ s[1] }} {{ s[::-1] }} {{ s[1:3] }} {{ s | length }} {{ s[-1] }}", ctx, "\xC3\xA9 oll\xC3\xA9h \xC3\xA9l 5 o");
    R("{{ [1, 2, 3][10:] }} {{ [1, 2, 3][::-2] }} {{ 'abc'[5] }}|", NULL, "[] [3, 1] |");
}

static void test_errors(void) {
    /* compile errors name line and column */
    T_EQ_STR(render("line1\n{% frobnicate %}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "line 2, column 4") && strstr(last_err, "frobnicate"), "%s", last_err);
    T_EQ_STR(render("{% if x %}open", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "line 1, column 4") && strstr(last_err, "endif"), "%s", last_err);
    T_EQ_STR(render("{{ x | nosuchfilter }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "line 1, column 8") && strstr(last_err, "nosuchfilter"), "%s", last_err);
    T_EQ_STR(render("{{ x is nosuchtest }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "nosuchtest"), "%s", last_err);
    T_EQ_STR(render("a\n  b {{ 1 + }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "line 2, column 12"), "%s", last_err);
    T_EQ_STR(render("{{ 'unterminated }}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ x", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{# never closed", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% raw %}never closed", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% endfor %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% break %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ a $ b }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "column 6") && strstr(last_err, "'$'"), "%s", last_err);
    T_EQ_STR(render("{% for x in y recursive %}{% endfor %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ 99999999999999999999 }}", NULL), "ERR:TEMPLATE");
    {
        tmpl *t;
        char err[128];
        T_EQ_INT(tmpl_compile("\xC3(", 2, &t, err, sizeof err), CM_EUTF8);
        T_EQ_INT(tmpl_compile(NULL, 1, &t, err, sizeof err), CM_EINVAL);
    }
    /* render errors */
    T_EQ_STR(render("{{ raise_exception('Roles must alternate') }}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(last_err, "Roles must alternate");
    T_EQ_STR(render("ok{% if true %}{{ raise_exception('custom: ' ~ 3) }}{% endif %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(last_err, "custom: 3");
    T_EQ_STR(render("\n\n  {{ 1 / 0 }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "line 3, column 8") && strstr(last_err, "division by zero"), "%s", last_err);
    T_EQ_STR(render("{{ 'a' + 1 }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "unsupported operand"), "%s", last_err);
    T_EQ_STR(render("{{ x + 'a' }}", "{\"x\":null}"), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ nofunc() }}", NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "nofunc"), "%s", last_err);
    T_EQ_STR(render("{{ 'x'.nomethod() }}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% for x in 5 %}{% endfor %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% set a, b = [1] %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{% set x = 1 %}{% set x.y = 2 %}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ messages.append(1) }}", "{\"messages\":[]}"), "ERR:TEMPLATE"); /* caller's list is read-only */
    T_CHECKF(strstr(last_err, "modify"), "%s", last_err);
    T_EQ_STR(render("{{ range(1, 2, 0) }}", NULL), "ERR:TEMPLATE");
    T_EQ_STR(render("{{ range(100000000) }}", NULL), "ERR:TOOBIG");
    T_EQ_STR(render("{{ [1, 'a'] | sort }}", NULL), "ERR:TEMPLATE");
    /* cyclic lists (lists the template made can contain themselves): no unbounded recursion */
    const char *cyc = "{% set a = [] %}{% set b = [] %}{% do a.append(a) %}{% do b.append(b) %}";
    char src[512];
    snprintf(src, sizeof src, "%s{{ a == b }}{{ a in [b] }}", cyc);
    T_EQ_STR(render(src, NULL), "FalseFalse");
    snprintf(src, sizeof src, "%s{{ [a, b] | sort | length }}", cyc);
    T_EQ_STR(render(src, NULL), "ERR:TEMPLATE");
    snprintf(src, sizeof src, "%s{{ a | tojson }}", cyc);
    T_EQ_STR(render(src, NULL), "ERR:TEMPLATE");
    snprintf(src, sizeof src, "%s{{ (a | string)[:6] }}", cyc);
    T_EQ_STR(render(src, NULL), "[[[[[[");
}

static void test_limits(void) {
    tmpl_limits lim = {.max_steps = 100000};
    /* runaway nested loops are cut by the step limit */
    T_EQ_STR(render_lim("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}x{% endfor %}{% endfor %}{% endfor %}",
                        NULL, &lim), "ERR:TOOBIG");
    T_CHECKF(strstr(last_err, "steps"), "%s", last_err);
    /* even with the default limits (50M steps): 10^12 iterations stop well before */
    T_EQ_STR(render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", NULL), "ERR:TOOBIG");
    /* unbounded recursion */
    T_EQ_STR(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL), "ERR:TOOBIG");
    T_CHECKF(strstr(last_err, "recursion"), "%s", last_err);
    /* output cap */
    tmpl_limits small = {.max_output = 1000};
    T_EQ_STR(render_lim("{% for i in range(2000) %}x{% endfor %}", NULL, &small), "ERR:TOOBIG");
    T_CHECKF(strstr(last_err, "output"), "%s", last_err);
    T_EQ_STR(render("{{ 'x' * 100000000 }}", NULL), "ERR:TOOBIG");
    /* memory: exponential string doubling */
    tmpl_limits mem = {.max_memory = 8 << 20};
    T_EQ_STR(render_lim("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                        NULL, &mem), "ERR:TOOBIG");
    /* work on big strings counts: a loop searching a 1 MB string a million times stops */
    {
        static char ctxbuf[(1 << 20) + 64];
        int k = snprintf(ctxbuf, sizeof ctxbuf, "{\"big\":\"");
        memset(ctxbuf + k, 'a', 1 << 20);
        snprintf(ctxbuf + k + (1 << 20), 64, "\"}");
        tmpl_limits few = {.max_steps = 2000000}; /* 1 MB costs 16384 steps */
        T_EQ_STR(render_lim("{% for i in range(100000) %}{% if 'zz' in big %}{% endif %}{% endfor %}", ctxbuf, &few), "ERR:TOOBIG");
        T_EQ_STR(render_lim("{% for i in range(100000) %}{% set x = big ~ i %}{% endfor %}", ctxbuf, &few), "ERR:TOOBIG");
        T_EQ_STR(render_lim("{% for i in range(100000) %}{% set x = big == big ~ '' %}{% endfor %}", ctxbuf, &few), "ERR:TOOBIG");
        T_EQ_STR(render_lim("{% for i in range(40) %}{% set x = big ~ i %}{% endfor %}ok", ctxbuf, &few), "ok");
        /* captured text held by nested macro calls counts against the memory limit */
        tmpl_limits m = {.max_memory = 32 << 20};
        T_EQ_STR(render_lim("{% macro f(n) %}{{ big }}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(200) }}", ctxbuf, &m),
                 "ERR:TOOBIG");
        /* and the time backstop */
        tmpl_limits t = {.max_ms = 50, .max_steps = (uint64_t)1 << 40};
        T_EQ_STR(render_lim("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &t), "ERR:TOOBIG");
        T_CHECKF(strstr(last_err, "ms"), "%s", last_err);
    }
    /* deep nesting at compile time */
    char deep[4000];
    size_t w = 0;
    w += (size_t)snprintf(deep + w, sizeof deep - w, "{{ ");
    for (int i = 0; i < 1000; i++) deep[w++] = '(';
    deep[w++] = '1';
    for (int i = 0; i < 1000; i++) deep[w++] = ')';
    snprintf(deep + w, sizeof deep - w, " }}");
    T_EQ_STR(render(deep, NULL), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "nesting"), "%s", last_err);
}

static void test_values_api(void) {
    tmpl_arena *a = tmpl_arena_create();
    tmpl_value *ctx = tmpl_dict(a), *msgs = tmpl_list(a), *m = tmpl_dict(a);
    T_EQ_INT(tmpl_dict_set(a, m, "role", 4, tmpl_str(a, "user", 4)), 0);
    T_EQ_INT(tmpl_dict_set(a, m, "content", 7, tmpl_str(a, "a\0b", 3)), 0);
    T_EQ_INT(tmpl_list_push(a, msgs, m), 0);
    T_EQ_INT(tmpl_dict_set(a, ctx, "messages", 8, msgs), 0);
    T_EQ_INT(tmpl_dict_set(a, ctx, "n", 1, tmpl_int(a, 3)), 0);
    T_EQ_INT(tmpl_dict_set(a, ctx, "n", 1, tmpl_int(a, 4)), 0); /* replace keeps one entry */
    T_EQ_INT(tmpl_dict_set(a, ctx, "f", 1, tmpl_float(a, 0.5)), 0);
    T_EQ_INT(tmpl_dict_set(a, ctx, "b", 1, tmpl_bool(a, 1)), 0);
    T_EQ_INT(tmpl_dict_set(a, ctx, "z", 1, tmpl_none(a)), 0);
    T_EQ_INT(tmpl_list_push(a, ctx, m), CM_EINVAL);
    T_EQ_INT(tmpl_dict_set(a, msgs, "x", 1, m), CM_EINVAL);
    T_EQ_INT(tmpl_dict_set(a, ctx, "x", 1, NULL), CM_ENOMEM);
    /* a dict large enough for the hash index */
    tmpl_value *big = tmpl_dict(a);
    char k[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof k, "k%d", i);
        tmpl_dict_set(a, big, k, strlen(k), tmpl_int(a, i));
    }
    tmpl_dict_set(a, big, "k500", 4, tmpl_int(a, -1));
    T_EQ_INT(tmpl_dict_set(a, ctx, "big", 3, big), 0);
    const char *src = "{{ messages[0].content | length }}{{ n }}{{ f }}{{ b }}{{ z }}{{ big.k999 }}{{ big['k500'] }}{{ big | length }}";
    tmpl *t;
    char err[256], *out;
    size_t n;
    T_EQ_INT(tmpl_compile(src, strlen(src), &t, err, sizeof err), 0);
    T_EQ_INT(tmpl_render(t, ctx, NULL, &out, &n, err, sizeof err), 0);
    T_EQ_STR(out, "340.5TrueNone999-11000");
    free(out);
    /* a NUL inside content survives */
    const char *src2 = "{{ messages[0].content }}";
    tmpl *t2;
    T_EQ_INT(tmpl_compile(src2, strlen(src2), &t2, err, sizeof err), 0);
    T_EQ_INT(tmpl_render(t2, ctx, NULL, &out, &n, err, sizeof err), 0);
    T_CHECK(n == 3 && memcmp(out, "a\0b", 3) == 0);
    free(out);
    T_EQ_INT(tmpl_render(t2, msgs, NULL, &out, &n, err, sizeof err), CM_EINVAL); /* context must be a dict */
    tmpl_free(t2);
    tmpl_free(t);
    tmpl_arena_destroy(a);
    tmpl_arena_destroy(NULL);
    tmpl_free(NULL);
}

static void test_builtins(void) {
    const char *conv = "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,\"messages\":["
                       "{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"Hello!\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Bye\"}]}]}";
    R(tmpl_builtin("chatml"), conv,
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
      "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    R(tmpl_builtin("llama3"), conv,
      "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
    R(tmpl_builtin("llama2"), conv, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
    R(tmpl_builtin("mistral"), conv, "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
    R(tmpl_builtin("gemma"), conv,
      "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    R(tmpl_builtin("phi3"), conv,
      "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
    const char *bad = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]}";
    T_EQ_STR(render(tmpl_builtin("gemma"), bad), "ERR:TEMPLATE");
    T_CHECKF(strstr(last_err, "alternate") != NULL, "%s", last_err);
    T_CHECK(tmpl_builtin("nope") == NULL && tmpl_builtin(NULL) == NULL);
    T_CHECK(strstr(tmpl_builtin_names(), "phi3") != NULL);
}

/* One compiled template, several threads rendering it at once with one shared context. */
typedef struct { const tmpl *t; const tmpl_value *ctx; const char *want; int bad; } thr_arg;
static void *thr_render(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < 300; i++) {
        char *out, err[128];
        size_t n;
        if (tmpl_render(a->t, a->ctx, NULL, &out, &n, err, sizeof err)) { a->bad++; continue; }
        if (strcmp(out, a->want)) a->bad++;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src = tmpl_builtin("llama3");
    tmpl *t;
    char err[128];
    T_EQ_INT(tmpl_compile(src, strlen(src), &t, err, sizeof err), 0);
    tmpl_arena *a = tmpl_arena_create();
    tmpl_value *ctx = tmpl_dict(a), *msgs = tmpl_list(a);
    for (int i = 0; i < 8; i++) {
        tmpl_value *m = tmpl_dict(a);
        tmpl_dict_set(a, m, "role", 4, tmpl_str(a, i % 2 ? "assistant" : "user", i % 2 ? 9 : 4));
        tmpl_dict_set(a, m, "content", 7, tmpl_str(a, "  message  ", 11));
        tmpl_list_push(a, msgs, m);
    }
    tmpl_dict_set(a, ctx, "messages", 8, msgs);
    tmpl_dict_set(a, ctx, "bos_token", 9, tmpl_str(a, "<s>", 3));
    T_EQ_INT(tmpl_dict_set(a, ctx, "add_generation_prompt", 21, tmpl_bool(a, 1)), 0);
    char *want;
    size_t n;
    T_EQ_INT(tmpl_render(t, ctx, NULL, &want, &n, err, sizeof err), 0);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, ctx, want, 0};
        pthread_create(&th[i], NULL, thr_render, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad += args[i].bad; }
    T_EQ_INT(bad, 0);
    free(want);
    tmpl_arena_destroy(a);
    tmpl_free(t);
}

int main(void) {
    test_basics();
    test_whitespace();
    test_for();
    test_if_set_ns();
    test_macro_call();
    test_filters();
    test_tests_methods();
    test_subscripts();
    test_errors();
    test_limits();
    test_values_api();
    test_builtins();
    test_threads();
    return t_done();
}
