// The OpenAI-compatible API's generation parameters (sampling, stopping, log-probabilities,
// vLLM's extensions) onto an OpenAiCall's GenerateRequest, and the refusal of parameters the
// server cannot honour. Part of ParseOpenAiRequest (openai_api.cc).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "server/openai_api.h"
#include "server/openai_body.h"

namespace thetaserve::server {

absl::Status ParseStop(const openai_body::In& body, v1::GenerateRequest* out);
// Sampling and stopping (ParseStop among them), n, best_of, echo, max_tokens. `body_text` is
// the body as sent (a JSON schema is taken from it with its keys in their order).
absl::Status ParseSampling(const openai_body::In& body, std::string_view body_text,
                           OpenAiCall* call);
// logprobs (completions: a count; chat: a flag and top_logprobs).
absl::Status ParseLogprobs(const openai_body::In& body, OpenAiCall* call);
// Parameters with no counterpart here: refused unless neutral (absent, null, empty, or the
// value that asks for nothing), so a client never believes it got what it asked for.
absl::Status RefuseUnsupported(const openai_body::In& body, OpenAiEndpoint endpoint);

}  // namespace thetaserve::server
