#include "server/generation_service.h"

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "server/generate_stream.h"
#include "server/validation.h"

namespace thetaserve::server {
namespace {

// A Generate call rejected before it reached the engine.
class RejectedStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

// Prompt p's request id in a call `id` of one prompt or several.
std::string PromptId(const std::string& id, size_t p, bool several) {
  return several ? absl::StrCat(id, "-", p) : id;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

GenerationService::GenerationService(scheduler::Engine& engine, const model::Model& model,
                                     const std::string& backend_name, Metrics* metrics,
                                     ServiceOptions options)
    : engine_(&engine),
      model_(&model),
      backend_name_(backend_name),
      metrics_(metrics),
      options_(std::move(options)) {}

grpc::Status GenerationService::CheckAuth(grpc::CallbackServerContext* ctx) const {
  if (options_.api_key.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <api key>' metadata");
  }
  if (!BearerMatches(std::string_view(it->second.data(), it->second.size()), options_.api_key)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid API key");
  }
  return grpc::Status::OK;
}

std::optional<std::string> GenerationService::Track(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : ids) {
    if (active_.count(id)) return id;
  }
  active_.insert(ids.begin(), ids.end());
  return std::nullopt;
}

absl::Status GenerationService::SubmitChoices(scheduler::Request req, int n,
                                              const SinkFactory& make_sink) {
  std::string id = req.id;
  std::vector<scheduler::Request> prompts;
  prompts.push_back(std::move(req));
  return SubmitPrompts(&id, std::move(prompts), n, make_sink);
}

absl::StatusOr<std::vector<std::string>> GenerationService::TrackCall(const std::string& id,
                                                                       size_t prompts, int n) {
  const bool several = prompts > 1;
  std::vector<std::string> ids;  // the call's, each prompt's, each completion's
  if (several) ids.push_back(id);
  for (size_t p = 0; p < prompts; ++p) {
    const std::string prompt_id = PromptId(id, p, several);
    ids.push_back(prompt_id);  // its group's (n > 1) or its one completion's
    for (int i = 0; n > 1 && i < n; ++i) ids.push_back(absl::StrCat(prompt_id, "/", i));
  }
  const std::optional<std::string> taken = Track(ids);
  if (!taken) return ids;
  if (*taken == id) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", id, "' is already in flight"));
  }
  const std::string names = several ? absl::StrCat("names its prompts '", id, "-<p>'")
                                    : absl::StrCat("with n = ", n, " names its completions '",
                                                   id, "/<i>'");
  return absl::AlreadyExistsError(
      absl::StrCat("request_id '", id, "' ", names, ", and '", *taken, "' is already in flight"));
}

absl::Status GenerationService::SubmitPrompts(std::string* id,
                                              std::vector<scheduler::Request> prompts, int n,
                                              const SinkFactory& make_sink, TakenId taken,
                                              int* refused_prompt) {
  CHECK(!prompts.empty());
  const bool several = prompts.size() > 1;
  // The ids are tracked before the requests are made, so that a call whose id is taken can go
  // on under another with the same requests.
  absl::StatusOr<std::vector<std::string>> ids = TrackCall(*id, prompts.size(), n);
  if (absl::IsAlreadyExists(ids.status()) && taken == TakenId::kSuffix) {
    *id = absl::StrCat(*id, "-", RandomHex128().substr(0, 8));
    ids = TrackCall(*id, prompts.size(), n);
  }
  if (!ids.ok()) return ids.status();
  std::vector<scheduler::Request> requests;
  std::vector<std::shared_ptr<ChoiceGroup>> groups;  // [request]: its prompt's group, or null
  std::vector<int> prompt_of;                         // [request]: p
  for (size_t p = 0; p < prompts.size(); ++p) {
    scheduler::Request& prompt = prompts[p];
    prompt.id = PromptId(*id, p, several);
    if (several) prompt.call_id = *id;
    const std::string prompt_id = prompt.id;
    std::vector<scheduler::Request> choices = SplitChoices(std::move(prompt), n);
    auto group = choices.size() > 1 ? std::make_shared<ChoiceGroup>(prompt_id, int(choices.size()))
                                    : nullptr;
    for (auto& r : choices) {
      requests.push_back(std::move(r));
      groups.push_back(group);
      prompt_of.push_back(int(p));
    }
  }
  auto call = several ? std::make_shared<ChoiceGroup>(*id, int(requests.size())) : nullptr;
  std::vector<std::shared_ptr<scheduler::TokenSink>> sinks;
  for (size_t i = 0; i < requests.size(); ++i) {
    std::shared_ptr<ServiceSink> sink = make_sink(int(i), requests[i].id);
    if (groups[i]) sink->JoinGroup(groups[i]);
    if (call) sink->JoinGroup(call);
    sinks.push_back(std::move(sink));
  }
  int refused = -1;
  absl::Status st = engine_->SubmitAll(std::move(requests), std::move(sinks), &refused);
  if (!st.ok()) {
    for (const std::string& t : *ids) Untrack(t);
    if (refused >= 0 && refused_prompt) *refused_prompt = prompt_of[refused];
  }
  return st;
}

void GenerationService::Untrack(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(id);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  auto reject = [&](const grpc::Status& s) {
    if (metrics_) metrics_->OnRejected(static_cast<absl::StatusCode>(s.error_code()));
    return new RejectedStream(s);
  };
  v1::GenerateRequest parsed;
  grpc::ByteBuffer copy(*raw);
  if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::GenerateRequest>(&copy, &parsed).ok()) {
    return reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "the request is not a valid GenerateRequest; string fields "
                               "(prompt, chat content, stop) must be valid UTF-8"));
  }
  const v1::GenerateRequest* request = &parsed;
  if (grpc::Status auth = CheckAuth(ctx); !auth.ok()) return reject(auth);
  if (!ready_.load()) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
  }
  if (engine_->draining()) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the server is draining; retry on another replica"));
  }
  auto built = BuildRequest(*request, *model_);
  if (!built.ok()) return reject(ToGrpcStatus(built.status()));
  scheduler::Request req = std::move(*built);
  if (req.id.empty()) req.id = absl::StrCat("req-", next_id_.fetch_add(1));
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    req.deadline = scheduler::Clock::now() + (ctx->deadline() - std::chrono::system_clock::now());
  }
  const std::string id = req.id;
  const int n = std::max<int>(1, int(request->n()));
  auto stream = std::make_shared<StreamSink>(id, n);
  absl::Status st =
      SubmitChoices(std::move(req), n, [&](int index, const std::string& choice_id) {
        return std::make_shared<ChoiceSink>(this, choice_id, stream, index);
      });
  if (!st.ok()) return reject(ToGrpcStatus(st));
  return new GenerateStream(this, std::move(stream), id);
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* ctx,
                                                   const v1::AbortRequest* request,
                                                   v1::AbortResponse* response) {
  if (grpc::Status auth = CheckAuth(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  if (request->request_id().empty()) {
    return FinishUnary(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         "request_id is required"));
  }
  bool found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    found = active_.count(request->request_id()) > 0;
  }
  if (found) {
    engine_->Cancel(request->request_id(), absl::CancelledError("aborted by an Abort call"));
  }
  response->set_found(found);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* info) {
  if (grpc::Status auth = CheckAuth(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  const auto& c = model_->config();
  info->set_name(c.name);
  info->set_architecture(c.architecture);
  info->set_context_length(static_cast<uint32_t>(c.max_context));
  info->set_vocab_size(static_cast<uint32_t>(c.vocab_size));
  info->set_num_layers(static_cast<uint32_t>(c.num_layers));
  info->set_num_heads(static_cast<uint32_t>(c.num_heads));
  info->set_num_kv_heads(static_cast<uint32_t>(c.num_kv_heads));
  info->set_head_dim(static_cast<uint32_t>(c.head_dim));
  info->set_block_size(static_cast<uint32_t>(engine_->config().block_size));
  info->set_theta_mode(options_.theta_mode);
  info->set_kv_policy(options_.kv_policy);
  info->set_calibration_fingerprint(options_.calibration_fingerprint);
  info->set_model_fingerprint(model_->fingerprint());
  info->set_backend(backend_name_);
  info->set_eos_token_id(static_cast<uint32_t>(std::max(0, model_->tokenizer().eos_id())));
  info->set_bos_token_id(static_cast<uint32_t>(std::max(0, model_->tokenizer().bos_id())));
  info->set_prefix_caching(engine_->prefix_caching());
  info->set_kv_cache_dtype(options_.kv_cache_dtype);
  info->set_matmul_activations(options_.matmul_activations);
  info->set_scheduling_policy(scheduler::SchedulingPolicyName(engine_->config().scheduler.policy));
  info->set_priority_aging(engine_->config().scheduler.priority_aging);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetServerStatus(grpc::CallbackServerContext* ctx,
                                                             const v1::GetServerStatusRequest*,
                                                             v1::ServerStatus* out) {
  if (grpc::Status auth = CheckAuth(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  const scheduler::EngineStats s = engine_->Stats();
  out->set_running(static_cast<uint32_t>(s.running));
  out->set_waiting(static_cast<uint32_t>(s.waiting));
  auto* pages = out->mutable_pages();
  pages->set_total(s.pages_total);
  pages->set_used_k(s.pages_used_k);
  pages->set_used_v(s.pages_used_v);
  pages->set_free(s.pages_free);
  pages->set_page_bytes(s.page_bytes);
  pages->set_cached(s.pages_cached);
  out->set_draining(engine_->draining());
  out->set_steps(s.counters.steps);
  out->set_preemptions(s.counters.preemptions);
  out->set_prefix_cache_blocks(s.prefix_cache_blocks);
  out->set_prefix_cache_query_tokens(s.counters.prefix_query_tokens);
  out->set_prefix_cache_hit_tokens(s.counters.prefix_hit_tokens);
  out->set_host_pages_total(s.host_pages_total);
  out->set_host_pages_used(s.host_pages_used);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  if (grpc::Status auth = CheckAuth(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  auto tokens = TokenizeInput(*request, *model_);
  if (!tokens.ok()) return FinishUnary(ctx, ToGrpcStatus(tokens.status()));
  *response = std::move(*tokens);
  return FinishUnary(ctx, grpc::Status::OK);
}

}  // namespace thetaserve::server
