// The Jinja renderer's own behaviour: statements, the loop object, filters and tests the chat
// templates call, whitespace control, errors with positions, and render limits. Expected
// outputs are @huggingface/jinja's (tests/chat/ compares whole model templates against it).

#include <string>

#include "core/chat/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace estuary::chat {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(std::string_view source, nlohmann::ordered_json variables = {},
                                   RenderLimits limits = RenderLimits()) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  ChatRenderInput input;
  input.add_generation_prompt = false;
  if (variables.is_object()) {
    if (variables.contains("messages")) input.messages = variables["messages"];
    input.variables = std::move(variables);
  }
  return t->Render(input, limits);
}

std::string Ok(std::string_view source, nlohmann::ordered_json variables = {}) {
  absl::StatusOr<std::string> out = Render(source, std::move(variables));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "<error>";
}

std::string Error(std::string_view source, nlohmann::ordered_json variables = {},
                  RenderLimits limits = RenderLimits()) {
  absl::StatusOr<std::string> out = Render(source, std::move(variables), limits);
  EXPECT_FALSE(out.ok()) << "rendered: " << *out;
  if (out.ok()) return "<no error>";
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

TEST(JinjaTest, TextAndExpressions) {
  EXPECT_EQ(Ok("hello"), "hello");
  EXPECT_EQ(Ok("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}"),
            "7|3|-4|1|1024");
  EXPECT_EQ(Ok("{{ 1 / 2 }}|{{ 4 / 2 }}|{{ 1.5 + 1 }}"), "0.5|2.0|2.5");
  EXPECT_EQ(Ok("{{ 'a' + 'b' ~ 1 }}|{{ 'x' * 1 if false else 'y' }}"), "ab1|y");
  EXPECT_EQ(Ok("{{ true }}|{{ none }}|{{ undefined_name }}|{{ [1, 'a'] }}|{{ {'k': 2} }}"),
            "true|||[1, \"a\"]|{\"k\": 2}");
  EXPECT_EQ(Ok("{{ 'ab' in 'cabd' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [3] }}"),
            "truetruetruefalse");
  EXPECT_EQ(Ok("{{ not 0 and 'x' or 'y' }}|{{ 0 or '' }}|{{ 1 == 1.0 }}|{{ 'a' != 'a' }}"),
            "x||true|false");
}

TEST(JinjaTest, MembersIndexesAndSlices) {
  nlohmann::ordered_json v = {{"m", {{"role", "user"}, {"list", {1, 2, 3, 4}}}}, {"s", "héllo"}};
  EXPECT_EQ(Ok("{{ m.role }}{{ m['role'] }}{{ m.list[-1] }}{{ m.list[1:3] }}{{ m.list[::-1] }}", v),
            "useruser4[2, 3][4, 3, 2, 1]");
  EXPECT_EQ(Ok("{{ s[1] }}|{{ s[1:] }}|{{ s|length }}|{{ m.missing is defined }}", v),
            "é|éllo|5|false");
  EXPECT_EQ(
      Ok("{{ s.upper() }}|{{ ' x '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'ab'.startswith('a') }}",
         v),
      "HéLLO|x|[\"a\", \"b\"]|true");
  EXPECT_EQ(Ok("{{ m.get('role') }}|{{ m.get('nope', 'd') }}|{% for k, v in {'a': 1}.items() %}"
               "{{ k }}={{ v }}{% endfor %}",
               v),
            "user|d|a=1");
}

TEST(JinjaTest, IfElifElse) {
  const std::string t =
      "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three"
      "{% else %}many{% endif %},{% endfor %}";
  EXPECT_EQ(Ok(t), "one,two,three,many,");
}

TEST(JinjaTest, LoopObject) {
  EXPECT_EQ(Ok("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
               "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}"
               "{{ loop.nextitem }};{% endfor %}"),
            "103truefalse3b;212falsefalse3ac;321falsetrue3b;");
  EXPECT_EQ(Ok("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Ok("{% for x in range(10) if x is odd %}{{ x }}{% endfor %}"), "13579");
  EXPECT_EQ(Ok("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "012");
  EXPECT_EQ(Ok("{% for x in range(5) %}{% if x is even %}{% continue %}{% endif %}{{ x }}"
               "{% endfor %}"),
            "13");
  EXPECT_EQ(Ok("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
  // Nested loops each have their own `loop`.
  EXPECT_EQ(Ok("{% for i in [1, 2] %}{% for j in [1, 2] %}{{ loop.index }}{% endfor %}"
               "{{ loop.index }}{% endfor %}"),
            "121122");
}

TEST(JinjaTest, SetScopingAndNamespaces) {
  // As in Jinja, `set` in a loop does not leak; a namespace carries state out.
  EXPECT_EQ(Ok("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Ok("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Ok("{% set block %}x{{ 1 }}y{% endset %}[{{ block }}]"), "[x1y]");
  EXPECT_THAT(Error("{% set d = {} %}{% set d.x = 1 %}"), HasSubstr("only of a namespace"));
}

TEST(JinjaTest, FiltersTheTemplatesUse) {
  nlohmann::ordered_json v = {
      {"messages",
       {{{"role", "system"}, {"content", "  sys  "}},
        {{"role", "user"}, {"content", "hi"}},
        {{"role", "user"}, {"content", "again"}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"n", 1.5}}}}}}};
  EXPECT_EQ(Ok("[{{ messages[0].content | trim }}]", v), "[sys]");
  EXPECT_EQ(
      Ok("{{ messages | length }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'a b' | title }}", v),
      "3|ABC|abc|A B");
  EXPECT_EQ(Ok("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') "
               "| join(', ') }}",
               v),
            "hi, again");
  EXPECT_EQ(Ok("{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}", v), "1");
  EXPECT_EQ(Ok("{{ tools[0] | tojson }}", v),
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 1.5}}");
  EXPECT_EQ(Ok("{{ tools[0].function | tojson(indent=2) }}", v),
            "{\n  \"name\": \"f\",\n  \"n\": 1.5\n}");
  EXPECT_EQ(Ok("{{ 'é\"' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}"),
            "\"é\\\"\"|\"\\u00e9\"");
  EXPECT_EQ(
      Ok("{{ missing | default('d') }}|{{ '' | default('d', true) }}|{{ 'x' | default('d') }}"),
      "d|d|x");
  EXPECT_EQ(Ok("{% for k, v in {'b': 1, 'a': 2} | items %}{{ k }}{{ v }}{% endfor %}"), "b1a2");
  EXPECT_EQ(
      Ok("{{ [3, 1, 2] | sort }}|{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ [1, 1, 2] | unique }}"),
      "[1, 2, 3]|12|[1, 2]");
  EXPECT_EQ(Ok("{{ '42' | int + 1 }}|{{ 2 | string }}|{{ -3 | abs }}|{{ 'a\nb' | indent(2) }}"),
            "43|2|3|a\n  b");
  // Not in @huggingface/jinja either (Llama 3.1's builtin_tools branch needs it).
  EXPECT_THAT(Error("{{ ['x'] | reject('equalto', 'x') }}"), HasSubstr("unknown filter 'reject'"));
  EXPECT_THAT(Error("{{ 1 | nosuchfilter }}"), HasSubstr("unknown filter 'nosuchfilter'"));
}

TEST(JinjaTest, Tests) {
  EXPECT_EQ(Ok("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ [1] is iterable }}"
               "{{ {} is mapping }}{{ 1 is number }}{{ 3 is odd }}{{ x is not defined }}"),
            "falsetruetruetruetruetruetruetrue");
}

TEST(JinjaTest, WhitespaceControl) {
  // {%- and -%} strip around tags; trim_blocks drops the newline after a block tag; lstrip_blocks
  // drops indentation before one; a single trailing newline of the template is dropped.
  EXPECT_EQ(Ok("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Ok("{% if true %}\nx\n{% endif %}\ny\n"), "x\ny");
  EXPECT_EQ(Ok("<\n    {% if true %}\n    x\n    {% endif %}\n>"), "<\n    x\n>");
  EXPECT_EQ(Ok("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(Ok("a {#- comment -#} b"), "ab");
  EXPECT_EQ(Ok("{{ 'x' }}\n"), "x");
}

TEST(JinjaTest, RaiseExceptionPassesTheMessageThrough) {
  absl::StatusOr<std::string> out = Render("{{ raise_exception('Roles must alternate!') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate!");
  EXPECT_TRUE(IsRaisedByTemplate(out.status()));
  // Other render errors are the template's fault and say where.
  absl::StatusOr<std::string> bad = Render("x\n  {{ none + 1 }}");
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(IsRaisedByTemplate(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("chat template: line 2, column"));
}

TEST(JinjaTest, MalformedTemplatesNameTheirPosition) {
  EXPECT_THAT(Error("ab\n{% if x %}never closed"),
              HasSubstr("line 2, column 4: unterminated '{% if"));
  EXPECT_THAT(Error("{{ 'unterminated }}"), HasSubstr("line 1, column 4: unterminated string"));
  EXPECT_THAT(Error("line one\n  {{ 1 + }}"), HasSubstr("line 2, column"));
  EXPECT_THAT(Error("{% macro m() %}{% endmacro %}"), HasSubstr("unsupported construct '{% macro"));
  EXPECT_THAT(Error("{% endfor %}"), HasSubstr("line 1, column 4"));
  EXPECT_THAT(Error("{{ x ? }}"), HasSubstr("unexpected character '?'"));
  EXPECT_THAT(Error("{% for x in y %}{% break %}{% endfor %}{% break %}"),
              HasSubstr("'break' outside a for loop"));
  std::string deep(2000, '(');
  EXPECT_THAT(Error("{{ " + deep + " }}"), HasSubstr("nesting deeper than"));
}

TEST(JinjaTest, LimitsStopHostileTemplates) {
  RenderLimits limits;
  limits.max_steps = 100000;
  limits.max_output_bytes = 1 << 16;
  // An endless amount of work fails instead of hanging.
  EXPECT_THAT(Error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}",
                    {}, limits),
              HasSubstr("evaluation steps"));
  // Output and intermediate strings are bounded.
  EXPECT_THAT(Error("{% for i in range(1000) %}{{ "
                    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                    "xxxxxxxx' }}{% endfor %}",
                    {}, limits),
              HasSubstr("template output exceeds"));
  EXPECT_THAT(Error("{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                    "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                    {}, limits),
              HasSubstr("exceeds"));
  // A list that doubles itself would be 2^64 entries in JSON; it is refused, not built.
  EXPECT_THAT(Error("{% set ns = namespace(a=[1]) %}{% for i in range(64) %}"
                    "{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | tojson }}",
                    {}, limits),
              HasSubstr("exceeds"));
  EXPECT_THAT(Error("{{ range(100000000) | length }}", {}, limits), HasSubstr("longer than"));
  // A namespace that holds itself neither recurses forever nor leaks.
  EXPECT_THAT(Error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", {}, limits),
              HasSubstr("nests deeper"));
}

TEST(JinjaTest, StrftimeNowUsesTheGivenClock) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  RenderLimits limits;
  limits.now_epoch_seconds = 1721952000;  // 2024-07-26 00:00 UTC
  absl::StatusOr<std::string> out = t->Render(ChatRenderInput(), limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "26 Jul 2024");
}

TEST(JinjaTest, ContentPartsAreJoined) {
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Parse("{% for m in messages %}[{{ m.content }}]{% endfor %}");
  ASSERT_TRUE(t.ok());
  ChatRenderInput input;
  input.messages = nlohmann::ordered_json::parse(
      R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}])");
  absl::StatusOr<std::string> out = t->Render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "[a\nb]");
  input.messages =
      nlohmann::ordered_json::parse(R"([{"role":"user","content":[{"type":"image_url"}]}])");
  out = t->Render(input);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("messages[0].content[0]"));
}

}  // namespace
}  // namespace estuary::chat
