#include "bench/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace thetaserve::bench {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ParseFlags(int argc, char** argv, const char* usage,
                const std::function<bool(const std::string& flag, const std::string& value)>& take) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s", flag.c_str(), usage);
      std::exit(2);
    }
    if (!take(flag, argv[i + 1])) {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), usage);
      std::exit(2);
    }
  }
}

int IntFlag(const std::string& flag, const std::string& value) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    std::fprintf(stderr, "%s wants an integer, got '%s'\n", flag.c_str(), value.c_str());
    std::exit(2);
  }
  return v;
}

double DoubleFlag(const std::string& flag, const std::string& value) {
  double v = 0;
  if (!absl::SimpleAtod(value, &v)) {
    std::fprintf(stderr, "%s wants a number, got '%s'\n", flag.c_str(), value.c_str());
    std::exit(2);
  }
  return v;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (auto part : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

void CountingSink::OnFinish(const scheduler::FinishInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_;
  tokens_ += info.completion_tokens;
  ttft_.push_back(info.ttft_seconds);
  cv_.notify_all();
}

double CountingSink::MedianTtft() {
  std::lock_guard<std::mutex> lock(mu_);
  return Median(ttft_);
}

void CountingSink::WaitFor(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ >= n; });
}

int64_t CountingSink::tokens() {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

scheduler::Request MakeRequest(const model::Model& model, int i, int prompt_tokens, int max_tokens,
                               const scheduler::SamplingParams* sampling) {
  scheduler::Request r;
  r.id = "bench-" + std::to_string(i);
  const std::vector<int32_t> text = model.tokenizer().Encode(
      "It is a truth universally acknowledged, that a single man in possession of a good "
      "fortune, must be in want of a wife. However little known the feelings or views of such "
      "a man may be on his first entering a neighbourhood, this truth is so well fixed.",
      false);
  for (int k = 0; k < prompt_tokens; ++k) r.prompt.push_back(text[(i + k) % text.size()]);
  r.sampling.temperature = 0;
  if (sampling) {
    r.sampling = *sampling;
    r.sampling.seed = uint64_t(i);
  }
  r.stopping.max_tokens = max_tokens;
  r.stopping.ignore_eos = true;
  return r;
}

absl::StatusOr<double> DecodeStepSeconds(scheduler::EngineConfig config, kernels::Backend& backend,
                                         const model::Model& model, int batch, int prompt_tokens,
                                         int max_tokens, const scheduler::SamplingParams* sampling) {
  auto times = DecodeStepMedians(config, backend, model, batch, prompt_tokens, max_tokens, sampling);
  if (!times.ok()) return times.status();
  return times->step_seconds;
}

absl::StatusOr<DecodeStepTimes> DecodeStepMedians(scheduler::EngineConfig config,
                                                  kernels::Backend& backend,
                                                  const model::Model& model, int batch,
                                                  int prompt_tokens, int max_tokens,
                                                  const scheduler::SamplingParams* sampling) {
  config.scheduler.max_num_seqs = batch;
  auto engine = scheduler::Engine::Create(config, backend);
  if (!engine.ok()) return engine.status();
  std::vector<double> steps, forwards, hosts;
  std::mutex mu;
  (*engine)->SetObserver([&](const scheduler::EngineStats&, const scheduler::StepStats* s) {
    if (s && s->prefill_tokens == 0 && s->num_seqs == batch) {
      std::lock_guard<std::mutex> lock(mu);
      steps.push_back(s->seconds);
      forwards.push_back(s->forward_seconds);
      hosts.push_back(s->seconds - s->forward_seconds);
    }
  });
  auto sink = std::make_shared<CountingSink>();
  for (int i = 0; i < batch; ++i) {
    if (auto st = (*engine)->Submit(MakeRequest(model, i, prompt_tokens, max_tokens, sampling), sink); !st.ok()) {
      (*engine)->Stop();
      return st;
    }
  }
  sink->WaitFor(batch);
  (*engine)->Stop();  // joins the engine thread: no observer call after this
  if (steps.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no decode step ran all ", batch, " sequences (the first ended before the last was "
        "prefilled): raise max_tokens above the prefill steps"));
  }
  return DecodeStepTimes{Median(steps), Median(forwards), Median(hosts)};
}

scheduler::SamplingParams TypicalSampling() {
  scheduler::SamplingParams p;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  return p;
}

}  // namespace thetaserve::bench
