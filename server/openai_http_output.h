// One OpenAI-compatible HTTP call's output on its way from the engine to the handler thread
// (openai_http.cc): HttpOutput holds what each of the call's n completions has delivered,
// pushed by the engine thread through the completion's HttpChoiceSink and taken by the
// handler; SharedPromptScores passes a prompt's scores to every choice of that prompt.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/request.h"
#include "server/service_sink.h"

namespace thetaserve::server {

// One call's output, for its n completions. Thread-safe: Deliver and Finish on the engine
// thread, Take on the handler thread.
class HttpOutput {
 public:
  explicit HttpOutput(int n) : choices_(n) {}

  struct Taken {
    scheduler::TokenDelta delta;
    // Set once the completion has finished and its last tokens were taken (then or before).
    std::optional<scheduler::FinishInfo> finish;
    bool finished_now = false;  // finish was set by this Take
  };

  // Waits up to `timeout` for output of any completion; moves what came into (*taken)[i].
  void Take(std::chrono::milliseconds timeout, std::vector<Taken>* taken);
  void Deliver(int index, const scheduler::TokenDelta& d);
  void Finish(int index, const scheduler::FinishInfo& info);

 private:
  struct Choice {
    scheduler::TokenDelta pending;
    std::optional<scheduler::FinishInfo> finish;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Choice> choices_;  // guarded by mu_
  bool news_ = false;            // guarded by mu_
};

// The prompt's scores (echo, prompt_logprobs) with n > 1: only the first completion of each
// prompt scores it (SplitChoices), but every choice carries them, as vLLM's do. Each other
// choice's output, and its end, are held until the first's scores have come, then go on with
// a copy of them; only if the first completion ends without scores (cancelled before its
// first delta), or the choice itself fails, does it go on without. Completions only (a chat
// response carries the scores once, from choice 0). Handler thread only.
class SharedPromptScores {
 public:
  SharedPromptScores(int choices, int per_prompt)
      : per_prompt_(per_prompt), scores_(choices / per_prompt), held_(choices),
        given_(choices, false) {}

  void Share(std::vector<HttpOutput::Taken>& taken);

 private:
  size_t per_prompt_;
  std::vector<std::shared_ptr<const scheduler::PromptScores>> scores_;  // [prompt]
  std::vector<scheduler::TokenDelta> held_;                   // [choice]
  std::vector<bool> given_;                                   // [choice]: scores passed on
};

// Completion `index` of a call: its output goes into the call's HttpOutput.
class HttpChoiceSink : public ServiceSink {
 public:
  HttpChoiceSink(GenerationService* service, std::string request_id,
                 std::shared_ptr<HttpOutput> output, int index)
      : ServiceSink(service, std::move(request_id)), output_(std::move(output)), index_(index) {}

 private:
  const char* api() const override { return "http"; }
  void Deliver(const scheduler::TokenDelta& d) override { output_->Deliver(index_, d); }
  void Finish(const scheduler::FinishInfo& info) override { output_->Finish(index_, info); }

  std::shared_ptr<HttpOutput> output_;
  const int index_;
};

// The first completion that failed (not finished, not cancelled), or null.
const scheduler::FinishInfo* FirstFailure(const std::vector<HttpOutput::Taken>& taken);

}  // namespace thetaserve::server
