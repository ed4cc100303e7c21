// The model hyper-parameters thetaserve needs, filled from GGUF metadata or HF config.json.
#pragma once

#include <cstdint>
#include <string>

namespace thetaserve::model {

enum class RopeScaling { kNone, kLinear, kLlama3 };

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2"
  std::string name;          // general.name or the directory name
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_context = 0;
  float rms_norm_eps = 1e-5f;

  float rope_theta = 10000.0f;
  // GGUF files converted by llama.cpp store LLaMA's Q and K rows permuted so that RoPE
  // rotates adjacent pairs (x[2i], x[2i+1]); HF checkpoints rotate halves (x[i], x[i+d/2]).
  bool rope_interleaved = false;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 1.0f;                // linear and llama3
  float rope_low_freq_factor = 1.0f;       // llama3
  float rope_high_freq_factor = 4.0f;      // llama3
  int64_t rope_original_context = 8192;    // llama3

  bool tied_embeddings = false;
  bool qkv_bias = false;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

}  // namespace thetaserve::model
