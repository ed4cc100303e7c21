// Tokenizer::ApplyChatTemplate: instead of a Jinja interpreter, the chat template's family is
// recognised from its text and rendered by hand, byte for byte as transformers renders the
// stock templates of that family (checked against jinja2 with trim_blocks/lstrip_blocks).
//
//   ChatML   (<|im_start|>)        SmolLM2, Qwen2; a literal default system message in the
//                                  template is used when the first message is not "system"
//   Llama 3  (<|start_header_id|>) incl. the Llama 3.1/3.2 "Cutting Knowledge Date" header
//                                  (date fixed to the template's default, 26 Jul 2024)
//   Llama 2  ([INST] + <<SYS>>)
//   Mistral  ([INST], no <<SYS>>)  v0.1 format; a system message is prefixed to the first
//                                  user message
//   Zephyr   (<|user|>)            TinyLlama-Chat
//
// Tool calls and other template features are not rendered.
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

enum class Family { kChatMl, kLlama3, kLlama2, kMistral, kZephyr, kUnknown };

Family Recognize(std::string_view t) {
  if (t.find("<|im_start|>") != std::string_view::npos) return Family::kChatMl;
  if (t.find("<|start_header_id|>") != std::string_view::npos) return Family::kLlama3;
  if (t.find("[INST]") != std::string_view::npos) {
    return t.find("<<SYS>>") != std::string_view::npos ? Family::kLlama2 : Family::kMistral;
  }
  if (t.find("<|user|>") != std::string_view::npos &&
      t.find("<|assistant|>") != std::string_view::npos) {
    return Family::kZephyr;
  }
  return Family::kUnknown;
}

// Python's str.strip() (Jinja's trim).
std::string Trim(std::string_view s) { return std::string(PythonRStrip(PythonLStrip(s))); }

// The literal default system message of a ChatML template: the text of a Jinja string
// literal '<|im_start|>system\n...<|im_end|>' ("\n" written either as an escape or as a real
// newline). Empty when the template builds the system turn from the messages only.
std::string DefaultChatMlSystem(std::string_view t) {
  for (std::string_view nl : {std::string_view("\\n"), std::string_view("\n")}) {
    const std::string head = absl::StrCat("<|im_start|>system", AsAbsl(nl));
    for (size_t pos = t.find(head); pos != std::string_view::npos;
         pos = t.find(head, pos + 1)) {
      const size_t start = pos + head.size();
      const size_t end = t.find("<|im_end|>", start);
      if (end == std::string_view::npos) break;
      std::string_view body = t.substr(start, end - start);
      // A quote, '+' or '{' means the system text is an expression, not a literal.
      if (body.empty() || body.find_first_of("'\"+{}") != std::string_view::npos) continue;
      std::string text;
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
          text.push_back('\n');
          ++i;
        } else {
          text.push_back(body[i]);
        }
      }
      return text;
    }
  }
  return {};
}

absl::Status Alternation(const std::vector<ChatMessage>& msgs, size_t first) {
  for (size_t i = first; i < msgs.size(); ++i) {
    const bool want_user = (i - first) % 2 == 0;
    if ((msgs[i].role == "user") != want_user ||
        (!want_user && msgs[i].role != "assistant")) {
      return absl::InvalidArgumentError(
          "this chat template needs roles that alternate user/assistant/user/... (after an "
          "optional first system message)");
    }
  }
  return absl::OkStatus();
}

