// One Generate call: the reactor gRPC drives, and the sink the engine pushes into.
//
// Lifetimes: the reactor deletes itself in OnDone; the engine may still hold the sink after
// that, so the sink outlives the reactor and forgets it on Detach. All reactor calls
// (StartWrite, Finish) are made without holding the sink's lock.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "grpcpp/grpcpp.h"
#include "scheduler/request.h"
#include "server/service_sink.h"
#include "thetaserve/v1/generation.pb.h"

namespace thetaserve::server {

class GenerationService;
class GenerateStream;

class StreamSink : public ServiceSink {
 public:
  using ServiceSink::ServiceSink;

  void Attach(GenerateStream* stream);
  void Detach();
  // gRPC thread: the previous write completed.
  void WriteDone(bool ok);

 private:
  // Engine thread.
  void Deliver(const scheduler::TokenDelta& delta) override;
  void Finish(const scheduler::FinishInfo& info) override;
  // Starts the next write or the Finish, if one is due. Call without holding mu_.
  void Pump();

  std::mutex mu_;
  GenerateStream* stream_ = nullptr;                 // guarded by mu_
  std::deque<v1::GenerateResponse> queue_;           // guarded by mu_
  grpc::ByteBuffer in_flight_;                       // owned by the write in flight
  bool writing_ = false;                             // guarded by mu_
  std::optional<grpc::Status> final_status_;         // guarded by mu_
  bool finish_started_ = false;                      // guarded by mu_
  bool broken_ = false;                              // a write failed; guarded by mu_
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
