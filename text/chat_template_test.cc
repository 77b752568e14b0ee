// text/chat_template_test.cc: the gemma3 formatter on hand-checked conversations, and what it
// refuses. Byte parity with jinja2 over many conversations is chat_template_parity_test.cc.
#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "text/utf8.h"

namespace twinstep::text {
namespace {

using json = nlohmann::json;

ChatTemplate gemma3() {
  auto t = ChatTemplate::create(kGemma3ChatTemplate, "<bos>");
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

TEST(ChatTemplate, Gemma3SystemFoldsIntoTheFirstUserTurn) {
  const json messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Hi  "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}
  ])");
  const auto out = gemma3().render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n<start_of_image>What is this?<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(gemma3().family(), "gemma3");
}

TEST(ChatTemplate, TrimIsPythonStrip) {
  const auto out = gemma3().render(
      json::parse(R"([{"role": "user", "content": "\u3000\u00a0x\u200b\u2028"}])"), false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<bos><start_of_turn>user\nx\u200b<end_of_turn>\n");  // U+200B stays
}

TEST(ChatTemplate, StructMessagesRenderLikeJson) {
  std::vector<ChatMessage> messages = {{"user", "a", {}}, {"assistant", "", {}}};
  messages.push_back({"user", "", {{"text", " b "}, {"image", ""}}});
  const auto out = gemma3().render(messages, false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<bos><start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\n<end_of_turn>\n"
            "<start_of_turn>user\nb<start_of_image><end_of_turn>\n");
}

TEST(ChatTemplate, TemplateErrorsAreTyped) {
  const auto code = [](const char* messages) {
    const auto out = gemma3().render(json::parse(messages), true);
    EXPECT_FALSE(out.ok()) << messages;
    return out.ok() ? std::string("ok") : chat_error_name(out.error().code);
  };
  EXPECT_EQ(code(R"([{"role": "assistant", "content": "x"}])"), "raised");
  EXPECT_EQ(code(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
            "raised");
  EXPECT_EQ(code(R"([{"role": "user", "content": null}])"), "raised");
  EXPECT_EQ(code(R"([])"), "undefined");
  EXPECT_EQ(code(R"([{"role": "system", "content": []}])"), "undefined");
  EXPECT_EQ(code(R"([{"role": "system", "content": [{"text": 5}]}])"), "type");
  EXPECT_EQ(code(R"([{"role": "user", "content": "a"}, {"role": 7, "content": "b"}])"), "type");
  EXPECT_EQ(code(R"({"role": "user"})"), "invalid_messages");
  EXPECT_EQ(code(R"(["user: hi"])"), "invalid_messages");
  EXPECT_EQ(code(R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])"),
            "invalid_messages");
  const auto raised = gemma3().render(json::parse(R"([{"role": "assistant"}])"), false);
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.error().message,
            "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplate, RefusesTemplatesItDoesNotRecognise) {
  std::string edited(kGemma3ChatTemplate);
  edited.back() = ' ';
  const auto t = ChatTemplate::create(edited, "<bos>");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ChatErrorCode::kUnsupportedTemplate);
  EXPECT_NE(t.error().message.find("not recognised"), std::string::npos);
  const auto list = ChatTemplate::from_config(
      json{{"chat_template", json::array({{{"name", "default"}, {"template", "x"}}})},
           {"bos_token", "<bos>"}});
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.error().code, ChatErrorCode::kUnsupportedTemplate);
  const auto no_bos = ChatTemplate::from_config(json{{"chat_template", kGemma3ChatTemplate}});
  ASSERT_FALSE(no_bos.ok());
  EXPECT_EQ(no_bos.error().code, ChatErrorCode::kBadConfig);
  const auto old_bos = ChatTemplate::from_config(
      json{{"chat_template", kGemma3ChatTemplate}, {"bos_token", {{"content", "<s>"}}}});
  ASSERT_TRUE(old_bos.ok());
  EXPECT_EQ(*old_bos->render(json::parse(R"([{"role": "user", "content": "x"}])"), false),
            "<s><start_of_turn>user\nx<end_of_turn>\n");
  EXPECT_EQ(ChatTemplate::from_config_file("/nonexistent.json").error().code, ChatErrorCode::kIo);
}

// Any JSON shaped roughly like messages renders or comes back as a typed error: never a crash,
// and output is valid UTF-8 that starts with <bos>.
RC_GTEST_PROP(ChatTemplate, AnyMessagesRenderOrFailTyped, ()) {
  static const ChatTemplate t = gemma3();
  const auto scalar = rc::gen::element<json>(nullptr, true, 7, 2.5, "", " x ", "user", "assistant",
                                             "system", "image", "text", "\u3000y\u2028");
  const auto part = rc::gen::map(rc::gen::pair(scalar, scalar), [](const auto& p) {
    return json{{"type", p.first}, {"text", p.second}};
  });
  const auto content =
      rc::gen::oneOf(scalar, rc::gen::map(rc::gen::container<std::vector<json>>(part),
                                          [](const std::vector<json>& v) { return json(v); }));
  const auto message = rc::gen::map(rc::gen::pair(scalar, content), [](const auto& p) {
    return json{{"role", p.first}, {"content", p.second}};
  });
  const json messages = *rc::gen::map(rc::gen::container<std::vector<json>>(message),
                                      [](const std::vector<json>& v) { return json(v); });
  const auto out = t.render(messages, *rc::gen::arbitrary<bool>());
  if (out.ok()) {
    RC_ASSERT(out->rfind("<bos>", 0) == 0);
    RC_ASSERT(utf8_valid(*out));
  } else {
    RC_ASSERT(!out.error().message.empty());
  }
}

}  // namespace
}  // namespace twinstep::text