std::string RenderChatMl(const std::vector<ChatMessage>& msgs, std::string_view default_system,
                         bool gen) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0 && !default_system.empty() && msgs[0].role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", AsAbsl(default_system), "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", msgs[i].role, "\n", msgs[i].content, "<|im_end|>\n");
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(const std::vector<ChatMessage>& msgs, std::string_view bos,
                         bool knowledge_header, bool gen) {
  std::string out(bos);
  size_t first = 0;
  if (knowledge_header) {
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = Trim(msgs[0].content);
      first = 1;
    }
    absl::StrAppend(&out,
                    "<|start_header_id|>system<|end_header_id|>\n\n"
                    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
                    system, "<|eot_id|>");
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    absl::StrAppend(&out, "<|start_header_id|>", msgs[i].role, "<|end_header_id|>\n\n",
                    Trim(msgs[i].content), "<|eot_id|>");
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

absl::StatusOr<std::string> RenderInst(const std::vector<ChatMessage>& msgs, bool llama2,
                                       std::string_view bos, std::string_view eos) {
  size_t first = 0;
  std::string system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    first = 1;
  }
  if (absl::Status s = Alternation(msgs, first); !s.ok()) return s;
  std::string out = llama2 ? "" : std::string(bos);
  for (size_t i = first; i < msgs.size(); ++i) {
    std::string content = msgs[i].content;
    if (i == first && first == 1) {
      content = llama2 ? absl::StrCat("<<SYS>>\n", system, "\n<</SYS>>\n\n", content)
                       : absl::StrCat(system, "\n\n", content);
    }
    if (llama2) {
      if (msgs[i].role == "user") {
        absl::StrAppend(&out, AsAbsl(bos), "[INST] ", Trim(content), " [/INST]");
      } else {
        absl::StrAppend(&out, " ", Trim(content), " ", AsAbsl(eos));
      }
    } else if (msgs[i].role == "user") {
      absl::StrAppend(&out, "[INST] ", content, " [/INST]");
    } else {
      absl::StrAppend(&out, content, AsAbsl(eos));
    }
  }
  return out;
}

std::string RenderZephyr(const std::vector<ChatMessage>& msgs, std::string_view eos, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    if (m.role == "user" || m.role == "system" || m.role == "assistant") {
      absl::StrAppend(&out, "<|", m.role, "|>\n", m.content, AsAbsl(eos), "\n");
    }
  }
  if (gen && !msgs.empty()) out += "<|assistant|>\n";
  return out;
}

}  // namespace

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                         bool add_generation_prompt,
                                                         bool continue_final_message) const {
  if (!continue_final_message) return Render(messages, add_generation_prompt);
  if (add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message opens no new turn; it cannot go with add_generation_prompt");
  }
  if (messages.empty()) return absl::InvalidArgumentError("no message to continue");
  // As transformers does it: render with a tag after the last message's content and cut at
  // the tag; when the template trimmed the content (the tag lost its trailing space), the
  // spaces before the tag go too.
  constexpr std::string_view kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  std::vector<ChatMessage> tagged = messages;
  tagged.back().content += kTag;
  auto rendered = Render(tagged, /*add_generation_prompt=*/false);
  if (!rendered.ok()) return rendered;
  const size_t at = rendered->rfind(kTag.substr(0, kTag.size() - 1));
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "the chat template does not render the last message, so it cannot be continued "
        "(continue_final_message)");
  }
  if (rendered->compare(at, kTag.size(), kTag) == 0) return rendered->substr(0, at);
  return std::string(PythonRStrip(std::string_view(*rendered).substr(0, at)));
}

absl::StatusOr<std::string> Tokenizer::Render(const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) const {
  const std::string bos = bos_id_ >= 0 ? pieces_[bos_id_] : "";
  const std::string eos = eos_id_ >= 0 ? pieces_[eos_id_] : "";
  Family family = Recognize(chat_template_);
  if (chat_template_.empty() && PieceToId("<|im_start|>") >= 0 &&
      PieceToId("<|im_end|>") >= 0) {
    family = Family::kChatMl;  // what transformers' old default template was
  }
  switch (family) {
    case Family::kChatMl:
      return RenderChatMl(messages, DefaultChatMlSystem(chat_template_), add_generation_prompt);
    case Family::kLlama3:
      return RenderLlama3(messages, bos,
                          chat_template_.find("Cutting Knowledge Date") != std::string::npos,
                          add_generation_prompt);
    case Family::kLlama2:
      return RenderInst(messages, /*llama2=*/true, bos, eos);
    case Family::kMistral:
      return RenderInst(messages, /*llama2=*/false, bos, eos);
    case Family::kZephyr:
      return RenderZephyr(messages, eos, add_generation_prompt);
    case Family::kUnknown:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      chat_template_.empty() ? "the model has no chat template"
                             : "the model's chat template is not one this server can render",
      "; supported families: ChatML (<|im_start|>), Llama 3 (<|start_header_id|>), Llama 2 "
      "([INST] with <<SYS>>), Mistral ([INST]), Zephyr (<|user|>). Send a plain prompt "
      "instead of chat messages."));
}

}  // namespace thetaserve::model
