// What the OpenAI-compatible API's tests share (openai_api_*_test.cc): a body parsed for each
// endpoint, a check that it is refused with given words, and a fixture holding the real SmolLM2
// model (its tokenizer renders the log-probabilities' tokens) with engine output to render.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "scheduler/request.h"
#include "server/openai_api.h"
#include "tests/test_util.h"

namespace thetaserve::testing {

using OrderedJson = nlohmann::ordered_json;  // the API's bodies keep their order
inline constexpr char kServed[] = "SmolLM2-135M-Instruct.Q4_1";

inline absl::StatusOr<server::OpenAiCall> Completion(const std::string& body) {
  return server::ParseOpenAiRequest(body, server::OpenAiEndpoint::kCompletions, kServed);
}
inline absl::StatusOr<server::OpenAiCall> Chat(const std::string& body) {
  return server::ParseOpenAiRequest(body, server::OpenAiEndpoint::kChatCompletions, kServed);
}

// The status is INVALID_ARGUMENT and its message contains `words`.
inline ::testing::AssertionResult RefusedWith(const absl::StatusOr<server::OpenAiCall>& call,
                                              const std::string& words) {
  if (call.ok()) return ::testing::AssertionFailure() << "accepted";
  if (call.status().code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << call.status();
  }
  if (std::string(call.status().message()).find(words) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << call.status().message()
                                         << "' lacks '" << words << "'";
  }
  return ::testing::AssertionSuccess();
}

class OpenAiResponseTest : public ::testing::Test {
 protected:
  // Nothing fails here (LoadSuiteModel says why): each test's SetUp does.
  static void SetUpTestSuite() { model_ = LoadSuiteModel(&load_error_); }
  void SetUp() override { ASSERT_NE(model_, nullptr) << load_error_; }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  // Two deltas: " Paris" (with its top two) and "." — ids from the real tokenizer.
  static std::vector<scheduler::TokenDelta> Deltas() {
    const auto& tok = model_->tokenizer();
    const int32_t paris = tok.Encode(" Paris", false, false).at(0);
    const int32_t dot = tok.Encode(".", false, false).at(0);
    scheduler::TokenDelta a, b;
    a.token_ids = {paris};
    a.text = std::string(" Paris");  // (assigning a literal sets off GCC 12's false -Wrestrict)
    a.logprobs = {-0.25f};
    a.top = {{{paris, -0.25f}, {dot, -2.0f}}};
    b.token_ids = {dot};
    b.text = std::string(".");
    b.logprobs = {-std::numeric_limits<float>::infinity()};
    b.top = {{{dot, -std::numeric_limits<float>::infinity()}, {paris, -3.0f}}};
    return {a, b};
  }
  static scheduler::FinishInfo Finished(scheduler::FinishReason reason) {
    scheduler::FinishInfo f;
    f.reason = reason;
    f.prompt_tokens = 5;
    f.completion_tokens = 2;
    return f;
  }
  inline static model::Model* model_ = nullptr;
  inline static std::string load_error_;
};

}  // namespace thetaserve::testing
