// Reading an OpenAI-compatible request body: the JSON object and its fields, each refusal
// naming the field (INVALID_ARGUMENT "<field> <what is wrong>"). Shared by the request parsers
// (openai_api.cc, openai_params.cc).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace thetaserve::server {

// The model names the HTTP API answers to (--served-model-name NAME[,ALIAS...], as vLLM's several
// names): names[0] is the one responses carry and /v1/models lists first. One name converts.
struct ServedModel {
  ServedModel(std::string name) : names{std::move(name)} {}  // NOLINT: one name is a model
  ServedModel(const char* name) : names{name} {}             // NOLINT
  explicit ServedModel(std::vector<std::string> all) : names(std::move(all)) {}
  const std::string& name() const { return names.front(); }
  bool Serves(std::string_view model) const;
  // "'a'", or "'a' (also 'b', 'c')": for messages.
  std::string Described() const;
  std::vector<std::string> names;  // not empty
};

}  // namespace thetaserve::server

namespace thetaserve::server::openai_body {

// Requests parse into nlohmann::json (a sorted map: ordered_json inserts a key by scanning the
// others, so a body with many keys would cost quadratic time); responses keep the field order
// OpenAI documents.
using In = nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& what);
// `key` is present and not null.
bool Given(const In& body, const char* key);
absl::StatusOr<double> Number(const In& body, const char* key);
// An integer, or a float with a whole value.
absl::StatusOr<int64_t> Integer(const In& body, const char* key);
absl::StatusOr<bool> Bool(const In& body, const char* key);
absl::StatusOr<std::string> String(const In& v, const std::string& field);
// Refuses a parameter the server cannot honour unless it has its neutral value.
absl::Status Unsupported(const std::string& key, const std::string& why);
// Token ids from a JSON array (the prompt, stop_token_ids).
absl::StatusOr<std::vector<uint32_t>> TokenIdArray(const In& v, const std::string& field);
// The text of the value at `path` (keys from the top object down; in an array, an index in
// decimal) in `body_text`, a body that
// ParseBody took; empty when absent (or not under objects). Of duplicate keys, the last, as
// the parse keeps. For a value whose keys' order matters (a JSON schema's properties), which
// In, sorted, does not keep.
std::string_view RawValue(std::string_view body_text,
                          std::initializer_list<std::string_view> path);
// A request body: a JSON object whose `model`, when given, is one `served_model` serves (else
// NOT_FOUND); invalid JSON is INVALID_ARGUMENT saying what the parser found wrong.
absl::StatusOr<In> ParseBody(std::string_view body_text, const ServedModel& served_model);

}  // namespace thetaserve::server::openai_body
