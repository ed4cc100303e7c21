// Test-only helpers: a minimal GGUF writer.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::testing {

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Builds GGUF files byte by byte, the way llama.cpp's gguf writer lays them out.
class GgufWriter {
 public:
  enum Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };
  // Where the parts of the last Build() start, for truncation tests.
  struct Layout {
    size_t metadata_begin = 0;
    size_t tensor_info_begin = 0;
    size_t tensor_info_end = 0;
    size_t data_begin = 0;
  };

  uint32_t version = 3;
  uint32_t alignment = 32;

  void AddString(const std::string& key, const std::string& v) {
    Key(key, kString);
    Str(&kv_, v);
    ++kv_count_;
  }
  template <typename T>
  void AddScalar(const std::string& key, Type type, T v) {
    Key(key, type);
    Pod(&kv_, v);
    ++kv_count_;
  }
  void AddU32(const std::string& key, uint32_t v) { AddScalar(key, kU32, v); }
  void AddI32(const std::string& key, int32_t v) { AddScalar(key, kI32, v); }
  void AddF32(const std::string& key, float v) { AddScalar(key, kF32, v); }
  void AddBool(const std::string& key, bool v) { AddScalar(key, kBool, uint8_t(v)); }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, kArray);
    Pod(&kv_, uint32_t(kString));
    Pod(&kv_, uint64_t(v.size()));
    for (const std::string& s : v) Str(&kv_, s);
    ++kv_count_;
  }
  template <typename T>
  void AddArray(const std::string& key, Type elem_type, const std::vector<T>& v) {
    Key(key, kArray);
    Pod(&kv_, uint32_t(elem_type));
    Pod(&kv_, uint64_t(v.size()));
    for (const T& x : v) Pod(&kv_, x);
    ++kv_count_;
  }
  // Raw key/value bytes (for malformed values).
  void AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes) {
    Key(key, type);
    kv_ += value_bytes;
    ++kv_count_;
  }

  // `ne` is innermost first, as GGUF stores it. The offset is the next aligned position
  // in the data section unless `offset_override` is given.
  void AddTensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& ne,
                 const std::string& data, int64_t offset_override = -1) {
    uint64_t offset = offset_override >= 0 ? uint64_t(offset_override) : data_.size();
    Str(&infos_, name);
    Pod(&infos_, uint32_t(ne.size()));
    for (uint64_t d : ne) Pod(&infos_, d);
    Pod(&infos_, ggml_type);
    Pod(&infos_, offset);
    ++tensor_count_;
    if (offset_override < 0) {
      data_ += data;
      data_.resize((data_.size() + alignment - 1) / alignment * alignment, '\0');
    }
  }

  std::string Build(Layout* layout = nullptr) const {
    std::string out = "GGUF";
    Pod(&out, version);
    Pod(&out, tensor_count_);
    Pod(&out, kv_count_);
    Layout l;
    l.metadata_begin = out.size();
    out += kv_;
    l.tensor_info_begin = out.size();
    out += infos_;
    l.tensor_info_end = out.size();
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    l.data_begin = out.size();
    out += data_;
    if (layout != nullptr) *layout = l;
    return out;
  }

  template <typename T>
  static std::string Bytes(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

 private:
  template <typename T>
  static void Pod(std::string* out, T v) {
    out->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void Str(std::string* out, const std::string& s) {
    Pod(out, uint64_t(s.size()));
    *out += s;
  }
  void Key(const std::string& key, uint32_t type) {
    Str(&kv_, key);
    Pod(&kv_, type);
  }

  std::string kv_, infos_, data_;
  uint64_t kv_count_ = 0;
  uint64_t tensor_count_ = 0;
};

}  // namespace thetaserve::testing
