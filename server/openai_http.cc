#include "server/openai_http.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "server/http_request_reader.h"
#include "server/openai_api.h"
#include "server/openai_http_output.h"
#include "server/openai_response.h"
#include "server/service_sink.h"
#include "server/validation.h"

namespace thetaserve::server {
namespace {

using Json = nlohmann::ordered_json;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{100};     // how often a waiting handler checks its client
// An SSE comment during a long silence of a stream (once its head is out).
constexpr milliseconds kKeepAliveInterval{15'000};

void SendError(HttpResponder& out, int status, std::string_view message,
               const HttpHeaders& extra = {}) {
  out.Send(status, "application/json", OpenAiErrorBody(status, message), extra);
}

// Whether a route that takes `methods` takes req's; if not, answers 405 naming them ("use GET
// or POST", HEAD going without saying) with Allow.
bool MethodAllowed(const HttpRequest& req, HttpResponder& out,
                   std::initializer_list<const char*> methods) {
  for (const char* m : methods) {
    if (req.method == m) return true;
  }
  std::vector<std::string> use;
  for (const char* m : methods) {
    if (std::string_view(m) != "HEAD") use.push_back(m);
  }
  SendError(out, 405, absl::StrCat("use ", absl::StrJoin(use, " or ")),
            {{"Allow", absl::StrJoin(methods, ", ")}});
  return false;
}

bool SendEvent(HttpResponder& out, const Json& j) {
  return out.WriteChunk(absl::StrCat("data: ", DumpJson(j), "\n\n"));
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    GenerationService& service, const model::Model& model, OpenAiHttpOptions options) {
  std::unique_ptr<OpenAiHttpServer> s(new OpenAiHttpServer(service, model, options));
  HttpServerOptions http;
  http.max_connections = options.max_connections;
  Metrics* metrics = service.metrics();
  if (metrics) {
    http.on_connections = [metrics](int open) { metrics->OnHttpConnections(open); };
    http.on_refused = [metrics](HttpTransportRefusal why) { metrics->OnHttpRefused(why); };
  }
  auto server = HttpServer::Start(
      options.host, options.port,
      [p = s.get()](const HttpRequest& req, HttpResponder& out) { p->Serve(req, out); }, http);
  if (!server.ok()) return server.status();
  if (metrics) metrics->SetHttpConnectionLimit(options.max_connections);
  s->http_ = std::move(*server);
  return s;
}

OpenAiHttpServer::OpenAiHttpServer(GenerationService& service, const model::Model& model,
                                   OpenAiHttpOptions options)
    : service_(&service), model_(&model), options_(std::move(options)),
      served_(options_.served_model_name), created_(UnixNow()) {
  for (const std::string& alias : options_.served_model_aliases) served_.names.push_back(alias);
}

bool OpenAiHttpServer::Authorized(const HttpRequest& req, HttpResponder& out) {
  if (options_.api_key.empty()) return true;
  const std::string auth = req.Header("authorization");
  if (auth.empty()) {
    SendError(out, 401, "missing 'Authorization: Bearer <api key>' header",
              {{"WWW-Authenticate", "Bearer"}});
    return false;
  }
  if (!BearerMatches(auth, options_.api_key)) {
    SendError(out, 401, "invalid API key", {{"WWW-Authenticate", "Bearer"}});
    return false;
  }
  return true;
}

void OpenAiHttpServer::Serve(const HttpRequest& req, HttpResponder& out) {
  Metrics* metrics = service_->metrics();
  if (metrics == nullptr) return Handle(req, out);
  // Counted by the status sent, before the client can have read it (a scrape that follows a
  // response finds it counted: counting after Handle returned raced the client's next
  // request). A handler that sent none (it threw) gets the transport's 500, which the hook
  // counts too: the transport sends it after this returns, so the hook holds nothing of this
  // frame (the request is the transport's, alive until the answer is sent). A request whose
  // client left before any answer is not counted (requests_total has it).
  out.OnStatus([metrics, request = &req](int status) {
    metrics->OnHttpRequest(request->path, status);
  });
  Handle(req, out);
}

void OpenAiHttpServer::Handle(const HttpRequest& req, HttpResponder& out) {
  if (req.path == "*") {  // OPTIONS * (the reader lets no other method have it): the server's
    out.Send(200, "text/plain", "", {{"Allow", "GET, HEAD, POST, OPTIONS"}});
    return;
  }
  // CORS, for pages in a browser: an allowed Origin gets Access-Control-Allow-Origin on every
  // answer, and a preflight (OPTIONS with Access-Control-Request-Method; it carries no API key)
  // the methods and headers it may use. Another origin gets neither, and the browser refuses.
  const std::string origin = req.Header("origin");
  const auto& allowed = options_.allowed_origins;
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!origin.empty() &&
      (any || std::find(allowed.begin(), allowed.end(), origin) != allowed.end())) {
    out.AddHeader("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) out.AddHeader("Vary", "Origin");
    out.AddHeader("Access-Control-Expose-Headers", "X-Request-Id");
    if (req.method == "OPTIONS" && !req.Header("access-control-request-method").empty()) {
      const std::string asked = req.Header("access-control-request-headers");
      out.Send(200, "text/plain", "",
               {{"Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS"},
                {"Access-Control-Allow-Headers",
                 asked.empty() ? "Authorization, Content-Type" : asked},
                {"Access-Control-Max-Age", "600"}});
      return;
    }
  }
  // /ping is vLLM's (Amazon SageMaker's health check, which may POST it): /health's answer.
  if (req.path == "/health" || req.path == "/ping") {
    if (req.path == "/ping" ? !MethodAllowed(req, out, {"GET", "HEAD", "POST"})
                            : !MethodAllowed(req, out, {"GET", "HEAD"})) {
      return;
    }
    if (service_->ready() && !service_->engine().draining()) {
      out.Send(200, "application/json", R"({"status":"serving"})");
      return;
    }
    out.CloseAfter();  // as every 503 while loading or draining
    out.Send(503, "application/json", R"({"status":"not serving"})", {{"Retry-After", "1"}});
    return;
  }
  if (req.path == "/version") {  // vLLM's: what a client or probe can check it talks to
    if (!MethodAllowed(req, out, {"GET", "HEAD"})) return;
    out.Send(200, "application/json", DumpJson(Json{{"version", THETASERVE_VERSION}}));
    return;
  }
  if (req.path == "/metrics") {
    // The Prometheus exposition here too, as vLLM serves it on its API port (scrape configs
    // written for vLLM find it); no API key, as the --metrics-port endpoint.
    if (!MethodAllowed(req, out, {"GET", "HEAD"})) return;
    if (service_->metrics() == nullptr) return SendError(out, 404, "no metrics in this server");
    out.Send(200, "text/plain; version=0.0.4; charset=utf-8", service_->metrics()->Serialize());
    return;
  }
  if (req.path == "/v1/completions" || req.path == "/v1/chat/completions") {
    if (!MethodAllowed(req, out, {"POST"})) return;
    if (!Authorized(req, out)) {
      // Counted as the gRPC API counts a Generate call with a wrong key.
      if (service_->metrics()) service_->metrics()->OnRejected(absl::StatusCode::kUnauthenticated);
      return;
    }
    return Generate(req, out, req.path == "/v1/chat/completions");
  }
  if (req.path == "/tokenize" || req.path == "/detokenize") {
    if (!MethodAllowed(req, out, {"POST"})) return;
    if (!Authorized(req, out)) return;
    return req.path == "/tokenize" ? Tokenize(req, out) : Detokenize(req, out);
  }
  if (req.path == "/v1/models" || req.path.starts_with("/v1/models/")) {
    if (!MethodAllowed(req, out, {"GET", "HEAD"})) return;
    if (!Authorized(req, out)) return;
    return Models(req, out);
  }
  SendError(out, 404,
            absl::StrCat("no route ", req.path, "; the API is POST /v1/completions, POST "
                         "/v1/chat/completions, GET /v1/models, POST /tokenize, POST "
                         "/detokenize, GET /health (or /ping), GET /metrics and GET /version"));
}

void OpenAiHttpServer::Models(const HttpRequest& req, HttpResponder& out) {
  // One card per name, as vLLM lists its several served names (an alias's root is the name).
  auto card = [&](const std::string& name) {
    return Json{{"id", name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "thetaserve"},
                {"root", served_.name()},
                {"max_model_len", model_->config().max_context}};
  };
  if (req.path == "/v1/models") {
    Json data = Json::array();
    for (const std::string& name : served_.names) data.push_back(card(name));
    out.Send(200, "application/json", DumpJson({{"object", "list"}, {"data", data}}));
    return;
  }
  const std::string id =
      PercentDecoded(std::string_view(req.path).substr(std::string_view("/v1/models/").size()));
  if (!served_.Serves(id)) {
    return SendError(out, 404, absl::StrCat("the model '", id, "' does not exist; this server "
                                            "serves ", served_.Described()));
  }
  out.Send(200, "application/json", DumpJson(card(id)));
}

void OpenAiHttpServer::Tokenize(const HttpRequest& req, HttpResponder& out) {
  auto request = ParseTokenizeRequest(req.body, served_);
  absl::StatusOr<v1::TokenizeResponse> tokens =
      request.ok() ? TokenizeInput(*request, *model_) : request.status();
  if (!tokens.ok()) {
    return SendError(out, HttpStatusFor(tokens.status()),
                     ToOpenAiFieldNames(std::string(tokens.status().message())));
  }
  Json ids = Json::array();
  for (uint32_t id : tokens->ids()) ids.push_back(id);
  out.Send(200, "application/json",
           DumpJson({{"count", tokens->ids_size()},
                     {"max_model_len", model_->config().max_context},
                     {"tokens", std::move(ids)}}));
}

void OpenAiHttpServer::Detokenize(const HttpRequest& req, HttpResponder& out) {
  auto tokens = ParseDetokenizeRequest(req.body, served_,
                                       model_->config().vocab_size);
  if (!tokens.ok()) {
    return SendError(out, HttpStatusFor(tokens.status()), std::string(tokens.status().message()));
  }
  out.Send(200, "application/json", DumpJson({{"prompt", model_->tokenizer().Decode(*tokens)}}));
}

void OpenAiHttpServer::Generate(const HttpRequest& http, HttpResponder& out, bool chat) {
  Metrics* metrics = service_->metrics();
  auto reject = [&](const absl::Status& st) {
    if (metrics) metrics->OnRejected(st.code());
    HttpHeaders extra;
    if (absl::IsUnavailable(st)) {
      // Loading or draining: this connection should go elsewhere (a pooled connection to a
      // draining replica would otherwise keep coming back here).
      out.CloseAfter();
      extra.push_back({"Retry-After", "1"});
    } else if (absl::IsResourceExhausted(st)) {
      extra.push_back({"Retry-After", "1"});
    }
    SendError(out, HttpStatusFor(st), ToOpenAiFieldNames(std::string(st.message())), extra);
  };
  if (!service_->ready()) return reject(absl::UnavailableError("the model is still loading"));
  if (service_->engine().draining()) {
    return reject(absl::UnavailableError("the server is draining; retry on another replica"));
  }
  const OpenAiEndpoint endpoint =
      chat ? OpenAiEndpoint::kChatCompletions : OpenAiEndpoint::kCompletions;
  auto call = ParseOpenAiRequest(http.body, endpoint, served_);
  if (!call.ok()) return reject(call.status());
  // The client's id, as vLLM takes it: the X-Request-Id header (a proxy's trace id, say), else
  // the body's request_id; the call's id is then cmpl-<it>, in the log line and for Abort.
  const std::string client_id = http.Header("x-request-id");
  if (!client_id.empty()) {
    if (absl::Status s = CheckClientRequestId(client_id, "the X-Request-Id header"); !s.ok()) {
      return reject(s);
    }
    call->request_id = client_id;
  }
  const size_t prompt_count = call->prompt_count();
  const int n_per_prompt = std::max<int>(1, int(call->request.n()));
  const int n = n_per_prompt * int(prompt_count);  // choices in all
  // A list of prompts: an error about prompt p names it ("prompt[1][2] = 999999 is outside the
  // vocabulary", "prompt[1]: the prompt has …"); one about a parameter they share does not.
  auto refuse_prompt = [&](const absl::Status& status, size_t p) {
    const std::string what = ToOpenAiFieldNames(std::string(status.message()));
    if (prompt_count == 1 || what.find("prompt") == std::string::npos) {
      return reject(absl::Status(status.code(), what));
    }
    const std::string which = absl::StrCat("prompt[", p, "]");
    reject(absl::Status(status.code(), what.starts_with("prompt[")
                                           ? absl::StrCat(which, what.substr(6))
                                           : absl::StrCat(which, ": ", what)));
  };
  std::vector<scheduler::Request> prompts;
  std::vector<std::string> echo_texts;  // [prompt]
  std::vector<std::vector<int32_t>> prompt_ids;  // [prompt], with return_token_ids
  std::vector<int64_t> prompt_lengths;           // [prompt]
  int64_t prompt_tokens = 0;
  // Completions' choices each carry the prompt's scores; a chat response carries them once.
  const int64_t scored_copies =
      !chat && call->request.sampling().has_prompt_logprobs() ? n_per_prompt : 1;
  // The prompts share their parameters: the bad words' tokens, the allowed ids and the
  // guided choice are built (and checked) once, and held once.
  auto constraints = BuildTokenConstraints(call->request.sampling(), *model_);
  if (!constraints.ok()) {
    // The fields named as the client named them.
    std::string message(constraints.status().message());
    if (call->structured_choice) {
      absl::StrReplaceAll({{"sampling.guided_choice", "structured_outputs.choice"}}, &message);
    }
    if (call->structured_regex) {
      absl::StrReplaceAll({{"sampling.guided_regex", "structured_outputs.regex"}}, &message);
    }
    if (!call->grammar_field.empty()) {
      absl::StrReplaceAll({{"sampling.guided_grammar", call->grammar_field}}, &message);
    }
    if (call->tool_calls == OpenAiCall::ToolCalls::kRequired) {
      // Where in the list's schema a function's parameters are, said as the client sent them.
      constexpr std::string_view kItem = "#/items/anyOf/", kParameters = "/properties/parameters";
      for (size_t at = message.find(kItem); at != std::string::npos;
           at = message.find(kItem, at + 1)) {
        const size_t digits = at + kItem.size();
        const size_t end = message.find_first_not_of("0123456789", digits);
        if (end == digits || end == std::string::npos ||
            message.compare(end, kParameters.size(), kParameters) != 0) {
          continue;
        }
        message.replace(at, end + kParameters.size() - at,
                        absl::StrCat("tools[", message.substr(digits, end - digits),
                                     "].function.parameters#"));
      }
    }
    if (call->tool_calls == OpenAiCall::ToolCalls::kRequired &&
        absl::StrContains(message, "too large")) {
      // The list's schema is the server's: say what the client can change.
      message = absl::StrCat(
          "tools: with tool_choice \"required\" the functions' parameters, as a list of calls, "
          "are too large to guide; name one function in tool_choice, or send "
          "parallel_tool_calls false (",
          absl::StripPrefix(message, "sampling.guided_json: "), ")");
    } else if (!call->schema_field.empty()) {
      absl::StrReplaceAll({{"sampling.guided_json", call->schema_field}}, &message);
    }
    return reject(absl::Status(constraints.status().code(), message));
  }
  // The chat API's default is "until the model stops" (set below, once the prompt's length is
  // known): the checks see the least it may be, not the gRPC API's 16, which refused a prompt
  // with fewer than 16 tokens of context left, and a min_tokens over 16.
  if (chat && !call->max_tokens_given) {
    call->request.mutable_stopping()->set_max_tokens(
        std::max<uint32_t>(1, call->request.stopping().min_tokens()));
  }
  for (size_t p = 0; p < prompt_count; ++p) {
    auto built = BuildRequest(call->RequestFor(p), *model_, &*constraints);
    if (!built.ok()) return refuse_prompt(built.status(), p);
    if (call->echo) {
      // The prompt as sent, or its tokens' text when it was ids or truncate_prompt_tokens cut it.
      const OpenAiPrompt& prompt = call->prompts[p];
      echo_texts.push_back(prompt.tokens || call->request.has_truncate_prompt_tokens()
                               ? model_->tokenizer().Decode(built->prompt)
                               : prompt.text);
    }
    // Each prompt's scores or completions are held until the call ends, and its scores go
    // to each of its n choices: a bound on the response, whatever the prompts and n.
    prompt_tokens += int64_t(built->prompt.size());
    if (prompt_count > 1 && prompt_tokens > kMaxPromptTokensPerCall) {
      return reject(absl::InvalidArgumentError(absl::StrCat(
          "the prompts hold more than ", kMaxPromptTokensPerCall, " tokens in all (", p + 1,
          " of ", prompt_count, " counted); send fewer prompts per request")));
    }
    if (scored_copies > 1 && prompt_tokens * scored_copies > kMaxPromptTokensPerCall) {
      return reject(absl::InvalidArgumentError(absl::StrCat(
          "the prompt scores asked for come to more than ", kMaxPromptTokensPerCall,
          " tokens (", prompt_tokens, " prompt tokens so far, n = ", scored_copies,
          " choices each); ask for fewer choices or send fewer prompts")));
    }
    prompt_lengths.push_back(int64_t(built->prompt.size()));
    if (call->return_token_ids) prompt_ids.push_back(built->prompt);
    prompts.push_back(std::move(*built));
  }
  // The chat API's default is "until the model stops": the rest of the context, or of what
  // the KV cache can hold for one sequence when that is less.
  if (chat && !call->max_tokens_given) {
    scheduler::Request& req = prompts.front();
    const int64_t most = service_->engine().MaxSequenceTokens();
    const int64_t room = most - static_cast<int64_t>(req.prompt.size());
    if (room < 1) {
      return reject(absl::InvalidArgumentError(absl::StrCat(
          "the prompt has ", req.prompt.size(), " tokens; with the model's context and the KV "
          "cache, at most ", most - 1, " fit")));
    }
    req.stopping.max_tokens = static_cast<int32_t>(room);
  }
  std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-",
                                call->request_id.empty() ? RandomHex128() : call->request_id);
  // X-Request-Id answers with the client's own value when it sent one (what a proxy matches).
  const std::string id_header = client_id.empty() ? id : client_id;
  auto output = std::make_shared<HttpOutput>(n);
  int refused = -1;
  // A proxy retries with the request's own X-Request-Id, possibly while its first try is still
  // being cancelled here: that one goes on under the id and a random suffix. A request_id in
  // the body is the client's own choice, refused when in flight (as gRPC's).
  const absl::Status submitted = service_->SubmitPrompts(
      &id, std::move(prompts), n_per_prompt,
      [&](int index, const std::string& choice_id) {
        return std::make_shared<HttpChoiceSink>(service_, choice_id, output, index);
      },
      client_id.empty() ? GenerationService::TakenId::kRefuse
                        : GenerationService::TakenId::kSuffix,
      &refused);
  if (!submitted.ok()) {
    if (absl::IsAlreadyExists(submitted)) {  // a client-chosen id (random ones do not meet)
      return reject(absl::AlreadyExistsError(
          absl::StrCat(submitted.message(), " (its request_id is in use: send another)")));
    }
    if (refused >= 0) return refuse_prompt(submitted, size_t(refused));
    return reject(submitted);
  }
  std::vector<HttpOutput::Taken> taken;
  auto all_finished = [&] {
    return !taken.empty() &&
           std::all_of(taken.begin(), taken.end(), [](const auto& t) { return t.finish.has_value(); });
  };
  // However this handler leaves before the request finished (the client gone, an error, an
  // exception), its completions are cancelled: their pages are freed at the next step.
  absl::Cleanup cancel_unless_finished = [&] {
    if (!all_finished()) service_->engine().Cancel(id, absl::CancelledError("the HTTP handler left"));
  };
  // The client is gone: write nothing more; the cleanup cancels.
  auto cancel = [&](const char* why) {
    out.Abandon();
    service_->engine().Cancel(id, absl::CancelledError(why));
  };
  auto infos = [&] {
    std::vector<scheduler::FinishInfo> v;
    for (const auto& t : taken) v.push_back(*t.finish);
    return v;
  };

  OpenAiResponseBuilder builder(*call, id, UnixNow(), options_.served_model_name,
                                model_->tokenizer(), n, std::move(echo_texts));
  builder.SetPromptLengths(std::move(prompt_lengths));
  builder.SetPromptTokens(std::move(prompt_ids));
  std::optional<SharedPromptScores> shared;
  if (!chat && n_per_prompt > 1 && call->request.sampling().has_prompt_logprobs()) {
    shared.emplace(n, n_per_prompt);
  }
  auto take = [&] {
    output->Take(kPollInterval, &taken);
    if (shared) shared->Share(taken);
  };
  // A failed completion fails the call (ServiceSink cancelled the others, which have ended).
  // Answered before anything else was sent: its HTTP status, as a refusal at submission is
  // (displaced from a full queue: 429; the server stopping: 503, and the connection closes).
  auto send_failure = [&](const scheduler::FinishInfo& failed) {
    HttpHeaders extra = {{"X-Request-Id", id_header}};
    if (absl::IsUnavailable(failed.status)) out.CloseAfter();
    if (absl::IsResourceExhausted(failed.status) || absl::IsUnavailable(failed.status)) {
      extra.push_back({"Retry-After", "1"});
    }
    SendError(out, HttpStatusFor(failed.status), std::string(failed.status.message()), extra);
  };
  if (!call->stream) {
    while (true) {
      take();
      for (int i = 0; i < n; ++i) builder.Add(i, taken[i].delta);
      if (all_finished()) break;
      if (out.ClientGone()) return cancel("the client went away");
    }
    if (const scheduler::FinishInfo* failed = FirstFailure(taken)) return send_failure(*failed);
    out.Send(200, "application/json", DumpJson(builder.Complete(infos())),
             {{"X-Request-Id", id_header}});
    return;
  }

  // The stream's head goes out with its first event (for chat, the role chunks first), or
  // after --stream-head-timeout without one (a long queue or prefill: then an SSE comment,
  // so proxies see bytes), so a request that fails before either — displaced from a full
  // queue, the server stopping — gets its HTTP status (a client's retry logic reads 429 and
  // 503, not an event in a 200).
  const auto head_by = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(options_.stream_head_timeout_s));
  bool started = false;
  auto last_write = std::chrono::steady_clock::now();
  auto start = [&](bool timed_out) {
    started = true;
    bool ok = out.StartChunked(200, "text/event-stream",
                               {{"Cache-Control", "no-cache"}, {"X-Request-Id", id_header}});
    for (int i = 0; ok && chat && i < n; ++i) ok = SendEvent(out, builder.RoleChunk(i));
    if (ok && timed_out) ok = out.WriteChunk(": keep-alive\n\n");
    last_write = std::chrono::steady_clock::now();
    return ok;
  };
  bool ok = true;
  if (options_.stream_head_timeout_s <= 0) ok = start(false);
  const scheduler::FinishInfo* failed = nullptr;
  while (ok) {
    take();
    // Once a completion failed, the others (cancelled by ServiceSink) send nothing more; what
    // came with the failure still goes out.
    const bool failed_before = failed != nullptr;
    failed = FirstFailure(taken);
    if (!started) {
      // A failure before the head: its status once the others (cancelled) have ended; what
      // they sent meanwhile is dropped as it is after a failure in a stream.
      if (failed) {
        if (all_finished()) return send_failure(*failed);
        if (out.ClientGone()) break;
        continue;
      }
      bool news = false;
      for (int i = 0; i < n; ++i) {
        news |= !taken[i].delta.token_ids.empty() || taken[i].delta.prompt != nullptr ||
                taken[i].finished_now;
      }
      const bool timed_out = !news && std::chrono::steady_clock::now() >= head_by;
      if (!news && !timed_out) {
        if (out.ClientGone()) break;
        continue;
      }
      if (!(ok = start(timed_out))) break;
    }
    for (int i = 0; ok && !failed_before && i < n; ++i) {
      const scheduler::TokenDelta& delta = taken[i].delta;
      if (!delta.token_ids.empty() || delta.prompt) {
        const nlohmann::ordered_json chunk = builder.DeltaChunk(i, delta);
        if (OpenAiResponseBuilder::Carries(chunk)) {
          ok = SendEvent(out, chunk);
          last_write = std::chrono::steady_clock::now();
        }
      }
      const auto& finish = taken[i].finish;
      if (ok && taken[i].finished_now && !Failed(*finish)) {
        ok = SendEvent(out, builder.FinishChunk(i, *finish));
      }
    }
    if (!ok) break;
    if (failed && all_finished()) {
      // The stream ends with the error.
      ok = out.WriteChunk(absl::StrCat(
          "data: ",
          OpenAiErrorBody(HttpStatusFor(failed->status), std::string(failed->status.message())),
          "\n\n"));
      if (ok) ok = out.WriteChunk("data: [DONE]\n\n");
      if (ok) out.EndChunked();
      return;
    }
    if (all_finished()) {
      if (call->include_usage) ok = SendEvent(out, builder.UsageChunk(infos()));
      if (ok) ok = out.WriteChunk("data: [DONE]\n\n");
      if (ok) out.EndChunked();
      return;
    }
    if (out.ClientGone()) break;
    // An SSE comment keeps proxies from closing a stream that is silent during a long prefill.
    if (std::chrono::steady_clock::now() - last_write > kKeepAliveInterval) {
      ok = out.WriteChunk(": keep-alive\n\n");
      last_write = std::chrono::steady_clock::now();
    }
  }
  cancel("the client went away");
}

}  // namespace thetaserve::server
