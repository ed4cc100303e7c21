#include "server/generate_stream.h"

#include <algorithm>

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

// ranks: [token] (prompt tokens), or empty.
void AddLogprobs(const std::vector<float>& logprobs,
                 const std::vector<std::vector<std::pair<int32_t, float>>>& top,
                 const std::vector<int32_t>& ranks,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out) {
  for (size_t i = 0; i < logprobs.size(); ++i) {
    v1::TokenLogprobs* lp = out->Add();
    lp->set_logprob(logprobs[i]);
    if (i < ranks.size()) lp->set_rank(static_cast<uint32_t>(ranks[i]));
    for (const auto& [id, logprob] : top[i]) {
      v1::TopLogprob* t = lp->add_top();
      t->set_token_id(static_cast<uint32_t>(id));
      t->set_logprob(logprob);
    }
  }
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

void StreamSink::Deliver(int index, const scheduler::TokenDelta& delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    if (delta.prompt) {
      open_[index] = nullptr;  // the scores come before the tokens
      const scheduler::PromptScores& s = *delta.prompt;
      v1::PromptLogprobs* p = queue_.emplace_back().mutable_prompt_logprobs();
      for (int32_t id : s.token_ids) p->add_token_ids(static_cast<uint32_t>(id));
      AddLogprobs(s.logprobs, s.top, s.ranks, p->mutable_logprobs());
    }
    // A delta of the prompt's scores alone (max_tokens = 0) has no chunk.
    if (!delta.token_ids.empty()) {
      // Coalesce into the completion's queued chunk when the client is slower than the
      // engine (a deque's elements stay put while others are added or the front removed).
      v1::Chunk*& chunk = open_[index];
      if (chunk == nullptr) {
        chunk = queue_.emplace_back().mutable_chunk();
        chunk->set_index(uint32_t(index));
      }
      for (int32_t id : delta.token_ids) chunk->add_token_ids(static_cast<uint32_t>(id));
      chunk->mutable_text()->append(delta.text);
      AddLogprobs(delta.logprobs, delta.top, {}, chunk->mutable_logprobs());
    }
  }
  Pump();
}

void StreamSink::Finish(int index, const scheduler::FinishInfo& info) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --left_;
    open_[index] = nullptr;
    // Cancellations (Abort, client gone) end with a Complete message; deadline, shutdown and
    // errors end the stream with their gRPC status (the first such, once every completion
    // has finished).
    if (failed_) {
      // The stream already ends with an error.
    } else if (!Failed(info)) {
      v1::GenerateResponse resp;
      v1::Complete* c = resp.mutable_complete();
      c->set_finish_reason(ToProto(info.reason));
      c->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(info.prompt_tokens));
      c->mutable_usage()->set_completion_tokens(static_cast<uint32_t>(info.completion_tokens));
      c->mutable_timings()->set_queue_seconds(info.queue_seconds);
      if (info.has_ttft()) c->mutable_timings()->set_time_to_first_token_seconds(info.ttft_seconds);
      c->mutable_timings()->set_total_seconds(info.total_seconds);
      c->set_request_id(request_id_);
      c->set_preemptions(static_cast<uint32_t>(info.preemptions));
      c->set_index(uint32_t(index));
      queue_.push_back(std::move(resp));
    } else {
      failed_ = ToGrpcStatus(info.status);
    }
    if (left_ == 0) final_status_ = failed_ ? *failed_ : grpc::Status::OK;
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
    if (broken_) {
      queue_.clear();
      std::fill(open_.begin(), open_.end(), nullptr);
    }
    if (!queue_.empty()) {
      bool own_buffer;
      in_flight_.Clear();  // the serializer wants an empty buffer
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::GenerateResponse>(
          queue_.front(), &in_flight_, &own_buffer);
      if (queue_.front().has_chunk()) {
        v1::Chunk*& open = open_[queue_.front().chunk().index()];
        if (open == queue_.front().mutable_chunk()) open = nullptr;
      }
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
  sink_->Detach();
  delete this;
}

}  // namespace thetaserve::server
