// Turns an API GenerateRequest into an engine Request, or says precisely what is wrong with
// it (INVALID_ARGUMENT with a message that names the field and the allowed range); and the
// API key check both APIs share.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "scheduler/request.h"
#include "thetaserve/v1/generation.pb.h"

namespace thetaserve::server {

// Whether an Authorization value (HTTP header or gRPC metadata) carries `api_key` as a bearer
// token: the scheme's name in any case (RFC 7235: "Bearer", "bearer"), one or more spaces, then
// the key exactly, compared in time that does not depend on where it differs.
bool BearerMatches(std::string_view authorization, std::string_view api_key);

constexpr int kMaxStopStrings = 16;
constexpr int kMaxStopStringBytes = 256;
constexpr int kMaxLogprobs = 20;
constexpr int kDefaultMaxTokens = 16;

constexpr int kMaxChoices = 128;  // GenerateRequest.n, OpenAI's n
constexpr int kMaxBadWords = 1024;
constexpr int kMaxBadWordBytes = 256;
constexpr int kMaxBadWordTokens = 4096;  // all words, both spellings: checked every step
constexpr int kMaxGuidedChoices = 1024;
constexpr int kMaxGuidedChoiceBytes = 1024;
constexpr int kMaxGuidedChoiceTotalBytes = 65536;

// The sampling half of BuildRequest: checks every field against its range (naming it as
// "sampling.<field>") and fills the engine's parameters, with the API's defaults for unset
// ones; all but the TokenConstraints.
absl::StatusOr<scheduler::SamplingParams> BuildSampling(const v1::SamplingParams& sp,
                                                        int64_t vocab_size);

// What the sampling parameters make of the vocabulary, the same whatever the prompt: the
// allowed ids (sorted, unique), the bad words' token sequences (SamplingParams.bad_words's
// rule) and the guided choice's guide; each null when not asked for. Built once per call and
// shared by its prompts and completions.
struct TokenConstraints {
  std::shared_ptr<const std::vector<int32_t>> allowed_tokens;
  std::shared_ptr<const std::vector<std::vector<int32_t>>> bad_words;
  std::shared_ptr<const scheduler::Guide> guide;
};
absl::StatusOr<TokenConstraints> BuildTokenConstraints(const v1::SamplingParams& sp,
                                                       const model::Model& model);

// `constraints`: req.sampling()'s, built already (a call of several prompts builds them once);
// null builds them here.
absl::StatusOr<scheduler::Request> BuildRequest(const v1::GenerateRequest& req,
                                                const model::Model& model,
                                                const TokenConstraints* constraints = nullptr);

// The engine requests for `n` completions of `req` (a checked request with its id set): for
// n = 1, `req` itself; otherwise a group with id req.id whose requests are "<id>/<i>", and
// with a seed, completion i samples with seed + i (so the n differ but repeat).
std::vector<scheduler::Request> SplitChoices(scheduler::Request req, int n);

// 128 random bits in hex, as vLLM's request ids: ids made of the start second and a counter
// were the same on two replicas started in the same second, and easy to guess for an Abort.
// Thread-safe.
std::string RandomHex128();

// A rendered chat's ids: BOS goes in front with add_special only when the model asks for one
// and the template did not write it (vLLM would put a second one there, which no model was
// trained on).
std::vector<int32_t> EncodeRenderedChat(const model::Tokenizer& tok, const std::string& text,
                                        bool add_special);

// Renders chat messages with the model's template (validating roles and UTF-8).
absl::StatusOr<std::string> RenderChat(const v1::ChatMessages& chat, const model::Model& model);

bool IsValidUtf8(std::string_view s);

// The Tokenize RPC's answer (and the HTTP API's /tokenize): the ids of the text, or of the
// rendered chat (then `rendered` too). add_special_tokens unset: true for text, false for a
// chat, as Generate takes it.
absl::StatusOr<v1::TokenizeResponse> TokenizeInput(const v1::TokenizeRequest& request,
                                                   const model::Model& model);

}  // namespace thetaserve::server
