// What every front end's TokenSink does for the service, whatever it then does with the output:
// inter-token latency and the finished request's metrics, and forgetting the request's id
// (Abort's "found", duplicate detection). gRPC's StreamSink and the HTTP API's sink derive
// from it and implement Deliver and Finish.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/request.h"

namespace thetaserve::server {

class GenerationService;

// Whether a request ended by failing: not finished, not cancelled (an Abort, a client gone).
inline bool Failed(const scheduler::FinishInfo& info) {
  return !info.status.ok() && !absl::IsCancelled(info.status);
}

// The n completions of one request, or the requests of one call with several prompts: its id
// stays in flight until the last of them finishes.
struct ChoiceGroup {
  ChoiceGroup(std::string group_id, int n) : id(std::move(group_id)), left(n) {}
  const std::string id;
  std::atomic<int> left;
};

class ServiceSink : public scheduler::TokenSink {
 public:
  ServiceSink(GenerationService* service, std::string request_id)
      : service_(service), request_id_(std::move(request_id)) {}

  // Before submission: this sink's request is one of a group's completions, or one of a
  // call's prompts (or both: a completion of one of the prompts).
  void JoinGroup(std::shared_ptr<ChoiceGroup> group) { groups_.push_back(std::move(group)); }

  // Engine thread: records, then hands on to Deliver / Finish. A completion of a group that
  // fails cancels the others still running or waiting (before the front end, which ends the
  // call once all have finished, tells the client).
  void OnTokens(const scheduler::TokenDelta& delta) final;
  void OnFinish(const scheduler::FinishInfo& info) final;

 protected:
  // Which front end: "grpc" or "http" (the request log's api=).
  virtual const char* api() const = 0;
  // Engine thread; must not block, as TokenSink's callbacks.
  virtual void Deliver(const scheduler::TokenDelta& delta) = 0;
  virtual void Finish(const scheduler::FinishInfo& info) = 0;

  GenerationService* service_;
  const std::string request_id_;

 private:
  std::optional<std::chrono::steady_clock::time_point> last_tokens_;  // engine thread
  std::vector<std::shared_ptr<ChoiceGroup>> groups_;  // none: a request of its own
};

}  // namespace thetaserve::server
