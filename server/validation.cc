#include "server/validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_utf8.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_regex.h"
#include "scheduler/guided_schema.h"

namespace thetaserve::server {
namespace {

// add_special_tokens: unset, true for a text prompt and false for a chat, whose template writes
// the special tokens it wants (HF encodes rendered chats with add_special_tokens=False, as vLLM
// does unless asked).
template <typename Req>
bool AddsSpecialTokens(const Req& req, bool chat) {
  return req.has_add_special_tokens() ? req.add_special_tokens() : !chat;
}

}  // namespace

std::vector<int32_t> EncodeRenderedChat(const model::Tokenizer& tok, const std::string& text,
                                        bool add_special) {
  std::vector<int32_t> ids = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/true);
  if (add_special && tok.add_bos() && (ids.empty() || ids.front() != tok.bos_id())) {
    ids.insert(ids.begin(), tok.bos_id());
  }
  return ids;
}

absl::StatusOr<v1::TokenizeResponse> TokenizeInput(const v1::TokenizeRequest& request,
                                                   const model::Model& model) {
  if (request.input_case() == v1::TokenizeRequest::INPUT_NOT_SET) {
    return absl::InvalidArgumentError("one of text or chat is required");
  }
  const bool add_special = AddsSpecialTokens(request, request.has_chat());
  v1::TokenizeResponse response;
  std::string text;
  if (request.has_chat()) {
    auto rendered = RenderChat(request.chat(), model);
    if (!rendered.ok()) return rendered.status();
    text = *rendered;
    response.set_rendered(text);
  } else {
    if (!IsValidUtf8(request.text())) return absl::InvalidArgumentError("text is not valid UTF-8");
    text = request.text();
  }
  const std::vector<int32_t> ids =
      request.has_chat() ? EncodeRenderedChat(model.tokenizer(), text, add_special)
                         : model.tokenizer().Encode(text, add_special, /*parse_special=*/true);
  for (int32_t id : ids) {
    response.add_ids(static_cast<uint32_t>(id));
  }
  return response;
}

bool BearerMatches(std::string_view authorization, std::string_view api_key) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() || authorization[kScheme.size()] != ' ') return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c) != kScheme[i]) return false;
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.size() != api_key.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < token.size(); ++i) differ |= (unsigned char)(token[i] ^ api_key[i]);
  return differ == 0;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    uint32_t cp;
    if ((c >> 5) == 0x6) {
      n = 1, cp = c & 0x1F;
    } else if ((c >> 4) == 0xE) {
      n = 2, cp = c & 0x0F;
    } else if ((c >> 3) == 0x1E) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

absl::StatusOr<std::string> RenderChat(const v1::ChatMessages& chat, const model::Model& model) {
  if (chat.messages_size() == 0) {
    return absl::InvalidArgumentError("chat has no messages");
  }
  std::vector<model::ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const auto& m = chat.messages(i);
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
        m.role() != "tool") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "chat.messages[%d].role is '%s'; use system, user, assistant or tool", i, m.role()));
    }
    if (!IsValidUtf8(m.content())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chat.messages[%d].content is not valid UTF-8", i));
    }
    messages.push_back({m.role(), m.content()});
  }
  // A continued last message opens no new turn unless asked (which the tokenizer refuses).
  const bool add_generation_prompt = chat.has_add_generation_prompt()
                                         ? chat.add_generation_prompt()
                                         : !chat.continue_final_message();
  return model.tokenizer().ApplyChatTemplate(messages, add_generation_prompt,
                                             chat.continue_final_message());
}

