#include "model/safetensors.h"

#include <sys/stat.h>

#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace thetaserve::model {
namespace {

using Json = nlohmann::json;

// The safetensors format caps the JSON header at 100 MB; anything bigger is a broken file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::optional<DType> DTypeFromSafetensors(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

// Reads and parses a JSON file; errors name the file.
absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

bool AsUint(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  if (!IsDir(dir)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  }
  auto ckpt = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  if (IsFile(index_path)) {
    auto index = ReadJson(index_path);
    if (!index.ok()) return index.status();
    auto map_it = index->find("weight_map");
    if (!index->is_object() || map_it == index->end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": no \"weight_map\" object"));
    }
    std::set<std::string> shards;
    for (auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map entry for '", tensor, "' is not a file name"));
      }
      const std::string name = shard.get<std::string>();
      if (name.empty() || name[0] == '/' || name.find("..") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map entry for '", tensor, "' names '", name,
            "', which is not a file in the checkpoint directory"));
      }
      shards.insert(name);
    }
    for (const std::string& shard : shards) {
      const std::string shard_path = dir + "/" + shard;
      if (!IsFile(shard_path)) {
        return absl::NotFoundError(absl::StrCat("missing shard ", shard_path, " (listed in ",
                                                index_path, ")"));
      }
      if (absl::Status s = ckpt->AddFile(shard_path); !s.ok()) return s;
    }
    for (auto& [tensor, shard] : map_it->items()) {
      if (ckpt->FindTensor(tensor) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor '", tensor, "' is listed for shard ",
                         shard.get<std::string>(), " but that shard does not contain it"));
      }
    }
  } else if (IsFile(single_path)) {
    if (absl::Status s = ckpt->AddFile(single_path); !s.ok()) return s;
  } else {
    return absl::NotFoundError(absl::StrCat(dir, " has neither model.safetensors nor ",
                                            "model.safetensors.index.json"));
  }
  return ckpt;
}

