// The Jinja interpreter against jinja2: every expected text below is what jinja2 3.1.6 renders for the same
// template and context in transformers' environment (trim_blocks, lstrip_blocks, loopcontrols, its tojson), so
// whitespace control, scoping, loop variables, macros, Python printing and the filters are checked against the
// real thing; then the errors, which must name the template line, and the constructs it refuses.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "data/jinja.h"

namespace df::jinja {
namespace {

using json = nlohmann::ordered_json;

struct Case {
  const char* source;
  const char* context;
  const char* want;
};

std::string render(const std::string& source, const std::string& context = "{}") {
  return Template(source, "t.jinja").render(json::parse(context));
}

std::string error_of(const std::string& source, const std::string& context = "{}") {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Jinja, RendersAsJinja2InTransformersEnvironment) {
  const Case cases[] = {
      {"a\n  {% if x %}\n    yes\n  {% endif %}\nb\n",
       "{}",
       "a\nb"},
      {"a\n  {%- if true %}\n    yes\n  {%- endif %}\nb {{ 1 }}  {% if true %}X{% endif %}\n  {{ 'v' }}\n{# c #}\n  {#- c2 -#}  z\n",
       "{}",
       "a    yesb 1  X  v\nz"},
      {"{%+ if true %}k{% endif +%}\nq",
       "{}",
       "k\nq"},
      {"{% for m in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
       "{\"xs\": [\"a\", \"b\", \"c\"]}",
       "1/0/3/True/False/3//b;2/1/2/False/False/3/a/c;3/2/1/False/True/3/b/;"},
      {"{% for x in xs if x != 2 %}{% if x == 4 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% else %}none{% endfor %}|{% for y in [] %}{{ y }}{% else %}empty{% endfor %}",
       "{\"xs\": [1, 2, 3, 4, 5]}",
       "3|empty"},
      {"{% set ns = namespace(n=0, s='') %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set inner = x %}{% endfor %}{{ ns.n }} {{ inner is defined }}",
       "{\"xs\": [1, 2, 3]}",
       "6 False"},
      {"{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='q') }}{{ m(b=5) }}|{{ m(1)|trim }}",
       "{}",
       "[12z][13z][12q][5z]|[12z]"},
      {"{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-05 }} {{ 0.0001 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ none }} {{ true }} {{ [1, 'a', none, true, 1.5] }} {{ {'k': \"it's\", 'e': []} }}",
       "{}",
       "1.0 0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001 1.5 3 -4 2 1024 None True [1, 'a', None, True, 1.5] {'k': \"it's\", 'e': []}"},
      {"{{ d | tojson }}",
       "{\"d\": {\"b\": [1, 2.5, null, true], \"a\": \"é \\\"q\\\" \\\\ \\n \\t \\u0001 😀\", \"f\": 1e-07, \"g\": 100.0}}",
       "{\"b\": [1, 2.5, null, true], \"a\": \"é \\\"q\\\" \\\\ \\n \\t \\u0001 😀\", \"f\": 1e-07, \"g\": 100.0}"},
      {"{{ '  x\t\n'|trim }}|{{ s.strip('\\n') }}|{{ s.lstrip() }}|{{ s.rstrip('\\n ') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'x</think>y'.split('</think>')[-1] }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'aXbX'.replace('X', '-') }}|{{ '-'.join(['a', 'b']) }}",
       "{\"s\": \"\\n a \\n\"}",
       "x| a |a \n|\n a|['a', 'b', '', 'c']|['a', 'b']|y|TrueTrue|HIhi|a-b-|a-b"},
      {"{{ xs|length }} {{ 'héllo'|length }} {{ d|length }} {{ u|length }} {{ xs[::-1] }} {{ xs[1:] }} {{ xs[-1] }} {{ 'héllo'[1] }} {{ 'héllo'[::-1] }} {{ xs|first }} {{ xs|last }} {{ xs|join(',') }} {{ d|items|list }} {{ u|default('dflt') }} {{ ''|default('e', true) }}",
       "{\"xs\": [1, 2, 3], \"d\": {\"z\": 1, \"a\": 2}}",
       "3 5 2 0 [3, 2, 1] [2, 3] 3 é olléh 1 3 1,2,3 [('z', 1), ('a', 2)] dflt e"},
      {"{{ x is string }}{{ x is mapping }}{{ d is mapping }}{{ xs is iterable }}{{ n is iterable }}{{ u is iterable }}{{ xs is sequence }}{{ x is not string }}{{ n is none }}{{ u is undefined }}{{ u is defined }}{{ 1 is number }}{{ true is boolean }}{{ true is true }}{{ 1 is true }}{{ 3 is odd }}{{ 4 is even }}{{ 1.5 is float }}{{ 1 is integer }}",
       "{\"x\": \"s\", \"xs\": [1], \"d\": {\"a\": 1}, \"n\": null}",
       "TrueFalseTrueTrueFalseTrueTrueFalseTrueTrueFalseTrueTrueTrueFalseTrueTrueTrueTrue"},
      {"{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ u == u }}{{ n == none }}",
       "{\"d\": {\"k\": 1}, \"n\": null}",
       "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"},
      {"{{ 'a' ~ 1 ~ none ~ u }}|{{ x if x else 'no' }}|{{ 'yes' if false }}|{{ not u and 1 }}|{{ 0 or 'b' }}|{{ -x2 }}|{{ (1, 2) }}",
       "{\"x\": \"\", \"x2\": 3}",
       "a1None|no||1|b|-3|(1, 2)"},
      {"{{ m.content }}|{{ m['role'] }}|{{ m.missing }}|{{ m.get('role') }}{{ m.get('zz', 'dd') }}|{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}|{{ m.keys()|list }}|{{ n.x }}|{{ xs.0 }}",
       "{\"m\": {\"role\": \"user\", \"content\": \"hi\"}, \"n\": null, \"xs\": [7]}",
       "hi|user||userdd|role=user;content=hi;|['role', 'content']||7"},
      {"{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set blk %}in {{ a }}{% endset %}[{{ blk }}]{{ range(3)|list }}{{ range(1, 7, 2)|list }}",
       "{}",
       "12[in 1][0, 1, 2][1, 3, 5]"},
      {"{{ '\\u00e9\\x41\\t\\'q\\'' }}{{ \"d\\\"q\" }}{{ 'a' 'b' }}",
       "{}",
       "éA\t'q'd\"qab"},
      {"{{ 5 | string }}{{ true | string }}{{ none|string }}{{ 2.50 | string }}{{ [1]|string }}|{{ 'x'|safe }}|{{ 3|int + '4'|int }}|{{ '2.5'|float }}|{{ ['b', 'a']|reverse|list }}",
       "{}",
       "5TrueNone2.5[1]|x|7|2.5|['a', 'b']"},
  };
  for (const Case& c : cases) EXPECT_EQ(render(c.source, c.context), c.want) << "template: " << c.source;
}

TEST(Jinja, ErrorsNameTheTemplateLine) {
  // raise_exception keeps the template's message; Python's TypeError and UndefinedError become errors too.
  std::string e = error_of("a\n{% if true %}\n{{ raise_exception('bad ' ~ 1) }}{% endif %}");
  EXPECT_NE(e.find("t.jinja line 3: "), std::string::npos) << e;
  EXPECT_NE(e.find("raise_exception: bad 1"), std::string::npos) << e;
  e = error_of("line1\n{{ u.x }}");
  EXPECT_NE(e.find("t.jinja line 2: "), std::string::npos) << e;
  EXPECT_NE(e.find("'u' is undefined"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str (not \"int\") to str"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' + n }}", R"({"n": null})").find("(not \"NoneType\")"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' in n }}", R"({"n": null})").find("argument of type 'NoneType' is not iterable"),
            std::string::npos);
  EXPECT_NE(error_of("{{ s|items }}", R"({"s": "x"})").find("Can only get item pairs from a mapping"),
            std::string::npos);
  EXPECT_NE(error_of("{{ xs.startswith('a') }}", R"({"xs": []})").find("'list' object has no method 'startswith'"),
            std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("not a namespace()"), std::string::npos);
  EXPECT_NE(error_of("{{ nope(1) }}").find("'nope' is undefined"), std::string::npos);
}

TEST(Jinja, BoundsStopHostileTemplates) {
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-1) ** 7 }} {{ 9 // -2 }}"), "4611686018427387904 -1 -5");
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100000000000)|length }}").find("range() of more than"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("a string repeated to more than"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("calls nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}")
                .find("steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("nested deeper"),
            std::string::npos);
  std::string deep;
  for (int k = 0; k < 200; ++k) deep += "{% if true %}";
  EXPECT_NE(error_of(deep).find("blocks nested deeper than 100"), std::string::npos);
}

