// `thetaserve status`: one line of a server's GetServerStatus (running, waiting, pages).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::server {

int RunStatus(const std::vector<std::string>& argv) {
  CliArgs args;
  if (auto exit = ParseCommandLine(
          "status", argv, {{"addr", true}, {"api-key", true}},
          "usage: thetaserve status [--addr HOST:PORT] [--api-key KEY]\n", &args)) {
    return *exit;
  }
  const std::string addr = args.GetString("addr", "localhost:50051");
  if (absl::Status st = CheckAddressFlag(addr); !st.ok()) {
    return ReportFailure("status", st, kExitUsage);
  }
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (args.Has("api-key")) ctx.AddMetadata("authorization", "Bearer " + args.GetString("api-key"));
  v1::ServerStatus st;
  grpc::Status s = stub->GetServerStatus(&ctx, {}, &st);
  if (!s.ok()) {
    std::fprintf(stderr, "thetaserve status: %s: %s\n",
                 absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())).c_str(),
                 s.error_message().c_str());
    return kExitFailed;
  }
  std::printf("running %u waiting %u pages_total %llu used_k %llu used_v %llu free %llu "
              "preemptions %llu draining %d cached %llu prefix_hit_tokens %llu "
              "prefix_query_tokens %llu host_pages_total %llu host_pages_used %llu\n",
              st.running(), st.waiting(), (unsigned long long)st.pages().total(),
              (unsigned long long)st.pages().used_k(), (unsigned long long)st.pages().used_v(),
              (unsigned long long)st.pages().free(), (unsigned long long)st.preemptions(),
              st.draining() ? 1 : 0, (unsigned long long)st.pages().cached(),
              (unsigned long long)st.prefix_cache_hit_tokens(),
              (unsigned long long)st.prefix_cache_query_tokens(),
              (unsigned long long)st.host_pages_total(), (unsigned long long)st.host_pages_used());
  return 0;
}

}  // namespace thetaserve::server