namespace {

// The bad words' token sequences (SamplingParams.bad_words's rule; null for none), or what is
// wrong with them.
absl::StatusOr<std::shared_ptr<const std::vector<std::vector<int32_t>>>> TokenizeBadWords(
    const google::protobuf::RepeatedPtrField<std::string>& words,
    const model::Tokenizer& tokenizer) {
  if (words.size() > kMaxBadWords) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.bad_words has %d words; at most %d are allowed", words.size(), kMaxBadWords));
  }
  if (words.empty()) return nullptr;
  std::vector<std::vector<int32_t>> out;
  size_t tokens = 0;
  for (int i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.size() > kMaxBadWordBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.bad_words[%d] is %d bytes; at most %d are allowed", i, word.size(),
          kMaxBadWordBytes));
    }
    if (!IsValidUtf8(word)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.bad_words[%d] is not valid UTF-8", i));
    }
    const std::string bare(model::PythonLStrip(word));
    std::vector<int32_t> alone = tokenizer.Encode(bare, /*add_bos=*/false, /*parse_special=*/true);
    if (alone.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.bad_words[%d] is empty (or only spaces); remove it", i));
    }
    // vLLM's rule: the word after a space too, when that makes another first token of the
    // same length (a word-initial token: "Paris" and " Paris" are different tokens).
    std::vector<int32_t> spaced =
        tokenizer.Encode(absl::StrCat(" ", bare), /*add_bos=*/false, /*parse_special=*/true);
    const bool another = !spaced.empty() && spaced.front() != alone.front() &&
                         spaced.size() == alone.size();
    tokens += alone.size() + (another ? spaced.size() : 0);
    if (tokens > size_t(kMaxBadWordTokens)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.bad_words come to more than %d tokens (%d words counted); each step "
          "checks them all, send fewer", kMaxBadWordTokens, i + 1));
    }
    out.push_back(std::move(alone));
    if (another) out.push_back(std::move(spaced));
  }
  return std::make_shared<const std::vector<std::vector<int32_t>>>(std::move(out));
}

}  // namespace

absl::StatusOr<scheduler::SamplingParams> BuildSampling(const v1::SamplingParams& sp,
                                                        int64_t vocab_size) {
  scheduler::SamplingParams o;
  o.temperature = sp.has_temperature() ? sp.temperature() : 1.0f;
  if (o.temperature == std::numeric_limits<float>::infinity()) {
    // As a float: JSON's 1e300 arrives as inf (it said "= inf; it must be >= 0").
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.temperature = %g; it must be finite (at most %g)", sp.temperature(),
        std::numeric_limits<float>::max()));
  }
  if (!(o.temperature >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.temperature = %g; it must be >= 0 (0 = greedy)", sp.temperature()));
  }
  o.top_p = sp.has_top_p() ? sp.top_p() : 1.0f;
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.top_p = %g; it must be in (0, 1]", sp.top_p()));
  }
  if (sp.top_k() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.top_k = %d; it must be >= 0 (0 = off)", sp.top_k()));
  }
  o.top_k = sp.top_k();
  if (!(sp.min_p() >= 0.0f && sp.min_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.min_p = %g; it must be in [0, 1]", sp.min_p()));
  }
  o.min_p = sp.min_p();
  o.repetition_penalty = sp.has_repetition_penalty() ? sp.repetition_penalty() : 1.0f;
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.repetition_penalty = %g; it must be > 0 (1 = off)", sp.repetition_penalty()));
  }
  for (const auto& [name, value] : {std::pair{"presence_penalty", sp.presence_penalty()},
                                     std::pair{"frequency_penalty", sp.frequency_penalty()}}) {
    if (!std::isfinite(value) || std::fabs(value) > 2.0f) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.%s = %g; it must be in [-2, 2]", name, value));
    }
  }
  o.presence_penalty = sp.presence_penalty();
  o.frequency_penalty = sp.frequency_penalty();
  if (sp.has_seed()) o.seed = sp.seed();
  if (sp.logprobs() < 0 || sp.logprobs() > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.logprobs = %d; it must be in [0, %d]", sp.logprobs(), kMaxLogprobs));
  }
  o.logprobs = sp.logprobs();
  for (const auto& [token, bias] : sp.logit_bias()) {
    if (token >= uint32_t(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.logit_bias has token id %d, outside the vocabulary [0, %d)", token,
          vocab_size));
    }
    if (!(std::fabs(bias) <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.logit_bias[%d] = %g; it must be in [-100, 100]", token, bias));
    }
    o.logit_bias.push_back({static_cast<int32_t>(token), bias});
  }
  return o;
}

