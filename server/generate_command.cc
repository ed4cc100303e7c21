// `thetaserve generate`: continue one prompt with a local model, streaming text to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/sequence_runner.h"
#include "model/tokenizer.h"
#include "scheduler/sampler.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/model_loading.h"
#include "server/theta_options.h"
#include "server/validation.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve generate --model PATH --prompt TEXT [flags]\n"
    "  --model PATH        GGUF file or Hugging Face directory\n"
    "  --prompt TEXT       text to continue (with --chat: the user's message)\n"
    "  --chat              wrap the prompt in the model's chat template\n"
    "  --system TEXT       system message for --chat\n"
    "  --max-tokens N      tokens to generate (default 64)\n"
    "  --temperature T     0 = greedy (default 0)\n"
    "  --top-p P --top-k K --min-p P --seed S --repetition-penalty R\n"
    "  --ignore-eos        keep going past end-of-sequence tokens\n"
    "  --special-tokens    write special tokens (<|im_end|>, ...) into the text\n"
    "  --threads N         CPU threads (default: all cores)\n"
    "  --device cpu|cuda|auto (default auto)\n"
    "  --kv-cache-dtype auto|f32|f16|bf16|fp8|fp8_e4m3|fp8_e5m2|q8_0   the KV pages' element\n"
    "                    type (default auto)\n"
    "  --exact-matmul      CPU: f32 activations for quantized weights (default: int8, faster)\n";

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& argv) {
  std::map<std::string, bool> known = {
      {"model", true}, {"prompt", true}, {"chat", false}, {"system", true},
      {"max-tokens", true}, {"temperature", true}, {"top-p", true}, {"top-k", true},
      {"min-p", true}, {"seed", true}, {"repetition-penalty", true},
      {"ignore-eos", false}, {"special-tokens", false}, {"threads", true}, {"device", true},
      {"kv-cache-dtype", true},
      {"exact-matmul", false},
  };
  for (const auto& [name, v] : ThetaFlags()) known[name] = v;
  CliArgs args;
  if (auto exit = ParseCommandLine("generate", argv, known, std::string(kUsage) + kThetaUsage,
                                   &args)) {
    return *exit;
  }
  auto usage = [](const absl::Status& st) { return ReportFailure("generate", st, kExitUsage); };
  auto fail = [](const absl::Status& st) { return ReportFailure("generate", st, kExitFailed); };
  auto max_tokens = args.GetInt("max-tokens", 64, 1, kMaxCountFlag);
  auto threads = args.GetInt("threads", 0, 0, kMaxThreadsFlag);
  auto temperature = args.GetDouble("temperature", 0.0);
  auto top_p = args.GetDouble("top-p", 1.0);
  auto top_k = args.GetInt("top-k", 0, 0, kMaxCountFlag);
  auto min_p = args.GetDouble("min-p", 0.0);
  auto rep = args.GetDouble("repetition-penalty", 1.0);
  auto seed = args.GetUint64("seed");
  auto device = ParseDevice(args.GetString("device", "auto"));
  auto kv_dtype = ParseKvDtypeFlag(args.GetString("kv-cache-dtype", "auto"));
  for (const absl::Status& st :
       {max_tokens.status(), threads.status(), temperature.status(), top_p.status(),
        top_k.status(), min_p.status(), rep.status(), seed.status(), device.status(),
        kv_dtype.status()}) {
    if (!st.ok()) return usage(st);
  }
  if (!args.Has("prompt")) return usage(absl::InvalidArgumentError("--prompt is required"));
  if (args.Has("system") && !args.Has("chat")) {  // it was dropped without a word
    return usage(absl::InvalidArgumentError("--system goes with --chat (a chat's system message)"));
  }
  if (absl::Status st = CheckModelFlag(args.GetString("model")); !st.ok()) return usage(st);
  // The API's checks, so a value the server refuses is refused here too.
  v1::SamplingParams api;
  api.set_temperature(static_cast<float>(*temperature));
  api.set_top_p(static_cast<float>(*top_p));
  api.set_top_k(static_cast<int32_t>(*top_k));
  api.set_min_p(static_cast<float>(*min_p));
  api.set_repetition_penalty(static_cast<float>(*rep));
  if (*seed) api.set_seed(**seed);
  // No logit bias here, so no vocabulary to check one against: checked before the model loads.
  auto sampling = BuildSampling(api, /*vocab_size=*/0);
  if (!sampling.ok()) return usage(SamplingErrorAsFlag(sampling.status()));
  auto theta = ParseThetaOptions(args);
  if (!theta.ok()) return usage(theta.status());
  if (absl::Status st = LoadThetaFile(*theta); !st.ok()) return fail(st);

  auto loaded = LoadModelForCli(args.GetString("model"), *device, static_cast<int>(*threads),
                                MatMulFlag(args), *kv_dtype);
  if (!loaded.ok()) return fail(loaded.status());
  const model::Tokenizer& tok = loaded->model->tokenizer();
  if (absl::Status st = CheckThetaForModel(*theta, *loaded->model); !st.ok()) return fail(st);
  loaded->backend->SetTopTheta(theta->config);

  std::string text = args.GetString("prompt");
  if (args.Has("chat")) {
    std::vector<model::ChatMessage> messages;
    if (args.Has("system")) messages.push_back({"system", args.GetString("system")});
    messages.push_back({"user", text});
    auto rendered = tok.ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return fail(rendered.status());
    text = *rendered;
  }
  // A rendered chat template already holds BOS where the model wants one.
  std::vector<int32_t> prompt =
      tok.Encode(text, /*add_bos=*/!args.Has("chat"), /*parse_special=*/true);
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));
  const int64_t max_ctx = loaded->model->config().max_context;
  const int64_t capacity = std::min<int64_t>(max_ctx, prompt.size() + *max_tokens);

  auto runner = scheduler::SequenceRunner::Create(*loaded->backend, capacity, 16, theta->sparse);
  if (!runner.ok()) return fail(runner.status());

  scheduler::Sampler sampler(*sampling);
  model::StreamDecoder decoder(tok, /*skip_special=*/!args.Has("special-tokens"));
  const bool ignore_eos = args.Has("ignore-eos");
  const auto& stops = tok.stop_ids();

  auto t0 = std::chrono::steady_clock::now();
  auto logits = runner->Append(prompt);
  if (!logits.ok()) return fail(logits.status());
  auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> output;
  std::string finish = "length";
  while (static_cast<int64_t>(output.size()) < *max_tokens) {
    scheduler::SampleResult r = sampler.Sample(*logits, prompt, output);
    output.push_back(r.token);
    if (!ignore_eos && std::find(stops.begin(), stops.end(), r.token) != stops.end()) {
      finish = "eos";
      break;
    }
    std::string delta = decoder.Push(r.token);
    std::fwrite(delta.data(), 1, delta.size(), stdout);
    std::fflush(stdout);
    if (static_cast<int64_t>(output.size()) >= *max_tokens) break;
    if (runner->length() >= capacity) break;
    int32_t next = r.token;
    logits = runner->Append(std::span<const int32_t>(&next, 1));
    if (!logits.ok()) return fail(logits.status());
  }
  std::string rest = decoder.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the text before the figures on stderr, when both go to one pipe
  auto t2 = std::chrono::steady_clock::now();
  const double prefill = Seconds(t0, t1);
  const double decode = Seconds(t1, t2);
  std::fprintf(stderr,
               "prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens in %.3f s "
               "(%.1f tok/s); finish: %s\n",
               prompt.size(), prefill, prompt.size() / std::max(prefill, 1e-9), output.size(),
               decode, output.size() > 1 ? (output.size() - 1) / std::max(decode, 1e-9) : 0.0,
               finish.c_str());
  return 0;
}

}  // namespace thetaserve::server