absl::Status SafetensorsCheckpoint::AddFile(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  const MappedFile& file = **mapped;
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (file.size() < 8) {
    return error(absl::StrCat("truncated safetensors file (", file.size(),
                              " bytes; the header length alone takes 8)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.data()[i];
  if (header_len > file.size() - 8) {
    return error(absl::StrCat("header length ", header_len, " runs past the end of the file (",
                              file.size(), " bytes): truncated, or not a safetensors file"));
  }
  if (header_len > kMaxHeaderBytes) {
    return error(absl::StrCat("header length ", header_len, " exceeds the 100 MB limit"));
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  Json header = Json::parse(header_begin, header_begin + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return error("header is not a JSON object");
  }
  const uint8_t* data = file.data() + 8 + header_len;
  const uint64_t data_size = file.size() - 8 - header_len;

  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    auto terror = [&](absl::string_view what) {
      return error(absl::StrCat("tensor '", name, "' ", what));
    };
    if (!info.is_object()) return terror("has no info object");
    auto dtype_it = info.find("dtype");
    auto shape_it = info.find("shape");
    auto offsets_it = info.find("data_offsets");
    if (dtype_it == info.end() || !dtype_it->is_string()) return terror("has no dtype");
    if (shape_it == info.end() || !shape_it->is_array()) return terror("has no shape");
    if (offsets_it == info.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return terror("has no data_offsets [begin, end]");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    std::optional<DType> dtype = DTypeFromSafetensors(dtype_name);
    if (!dtype) {
      return terror(absl::StrCat("has dtype ", dtype_name,
                                 ", which thetaserve does not read (supported: F32, F16, BF16)"));
    }
    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const Json& d : *shape_it) {
      uint64_t dim;
      if (!AsUint(d, &dim) || dim > uint64_t(INT64_MAX) ||
          __builtin_mul_overflow(numel, dim, &numel)) {
        return terror(absl::StrCat("has an invalid shape ", shape_it->dump()));
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t begin, end, expected;
    if (!AsUint((*offsets_it)[0], &begin) || !AsUint((*offsets_it)[1], &end) || end < begin) {
      return terror(absl::StrCat("has invalid data_offsets ", offsets_it->dump()));
    }
    if (end > data_size) {
      return terror(absl::StrCat("data_offsets [", begin, ", ", end,
                                 ") are out of range: the file has ", data_size,
                                 " bytes of tensor data (truncated file?)"));
    }
    if (__builtin_mul_overflow(numel, uint64_t(BlockBytes(t.dtype)), &expected) ||
        end - begin != expected) {
      return terror(absl::StrCat("has ", end - begin, " bytes of data but shape ",
                                 shape_it->dump(), " of ", dtype_name, " needs ", expected));
    }
    t.data = data + begin;
    t.nbytes = end - begin;
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return terror("appears in more than one file of the checkpoint");
    }
    tensors_.push_back(std::move(t));
  }
  files_.push_back(std::move(*mapped));
  return absl::OkStatus();
}

const TensorView* SafetensorsCheckpoint::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& config_json_path) {
  auto parsed = ReadJson(config_json_path);
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  const std::string& path = config_json_path;
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!j.is_object()) return error("not a JSON object");

  // Field readers: a null value counts as absent (HF writes "head_dim": null).
  auto present = [&](const Json& obj, const char* key) {
    auto it = obj.find(key);
    return it != obj.end() && !it->is_null();
  };
  auto get_int = [&](const Json& obj, const char* key,
                     std::optional<int64_t> fallback) -> absl::StatusOr<int64_t> {
    if (!present(obj, key)) {
      if (fallback) return *fallback;
      return error(absl::StrCat("missing required field \"", key, "\""));
    }
    const Json& v = obj.at(key);
    if (!v.is_number_integer()) return error(absl::StrCat("\"", key, "\" is not an integer"));
    return v.get<int64_t>();
  };
  auto get_float = [&](const Json& obj, const char* key,
                       std::optional<double> fallback) -> absl::StatusOr<double> {
    if (!present(obj, key)) {
      if (fallback) return *fallback;
      return error(absl::StrCat("missing required field \"", key, "\""));
    }
    const Json& v = obj.at(key);
    if (!v.is_number()) return error(absl::StrCat("\"", key, "\" is not a number"));
    return v.get<double>();
  };
  auto get_bool = [&](const Json& obj, const char* key, bool fallback) -> absl::StatusOr<bool> {
    if (!present(obj, key)) return fallback;
    const Json& v = obj.at(key);
    if (!v.is_boolean()) return error(absl::StrCat("\"", key, "\" is not true or false"));
    return v.get<bool>();
  };
#define THETASERVE_ASSIGN(lhs, expr) \
  do {                               \
    auto _v = (expr);                \
    if (!_v.ok()) return _v.status(); \
    lhs = *_v;                       \
  } while (0)

  ModelConfig c;
  if (!present(j, "model_type") || !j.at("model_type").is_string()) {
    return error("missing required field \"model_type\"");
  }
  c.architecture = j.at("model_type").get<std::string>();
  if (c.architecture != "llama" && c.architecture != "mistral" && c.architecture != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported architecture '", c.architecture,
                                                   "' in ", path,
                                                   "; supported: llama, mistral, qwen2"));
  }
  // HF's per-architecture defaults for the fields configs often leave out.
  const bool qwen2 = c.architecture == "qwen2";
  const int64_t default_context = qwen2 ? 32768 : c.architecture == "mistral" ? 131072 : 2048;
  const double default_eps = 1e-6;

  // The name is the checkpoint directory's (".../SmolLM2-135M/config.json" -> SmolLM2-135M).
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos
                                       ? 0
                                       : path.find_last_of('/'));
  while (!dir.empty() && dir.back() == '/') dir.pop_back();
  c.name = dir.empty() ? "model" : dir.substr(dir.find_last_of('/') + 1);

  THETASERVE_ASSIGN(c.vocab_size, get_int(j, "vocab_size", std::nullopt));
  THETASERVE_ASSIGN(c.hidden_size, get_int(j, "hidden_size", std::nullopt));
  THETASERVE_ASSIGN(c.intermediate_size, get_int(j, "intermediate_size", std::nullopt));
  THETASERVE_ASSIGN(c.num_layers, get_int(j, "num_hidden_layers", std::nullopt));
  THETASERVE_ASSIGN(c.num_heads, get_int(j, "num_attention_heads", std::nullopt));
  THETASERVE_ASSIGN(c.num_kv_heads, get_int(j, "num_key_value_heads", c.num_heads));
  for (auto [field, value] : {std::pair{"vocab_size", c.vocab_size},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_hidden_layers", c.num_layers},
                              {"num_attention_heads", c.num_heads},
                              {"num_key_value_heads", c.num_kv_heads}}) {
    if (value <= 0) return error(absl::StrCat("\"", field, "\" must be positive, got ", value));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return error(absl::StrCat("num_attention_heads ", c.num_heads,
                              " is not a multiple of num_key_value_heads ", c.num_kv_heads));
  }
  if (!present(j, "head_dim") && c.hidden_size % c.num_heads != 0) {
    return error(absl::StrCat("hidden_size ", c.hidden_size,
                              " is not a multiple of num_attention_heads ", c.num_heads,
                              " and there is no head_dim"));
  }
  THETASERVE_ASSIGN(c.head_dim, get_int(j, "head_dim", c.hidden_size / c.num_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return error(absl::StrCat("head_dim ", c.head_dim, " must be positive and even"));
  }
  THETASERVE_ASSIGN(c.max_context, get_int(j, "max_position_embeddings", default_context));
  double eps, theta;
  THETASERVE_ASSIGN(eps, get_float(j, "rms_norm_eps", default_eps));
  THETASERVE_ASSIGN(theta, get_float(j, "rope_theta", 10000.0));
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);
  c.rope_interleaved = false;  // HF checkpoints rotate halves
  THETASERVE_ASSIGN(c.tied_embeddings, get_bool(j, "tie_word_embeddings", false));
  // Qwen2 always has Q/K/V biases; LlamaConfig makes them optional; Mistral never has them.
  if (qwen2) {
    c.qkv_bias = true;
  } else if (c.architecture == "llama") {
    THETASERVE_ASSIGN(c.qkv_bias, get_bool(j, "attention_bias", false));
  }

  if (present(j, "rope_scaling")) {
    const Json& rs = j.at("rope_scaling");
    if (!rs.is_object()) return error("\"rope_scaling\" is not an object");
    std::string type;
    if (present(rs, "rope_type") && rs.at("rope_type").is_string()) {
      type = rs.at("rope_type").get<std::string>();
    } else if (present(rs, "type") && rs.at("type").is_string()) {
      type = rs.at("type").get<std::string>();
    }
    double factor = 1, low = 1, high = 4;
    if (type == "linear" || type == "llama3") {
      THETASERVE_ASSIGN(factor, get_float(rs, "factor", std::nullopt));
    }
    if (type == "linear") {
      c.rope_scaling = RopeScaling::kLinear;
    } else if (type == "llama3") {
      c.rope_scaling = RopeScaling::kLlama3;
      THETASERVE_ASSIGN(low, get_float(rs, "low_freq_factor", 1.0));
      THETASERVE_ASSIGN(high, get_float(rs, "high_freq_factor", 4.0));
      THETASERVE_ASSIGN(c.rope_original_context,
                        get_int(rs, "original_max_position_embeddings", 8192));
      if (high <= low) {
        return error("rope_scaling high_freq_factor must be larger than low_freq_factor");
      }
    } else if (type != "default") {
      return error(absl::StrCat("rope_scaling type '", type,
                                "' is not supported (supported: linear, llama3)"));
    }
    c.rope_factor = static_cast<float>(factor);
    c.rope_low_freq_factor = static_cast<float>(low);
    c.rope_high_freq_factor = static_cast<float>(high);
  }
#undef THETASERVE_ASSIGN
  return c;
}

}  // namespace thetaserve::model
