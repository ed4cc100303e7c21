// GGUF v3 reader (llama.cpp's model file format): memory-maps the file, parses metadata and
// tensor infos, and hands out TensorViews that point into the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/mapped_file.h"
#include "model/tensor.h"

namespace thetaserve::model {

class GgufFile {
 public:
  // A metadata value. Integers of every width are widened to int64/uint64 and floats to
  // double; arrays keep one element type.
  using Value = std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<int64_t>,
                             std::vector<double>, std::vector<std::string>, std::vector<bool>>;

  // Fails with a Status naming the file and the problem (missing file, wrong magic,
  // unsupported version, truncated header/metadata/tensor data, unknown tensor type,
  // tensor data out of bounds or misaligned).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  bool Has(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;  // any integer type
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // float or integer
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;
  const std::map<std::string, Value, std::less<>>& metadata() const { return metadata_; }

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(std::string_view name) const;

  // Bytes of tensor data in the file (sum of all tensors' nbytes).
  uint64_t tensor_bytes() const;

 private:
  GgufFile() = default;

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, Value, std::less<>> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// The ModelConfig of a GGUF file from its `<arch>.*` metadata (architectures llama — which
// mistral GGUFs use too — and qwen2), its vocabulary and which tensors it holds (no
// output.weight means tied embeddings; Llama 3's rope_freqs.weight becomes kLlama3 scaling).
// Other architectures and missing keys fail with a Status naming the file and the key.
absl::StatusOr<ModelConfig> ParseGgufConfig(const GgufFile& gguf);

}  // namespace thetaserve::model
