#include "server/service_sink.h"

#include "server/generation_service.h"
#include "server/request_log.h"

namespace thetaserve::server {

void ServiceSink::OnTokens(const scheduler::TokenDelta& delta) {
  const auto now = std::chrono::steady_clock::now();
  if (last_tokens_ && service_->metrics()) {
    service_->metrics()->OnInterTokenLatency(
        std::chrono::duration<double>(now - *last_tokens_).count());
  }
  last_tokens_ = now;
  Deliver(delta);
}

void ServiceSink::OnFinish(const scheduler::FinishInfo& info) {
  if (service_->metrics()) service_->metrics()->OnFinish(info);
  if (service_->options().log_requests) {
    WriteLogLine(RequestLogLine(api(), request_id_, info));
  }
  service_->Untrack(request_id_);
  for (const auto& group : groups_) {
    const int others_left = group->left.fetch_sub(1) - 1;
    if (others_left == 0) {
      service_->Untrack(group->id);
    } else if (Failed(info)) {
      service_->engine().Cancel(group->id,
                                absl::CancelledError("another completion of the request failed"));
    }
  }
  Finish(info);
}

}  // namespace thetaserve::server
