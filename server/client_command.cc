// `thetaserve client`: streams one completion from a running server to stdout.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_regex.h"
#include "scheduler/guided_schema.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/validation.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve client --prompt TEXT [flags]\n"
    "  --addr HOST:PORT       the server (default localhost:50051)\n"
    "  --chat                 send the prompt as a user chat message\n"
    "  --max-tokens N         (default 64)\n"
    "  --temperature T        (default 0 = greedy)  --top-p P --top-k K --seed S\n"
    "  --stop TEXT            a stop string\n"
    "  --min-tokens N         no EOS or stop before N tokens  --ignore-eos\n"
    "  --special-tokens       write special tokens (<|im_end|>, ...) into the text\n"
    "                         (skip_special_tokens false)\n"
    "  --logit-bias ID:B,...  add B (in [-100, 100]) to token ID's logit\n"
    "  --n N                  N completions of the prompt (printed one after another)\n"
    "  --guided-regex RE      the output matches RE whole (Python's re syntax)\n"
    "  --guided-json SCHEMA   the output is JSON the JSON schema describes (@FILE: read it)\n"
    "  --json-object          the output is one JSON object\n"
    "  --guided-grammar G     the output is text the GBNF grammar G matches, its rule root\n"
    "                         (@FILE: read it); one guide at most\n"
    "  --priority N           lower goes first (a server run with --scheduling-policy\n"
    "                         priority; another refuses any but 0)\n"
    "  --api-key KEY          sent as 'authorization: Bearer KEY' (or THETASERVE_API_KEY)\n"
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

// "ID:BIAS,ID:BIAS" (empty: none). The server checks the ids; the range is checked as it does.
absl::StatusOr<std::vector<std::pair<uint32_t, float>>> ParseLogitBias(const std::string& text) {
  std::vector<std::pair<uint32_t, float>> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    uint32_t token;
    float bias;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &token) ||
        !absl::SimpleAtof(parts[1], &bias)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--logit-bias takes TOKEN_ID:BIAS pairs separated by commas, not '", item, "'"));
    }
    out.push_back({token, bias});
  }
  return out;
}

