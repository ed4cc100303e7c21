// What the benchmarks share: timing helpers, list flags, and decode steps timed through the
// real engine (the CPU decode benchmark and the GPU benchmark's end-to-end part).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "scheduler/engine.h"

namespace thetaserve::bench {

// Seconds on a steady clock.
double Now();

// The middle element (upper middle for an even count); 0 for an empty list.
double Median(std::vector<double> v);

// "1,8,32" -> {1, 8, 32}; parts that are not integers are skipped.
std::vector<int> ParseList(const std::string& s);

// A benchmark's command line of `--flag value` pairs, each given to take(flag, value), which
// returns false for a flag it does not know. --help (or -h) prints `usage` and exits 0 (it
// started a whole run); an unknown flag or one without its value exits 2, naming it.
void ParseFlags(int argc, char** argv, const char* usage,
                const std::function<bool(const std::string& flag, const std::string& value)>& take);
// A flag's value as a number, or exit 2 naming the flag (std::stoi's exception ended the
// process with "terminate called ... stoi").
int IntFlag(const std::string& flag, const std::string& value);
double DoubleFlag(const std::string& flag, const std::string& value);

// Counts finished requests and their tokens; thread-safe (the engine thread finishes them,
// the benchmark waits).
class CountingSink : public scheduler::TokenSink {
 public:
  void OnTokens(const scheduler::TokenDelta&) override {}
  void OnFinish(const scheduler::FinishInfo& info) override;
  void WaitFor(int n);
  int64_t tokens();
  // Median time to first token of the requests finished so far (seconds).
  double MedianTtft();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
  int64_t tokens_ = 0;
  std::vector<double> ttft_;
};

// Request i of a benchmark: a distinct prompt of prompt_tokens tokens cut from a repeating
// text, exactly max_tokens output tokens (EOS ignored), greedy unless `sampling` is given
// (request i is then seeded with i).
scheduler::Request MakeRequest(const model::Model& model, int i, int prompt_tokens, int max_tokens,
                               const scheduler::SamplingParams* sampling = nullptr);

// Submits `batch` requests at once to a fresh engine (config with max_num_seqs = batch) and
// returns the median duration of the steps that decoded the whole batch and prefilled nothing
// (FAILED_PRECONDITION when there was none: the first sequences ended before the last began).
absl::StatusOr<double> DecodeStepSeconds(scheduler::EngineConfig config, kernels::Backend& backend,
                                         const model::Model& model, int batch, int prompt_tokens,
                                         int max_tokens,
                                         const scheduler::SamplingParams* sampling = nullptr);
// The same steps' medians of the whole step and of its part up to the logits on the host
// (StepStats::forward_seconds: the batch's tables and the backend's forward pass); the
// difference is sampling and the engine's bookkeeping after it.
struct DecodeStepTimes {
  double step_seconds = 0;
  double forward_seconds = 0;
  double host_seconds = 0;  // median of each step's time after its logits
};
absl::StatusOr<DecodeStepTimes> DecodeStepMedians(scheduler::EngineConfig config,
                                                  kernels::Backend& backend,
                                                  const model::Model& model, int batch,
                                                  int prompt_tokens, int max_tokens,
                                                  const scheduler::SamplingParams* sampling = nullptr);

// The sampling the benchmarks time besides greedy: temperature 0.7, top-p 0.9.
scheduler::SamplingParams TypicalSampling();

}  // namespace thetaserve::bench