absl::StatusOr<TokenConstraints> BuildTokenConstraints(const v1::SamplingParams& sp,
                                                       const model::Model& model) {
  const auto& config = model.config();
  TokenConstraints out;
  if (sp.allowed_token_ids_size() > 0) {
    std::vector<int32_t> allowed;
    for (int i = 0; i < sp.allowed_token_ids_size(); ++i) {
      if (sp.allowed_token_ids(i) >= uint32_t(config.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "sampling.allowed_token_ids[%d] = %d is outside the vocabulary [0, %d)", i,
            sp.allowed_token_ids(i), config.vocab_size));
      }
      allowed.push_back(static_cast<int32_t>(sp.allowed_token_ids(i)));
    }
    std::sort(allowed.begin(), allowed.end());
    allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
    out.allowed_tokens = std::make_shared<const std::vector<int32_t>>(std::move(allowed));
  }
  auto bad_words = TokenizeBadWords(sp.bad_words(), model.tokenizer());
  if (!bad_words.ok()) return bad_words.status();
  out.bad_words = std::move(*bad_words);
  const auto& choices = sp.guided_choice();
  if (choices.size() > kMaxGuidedChoices) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.guided_choice has %d choices; at most %d are allowed", choices.size(),
        kMaxGuidedChoices));
  }
  std::vector<std::string> guided;
  size_t guided_bytes = 0;
  for (int i = 0; i < choices.size(); ++i) {
    if (choices[i].empty() || choices[i].size() > kMaxGuidedChoiceBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.guided_choice[%d] has %d bytes; it must have 1 to %d", i, choices[i].size(),
          kMaxGuidedChoiceBytes));
    }
    if (!IsValidUtf8(choices[i])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.guided_choice[%d] is not valid UTF-8", i));
    }
    guided_bytes += choices[i].size();
    if (guided_bytes > size_t(kMaxGuidedChoiceTotalBytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.guided_choice holds more than %d bytes in all (%d choices counted)",
          kMaxGuidedChoiceTotalBytes, i + 1));
    }
    guided.push_back(choices[i]);
  }
  if (!guided.empty()) {
    out.guide = std::make_shared<const scheduler::ChoiceGuide>(std::move(guided));
  }
  if (!sp.guided_regex().empty()) {
    if (out.guide) {
      return absl::InvalidArgumentError(
          "sampling.guided_choice and sampling.guided_regex are both given; send one");
    }
    auto regex = scheduler::RegexGuide::Compile(sp.guided_regex());
    if (!regex.ok()) {
      return absl::Status(regex.status().code(),
                          absl::StrCat("sampling.", regex.status().message()));
    }
    out.guide = std::move(*regex);
  }
  const char* earlier =
      sp.guided_choice_size() > 0 ? "sampling.guided_choice" : "sampling.guided_regex";
  if (sp.json_object()) {
    if (out.guide) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.json_object and ", earlier, " are both given; send one"));
    }
    out.guide = std::make_shared<const scheduler::JsonObjectGuide>();
  }
  if (!sp.guided_json().empty()) {
    if (out.guide) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.guided_json and ", sp.json_object() ? "sampling.json_object" : earlier,
          " are both given; send one"));
    }
    auto schema = scheduler::CompileJsonSchema(sp.guided_json());
    if (!schema.ok()) {
      return absl::Status(schema.status().code(),
                          absl::StrCat("sampling.", schema.status().message()));
    }
    out.guide = std::move(*schema);
  }
  if (!sp.guided_grammar().empty()) {
    if (out.guide) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.guided_grammar and ",
          !sp.guided_json().empty() ? "sampling.guided_json"
          : sp.json_object()        ? "sampling.json_object"
                                    : earlier,
          " are both given; send one"));
    }
    auto grammar = scheduler::GrammarGuide::Compile(sp.guided_grammar());
    if (!grammar.ok()) {
      return absl::Status(grammar.status().code(),
                          absl::StrCat("sampling.", grammar.status().message()));
    }
    out.guide = std::move(*grammar);
  }
  return out;
}

