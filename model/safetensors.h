// Safetensors reader (single file, or sharded with model.safetensors.index.json) and the
// Hugging Face config.json parser.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/mapped_file.h"
#include "model/tensor.h"

namespace thetaserve::model {

// All tensors of one checkpoint directory. Supports dtypes F32, F16 and BF16; others fail
// with a Status naming file, tensor and dtype.
class SafetensorsCheckpoint {
 public:
  // `dir` holds model.safetensors, or model.safetensors.index.json plus its shards.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(std::string_view name) const;

 private:
  SafetensorsCheckpoint() = default;
  absl::Status AddFile(const std::string& path);

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Parses HF config.json (model_type llama, mistral or qwen2). Unsupported model types and
// missing required fields fail with a Status naming the file and the field.
absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& config_json_path);

}  // namespace thetaserve::model
