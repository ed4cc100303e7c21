// Chat's tools and tool_choice (OpenAI's function calling, forced): a named function or
// "required" guides the output to the call's JSON. Part of ParseSampling (openai_params.cc).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/openai_api.h"
#include "server/openai_body.h"

namespace thetaserve::server {

// tool_choice naming a function or "required": the output guided to the call's JSON
// (OpenAiCall::tool_calls). `other_guide`: another guide given, if any; response_format's
// gives way (it shapes a text answer, and a called function gives none). `body_text` is the
// body as sent (the parameters' schemas are taken from it with their keys in their order).
absl::Status ParseToolCalls(const openai_body::In& body, std::string_view body_text,
                            OpenAiCall* call, const std::string& other_guide);

}  // namespace thetaserve::server
