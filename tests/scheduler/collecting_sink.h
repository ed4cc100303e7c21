// A TokenSink for engine tests: collects one request's output; thread-safe to wait on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/engine.h"

namespace thetaserve::scheduler {

class CollectingSink : public TokenSink {
 public:
  void OnTokens(const TokenDelta& d) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    text += d.text;
    logprobs.insert(logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.prompt) {
      ++prompt_deliveries;
      prompt_token_ids = d.prompt->token_ids;
      prompt_logprobs = d.prompt->logprobs;
      prompt_top = d.prompt->top;
      prompt_ranks = d.prompt->ranks;
    }
    count_.store(static_cast<int>(tokens.size()));
  }
  void OnFinish(const FinishInfo& i) override {
    std::lock_guard<std::mutex> lock(mu_);
    info = i;
    finished = true;
    cv_.notify_all();
  }
  bool Wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return finished; });
  }
  int count() const { return count_.load(); }

  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;  // when the request asked for them
  // Request::prompt_logprobs: what the first delta brought, and how many deltas brought any.
  std::vector<int32_t> prompt_token_ids;
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> prompt_top;
  std::vector<int32_t> prompt_ranks;
  int prompt_deliveries = 0;
  FinishInfo info;
  bool finished = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> count_{0};
};

}  // namespace thetaserve::scheduler
