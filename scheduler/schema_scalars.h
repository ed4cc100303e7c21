// The scalar schemas of guided_schema.cc (guided_schema.h): strings (lengths, a pattern or a
// format), integers (any bounds) and numbers, each as the regular expression of its JSON text;
// and how a schema's refusals read.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace thetaserve::scheduler {

// Ordered: properties are written in the schema's order.
using SchemaJson = nlohmann::ordered_json;

// INVALID_ARGUMENT "guided_json: <path>: <what>" (`path` a JSON pointer into the schema).
absl::Status SchemaRefused(const std::string& path, std::string_view what);

// A count (minLength, maxItems, ...): absent, or a whole number from 0 to kMaxRegexRepeat.
absl::StatusOr<std::optional<int>> SchemaCount(const SchemaJson& s, const char* key,
                                               const std::string& path);

// Schema `s` of type string, at `path`: a JSON string with minLength/maxLength, a pattern it
// contains (unanchored, as JSON schema's patterns search) or a format (date, time, date-time,
// uuid). Lengths are counted repeats: (where, count) goes to `counted` (the automaton and the
// grammar grow with them; the ones to blame when the whole is too large).
absl::Status StringSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out,
                               std::vector<std::pair<std::string, int>>* counted);
// Type integer: any of minimum, maximum, exclusiveMinimum, exclusiveMaximum (whole numbers,
// rounded inwards, within ±1e18).
absl::Status IntegerSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out);
// Type number: no bounds, or minimum 0.
absl::Status NumberSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out);

}  // namespace thetaserve::scheduler
