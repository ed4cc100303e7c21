#include "tests/server/e2e_util.h"

#include <array>
#include <chrono>
#include <cstdio>

#include "tests/test_util.h"

namespace thetaserve::testing {

StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                      double timeout_s, const std::string& api_key) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  auto reader = stub.Generate(&ctx, req);
  StreamResult out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      out.text += resp.chunk().text();
      out.ids.insert(out.ids.end(), resp.chunk().token_ids().begin(),
                     resp.chunk().token_ids().end());
      ++out.chunks;
    } else {
      out.complete = resp.complete();
    }
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest Prompt(const std::string& text, int max_tokens, float temperature) {
  v1::GenerateRequest req;
  req.set_prompt(text);
  req.mutable_sampling()->set_temperature(temperature);
  req.mutable_stopping()->set_max_tokens(max_tokens);
  return req;
}

v1::TokenizeResponse TokenizeRpc(v1::Generation::Stub& stub, const v1::TokenizeRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::TokenizeResponse resp;
  const grpc::Status status = stub.Tokenize(&ctx, req, &resp);
  if (!status.ok()) {
    ADD_FAILURE() << "Tokenize failed: " << status.error_message();
    return v1::TokenizeResponse();
  }
  return resp;
}

std::vector<uint32_t> TokenIds(v1::Generation::Stub& stub, const std::string& text,
                               std::optional<bool> add_special_tokens) {
  v1::TokenizeRequest req;
  req.set_text(text);
  if (add_special_tokens) req.set_add_special_tokens(*add_special_tokens);
  return TokenIds(TokenizeRpc(stub, req));
}

std::vector<uint32_t> TokenIds(const v1::TokenizeResponse& response) {
  return std::vector<uint32_t>(response.ids().begin(), response.ids().end());
}

std::string RunCommand(const std::string& cmd, int* rc) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  if (rc) *rc = status;
  return out;
}

std::string RunGenerateBinary(const std::string& args) {
  return RunCommand(BinaryPath() + " generate --model " + DefaultModelPath() + " " + args +
                    " 2>/dev/null");
}

}  // namespace thetaserve::testing
