// One Generate call: the reactor gRPC drives, and the sink the engine pushes into.
//
// Lifetimes: the reactor deletes itself in OnDone; the engine may still hold the sinks after
// that, so the StreamSink outlives the reactor and forgets it on Detach. All reactor calls
// (StartWrite, Finish) are made without holding the sink's lock.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "scheduler/request.h"
#include "server/service_sink.h"
#include "thetaserve/v1/generation.pb.h"

namespace thetaserve::server {

class GenerationService;
class GenerateStream;

// One Generate stream's output: what its completions' sinks push, in order, and the stream's
// end once every completion has finished (or at the first that failed).
class StreamSink {
 public:
  // request_id: the client's, for Complete messages; n: the completions.
  StreamSink(std::string request_id, int n)
      : request_id_(std::move(request_id)), left_(n), open_(n, nullptr) {}

  void Attach(GenerateStream* stream);
  void Detach();
  // gRPC thread: the previous write completed.
  void WriteDone(bool ok);

  // Engine thread.
  void Deliver(int index, const scheduler::TokenDelta& delta);
  void Finish(int index, const scheduler::FinishInfo& info);

 private:
  // Starts the next write or the Finish, if one is due. Call without holding mu_.
  void Pump();

  const std::string request_id_;
  std::mutex mu_;
  int left_;                                         // completions not finished; guarded by mu_
  // Per completion, its last queued chunk while no later message of it is queued (where its
  // next tokens merge when the client reads slower than the engine); guarded by mu_.
  std::vector<v1::Chunk*> open_;
  // The first completion that failed: the stream ends with its status once the others, which
  // it cancels, have finished; what they send meanwhile is dropped. Guarded by mu_.
  std::optional<grpc::Status> failed_;
  GenerateStream* stream_ = nullptr;                 // guarded by mu_
  std::deque<v1::GenerateResponse> queue_;           // guarded by mu_
  grpc::ByteBuffer in_flight_;                       // owned by the write in flight
  bool writing_ = false;                             // guarded by mu_
  std::optional<grpc::Status> final_status_;         // guarded by mu_
  bool finish_started_ = false;                      // guarded by mu_
  bool broken_ = false;                              // a write failed; guarded by mu_
};

// The engine's sink for completion `index` of a stream.
class ChoiceSink : public ServiceSink {
 public:
  ChoiceSink(GenerationService* service, std::string request_id,
             std::shared_ptr<StreamSink> stream, int index)
      : ServiceSink(service, std::move(request_id)), stream_(std::move(stream)), index_(index) {}

 private:
  const char* api() const override { return "grpc"; }
  void Deliver(const scheduler::TokenDelta& delta) override { stream_->Deliver(index_, delta); }
  void Finish(const scheduler::FinishInfo& info) override { stream_->Finish(index_, info); }

  std::shared_ptr<StreamSink> stream_;
  const int index_;
};

class GenerateStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateStream(GenerationService* service, std::shared_ptr<StreamSink> sink,
                 std::string request_id);
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  GenerationService* service_;
  std::shared_ptr<StreamSink> sink_;
  std::string request_id_;
};

}  // namespace thetaserve::server