// --guided-regex, --guided-json, --json-object, --guided-grammar into the request's sampling,
// each checked as the server checks it (its message naming the flag); a schema or grammar
// "@FILE" is read from the file (a pattern is taken as it is: '@' begins many); NotFound: a
// file that cannot be read.
absl::Status SetGuide(const CliArgs& args, v1::SamplingParams* sp) {
  auto text = [&](const std::string& flag) -> absl::StatusOr<std::string> {
    const std::string value = args.GetString(flag);
    if (flag == "guided-regex" || !value.starts_with("@")) return value;
    const std::string path = value.substr(1);
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) {
      return absl::NotFoundError(absl::StrCat("cannot read --", flag, " ", value, ": not a file"));
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --", flag, " ", value));
    return ss.str();
  };
  int guides = 0;
  for (const char* flag : {"guided-regex", "guided-json", "json-object", "guided-grammar"}) {
    guides += args.Has(flag);
  }
  if (guides > 1) {
    return absl::InvalidArgumentError(
        "--guided-regex, --guided-json, --json-object and --guided-grammar: give one");
  }
  sp->set_json_object(args.Has("json-object"));
  for (const auto& [flag, field] :
       {std::pair<const char*, const char*>{"guided-regex", "guided_regex"},
        {"guided-json", "guided_json"},
        {"guided-grammar", "guided_grammar"}}) {
    if (!args.Has(flag)) continue;
    auto value = text(flag);
    if (!value.ok()) return value.status();
    if (value->empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
    absl::Status checked;
    if (std::string_view(flag) == "guided-regex") {
      sp->set_guided_regex(*value);
      checked = scheduler::RegexGuide::Compile(*value).status();
    } else if (std::string_view(flag) == "guided-json") {
      sp->set_guided_json(*value);
      checked = scheduler::CompileJsonSchema(*value).status();
    } else {
      sp->set_guided_grammar(*value);
      checked = scheduler::GrammarGuide::Compile(*value).status();
    }
    if (!checked.ok()) {  // "guided_grammar: ..." or "guided_grammar has ..."
      std::string message(checked.message());
      if (message.starts_with(field)) message.replace(0, strlen(field), absl::StrCat("--", flag));
      return absl::InvalidArgumentError(message);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunClient(const std::vector<std::string>& argv) {
  const std::map<std::string, bool> known = {
      {"addr", true},        {"prompt", true},     {"chat", false},       {"max-tokens", true},
      {"temperature", true}, {"top-p", true},      {"top-k", true},       {"seed", true},
      {"stop", true},        {"api-key", true},    {"tls-ca", true},      {"timeout", true},
      {"min-tokens", true},  {"ignore-eos", false}, {"logit-bias", true}, {"n", true},
      {"priority", true},    {"special-tokens", false}, {"guided-regex", true},
      {"guided-json", true}, {"json-object", false}, {"guided-grammar", true}};
  CliArgs args;
  if (auto exit = ParseCommandLine("client", argv, known, kUsage, &args)) return *exit;
  auto usage = [](const absl::Status& st) { return ReportFailure("client", st, kExitUsage); };
  if (!args.Has("prompt")) return usage(absl::InvalidArgumentError("--prompt is required"));
  // Passed on as the proto's fields: out of their types' range is refused here, not wrapped.
  constexpr int64_t kU32 = std::numeric_limits<uint32_t>::max();
  auto max_tokens = args.GetInt("max-tokens", 64, 1, kU32);  // 0 only scores a prompt
  auto temperature = args.GetDouble("temperature", 0);
  auto top_p = args.GetDouble("top-p", 1);
  auto top_k = args.GetInt("top-k", 0, -kMaxCountFlag - 1, kMaxCountFlag);
  auto seed = args.GetUint64("seed");
  auto timeout = args.GetDouble("timeout", 0, 0, 86400);  // 0 = no deadline
  auto min_tokens = args.GetInt("min-tokens", 0, 0, kU32);
  auto n = args.GetInt("n", 1, 1, kMaxChoices);  // the server's limit, before any output
  auto priority = args.GetInt("priority", 0);
  auto bias = ParseLogitBias(args.GetString("logit-bias"));
  for (const absl::Status& st : {max_tokens.status(), temperature.status(), top_p.status(),
                                 top_k.status(), seed.status(), timeout.status(),
                                 min_tokens.status(), n.status(), priority.status(),
                                 bias.status()}) {
    if (!st.ok()) return usage(st);
  }
  v1::GenerateRequest req;
  if (args.Has("chat")) {
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(args.GetString("prompt"));
  } else {
    req.set_prompt(args.GetString("prompt"));
  }
  req.mutable_sampling()->set_temperature(static_cast<float>(*temperature));
  req.mutable_sampling()->set_top_p(static_cast<float>(*top_p));
  req.mutable_sampling()->set_top_k(static_cast<int32_t>(*top_k));
  if (*seed) req.mutable_sampling()->set_seed(**seed);
  req.mutable_stopping()->set_max_tokens(static_cast<uint32_t>(*max_tokens));
  if (args.Has("stop")) req.mutable_stopping()->add_stop(args.GetString("stop"));
  req.mutable_stopping()->set_min_tokens(static_cast<uint32_t>(*min_tokens));
  req.mutable_stopping()->set_ignore_eos(args.Has("ignore-eos"));
  if (args.Has("special-tokens")) req.set_skip_special_tokens(false);
  for (const auto& [token, b] : *bias) (*req.mutable_sampling()->mutable_logit_bias())[token] = b;
  req.set_n(static_cast<uint32_t>(*n));
  req.set_priority(*priority);
  if (absl::Status st = SetGuide(args, req.mutable_sampling()); !st.ok()) {
    // An unreadable file fails the run (as --tls-ca's does); a bad value is a bad command line.
    return st.code() == absl::StatusCode::kNotFound ? ReportFailure("client", st, kExitFailed)
                                                    : usage(st);
  }
  // The server's checks of the sampling fields, so a value it would refuse is a bad command
  // line here (the token ids are the server's to check: it knows the vocabulary).
  auto sampling = BuildSampling(req.sampling(), std::numeric_limits<uint32_t>::max());
  if (!sampling.ok()) return usage(SamplingErrorAsFlag(sampling.status()));
  const std::string addr = args.GetString("addr", "localhost:50051");
  if (absl::Status st = CheckAddressFlag(addr); !st.ok()) return usage(st);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (args.Has("tls-ca")) {
    std::ifstream in(args.GetString("tls-ca"));
    std::stringstream ss;
    ss << in.rdbuf();
    // An unreadable file gave empty roots, and gRPC then trusted the system's instead.
    if (!in || ss.str().empty()) {
      return ReportFailure("client",
                           absl::NotFoundError("cannot read --tls-ca " + args.GetString("tls-ca")),
                           kExitFailed);
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(addr, creds);
  auto stub = v1::Generation::NewStub(channel);

  grpc::ClientContext ctx;
  const std::string api_key = ApiKeyFlag(args);
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  if (*timeout > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  }
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  // One completion streams as it comes; several are printed whole, one after another.
  std::vector<std::string> texts(*n);
  bool wrote = false;  // n == 1: text went to stdout
  std::vector<v1::Complete> completes(*n);
  while (reader->Read(&resp)) {
    if (resp.has_chunk() && resp.chunk().index() < texts.size()) {
      if (*n == 1) {
        std::fwrite(resp.chunk().text().data(), 1, resp.chunk().text().size(), stdout);
        std::fflush(stdout);
        wrote |= !resp.chunk().text().empty();
      } else {
        texts[resp.chunk().index()] += resp.chunk().text();
      }
    } else if (resp.has_complete() && resp.complete().index() < completes.size()) {
      completes[resp.complete().index()] = resp.complete();
    }
  }
  grpc::Status status = reader->Finish();
  // Nothing on stdout for a call that failed before any text (it printed an empty line, or
  // empty completions).
  const bool any_text = wrote || std::any_of(texts.begin(), texts.end(),
                                             [](const std::string& t) { return !t.empty(); });
  if (*n == 1 && wrote) std::fputc('\n', stdout);
  for (int64_t i = 0; *n > 1 && (status.ok() || any_text) && i < *n; ++i) {
    std::printf("--- completion %lld ---\n%s\n", static_cast<long long>(i), texts[i].c_str());
  }
  if (!status.ok()) {
    // The code names what to do about it (UNAVAILABLE: retry; INVALID_ARGUMENT: fix the flags).
    const auto code = static_cast<absl::StatusCode>(status.error_code());
    std::fprintf(stderr, "thetaserve client: %s: %s\n", absl::StatusCodeToString(code).c_str(),
                 status.error_message().c_str());
    return kExitFailed;
  }
  for (int64_t i = 0; i < *n; ++i) {
    const v1::Complete& complete = completes[i];
    const v1::Timings& t = complete.timings();
    const std::string ttft = t.has_time_to_first_token_seconds()
                                 ? absl::StrFormat("%.3f s", t.time_to_first_token_seconds())
                                 : std::string("-");
    std::fprintf(stderr,
                 "%sfinish: %s, prompt %u tokens, completion %u tokens, ttft %s, total %.3f s\n",
                 *n > 1 ? absl::StrCat("completion ", i, ": ").c_str() : "",
                 ReasonName(complete.finish_reason()), complete.usage().prompt_tokens(),
                 complete.usage().completion_tokens(), ttft.c_str(), t.total_seconds());
  }
  return 0;
}

}  // namespace thetaserve::server
