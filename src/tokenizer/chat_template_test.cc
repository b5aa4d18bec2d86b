// Tests of the chat template interpreter: real model templates rendered byte
// for byte as Python's jinja2 renders them (tests/data/chat_templates/
// expected.json, made by scripts/render_chat_templates.py), unit tests of
// each construct, and the error messages.
#include "src/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace loom::tok {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;
using ::testing::HasSubstr;

const std::string kData = std::string(LOOM_TESTDATA_DIR) + "/chat_templates";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------- real templates

TEST(ChatTemplateGoldenTest, MatchesJinja2ByteForByte) {
  const std::string text = ReadFile(kData + "/expected.json");
  ASSERT_FALSE(text.empty()) << "missing " << kData << "/expected.json";
  const OJson expected =
      OJson::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(expected.is_object());
  std::map<std::string, ChatTemplate> templates;
  int checked = 0;
  for (const auto& c : expected["cases"]) {
    const std::string file = c["template"].get<std::string>();
    const std::string name = file + " / " + c["name"].get<std::string>();
    if (!templates.count(file)) {
      auto t = ChatTemplate::Parse(ReadFile(kData + "/" + file));
      ASSERT_TRUE(t.ok()) << file << ": " << t.status().ToString();
      templates.emplace(file, *t);
    }
    auto out = templates.at(file).Render(c["context"]);
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << name;
      EXPECT_THAT(out.status().message(),
                  HasSubstr(c["error"].get<std::string>()))
          << name;
    } else {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status().ToString();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << name;
    }
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(ChatTemplateGoldenTest, LoadsFromModelDirectory) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_chat_tmpl_load";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "tool_use", "template": "TOOLS"},
      {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}
    ]})";
  auto t = LoadChatTemplate(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
  auto out = t->Render(OJson::parse(R"({"messages":[{"content":"hi"}]})"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "<s>hi</s>");
  // chat_template.jinja wins over tokenizer_config.json.
  std::ofstream(dir / "chat_template.jinja") << "J{{ eos_token }}\n";
  t = LoadChatTemplate(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t->Render(OJson::object()), "J</s>");
  // No template at all.
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  t = LoadChatTemplate(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  // A chat_template.jinja that cannot be read is an OS error, not an empty
  // template.
  fs::create_directory(dir / "chat_template.jinja");
  t = LoadChatTemplate(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kIoError);
  EXPECT_THAT(t.status().message(),
              testing::HasSubstr((dir / "chat_template.jinja").string() +
                                 ": read: " + std::strerror(EISDIR)));
}

TEST(ChatTemplateGoldenTest, LoadsSharedModelTokenizerConfigs) {
  // The models under ../shared (when present) load and render.
  const fs::path shared =
      fs::path(LOOM_TESTDATA_DIR).parent_path().parent_path().parent_path() /
      "shared" / "models" / "tokenizers";
  for (const char* m : {"llama3", "qwen3"}) {
    const fs::path dir = shared / m;
    if (!fs::exists(dir / "tokenizer_config.json")) continue;
    auto t = LoadChatTemplate(dir.string());
    ASSERT_TRUE(t.ok()) << m << ": " << t.status().ToString();
    EXPECT_EQ(t->source(), ReadFile(kData + "/" + m + ".jinja")) << m;
    auto out = t->Render(OJson::parse(
        R"({"messages":[{"role":"user","content":"hi"}],
            "add_generation_prompt":true})"));
    EXPECT_TRUE(out.ok()) << m << ": " << out.status().ToString();
  }
}

// ------------------------------------------------------ constructs

std::string R(std::string_view tmpl, const OJson& ctx = OJson::object()) {
  auto t = ChatTemplate::Parse(tmpl);
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  auto out = t->Render(ctx);
  if (!out.ok()) return "RENDER ERROR: " + out.status().message();
  return *out;
}

TEST(ChatTemplateTest, TextAndExpressions) {
  EXPECT_EQ(R("plain text"), "plain text");
  EXPECT_EQ(R("trailing newline dropped\n"), "trailing newline dropped");
  EXPECT_EQ(R("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}"),
            "7|9|3|-4");
  EXPECT_EQ(R("{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 2 ** 10 }}|{{ 1.5 }}"),
            "1|2|3.5|1024|1.5");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none }}|{{ 'x' * 3 }}|{{ \"q\\\"\\n\" }}"),
            "a1None|xxx|q\"\n");
  EXPECT_EQ(
      R("{{ true }} {{ False }} {{ none }} {{ [1, 'a'] }} {{ {'k': 1} }}"),
      "True False None [1, 'a'] {'k': 1}");
  EXPECT_EQ(R("{{ 1 < 2 and 2 <= 2 and 3 > 2 and not 1 == 2 }}"), "True");
  EXPECT_EQ(R("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' not in {'k': 1} }}"),
            "True True False");
  EXPECT_EQ(R("{{ 'y' if x else 'n' }}{{ 'z' if false }}", {{"x", 1}}), "y");
  EXPECT_EQ(R("{{ 0 or 'dflt' }} {{ 1 and 'both' }}"), "dflt both");
  EXPECT_EQ(R("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 3.0 }}"),
            "1e+20 0.30000000000000004 1e-05 3.0");
}

