// `thetaserve eval`: perplexity of a model on a text file, in fixed windows of `--context`
// tokens (each window starts from an empty cache; every token but the first of a window is
// predicted).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scheduler/sequence_runner.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/model_loading.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve eval --model PATH --text FILE [flags]\n"
    "  --context N       window length in tokens (default 2048)\n"
    "  --max-tokens N    tokens of the text to evaluate (default 65536)\n"
    "  --threads N --device cpu|cuda|auto\n"
    "  --out FILE        append a JSON line with the result\n";

}  // namespace

int RunEval(const std::vector<std::string>& argv) {
  auto args = CliArgs::Parse(argv, {{"model", true}, {"text", true}, {"context", true},
                                    {"max-tokens", true}, {"threads", true}, {"device", true},
                                    {"out", true}, {"help", false}});
  if (!args.ok() || args->Has("help")) {
    if (!args.ok()) std::fprintf(stderr, "thetaserve eval: %s\n", args.status().ToString().c_str());
    std::fprintf(stderr, "%s", kUsage);
    return args.ok() ? 0 : 2;
  }
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "thetaserve eval: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  auto context = args->GetInt("context", 2048);
  auto max_tokens = args->GetInt("max-tokens", 65536);
  auto threads = args->GetInt("threads", 0);
  auto device = ParseDevice(args->GetString("device", "auto"));
  for (const absl::Status& st :
       {context.status(), max_tokens.status(), threads.status(), device.status()}) {
    if (!st.ok()) return fail(st);
  }
  if (*context < 2) return fail(absl::InvalidArgumentError("--context must be at least 2"));
  const std::string text_path = args->GetString("text");
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    return fail(absl::NotFoundError("cannot read --text '" + text_path +
                                    "' (scripts/fetch-corpora.sh writes data/*.txt)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();

  auto loaded = LoadModelForCli(args->GetString("model"), *device, static_cast<int>(*threads));
  if (!loaded.ok()) return fail(loaded.status());
  const auto& tok = loaded->model->tokenizer();
  // ~4 bytes per token in English: encode a generous prefix rather than the whole file.
  const size_t prefix = std::min(text.size(), static_cast<size_t>(*max_tokens) * 8 + 1024);
  std::vector<int32_t> ids = tok.Encode(std::string_view(text).substr(0, prefix),
                                        /*add_bos=*/false, /*parse_special=*/false);
  if (static_cast<int64_t>(ids.size()) > *max_tokens) ids.resize(*max_tokens);
  const int64_t windows = static_cast<int64_t>(ids.size()) / *context;
  if (windows == 0) {
    return fail(absl::InvalidArgumentError("the text has fewer tokens than one --context window"));
  }
  auto runner = scheduler::SequenceRunner::Create(*loaded->backend, *context);
  if (!runner.ok()) return fail(runner.status());
  const int64_t vocab = loaded->model->config().vocab_size;

  double nll = 0;
  int64_t count = 0;
  auto start = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    runner->Reset();
    std::span<const int32_t> window(ids.data() + w * *context, *context);
    auto logits = runner->Append(window, /*all_logits=*/true);
    if (!logits.ok()) return fail(logits.status());
    for (int64_t i = 0; i + 1 < *context; ++i) {
      const float* row = logits->data() + i * vocab;
      float m = row[0];
      for (int64_t v = 1; v < vocab; ++v) m = std::max(m, row[v]);
      double s = 0;
      for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(row[v]) - m);
      nll += (m + std::log(s)) - row[window[i + 1]];
      ++count;
    }
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r[%lld/%lld windows] ppl so far %.4f, %.0f tok/s   ",
                 (long long)(w + 1), (long long)windows, std::exp(nll / count),
                 (w + 1) * *context / secs);
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  const double ppl = std::exp(nll / count);
  std::printf("perplexity %.4f over %lld predicted tokens (%lld windows of %lld) on %s\n", ppl,
              (long long)count, (long long)windows, (long long)*context, text_path.c_str());
  if (args->Has("out")) {
    std::ofstream out(args->GetString("out"), std::ios::app);
    out << "{\"model\":\"" << loaded->model->config().name << "\",\"text\":\"" << text_path
        << "\",\"context\":" << *context << ",\"tokens\":" << count << ",\"perplexity\":" << ppl
        << ",\"mode\":\"dense\"}\n";
  }
  return 0;
}

}  // namespace thetaserve::server