TEST(Jinja, KnowsWhichVariablesItReads) {
  const Template t(
      "{%- macro m(x, d=depth) %}{{ x ~ d }}{% endmacro %}"
      "{%- for i in items if i != skip %}{%- set ns.n = i %}{% endfor %}"
      "{%- if flag is defined and flag is true %}{{ m(a.b[key] | default(fallback)) }}{% else %}{{ other "
      "}}{% endif %}"
      "{%- set s %}{{ in_set_block }}{% endset %}",
      "t.jinja");
  for (const char* n :
       {"depth", "items", "skip", "ns", "flag", "a", "key", "fallback", "other", "in_set_block", "m"})
    EXPECT_TRUE(t.reads(n)) << n;
  for (const char* n : {"b", "i2", "preserve_thinking", "true", "defined", "default"})
    EXPECT_FALSE(t.reads(n)) << n;
}

TEST(Jinja, RefusesWhatItDoesNotImplementWhenRead) {
  auto refusal = [](const std::string& source) {
    try {
      Template t(source, "model.jinja");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string e = refusal("ok\n\n{% include 'other.jinja' %}");
  EXPECT_NE(e.find("model.jinja line 3: the '{% include %}' tag is not supported"), std::string::npos) << e;
  e = refusal("{{ xs|selectattr('a') }}");
  EXPECT_NE(e.find("model.jinja line 1: the filter 'selectattr' is not supported"), std::string::npos) << e;
  EXPECT_NE(refusal("{% if x is sameas y %}{% endif %}").find("the test 'sameas' is not supported"), std::string::npos);
  EXPECT_NE(refusal("{% for x in y recursive %}{% endfor %}").find("recursive for loops"), std::string::npos);
  EXPECT_NE(refusal("{% if x %}open").find("ends inside a block; expected one of: {% elif %}"), std::string::npos);
  EXPECT_NE(refusal("a {{ x ").find("line 1: '{{' is never closed with '}}'"), std::string::npos);
  EXPECT_NE(refusal("{{ a < b < c }}").find("chained comparisons"), std::string::npos);
  EXPECT_NE(error_of("{{ x|tojson(indent=2) }}", R"({"x": 1})").find("arguments (indent, separators, ...)"),
            std::string::npos);
}

}  // namespace
}  // namespace df::jinja
