// `thetaserve client`: streams one completion from a running server to stdout.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve client --addr HOST:PORT --prompt TEXT [flags]\n"
    "  --chat                 send the prompt as a user chat message\n"
    "  --max-tokens N         (default 64)\n"
    "  --temperature T        (default 0 = greedy)  --top-p P --top-k K --seed S\n"
    "  --stop TEXT            a stop string\n"
    "  --api-key KEY          sent as 'authorization: Bearer KEY'\n"
    "  --tls-ca FILE          connect with TLS, trusting this CA\n"
    "  --timeout SECONDS      deadline for the call\n";

const char* ReasonName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_EOS: return "eos";
    case v1::FINISH_REASON_CANCELLED: return "cancelled";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

}  // namespace

int RunClient(const std::vector<std::string>& argv) {
  auto args = CliArgs::Parse(
      argv, {{"addr", true}, {"prompt", true}, {"chat", false}, {"max-tokens", true},
             {"temperature", true}, {"top-p", true}, {"top-k", true}, {"seed", true},
             {"stop", true}, {"api-key", true}, {"tls-ca", true}, {"timeout", true},
             {"help", false}});
  if (!args.ok() || args->Has("help") || !args->Has("prompt")) {
    if (!args.ok()) std::fprintf(stderr, "thetaserve client: %s\n", args.status().ToString().c_str());
    std::fprintf(stderr, "%s", kUsage);
    return args.ok() && args->Has("help") ? 0 : 2;
  }
  auto max_tokens = args->GetInt("max-tokens", 64);
  auto temperature = args->GetDouble("temperature", 0);
  auto top_p = args->GetDouble("top-p", 1);
  auto top_k = args->GetInt("top-k", 0);
  auto seed = args->GetInt("seed", -1);
  auto timeout = args->GetDouble("timeout", 0);
  for (const absl::Status& st : {max_tokens.status(), temperature.status(), top_p.status(),
                                 top_k.status(), seed.status(), timeout.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "thetaserve client: %s\n", std::string(st.message()).c_str());
      return 2;
    }
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (args->Has("tls-ca")) {
    std::ifstream in(args->GetString("tls-ca"));
    std::stringstream ss;
    ss << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(args->GetString("addr", "localhost:50051"), creds);
  auto stub = v1::Generation::NewStub(channel);

  v1::GenerateRequest req;
  if (args->Has("chat")) {
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(args->GetString("prompt"));
  } else {
    req.set_prompt(args->GetString("prompt"));
  }
  req.mutable_sampling()->set_temperature(static_cast<float>(*temperature));
  req.mutable_sampling()->set_top_p(static_cast<float>(*top_p));
  req.mutable_sampling()->set_top_k(static_cast<int32_t>(*top_k));
  if (*seed >= 0) req.mutable_sampling()->set_seed(static_cast<uint64_t>(*seed));
  req.mutable_stopping()->set_max_tokens(static_cast<uint32_t>(*max_tokens));
  if (args->Has("stop")) req.mutable_stopping()->add_stop(args->GetString("stop"));

  grpc::ClientContext ctx;
  if (args->Has("api-key")) ctx.AddMetadata("authorization", "Bearer " + args->GetString("api-key"));
  if (*timeout > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  }
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  v1::Complete complete;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      std::fwrite(resp.chunk().text().data(), 1, resp.chunk().text().size(), stdout);
      std::fflush(stdout);
    } else if (resp.has_complete()) {
      complete = resp.complete();
    }
  }
  grpc::Status status = reader->Finish();
  std::fputc('\n', stdout);
  if (!status.ok()) {
    std::fprintf(stderr, "thetaserve client: %s: %s\n",
                 status.error_code() == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE" : "error",
                 status.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "finish: %s, prompt %u tokens, completion %u tokens, ttft %.3f s, total %.3f s\n",
               ReasonName(complete.finish_reason()), complete.usage().prompt_tokens(),
               complete.usage().completion_tokens(), complete.timings().time_to_first_token_seconds(),
               complete.timings().total_seconds());
  return 0;
}

}  // namespace thetaserve::server