TEST(ChatTemplateTest, AttributesSubscriptsAndSlices) {
  const OJson ctx = OJson::parse(
      R"({"m": {"role": "user", "list": [1, 2, 3, 4]}, "s": "héllo"})");
  EXPECT_EQ(
      R("{{ m.role }} {{ m['role'] }} {{ m.list[-1] }} {{ m.list.0 }}", ctx),
      "user user 4 1");
  EXPECT_EQ(R("{{ m.list[1:] }} {{ m.list[::-1] }} {{ m.list[1:3] }} "
              "{{ m.list[::2] }} {{ s[1:3] }} {{ s[::-1] }}",
              ctx),
            "[2, 3, 4] [4, 3, 2, 1] [2, 3] [1, 3] él olléh");
  EXPECT_EQ(R("[{{ m.missing }}][{{ m.list[10] }}]", ctx), "[][]");
  EXPECT_EQ(R("{{ m.missing is defined }} {{ nothing is undefined }}", ctx),
            "False True");
}

TEST(ChatTemplateTest, IfElifElse) {
  const char* t =
      "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(R(t, {{"x", 1}}), "one");
  EXPECT_EQ(R(t, {{"x", 2}}), "two");
  EXPECT_EQ(R(t, {{"x", 3}}), "many");
}

TEST(ChatTemplateTest, ForLoops) {
  const OJson ctx =
      OJson::parse(R"({"xs": ["a", "b", "c"], "d": {"k": 1, "j": 2}})");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}"
              "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}"
              "{{ loop.length }};{% endfor %}",
              ctx),
            "10aF3;21b3;32cL3;");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", ctx),
            "k=1,j=2,");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}"
              "{% endfor %}",
              ctx),
            "a2c2");
  EXPECT_EQ(R("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}"
              "{{ x }}{% if x == 'a' %}{% break %}{% endif %}{% endfor %}",
              ctx),
            "a");
  EXPECT_EQ(R("{% for i in range(3) %}{{ i }}{% endfor %}"
              "{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}"),
            "012135");
  // A set inside a loop does not leak out; a namespace does.
  EXPECT_EQ(R("{% set n = 0 %}{% set ns = namespace(n=0) %}"
              "{% for x in xs %}{% set n = n + 1 %}{% set ns.n = ns.n + 1 %}"
              "{% endfor %}{{ n }} {{ ns.n }}",
              ctx),
            "0 3");
}

TEST(ChatTemplateTest, SetMacroRawComments) {
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(R("{% set x %}in{{ 1 }}{% endset %}[{{ x }}]"), "[in1]");
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}"
              "{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(R("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}"
              "{% endmacro %}{{ f(3) }}"),
            "321");
  EXPECT_EQ(R("{% raw %}{{ not evaluated }}{% endraw %}"),
            "{{ not evaluated }}");
  EXPECT_EQ(R("a{# comment #}b"), "ab");
}

