// ApplyChatTemplate: expected strings are jinja2 renderings (trim_blocks, lstrip_blocks, as
// transformers does) of the real templates: SmolLM2-135M-Instruct's (from its GGUF), Meta
// Llama 3 Instruct, Llama 2 chat, Mistral 7B Instruct v0.1 and TinyLlama/Zephyr.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"

namespace thetaserve::model {
namespace {

constexpr char kSmolTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

constexpr char kLlama2Template[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% "
    "set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == "
    "0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() "
    "+ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";

constexpr char kMistralTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

constexpr char kZephyrTemplate[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
    "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' "
    "%}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if "
    "loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

// A vocabulary of just the given special pieces; bos/eos by position.
std::unique_ptr<Tokenizer> WithTemplate(std::vector<std::string> specials, int bos, int eos,
                                        std::string chat_template) {
  TokenizerSpec spec;
  for (std::string& s : specials) {
    AddedTokenSpec t;
    t.id = static_cast<int32_t>(spec.pieces.size());
    t.content = s;
    spec.added_tokens.push_back(t);
    spec.pieces.push_back(std::move(s));
  }
  spec.bos_id = bos;
  spec.eos_id = eos;
  spec.chat_template = std::move(chat_template);
  auto tok = BuildTokenizer(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::move(*tok);
}

const std::vector<ChatMessage> kOneTurn = {{"user", "Hi there"}};
const std::vector<ChatMessage> kWithSystem = {{"system", "Be brief."},
                                              {"user", " Hi there "},
                                              {"assistant", "Hello!"},
                                              {"user", "Thanks"}};

std::string Render(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool gen = true) {
  absl::StatusOr<std::string> s = tok.ApplyChatTemplate(msgs, gen);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

TEST(ChatTemplateTest, SmolLm2AddsItsDefaultSystemMessage) {
  auto tok = WithTemplate({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 1, 2, kSmolTemplate);
  EXPECT_EQ(Render(*tok, kOneTurn),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(*tok, kOneTurn, false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n");
  EXPECT_EQ(Render(*tok, kWithSystem),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there "
            "<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nThanks"
            "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{2}));
}

TEST(ChatTemplateTest, ChatMlWithoutDefaultSystem) {
  auto tok = WithTemplate(
      {"<|im_start|>", "<|im_end|>"}, -1, 1,
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
  EXPECT_EQ(Render(*tok, kOneTurn), "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3) {
  auto tok = WithTemplate({"<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"}, 0, 2,
                          kLlama3Template);
  EXPECT_EQ(Render(*tok, kOneTurn),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(*tok, kWithSystem, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>"
            "assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nThanks<|eot_id|>");
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{2, 1}));
}

TEST(ChatTemplateTest, Llama2PutsTheSystemPromptInTheFirstInst) {
  auto tok = WithTemplate({"<unk>", "<s>", "</s>"}, 1, 2, kLlama2Template);
  EXPECT_EQ(Render(*tok, kOneTurn), "<s>[INST] Hi there [/INST]");
  EXPECT_EQ(Render(*tok, kWithSystem),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] "
            "Thanks [/INST]");
  auto bad = tok->ApplyChatTemplate({{"user", "a"}, {"user", "b"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, MistralV01) {
  auto tok = WithTemplate({"<unk>", "<s>", "</s>"}, 1, 2, kMistralTemplate);
  EXPECT_EQ(Render(*tok, {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "X"}}),
            "<s>[INST] Hi [/INST]Yo</s>[INST] X [/INST]");
}

TEST(ChatTemplateTest, ZephyrForTinyLlama) {
  auto tok = WithTemplate({"<unk>", "<s>", "</s>"}, 1, 2, kZephyrTemplate);
  EXPECT_EQ(Render(*tok, kOneTurn), "<|user|>\nHi there</s>\n<|assistant|>\n");
  EXPECT_EQ(Render(*tok, kWithSystem, false),
            "<|system|>\nBe brief.</s>\n<|user|>\n Hi there </s>\n<|assistant|>\nHello!</s>\n"
            "<|user|>\nThanks</s>\n");
}

// continue_final_message: the text ends right after the last message's content, its spaces
// kept unless the template trims the content. The expected strings are transformers 5.25's
// apply_chat_template(continue_final_message=True, add_generation_prompt=False) of the same
// templates and messages.
TEST(ChatTemplateTest, ContinueFinalMessageEndsRightAfterItsContent) {
  const std::vector<ChatMessage> prefill = {{"user", "Hi there"}, {"assistant", " The answer: "}};
  const std::vector<ChatMessage> sure = {{"user", "Hi"}, {"assistant", "Sure, "}};
  const std::vector<ChatMessage> user_last = {{"system", "S"}, {"user", "Complete this"}};
  auto continued = [](const Tokenizer& tok, const std::vector<ChatMessage>& msgs) {
    absl::StatusOr<std::string> s = tok.ApplyChatTemplate(msgs, false, true);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : "";
  };
  const std::string smol_system =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n";
  auto smol = WithTemplate({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 1, 2, kSmolTemplate);
  EXPECT_EQ(continued(*smol, prefill),
            smol_system + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
                          " The answer: ");
  EXPECT_EQ(continued(*smol, sure),
            smol_system + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure, ");
  // A user's message continued: its end of turn goes too.
  EXPECT_EQ(continued(*smol, user_last), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n"
                                         "Complete this");
  // Llama 3 trims contents: so does the cut.
  auto llama3 = WithTemplate({"<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"}, 0, 2,
                             kLlama3Template);
  const std::string llama3_user =
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n";
  EXPECT_EQ(continued(*llama3, prefill),
            llama3_user + "Hi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                          "The answer:");
  EXPECT_EQ(continued(*llama3, sure),
            llama3_user + "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nSure,");
  // Llama 2 strips the content but writes a space after it.
  auto llama2 = WithTemplate({"<unk>", "<s>", "</s>"}, 1, 2, kLlama2Template);
  EXPECT_EQ(continued(*llama2, prefill), "<s>[INST] Hi there [/INST] The answer: ");
  EXPECT_EQ(continued(*llama2, sure), "<s>[INST] Hi [/INST] Sure, ");
  EXPECT_EQ(continued(*llama2, user_last), "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nComplete this");

  EXPECT_FALSE(smol->ApplyChatTemplate(prefill, true, true).ok()) << "no new turn to open";
  EXPECT_FALSE(smol->ApplyChatTemplate({}, false, true).ok());
}

TEST(ChatTemplateTest, UnknownTemplateNamesTheSupportedFamilies) {
  auto tok = WithTemplate({"<s>"}, 0, 0, "{{ messages[0]['content'] }}");
  auto s = tok->ApplyChatTemplate(kOneTurn);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("ChatML"), std::string::npos);
}

TEST(ChatTemplateTest, EmptyTemplateFallsBackToChatMlOnlyWithItsTokens) {
  auto chatml = WithTemplate({"<|im_start|>", "<|im_end|>"}, -1, 1, "");
  EXPECT_EQ(Render(*chatml, kOneTurn), "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  auto plain = WithTemplate({"<s>"}, 0, 0, "");
  EXPECT_FALSE(plain->ApplyChatTemplate(kOneTurn).ok());
}

}  // namespace
}  // namespace thetaserve::model
