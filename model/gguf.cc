#include "model/gguf.h"

#include <cstring>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace thetaserve::model {
namespace {

// GGUF metadata value types (gguf.h's enum gguf_type).
enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Bytes of one scalar of `type`; 8 (the length prefix) for strings; 0 for unknown types.
size_t ScalarSize(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    default: return 0;
  }
}

// ggml type ids (ggml.h's enum ggml_type) of the storage types thetaserve reads.
std::optional<DType> DTypeFromGgml(uint32_t id) {
  switch (id) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 8: return DType::kQ8_0;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

// Names of ggml types thetaserve does not read, so the error says what the file holds.
const char* GgmlTypeName(uint32_t id) {
  static const char* const kNames[] = {
      "F32",  "F16",     "Q4_0",    "Q4_1",   "Q4_2",   "Q4_3",  "Q5_0", "Q5_1",
      "Q8_0", "Q8_1",    "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",  "Q6_K", "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",   "I16",     "I32",     "I64",    "F64",    "IQ1_M", "BF16"};
  return id < sizeof(kNames) / sizeof(kNames[0]) ? kNames[id] : "unknown";
}

const char* ValueTypeName(const GgufFile::Value& v) {
  static const char* const kNames[] = {"int",          "uint",         "float",
                                       "bool",         "string",       "int array",
                                       "float array",  "string array", "bool array"};
  return kNames[v.index()];
}

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  bool Read(void* out, size_t n) {
    if (n > remaining()) return false;
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Read(T* out) {
    return Read(static_cast<void*>(out), sizeof(T));
  }
  bool ReadString(std::string* out) {
    uint64_t len;
    if (!Read(&len) || len > remaining()) return false;
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

class Parser {
 public:
  Parser(const std::string& path, const MappedFile& file)
      : path_(path), file_size_(file.size()), in_(file.data(), file.size()) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
  }
  absl::Status Truncated(absl::string_view where) const {
    return Error(absl::StrCat("truncated GGUF file: ", where, " runs past the end (offset ",
                              in_.pos(), ", file size ", file_size_, ")"));
  }

  Cursor& in() { return in_; }

  // Reads a scalar of GGUF `type` widened into a Value.
  bool ReadScalar(uint32_t type, GgufFile::Value* out) {
    switch (type) {
      case kU8: return ReadAs<uint8_t, uint64_t>(out);
      case kI8: return ReadAs<int8_t, int64_t>(out);
      case kU16: return ReadAs<uint16_t, uint64_t>(out);
      case kI16: return ReadAs<int16_t, int64_t>(out);
      case kU32: return ReadAs<uint32_t, uint64_t>(out);
      case kI32: return ReadAs<int32_t, int64_t>(out);
      case kU64: return ReadAs<uint64_t, uint64_t>(out);
      case kI64: return ReadAs<int64_t, int64_t>(out);
      case kF32: return ReadAs<float, double>(out);
      case kF64: return ReadAs<double, double>(out);
      case kBool: {
        uint8_t b;
        if (!in_.Read(&b)) return false;
        *out = b != 0;
        return true;
      }
      case kString: {
        std::string s;
        if (!in_.ReadString(&s)) return false;
        *out = std::move(s);
        return true;
      }
    }
    return false;
  }

  absl::Status ReadValue(const std::string& key, uint32_t type, GgufFile::Value* out) {
    const std::string where = absl::StrCat("value of metadata key '", key, "'");
    if (type != kArray) {
      if (ScalarSize(type) == 0) {
        return Error(absl::StrCat("metadata key '", key, "' has unknown value type ", type));
      }
      if (!ReadScalar(type, out)) return Truncated(where);
      return absl::OkStatus();
    }
    uint32_t elem_type;
    uint64_t count;
    if (!in_.Read(&elem_type) || !in_.Read(&count)) return Truncated(where);
    if (elem_type == kArray) {
      return Error(absl::StrCat("metadata key '", key,
                                "' is an array of arrays, which thetaserve does not read"));
    }
    const size_t elem_size = ScalarSize(elem_type);
    if (elem_size == 0) {
      return Error(absl::StrCat("metadata key '", key, "' is an array of unknown value type ",
                                elem_type));
    }
    // Every element takes at least elem_size bytes: reject absurd counts before allocating.
    if (count > in_.remaining() / elem_size) return Truncated(where);
    GgufFile::Value elem;
    switch (elem_type) {
      case kString: {
        std::vector<std::string> v;
        v.reserve(count);
        for (uint64_t i = 0; i < count; ++i) {
          v.emplace_back();
          if (!in_.ReadString(&v.back())) return Truncated(where);
        }
        *out = std::move(v);
        return absl::OkStatus();
      }
      case kBool: {
        std::vector<bool> v(count);
        for (uint64_t i = 0; i < count; ++i) {
          if (!ReadScalar(elem_type, &elem)) return Truncated(where);
          v[i] = std::get<bool>(elem);
        }
        *out = std::move(v);
        return absl::OkStatus();
      }
      case kF32:
      case kF64: {
        std::vector<double> v(count);
        for (uint64_t i = 0; i < count; ++i) {
          if (!ReadScalar(elem_type, &elem)) return Truncated(where);
          v[i] = std::get<double>(elem);
        }
        *out = std::move(v);
        return absl::OkStatus();
      }
      default: {  // integers of every width
        std::vector<int64_t> v(count);
        for (uint64_t i = 0; i < count; ++i) {
          if (!ReadScalar(elem_type, &elem)) return Truncated(where);
          v[i] = std::holds_alternative<int64_t>(elem)
                     ? std::get<int64_t>(elem)
                     : static_cast<int64_t>(std::get<uint64_t>(elem));
        }
        *out = std::move(v);
        return absl::OkStatus();
      }
    }
  }

 private:
  template <typename Stored, typename Widened>
  bool ReadAs(GgufFile::Value* out) {
    Stored v;
    if (!in_.Read(&v)) return false;
    *out = static_cast<Widened>(v);
    return true;
  }

  const std::string& path_;
  size_t file_size_;
  Cursor in_;
};

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto gguf = std::unique_ptr<GgufFile>(new GgufFile());
  gguf->path_ = path;
  gguf->file_ = std::move(*mapped);
  const MappedFile& file = *gguf->file_;
  Parser p(path, file);
  Cursor& in = p.in();

  // Header: magic, version, tensor_count, kv_count.
  char magic[4];
  if (!in.Read(magic, 4)) return p.Truncated("the GGUF magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return p.Error(absl::StrCat("not a GGUF file (magic is '",
                                absl::CHexEscape(absl::string_view(magic, 4)),
                                "', expected 'GGUF')"));
  }
  if (!in.Read(&gguf->version_)) return p.Truncated("the GGUF version");
  if (gguf->version_ != 2 && gguf->version_ != 3) {
    return p.Error(absl::StrCat("unsupported GGUF version ", gguf->version_,
                                " (thetaserve reads versions 2 and 3; re-convert the model "
                                "with a current llama.cpp)"));
  }
  uint64_t tensor_count, kv_count;
  if (!in.Read(&tensor_count) || !in.Read(&kv_count)) return p.Truncated("the GGUF header");

  // Metadata.
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    uint32_t type;
    if (!in.ReadString(&key)) return p.Truncated(absl::StrCat("metadata key #", i));
    if (!in.Read(&type)) return p.Truncated(absl::StrCat("type of metadata key '", key, "'"));
    Value value;
    if (absl::Status s = p.ReadValue(key, type, &value); !s.ok()) return s;
    if (!gguf->metadata_.emplace(key, std::move(value)).second) {
      return p.Error(absl::StrCat("duplicate metadata key '", key, "'"));
    }
  }
  if (gguf->Has("general.alignment")) {
    auto a = gguf->GetInt("general.alignment");
    if (!a.ok()) return a.status();
    if (*a <= 0 || (*a & (*a - 1)) != 0) {
      return p.Error(absl::StrCat("general.alignment is ", *a, "; it must be a power of two"));
    }
    gguf->alignment_ = static_cast<uint64_t>(*a);
  }

  // Tensor infos.
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorView t;
    if (!in.ReadString(&t.name)) return p.Truncated(absl::StrCat("name of tensor #", i));
    const std::string where = absl::StrCat("info of tensor '", t.name, "'");
    uint32_t n_dims;
    if (!in.Read(&n_dims)) return p.Truncated(where);
    if (n_dims == 0 || n_dims > 4) {
      return p.Error(absl::StrCat("tensor '", t.name, "' has ", n_dims,
                                  " dimensions; GGUF allows 1 to 4"));
    }
    uint64_t ne[4];
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (!in.Read(&ne[d])) return p.Truncated(where);
    }
    uint32_t type_id;
    uint64_t offset;
    if (!in.Read(&type_id) || !in.Read(&offset)) return p.Truncated(where);

    std::optional<DType> dtype = DTypeFromGgml(type_id);
    if (!dtype) {
      return p.Error(absl::StrCat("tensor '", t.name, "' has ggml type ", type_id, " (",
                                  GgmlTypeName(type_id),
                                  "), which thetaserve does not read; supported: F32, F16, "
                                  "BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K"));
    }
    t.dtype = *dtype;
    if (ne[0] % BlockElems(t.dtype) != 0) {
      return p.Error(absl::StrCat("tensor '", t.name, "' has rows of ", ne[0],
                                  " elements, not a multiple of the ", DTypeName(t.dtype),
                                  " block size ", BlockElems(t.dtype)));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (ne[d] > uint64_t(std::numeric_limits<int64_t>::max()) ||
          MulOverflows(numel, ne[d], &numel)) {
        return p.Error(absl::StrCat("tensor '", t.name, "' has an impossible shape"));
      }
    }
    uint64_t nbytes;
    if (MulOverflows(numel / BlockElems(t.dtype), BlockBytes(t.dtype), &nbytes) ||
        nbytes > file.size()) {
      return p.Error(absl::StrCat("tensor '", t.name, "' data is larger than the whole file (",
                                  file.size(), " bytes; truncated file?)"));
    }
    if (offset % gguf->alignment_ != 0) {
      return p.Error(absl::StrCat("tensor '", t.name, "' data offset ", offset,
                                  " is not a multiple of the alignment ", gguf->alignment_));
    }
    for (int d = static_cast<int>(n_dims) - 1; d >= 0; --d) {
      t.shape.push_back(static_cast<int64_t>(ne[d]));
    }
    t.nbytes = nbytes;
    if (!gguf->tensor_index_.emplace(t.name, gguf->tensors_.size()).second) {
      return p.Error(absl::StrCat("duplicate tensor '", t.name, "'"));
    }
    gguf->tensors_.push_back(std::move(t));
    offsets.push_back(offset);
  }

  // Tensor data starts at the next multiple of the alignment.
  const uint64_t align = gguf->alignment_;
  const uint64_t data_start = (in.pos() + align - 1) / align * align;
  const uint64_t data_size = data_start <= file.size() ? file.size() - data_start : 0;
  for (size_t i = 0; i < gguf->tensors_.size(); ++i) {
    TensorView& t = gguf->tensors_[i];
    if (offsets[i] > data_size || t.nbytes > data_size - offsets[i]) {
      return p.Error(absl::StrCat("tensor '", t.name, "' data [", offsets[i], ", ",
                                  offsets[i] + t.nbytes, ") is out of bounds: the file has ",
                                  data_size, " bytes of tensor data (truncated file?)"));
    }
    t.data = file.data() + data_start + offsets[i];
  }
  return gguf;
}

