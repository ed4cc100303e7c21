// Loading a model and a backend for the command-line tools, with a progress line.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace thetaserve::server {

class CliArgs;

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<kernels::Backend> backend;
};

absl::StatusOr<kernels::Device> ParseDevice(const std::string& name);

// Reads a corpus named by `--<flag>`; a missing file says how to fetch the corpora; a directory
// or an empty file is refused by name.
absl::StatusOr<std::string> ReadCorpus(const std::string& flag, const std::string& path);
// The first `max_tokens` tokens of `text`, no special tokens (encodes a generous prefix of
// ~8 bytes a token rather than the whole file).
std::vector<int32_t> TokenizePrefix(const model::Tokenizer& tokenizer, const std::string& text,
                                    int64_t max_tokens);

// --exact-matmul given: MatMulMode::kExact (f32 activations on the CPU), else kQuantized.
kernels::MatMulMode MatMulFlag(const CliArgs& args);

// "auto", "f32", "f16" or "bf16" for --kv-cache-dtype.
absl::StatusOr<kernels::KvDtype> ParseKvDtypeFlag(const std::string& name);

// Whether `path` (from --<flag>) can be written later, without creating it now: a file that is
// there must be writable, else its directory must be.
absl::Status CheckWritable(const std::string& flag, const std::string& path);

// --model as given: empty is a bad command line that says where the default model comes from.
absl::Status CheckModelFlag(const std::string& path);

// Loads `path`, prints "loading <path> ..." and a summary line to stderr. `matmul`: see
// kernels/matmul_mode.h (CPU backend only); `kv_dtype`: the KV pages' element type.
absl::StatusOr<LoadedModel> LoadModelForCli(
    const std::string& path, kernels::Device device, int threads,
    kernels::MatMulMode matmul = kernels::MatMulMode::kQuantized,
    kernels::KvDtype kv_dtype = kernels::KvDtype::kAuto);

}  // namespace thetaserve::server
