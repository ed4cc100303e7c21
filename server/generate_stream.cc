#include "server/generate_stream.h"

#include "grpcpp/support/proto_buffer_writer.h"
#include "server/generation_service.h"

namespace thetaserve::server {
namespace {

v1::FinishReason ToProto(scheduler::FinishReason r) {
  switch (r) {
    case scheduler::FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case scheduler::FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case scheduler::FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case scheduler::FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case scheduler::FinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

void StreamSink::Attach(GenerateStream* stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = stream;
  }
  Pump();
}

void StreamSink::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  stream_ = nullptr;
}

bool StreamSink::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return left_ == 0;
}

void StreamSink::Deliver(int index, const scheduler::TokenDelta& delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Coalesce into the last queued chunk (of the same completion) when the client is slower
    // than the engine.
    v1::Chunk* chunk;
    if (!queue_.empty() && queue_.back().has_chunk() &&
        queue_.back().chunk().index() == uint32_t(index)) {
      chunk = queue_.back().mutable_chunk();
    } else {
      queue_.emplace_back();
      chunk = queue_.back().mutable_chunk();
      chunk->set_index(uint32_t(index));
    }
    for (int32_t id : delta.token_ids) chunk->add_token_ids(static_cast<uint32_t>(id));
    chunk->mutable_text()->append(delta.text);
    for (size_t i = 0; i < delta.logprobs.size(); ++i) {
      auto* lp = chunk->add_logprobs();
      lp->set_logprob(delta.logprobs[i]);
      for (const auto& [id, logprob] : delta.top[i]) {
        auto* t = lp->add_top();
        t->set_token_id(static_cast<uint32_t>(id));
        t->set_logprob(logprob);
      }
    }
  }
  Pump();
}

void StreamSink::Finish(int index, const scheduler::FinishInfo& info) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --left_;
    // Cancellations (Abort, client gone) end with a Complete message; deadline, shutdown and
    // errors end the stream with their gRPC status (the first such; the stream's end cancels
    // the other completions).
    if (final_status_) {
      // The stream already ends with an error.
    } else if (info.status.ok() || absl::IsCancelled(info.status)) {
      v1::GenerateResponse resp;
      v1::Complete* c = resp.mutable_complete();
      c->set_finish_reason(ToProto(info.reason));
      c->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(info.prompt_tokens));
      c->mutable_usage()->set_completion_tokens(static_cast<uint32_t>(info.completion_tokens));
      c->mutable_timings()->set_queue_seconds(info.queue_seconds);
      c->mutable_timings()->set_time_to_first_token_seconds(info.ttft_seconds);
      c->mutable_timings()->set_total_seconds(info.total_seconds);
      c->set_request_id(request_id_);
      c->set_preemptions(static_cast<uint32_t>(info.preemptions));
      c->set_index(uint32_t(index));
      queue_.push_back(std::move(resp));
      if (left_ == 0) final_status_ = grpc::Status::OK;
    } else {
      final_status_ = ToGrpcStatus(info.status);
    }
  }
  Pump();
}

void StreamSink::WriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    // The client is gone: drop what is queued, and Finish as soon as the engine has let the
    // request go (gRPC calls OnDone only after Finish).
    if (!ok) broken_ = true;
  }
  Pump();
}

void StreamSink::Pump() {
  GenerateStream* stream = nullptr;
  bool write = false;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == nullptr || writing_ || finish_started_) return;
    if (broken_) queue_.clear();
    if (!queue_.empty()) {
      bool own_buffer;
      in_flight_.Clear();  // the serializer wants an empty buffer
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::GenerateResponse>(
          queue_.front(), &in_flight_, &own_buffer);
      queue_.pop_front();
      writing_ = true;
      write = true;
    } else if (final_status_) {
      finish_started_ = true;
      status = *final_status_;
    } else {
      return;
    }
    stream = stream_;
  }
  if (write) {
    stream->StartWrite(&in_flight_);
  } else {
    stream->Finish(status);
  }
}

GenerateStream::GenerateStream(GenerationService* service, std::shared_ptr<StreamSink> sink,
                               std::string request_id)
    : service_(service), sink_(std::move(sink)), request_id_(std::move(request_id)) {
  sink_->Attach(this);
}

void GenerateStream::OnWriteDone(bool ok) {
  if (!ok) {
    service_->engine().Cancel(request_id_, absl::CancelledError("the client went away"));
  }
  sink_->WriteDone(ok);
}

void GenerateStream::OnCancel() {
  // Client cancelled, disconnected, or its deadline passed: free the pages at the next step.
  service_->engine().Cancel(request_id_, absl::CancelledError("cancelled by the client"));
}

void GenerateStream::OnDone() {
  // A completion failed and ended the stream: the others go too.
  if (!sink_->done()) {
    service_->engine().Cancel(request_id_, absl::CancelledError("the stream ended"));
  }
  sink_->Detach();
  delete this;
}

}  // namespace thetaserve::server