bool GgufFile::Has(std::string_view key) const {
  return metadata_.find(key) != metadata_.end();
}

namespace {

template <typename T>
absl::StatusOr<const T*> Lookup(const std::string& path,
                                const std::map<std::string, GgufFile::Value, std::less<>>& m,
                                std::string_view key_sv, const char* expected) {
  auto it = m.find(key_sv);
  const absl::string_view key(key_sv.data(), key_sv.size());
  if (it == m.end()) {
    return absl::NotFoundError(absl::StrCat(path, ": metadata key '", key, "' not found"));
  }
  if (!std::holds_alternative<T>(it->second)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": metadata key '", key,
                                                   "' has type ", ValueTypeName(it->second),
                                                   ", expected ", expected));
  }
  return &std::get<T>(it->second);
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  auto v = Lookup<std::string>(path_, metadata_, key, "string");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (auto* u = std::get_if<uint64_t>(&it->second)) {
      if (*u > uint64_t(std::numeric_limits<int64_t>::max())) {
        return absl::OutOfRangeError(absl::StrCat(path_, ": metadata key '", it->first,
                                                  "' value ", *u, " is too large"));
      }
      return static_cast<int64_t>(*u);
    }
  }
  auto v = Lookup<int64_t>(path_, metadata_, key, "integer");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
    if (auto* u = std::get_if<uint64_t>(&it->second)) return static_cast<double>(*u);
  }
  auto v = Lookup<double>(path_, metadata_, key, "float");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  auto v = Lookup<bool>(path_, metadata_, key, "bool");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  auto v = Lookup<std::vector<std::string>>(path_, metadata_, key, "string array");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  auto v = Lookup<std::vector<int64_t>>(path_, metadata_, key, "int array");
  if (!v.ok()) return v.status();
  return **v;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (auto* ints = std::get_if<std::vector<int64_t>>(&it->second)) {
      return std::vector<double>(ints->begin(), ints->end());
    }
  }
  auto v = Lookup<std::vector<double>>(path_, metadata_, key, "float array");
  if (!v.ok()) return v.status();
  return **v;
}

const TensorView* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t GgufFile::tensor_bytes() const {
  uint64_t total = 0;
  for (const TensorView& t : tensors_) total += t.nbytes;
  return total;
}

}  // namespace thetaserve::model