absl::StatusOr<scheduler::Request> BuildRequest(const v1::GenerateRequest& req,
                                                const model::Model& model,
                                                const TokenConstraints* constraints) {
  const auto& config = model.config();
  const auto& tok = model.tokenizer();
  scheduler::Request out;
  out.id = req.request_id();
  if (req.cache_salt().size() > 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cache_salt has %d bytes; at most 256", req.cache_salt().size()));
  }
  out.cache_salt = req.cache_salt();
  out.priority = req.priority();
  out.skip_special_tokens = !req.has_skip_special_tokens() || req.skip_special_tokens();
  if (req.n() > uint32_t(kMaxChoices)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("n = %d; it must be in [1, %d] (0 means 1)", req.n(), kMaxChoices));
  }
  const bool add_special = AddsSpecialTokens(req, req.input_case() == v1::GenerateRequest::kChat);

  switch (req.input_case()) {
    case v1::GenerateRequest::kPrompt:
      if (req.prompt().empty()) {
        return absl::InvalidArgumentError("prompt is empty; send some text to continue");
      }
      if (!IsValidUtf8(req.prompt())) return absl::InvalidArgumentError("prompt is not valid UTF-8");
      out.prompt = tok.Encode(req.prompt(), add_special, /*parse_special=*/true);
      break;
    case v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = req.prompt_token_ids().ids();
      if (ids.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] >= static_cast<uint64_t>(config.vocab_size)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "prompt_token_ids[%d] = %d is outside the vocabulary [0, %d)", i, ids[i],
              config.vocab_size));
        }
        out.prompt.push_back(static_cast<int32_t>(ids[i]));
      }
      break;
    }
    case v1::GenerateRequest::kChat: {
      auto text = RenderChat(req.chat(), model);
      if (!text.ok()) return text.status();
      out.prompt = EncodeRenderedChat(tok, *text, add_special);
      break;
    }
    default:
      return absl::InvalidArgumentError("one of prompt, prompt_token_ids or chat is required");
  }
  if (out.prompt.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  if (req.has_truncate_prompt_tokens()) {
    // vLLM's: keep the last k tokens; -1 is the model's context (still checked below).
    const int32_t k = req.truncate_prompt_tokens();
    if (k < 1 && k != -1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "truncate_prompt_tokens = %d; it must be >= 1 (the prompt's last k tokens are kept) "
          "or -1 (the model's context)", k));
    }
    const size_t keep = k == -1 ? size_t(config.max_context) : size_t(k);
    // A prompt keeps the BOS the tokenizer put in front, and the last k - 1 after it, as
    // vLLM's (HF's left truncation adds the special tokens after cutting).
    const bool bos_added = req.input_case() != v1::GenerateRequest::kPromptTokenIds &&
                           add_special && tok.add_bos() && out.prompt.front() == tok.bos_id();
    const size_t head = bos_added ? 1 : 0;  // k = 1: BOS alone, as HF's left truncation
    if (out.prompt.size() > keep) {
      out.prompt.erase(out.prompt.begin() + head, out.prompt.end() - (keep - head));
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(out.prompt.size());
  if (prompt_len >= config.max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt has %d tokens; the model's context is %d tokens, and at least one must be "
        "left to generate",
        prompt_len, config.max_context));
  }

  const auto& st = req.stopping();
  const auto& sp0 = req.sampling();
  if (sp0.has_prompt_logprobs()) {
    if (sp0.prompt_logprobs() > uint32_t(kMaxLogprobs)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sampling.prompt_logprobs = %d; it must be in [0, %d]", sp0.prompt_logprobs(),
          kMaxLogprobs));
    }
    out.prompt_logprobs = static_cast<int32_t>(sp0.prompt_logprobs());
  }
  int64_t max_tokens = kDefaultMaxTokens;
  if (st.has_max_tokens()) {
    // 0 scores the prompt without generating (prompt_logprobs).
    if (st.max_tokens() < 1 && out.prompt_logprobs < 0) {
      return absl::InvalidArgumentError(
          "stopping.max_tokens must be >= 1 (0 only with sampling.prompt_logprobs)");
    }
    max_tokens = st.max_tokens();
  }
  if (prompt_len + max_tokens > config.max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stopping.max_tokens = %d with a %d-token prompt exceeds the model's context of %d; "
        "use max_tokens <= %d",
        max_tokens, prompt_len, config.max_context, config.max_context - prompt_len));
  }
  out.stopping.max_tokens = static_cast<int32_t>(max_tokens);
  if (st.min_tokens() > uint64_t(max_tokens)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stopping.min_tokens = %d exceeds max_tokens = %d", st.min_tokens(), max_tokens));
  }
  out.stopping.min_tokens = static_cast<int32_t>(st.min_tokens());
  if (st.stop_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stopping.stop has %d strings; at most %d stop strings are allowed", st.stop_size(),
        kMaxStopStrings));
  }
  for (int i = 0; i < st.stop_size(); ++i) {
    const std::string& s = st.stop(i);
    if (s.empty()) return absl::InvalidArgumentError(absl::StrFormat("stopping.stop[%d] is empty", i));
    if (s.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stopping.stop[%d] is %d bytes; at most %d are allowed", i, s.size(), kMaxStopStringBytes));
    }
    if (!IsValidUtf8(s)) {
      return absl::InvalidArgumentError(absl::StrFormat("stopping.stop[%d] is not valid UTF-8", i));
    }
    out.stopping.stop.push_back(s);
  }
  for (int i = 0; i < st.stop_token_ids_size(); ++i) {
    if (st.stop_token_ids(i) >= static_cast<uint64_t>(config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stopping.stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", i,
          st.stop_token_ids(i), config.vocab_size));
    }
    out.stopping.stop_token_ids.push_back(static_cast<int32_t>(st.stop_token_ids(i)));
  }
  out.stopping.ignore_eos = st.ignore_eos();
  out.stopping.include_stop_str = st.include_stop_str_in_output();

  auto sampling = BuildSampling(req.sampling(), config.vocab_size);
  if (!sampling.ok()) return sampling.status();
  out.sampling = std::move(*sampling);
  TokenConstraints built;
  if (constraints == nullptr) {
    auto made = BuildTokenConstraints(req.sampling(), model);
    if (!made.ok()) return made.status();
    built = std::move(*made);
    constraints = &built;
  }
  out.sampling.allowed_tokens = constraints->allowed_tokens;
  out.sampling.bad_words = constraints->bad_words;
  out.guide = constraints->guide;
  return out;
}

std::vector<scheduler::Request> SplitChoices(scheduler::Request req, int n) {
  std::vector<scheduler::Request> out;
  if (n <= 1) {
    out.push_back(std::move(req));
    return out;
  }
  for (int i = 0; i < n; ++i) {
    scheduler::Request r = req;
    r.id = absl::StrCat(req.id, "/", i);
    r.group_id = req.id;
    r.group_index = i;
    if (r.sampling.seed) *r.sampling.seed += uint64_t(i);
    // The prompt's scores are the same for every completion: the first computes them (the
    // others adopt its blocks instead of computing the prompt).
    if (i > 0) r.prompt_logprobs = -1;
    out.push_back(std::move(r));
  }
  return out;
}

std::string RandomHex128() {
  static std::mutex mu;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mu);
  uint64_t hi = (uint64_t(device()) << 32) | device();
  uint64_t lo = (uint64_t(device()) << 32) | device();
  return absl::StrFormat("%016x%016x", hi, lo);
}

}  // namespace thetaserve::server
