// Test-only helper: builds safetensors files (8-byte header length, JSON header, data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace thetaserve::testing {

class SafetensorsWriter {
 public:
  void Add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
           const std::string& data) {
    header_[name] = {{"dtype", dtype},
                     {"shape", shape},
                     {"data_offsets", {data_.size(), data_.size() + data.size()}}};
    data_ += data;
  }
  // An entry written verbatim (for malformed headers).
  void AddRaw(const std::string& name, const nlohmann::json& entry) { header_[name] = entry; }
  void AddMetadata() { header_["__metadata__"] = {{"format", "pt"}}; }
  // Appends bytes to the data section without a header entry.
  void AppendData(const std::string& bytes) { data_ += bytes; }

  std::string Build() const {
    std::string header = header_.dump();
    header.resize((header.size() + 7) / 8 * 8, ' ');  // writers pad with spaces
    uint64_t len = header.size();
    std::string out(reinterpret_cast<const char*>(&len), 8);
    return out + header + data_;
  }

  template <typename T>
  static std::string Bytes(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

}  // namespace thetaserve::testing