TEST(ChatTemplateTest, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes.
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  // lstrip_blocks: indentation before a block tag goes.
  EXPECT_EQ(R("a\n    {% if true %}\n    b\n    {% endif %}\nc"),
            "a\n    b\nc");
  // Not before an expression.
  EXPECT_EQ(R("a\n  {{ 'b' }}\n"), "a\n  b");
  // `-` strips all whitespace, newlines included.
  EXPECT_EQ(R("a  \n  {%- if true -%}  \n  b  {{- ' c ' -}}  d{% endif %}"),
            "ab c d");
  // `+` disables lstrip_blocks.
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
}

TEST(ChatTemplateTest, Filters) {
  const OJson ctx = OJson::parse(
      R"({"s": "  Hello World  ", "xs": [3, 1, 3, 2],
          "users": [{"name": "a", "ok": true}, {"name": "b", "ok": false}],
          "obj": {"b": "é\"\n", "a": [1, 2.5, null, true]}})");
  EXPECT_EQ(R("[{{ s|trim }}] {{ s|trim|upper }} {{ s|trim|lower }} "
              "{{ 'hello there'|capitalize }} {{ 'hello there'|title }}",
              ctx),
            "[Hello World] HELLO WORLD hello world Hello there Hello There");
  EXPECT_EQ(R("{{ xs|length }} {{ s|count }} {{ xs|first }} {{ xs|last }} "
              "{{ xs|join(',') }} {{ xs|unique|list }} {{ 'ab'|list }}",
              ctx),
            "4 15 3 2 3,1,3,2 [3, 1, 2] ['a', 'b']");
  EXPECT_EQ(R("{{ missing|default('d') }} {{ ''|default('e', true) }} "
              "{{ none|d('n') }}",
              ctx),
            "d e None");
  EXPECT_EQ(R("{{ obj|tojson }}", ctx),
            "{\"b\": \"é\\\"\\n\", \"a\": [1, 2.5, null, true]}");
  EXPECT_EQ(R("{{ obj.a|tojson(indent=2) }}", ctx),
            "[\n  1,\n  2.5,\n  null,\n  true\n]");
  EXPECT_EQ(R("{{ users|map(attribute='name')|join('+') }} "
              "{{ users|selectattr('ok')|map(attribute='name')|list }} "
              "{{ users|rejectattr('ok')|map(attribute='name')|first }} "
              "{{ users|selectattr('name', 'equalto', 'b')|list|length }}",
              ctx),
            "a+b ['a'] b 1");
  EXPECT_EQ(R("{{ '42'|int + 1 }} {{ '2.5'|float }} {{ 3|string ~ 'x' }} "
              "{{ -3|abs }} {{ 2.567|round(2) }} {{ 'a-b'|replace('-', '+') }} "
              "{{ '<&>'|escape }} {{ 'x'|safe }}",
              ctx),
            "43 2.5 3x 3 2.57 a+b &lt;&amp;&gt; x");
  EXPECT_EQ(R("{% for k, v in obj|items %}{{ k }}{% endfor %}", ctx), "ba");
}

