// A loaded model: configuration, weights and tokenizer, from a GGUF file or an HF directory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace thetaserve::model {

class GgufFile;
class SafetensorsCheckpoint;

class Model {
 public:
  // `path` is a .gguf file or a directory with config.json, *.safetensors, tokenizer.json.
  // Every tensor the architecture needs is checked for presence and shape; failures name
  // the file, the tensor and the problem.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path);
  ~Model();

  const ModelConfig& config() const { return config_; }
  // Serves at most `tokens` of context, prompt and output together (config().max_context), to
  // bound requests and the memory one sequence may take. Only shortens: a longer context than
  // the model was trained for is refused.
  absl::Status LimitContext(int64_t tokens);
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& path() const { return path_; }
  // Bytes of weight data as stored in the file (what one forward pass must read).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // A short stable id of this model's weights (used to bind θ tables to a model).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Model() = default;
  absl::Status BindWeights(const std::string& source);

  std::string path_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsCheckpoint> safetensors_;
  // 1-D weights (norms, biases) stored as F16/BF16 (or unaligned) are converted to F32 here
  // so kernels can read them as float*; the views in weights_ point into these buffers.
  std::vector<std::vector<float>> owned_f32_;
  uint64_t weight_bytes_ = 0;
  std::string fingerprint_;
};

}  // namespace thetaserve::model
