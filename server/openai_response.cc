#include "server/openai_response.h"

#include <algorithm>
#include <random>
#include <string_view>

#include "absl/strings/str_format.h"

namespace thetaserve::server {
namespace {

using Json = nlohmann::ordered_json;

// vLLM's stand-in for a log-probability of -inf, which JSON cannot carry.
constexpr float kMinLogprob = -9999.0f;

// Characters (code points) in UTF-8 text: the bytes that begin one. A token that ends inside
// a character counts it; the token holding the rest adds none.
size_t Utf8Chars(std::string_view text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// A tool call's id, as OpenAI's look: "call_" and 24 random hex digits.
std::string ToolCallId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("call_%016x%08x", rng(), uint32_t(rng()));
}

Json ToolCall(const std::string& id, const Json& name, const std::string& arguments) {
  return {{"id", id},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", arguments}}}};
}

// Chat's "bytes": a token's raw bytes as integers.
Json ByteList(const std::string& bytes) {
  Json b = Json::array();
  for (unsigned char c : bytes) b.push_back(int(c));
  return b;
}

Json TopList(const std::vector<std::pair<int32_t, float>>& top, int n,
             const model::Tokenizer& tok, bool chat) {
  Json out = chat ? Json::array() : Json::object();
  for (int i = 0; i < n && i < static_cast<int>(top.size()); ++i) {
    const std::string bytes = tok.TokenBytes(top[i].first);
    const float lp = std::max(top[i].second, kMinLogprob);
    if (chat) {
      out.push_back({{"token", bytes}, {"logprob", lp}, {"bytes", ByteList(bytes)}});
    } else {
      out[bytes] = lp;
    }
  }
  return out;
}

}  // namespace

const char* OpenAiFinishReason(scheduler::FinishReason reason) {
  switch (reason) {
    case scheduler::FinishReason::kLength: return "length";
    case scheduler::FinishReason::kCancelled: return "abort";
    case scheduler::FinishReason::kError: return "error";
    case scheduler::FinishReason::kStop:
    case scheduler::FinishReason::kEos: break;
  }
  return "stop";
}

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

OpenAiResponseBuilder::OpenAiResponseBuilder(const OpenAiCall& call, std::string id,
                                             int64_t created, std::string model,
                                             const model::Tokenizer& tokenizer, int choices,
                                             std::vector<std::string> echo_texts)
    : call_(call), id_(std::move(id)), created_(created), model_(std::move(model)),
      tokenizer_(&tokenizer), choices_(std::max(1, choices)),
      per_prompt_(std::max<int>(1, int(choices_.size() / call.prompt_count()))) {
  for (size_t i = 0; i < choices_.size(); ++i) {
    const size_t p = i / size_t(per_prompt_);
    if (p < echo_texts.size()) choices_[i].echo = echo_texts[p];
    if (call_.tool_calls == OpenAiCall::ToolCalls::kNamed) choices_[i].tool_id = ToolCallId();
  }
}

std::string OpenAiResponseBuilder::EchoText(Choice& c, const scheduler::TokenDelta& delta) {
  if (!call_.echo || c.echoed) return "";
  if (delta.token_ids.empty() && !delta.prompt) return "";
  c.echoed = true;
  c.text += c.echo;
  c.token_chars += Utf8Chars(c.echo);
  return c.echo;
}

Json OpenAiResponseBuilder::PromptLogprobs(const scheduler::TokenDelta& delta) const {
  if (!call_.echo || !call_.logprobs || !delta.prompt) return nullptr;
  const scheduler::PromptScores& d = *delta.prompt;
  // The legacy format: the prompt's tokens, the first with null log-probabilities.
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  size_t offset = 0;
  for (size_t i = 0; i < d.token_ids.size(); ++i) {
    const std::string bytes = tokenizer_->TokenBytes(d.token_ids[i]);
    tokens.push_back(bytes);
    offsets.push_back(offset);
    offset += Utf8Chars(bytes);
    if (i == 0 || i - 1 >= d.logprobs.size()) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    const float lp = std::max(d.logprobs[i - 1], kMinLogprob);
    token_logprobs.push_back(lp);
    Json alternatives = TopList(d.top[i - 1], call_.top_logprobs, *tokenizer_, false);
    if (!alternatives.contains(bytes)) alternatives[bytes] = lp;
    top.push_back(alternatives);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
          {"text_offset", offsets}};
}

Json OpenAiResponseBuilder::VllmPromptLogprobs(const scheduler::PromptScores& d) const {
  Json out = Json::array({nullptr});
  auto entry = [&](int32_t id, float logprob, int32_t rank) {
    return Json{{"logprob", std::max(logprob, kMinLogprob)},
                {"rank", rank},
                {"decoded_token", tokenizer_->TokenBytes(id)}};
  };
  for (size_t i = 0; i < d.logprobs.size() && i + 1 < d.token_ids.size(); ++i) {
    const int32_t id = d.token_ids[i + 1];
    Json scores = Json::object();
    scores[std::to_string(id)] = entry(id, d.logprobs[i], i < d.ranks.size() ? d.ranks[i] : 0);
    const auto& top = d.top[i];
    for (int k = 0; k < call_.prompt_logprobs && k < int(top.size()); ++k) {
      const std::string key = std::to_string(top[k].first);
      if (!scores.contains(key)) scores[key] = entry(top[k].first, top[k].second, k + 1);
    }
    out.push_back(std::move(scores));
  }
  return out;
}

Json OpenAiResponseBuilder::Envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

Json OpenAiResponseBuilder::Usage(const std::vector<scheduler::FinishInfo>& infos) const {
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (i % size_t(per_prompt_) == 0) prompt += infos[i].prompt_tokens;  // its prompt's first
    completion += infos[i].completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

Json OpenAiResponseBuilder::Logprobs(const scheduler::TokenDelta& d, size_t* offset) const {
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  if (!call_.logprobs || d.logprobs.empty()) return nullptr;
  if (chat) {
    Json content = Json::array();
    for (size_t i = 0; i < d.logprobs.size() && i < d.token_ids.size(); ++i) {
      const std::string bytes = tokenizer_->TokenBytes(d.token_ids[i]);
      content.push_back({{"token", bytes},
                         {"logprob", std::max(d.logprobs[i], kMinLogprob)},
                         {"bytes", ByteList(bytes)},
                         {"top_logprobs", TopList(d.top[i], call_.top_logprobs, *tokenizer_, true)}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  for (size_t i = 0; i < d.logprobs.size() && i < d.token_ids.size(); ++i) {
    const std::string bytes = tokenizer_->TokenBytes(d.token_ids[i]);
    tokens.push_back(bytes);
    token_logprobs.push_back(std::max(d.logprobs[i], kMinLogprob));
    // The legacy format always carries the sampled token among the alternatives: up to n + 1
    // entries (OpenAI's documentation; vLLM does the same).
    Json alternatives = TopList(d.top[i], call_.top_logprobs, *tokenizer_, false);
    if (!alternatives.contains(bytes)) alternatives[bytes] = std::max(d.logprobs[i], kMinLogprob);
    top.push_back(alternatives);
    offsets.push_back(*offset);
    *offset += Utf8Chars(bytes);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
          {"text_offset", offsets}};
}

const std::vector<int32_t>& OpenAiResponseBuilder::PromptIds(int index) const {
  static const std::vector<int32_t> kNone;
  const size_t p = size_t(index / per_prompt_);
  return p < prompt_ids_.size() ? prompt_ids_[p] : kNone;
}

void OpenAiResponseBuilder::AddChoiceUsage(int index, Json& chunk) const {
  if (!call_.continuous_usage) return;
  const size_t p = size_t(index / per_prompt_);
  const int64_t prompt = p < prompt_lengths_.size() ? prompt_lengths_[p] : 0;
  const int64_t completion = choices_.at(index).tokens;
  chunk["usage"] = {{"prompt_tokens", prompt},
                    {"completion_tokens", completion},
                    {"total_tokens", prompt + completion}};
}

Json OpenAiResponseBuilder::RoleChunk(int index) const {
  Json j = Envelope("chat.completion.chunk");
  j["choices"] = Json::array({{{"index", index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (call_.return_token_ids) j["prompt_token_ids"] = PromptIds(index);  // as vLLM's, first
  AddChoiceUsage(index, j);
  return j;
}

Json OpenAiResponseBuilder::DeltaChunk(int index, const scheduler::TokenDelta& delta) {
  Choice& c = choices_.at(index);
  const std::string echo = EchoText(c, delta);
  Json logprobs = PromptLogprobs(delta);
  c.text += delta.text;
  c.tokens += int64_t(delta.token_ids.size());
  AppendLogprobs(logprobs, Logprobs(delta, &c.token_chars));
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  Json choice = chat ? Json{{"index", index}, {"delta", {{"content", delta.text}}}}
                     : Json{{"text", echo + delta.text}, {"index", index}};
  if (chat && call_.tool_calls == OpenAiCall::ToolCalls::kNamed) {
    // The named function's arguments, streamed as the call's: its id and name first.
    Json call = {{"index", 0}};
    if (c.tool_started) {
      call["function"] = {{"arguments", delta.text}};
    } else {
      call.update(ToolCall(c.tool_id, call_.tool_name, delta.text));
      c.tool_started = true;
    }
    choice["delta"] = {{"tool_calls", Json::array({call})}};
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = nullptr;
  if (call_.return_token_ids) {
    // Completions give the prompt's ids with a choice's first chunk (chat: its role chunk).
    if (!chat && !c.prompt_ids_sent) choice["prompt_token_ids"] = PromptIds(index);
    c.prompt_ids_sent = true;
    choice["token_ids"] = delta.token_ids;
  }
  Json j = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array({choice});
  AddChoiceUsage(index, j);
  return j;
}

Json OpenAiResponseBuilder::FinishChunk(int index, const scheduler::FinishInfo& info) const {
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  Json choice = chat ? Json{{"index", index}, {"delta", Json::object()}}
                     : Json{{"text", ""}, {"index", index}};
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = OpenAiFinishReason(info.reason);
  Json j = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array({choice});
  AddChoiceUsage(index, j);
  return j;
}

Json OpenAiResponseBuilder::UsageChunk(const std::vector<scheduler::FinishInfo>& infos) const {
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  Json j = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array();
  j["usage"] = Usage(infos);
  return j;
}

void OpenAiResponseBuilder::AppendLogprobs(Json& into, const Json& more) {
  if (more.is_null()) return;
  if (into.is_null()) {
    into = more;
    return;
  }
  for (auto& [key, value] : more.items()) {
    for (const Json& x : value) into[key].push_back(x);
  }
}

void OpenAiResponseBuilder::Add(int index, const scheduler::TokenDelta& delta) {
  Choice& c = choices_.at(index);
  // A chat response carries its prompt's scores once, from choice 0.
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  if (call_.prompt_logprobs >= 0 && delta.prompt && (!chat || index == 0)) {
    c.prompt_logprobs = VllmPromptLogprobs(*delta.prompt);
  }
  EchoText(c, delta);
  AppendLogprobs(c.logprobs, PromptLogprobs(delta));
  AppendLogprobs(c.logprobs, Logprobs(delta, &c.token_chars));
  c.text += delta.text;
  if (call_.return_token_ids) {
    c.token_ids.insert(c.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
  }
}

bool OpenAiResponseBuilder::Carries(const Json& chunk) {
  if (chunk["choices"].empty()) return false;
  const Json& c = chunk["choices"][0];
  if (!c["logprobs"].is_null()) return true;
  // Token ids asked for (return_token_ids) go out even before their text is whole.
  if (c.contains("token_ids") && !c["token_ids"].empty()) return true;
  if (c.contains("prompt_token_ids")) return true;
  if (c.contains("delta") && c["delta"].contains("tool_calls")) {
    const Json& call = c["delta"]["tool_calls"][0];
    return call.contains("id") || !call["function"]["arguments"].get<std::string>().empty();
  }
  const Json& text = c.contains("delta") ? c["delta"]["content"] : c["text"];
  return text.is_string() && !text.get<std::string>().empty();
}

Json OpenAiResponseBuilder::Complete(const std::vector<scheduler::FinishInfo>& infos) const {
  const bool chat = call_.endpoint == OpenAiEndpoint::kChatCompletions;
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size() && i < infos.size(); ++i) {
    const Choice& c = choices_[i];
    // A completion cancelled before its first token still echoes its prompt.
    const std::string text = call_.echo && !c.echoed ? c.echo + c.text : c.text;
    Json logprobs = c.logprobs;
    if (call_.logprobs && logprobs.is_null()) {
      logprobs = chat ? Json{{"content", Json::array()}}
                      : Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()},
                             {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
    }
    const int index = static_cast<int>(i);
    Json choice = chat ? Json{{"index", index},
                              {"message", {{"role", "assistant"}, {"content", text}}}}
                       : Json{{"text", text}, {"index", index}};
    std::string finish = OpenAiFinishReason(infos[i].reason);
    if (chat && call_.tool_calls == OpenAiCall::ToolCalls::kNamed) {
      // The output is the named function's arguments (finish "stop", as OpenAI's forced call).
      choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] =
          Json::array({ToolCall(c.tool_id, call_.tool_name, text)});
    } else if (chat && call_.tool_calls == OpenAiCall::ToolCalls::kRequired) {
      // The output is a list of calls: [{"name", "parameters"}]. Cut short, it stays text.
      const Json calls = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      const bool whole = calls.is_array() && std::all_of(calls.begin(), calls.end(), [](auto& c) {
        return c.is_object() && c.contains("name") && c.contains("parameters");
      });
      if (whole) {
        Json tool_calls = Json::array();
        for (const Json& call : calls) {
          tool_calls.push_back(ToolCall(ToolCallId(), call["name"], call["parameters"].dump()));
        }
        choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = std::move(tool_calls);
        if (infos[i].reason == scheduler::FinishReason::kStop) finish = "tool_calls";
      }
    }
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = finish;
    if (!chat && call_.prompt_logprobs >= 0) choice["prompt_logprobs"] = c.prompt_logprobs;
    if (call_.return_token_ids) {
      if (!chat) choice["prompt_token_ids"] = PromptIds(index);
      choice["token_ids"] = c.token_ids;
    }
    choices.push_back(std::move(choice));
  }
  Json j = Envelope(chat ? "chat.completion" : "text_completion");
  j["choices"] = std::move(choices);
  // vLLM gives a chat's prompt_logprobs once, beside the choices.
  if (chat && call_.prompt_logprobs >= 0) j["prompt_logprobs"] = choices_[0].prompt_logprobs;
  if (chat && call_.return_token_ids) j["prompt_token_ids"] = PromptIds(0);
  j["usage"] = Usage(infos);
  return j;
}

}  // namespace thetaserve::server