TEST(ChatTemplateTest, TestsAndMethods) {
  EXPECT_EQ(R("{{ 'a' is string }}{{ {} is mapping }}{{ [] is sequence }}"
              "{{ 1 is number }}{{ 1 is integer }}{{ true is boolean }}"
              "{{ none is none }}{{ true is true }}{{ false is false }}"
              "{{ 3 is odd }}{{ 4 is even }}{{ 'a' is iterable }}"
              "{{ 1 is not string }}{{ 6 is divisibleby 3 }}"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      R("{{ ' x '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a'.lstrip() }}"
        "|{{ 'a '.rstrip() }}|{{ 'a,b'.split(',') }}|{{ ' a  b '.split() }}"
        "|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}"
        "|{{ 'aBc'.upper() }}{{ 'aBc'.lower() }}|{{ 'a-a'.replace('a', 'b') }}"
        "|{{ 'ab cd'.title() }}"),
      "x|a|a|a|['a', 'b']|['a', 'b']|TrueTrue|ABCabc|b-b|Ab Cd");
  const OJson ctx = OJson::parse(R"({"d": {"k": 1}})");
  EXPECT_EQ(R("{{ d.get('k') }} {{ d.get('z', 5) }} {{ d.keys()|list }} "
              "{{ d.values()|list }}",
              ctx),
            "1 5 ['k'] [1]");
}

// Python/jinja2 details checked against jinja2 3.1.6.
TEST(ChatTemplateTest, PythonDetails) {
  EXPECT_EQ(R("{{ 2.5|round }} {{ -2.5|round }} {{ 2.675|round(2) }} "
              "{{ 7|round }} {{ 1.5|round(0, 'floor') }}"),
            "2.0 -2.0 2.67 7 1.0");
  EXPECT_EQ(R("{{ (1, 2) }}{{ () }}{{ (1,) }}{{ {'b': 1}|items|list }}"
              "{% set t = 1, 2 %}{{ t }}"),
            "(1, 2)()(1,)[('b', 1)](1, 2)");
  EXPECT_EQ(
      R("{{ '3.7'|int }}{{ 'x'|int }}{{ 3.9|int }}{{ \"it's\" ~ [\"it's\"] }}"),
      "303it's[\"it's\"]");
  EXPECT_EQ(R("{{ 1/3 }} {{ 10/5 }} {{ 123456789012345678.0 }} {{ 0.0001 }}"),
            "0.3333333333333333 2.0 1.2345678901234568e+17 0.0001");
  // trim_blocks does not apply after {% raw %}; lstrip does before endraw.
  EXPECT_EQ(R("{% raw %}\n  a\n  {% endraw %}\nz"), "\n  a\nz");
  EXPECT_EQ(R("line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n"),
            "line1\nline2\nx\n");
}

TEST(ChatTemplateTest, StrftimeNowIsFixedByContext) {
  const OJson ctx = OJson::parse(R"({"__loom_now_epoch": 1736937000})");
  EXPECT_EQ(
      R("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %b %Y') }}",
        ctx),
      "2025-01-15 10:30 15 Jan 2025");
}

TEST(ChatTemplateTest, PlainJsonContextWorks) {
  auto t = ChatTemplate::Parse("{{ messages[0]['content'] }}{{ bos_token }}");
  ASSERT_TRUE(t.ok());
  t->set_special_tokens("<s>", "</s>");
  auto out =
      t->Render(nlohmann::json::parse(R"({"messages":[{"content":"x"}]})"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "x<s>");
}

// ------------------------------------------------------------ errors

std::string ParseError(std::string_view tmpl) {
  auto t = ChatTemplate::Parse(tmpl);
  return t.ok() ? "OK" : t.status().message();
}

std::string RenderError(std::string_view tmpl,
                        const OJson& ctx = OJson::object()) {
  auto t = ChatTemplate::Parse(tmpl);
  if (!t.ok()) return "PARSE: " + t.status().message();
  auto out = t->Render(ctx);
  return out.ok() ? "OK" : out.status().message();
}

TEST(ChatTemplateErrorTest, UnsupportedConstructsNamedWithPosition) {
  EXPECT_EQ(ParseError("ab\n  {% include 'x' %}"),
            "chat template 2:3: unsupported tag 'include'");
  EXPECT_EQ(ParseError("{% frobnicate %}"),
            "chat template 1:1: unknown tag 'frobnicate'");
  EXPECT_EQ(RenderError("x\n{{ 'a'|shuffle }}"),
            "chat template 2:8: unsupported filter 'shuffle'");
  EXPECT_EQ(RenderError("{{ 1 is prime }}"),
            "chat template 1:9: unsupported test 'prime'");
  EXPECT_EQ(RenderError("{{ 'a'.zfill(3) }}"),
            "chat template 1:8: unsupported string method 'zfill'");
  EXPECT_EQ(ParseError("{% for x in xs recursive %}{% endfor %}"),
            "chat template 1:16: unsupported: recursive for loops");
}

TEST(ChatTemplateErrorTest, RaiseExceptionMessageReturned) {
  const std::string msg = RenderError(
      "{% if messages|length == 0 %}{{ raise_exception('No messages!') }}"
      "{% endif %}",
      OJson::parse(R"({"messages": []})"));
  EXPECT_THAT(msg, HasSubstr("No messages!"));
  EXPECT_THAT(msg, HasSubstr("1:33"));
}

TEST(ChatTemplateErrorTest, MalformedTemplatesAreErrorsNotCrashes) {
  EXPECT_THAT(ParseError("{% if x %}never closed"),
              HasSubstr("missing {% endif %}"));
  EXPECT_THAT(ParseError("{{ unterminated"), HasSubstr("unterminated '{{'"));
  EXPECT_THAT(ParseError("{# open comment"), HasSubstr("unterminated comment"));
  EXPECT_THAT(ParseError("{{ 'abc }}"), HasSubstr("unterminated string"));
  EXPECT_THAT(ParseError("{% endfor %}"), HasSubstr("unexpected 'endfor'"));
  EXPECT_THAT(ParseError("{{ 1 + }}"), HasSubstr("expected an expression"));
  EXPECT_THAT(ParseError("{{ a b }}"), HasSubstr("unexpected 'b'"));
  EXPECT_THAT(ParseError("{% break %}"), HasSubstr("outside a for loop"));
  EXPECT_THAT(ParseError("{{ x[1:2:3:4] }}"), HasSubstr("too many ':'"));
  EXPECT_THAT(ParseError("{{ @ }}"), HasSubstr("unexpected character '@'"));
  EXPECT_THAT(ParseError("{% raw %}abc"), HasSubstr("missing {% endraw %}"));
  // Every prefix of a real template parses or fails cleanly.
  const std::string src = ReadFile(kData + "/qwen3.jinja");
  for (size_t n = 0; n < src.size(); n += 7) {
    auto t = ChatTemplate::Parse(src.substr(0, n));
    if (t.ok()) {
      (void)t->Render(
          OJson::parse(R"({"messages":[{"role":"user","content":"x"}]})"));
    }
  }
}

TEST(ChatTemplateErrorTest, UndefinedAndTypeErrors) {
  EXPECT_EQ(RenderError("{{ a.b.c }}", OJson::parse(R"({"a": {}})")),
            "chat template 1:8: 'b' is undefined (reading attribute 'c')");
  EXPECT_THAT(RenderError("{{ 'a' + 1 }}"),
              HasSubstr("unsupported operand types for +: 'str' and 'int'"));
  EXPECT_THAT(RenderError("{{ 'a' + nope }}"),
              HasSubstr("'nope' is undefined"));
  EXPECT_THAT(RenderError("{{ 1 // 0 }}"), HasSubstr("division by zero"));
  EXPECT_THAT(RenderError("{% set x = 1 %}{% set x.a = 2 %}"),
              HasSubstr("non-namespace"));
  EXPECT_THAT(RenderError("{{ 1 }}", OJson::array()),
              HasSubstr("context must be an object"));
}

TEST(ChatTemplateErrorTest, DepthAndLoopLimits) {
  std::string deep =
      "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THAT(ParseError(deep), HasSubstr("nested too deeply"));
  std::string nots = "{{ ";
  for (int k = 0; k < 5000; ++k) nots += "not ";
  nots += "1 }}";
  EXPECT_THAT(ParseError(nots), HasSubstr("nested too deeply"));
  std::string ifs;
  for (int k = 0; k < 5000; ++k) ifs += "{% if 1 %}";
  EXPECT_THAT(ParseError(ifs), HasSubstr("nested too deeply"));
  EXPECT_THAT(RenderError("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
              HasSubstr("recursion too deep"));
  EXPECT_THAT(RenderError("{% for i in range(1000) %}{% for j in range(1000) %}"
                          "{% for k in range(2) %}{% endfor %}{% endfor %}"
                          "{% endfor %}"),
              HasSubstr("loop iterations"));
  EXPECT_THAT(RenderError("{{ range(10000000) }}"), HasSubstr("too large"));
  EXPECT_THAT(RenderError("{% set x = [] %}{% set ns = namespace(x=[]) %}"
                          "{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                          "{% endfor %}{{ ns.x }}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(RenderError("{% set ns = namespace() %}{% set ns.me = ns %}"
                          "{{ ns }}"),
              HasSubstr("contains itself"));
  std::string deep_json;
  for (int k = 0; k < 1000; ++k) deep_json += "[";
  for (int k = 0; k < 1000; ++k) deep_json += "]";
  EXPECT_THAT(
      RenderError("{{ x }}", OJson::parse("{\"x\": " + deep_json + "}")),
      HasSubstr("nested too deeply"));
}

}  // namespace
}  // namespace loom::tok
