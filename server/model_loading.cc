#include "server/model_loading.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "server/cli_args.h"

namespace thetaserve::server {

absl::StatusOr<kernels::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return kernels::Device::kCpu;
  if (name == "cuda") return kernels::Device::kCuda;
  if (name == "auto" || name.empty()) return kernels::Device::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu, cuda or auto, got '", name, "'"));
}

absl::StatusOr<kernels::KvDtype> ParseKvDtypeFlag(const std::string& name) {
  kernels::KvDtype t;
  if (kernels::ParseKvDtype(name, &t)) return t;
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv-cache-dtype must be auto, f32, f16, bf16, fp8 (= fp8_e4m3), fp8_e5m2 or q8_0, got '", name,
      "'"));
}

absl::StatusOr<std::string> ReadCorpus(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read --", flag, " '", path,
                                            "' (scripts/fetch-corpora.sh writes data/*.txt)"));
  }
  // A directory opens on Linux and reads as nothing: it was "fewer tokens than one window".
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " '", path, "' is not a file (a directory?)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " '", path, "' is empty"));
  }
  return ss.str();
}

std::vector<int32_t> TokenizePrefix(const model::Tokenizer& tokenizer, const std::string& text,
                                    int64_t max_tokens) {
  const size_t prefix = std::min(text.size(), static_cast<size_t>(max_tokens) * 8 + 1024);
  std::vector<int32_t> ids =
      tokenizer.Encode(std::string_view(text).substr(0, prefix), /*add_bos=*/false,
                       /*parse_special=*/false);
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
  return ids;
}

absl::Status CheckWritable(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  // "" would pass as the working directory's file and fail only when written.
  if (path.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write --", flag, ": the path is empty"));
  }
  std::error_code ec;
  const fs::path p(path);
  const bool exists = fs::exists(p, ec);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  bool ok;
  if (exists) {
    ok = !fs::is_directory(p, ec) && ::access(path.c_str(), W_OK) == 0;
  } else {
    ok = fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0;
  }
  if (ok) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("cannot write --", flag, " ", path));
}

absl::Status CheckModelFlag(const std::string& path) {
  if (!path.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--model is required (e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf; "
      "scripts/fetch-model.sh downloads it)");
}

kernels::MatMulMode MatMulFlag(const CliArgs& args) {
  return args.Has("exact-matmul") ? kernels::MatMulMode::kExact : kernels::MatMulMode::kQuantized;
}

absl::StatusOr<LoadedModel> LoadModelForCli(const std::string& path, kernels::Device device,
                                            int threads, kernels::MatMulMode matmul,
                                            kernels::KvDtype kv_dtype) {
  if (absl::Status st = CheckModelFlag(path); !st.ok()) return st;
  auto start = std::chrono::steady_clock::now();
  std::fprintf(stderr, "loading %s ...\n", path.c_str());
  LoadedModel out;
  auto model = model::Model::Load(path);
  if (!model.ok()) return model.status();
  out.model = std::move(*model);
  auto backend = kernels::CreateBackend(*out.model, device, threads, matmul, kv_dtype);
  if (!backend.ok()) return backend.status();
  out.backend = std::move(*backend);
  const auto& c = out.model->config();
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "loaded %s: %s, %lld layers, hidden %lld, %lld/%lld heads, vocab %lld, "
               "%.1f MB of weights, backend %s (KV cache in %s%s), in %.2f s\n",
               c.name.c_str(), c.architecture.c_str(), (long long)c.num_layers,
               (long long)c.hidden_size, (long long)c.num_heads, (long long)c.num_kv_heads,
               (long long)c.vocab_size, out.model->weight_bytes() / 1e6,
               out.backend->name().c_str(),
               std::string(kernels::KvDtypeName(out.backend->kv_dtype())).c_str(),
               // The CPU backend's f32 path (the default, int8 activations, goes unsaid).
               out.backend->matmul_activations() == "f32" ? "; f32 activations" : "", secs);
  if (matmul == kernels::MatMulMode::kExact && out.backend->matmul_activations() == "bf16") {
    std::fprintf(stderr, "--exact-matmul: no effect on the %s backend, which multiplies in bf16 "
                         "(--device cpu for f32 activations)\n",
                 out.backend->name().c_str());
  }
  return out;
}

}  // namespace thetaserve::server
