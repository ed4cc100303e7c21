// Regular expressions (Python's re syntax, as guided_regex takes) for pieces of JSON text: a
// string's characters, numbers, RFC 3339 dates and times, literals, integer ranges. The
// building blocks guided_schema.cc and schema_scalars.cc put together.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "scheduler/guided_json.h"

namespace thetaserve::scheduler {

// One character of a JSON string: any but '"', '\' and controls, an escape, or \uXXXX with
// surrogates only as a high-low pair.
inline constexpr char kJsonStringChar[] =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|)"
    R"([dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})))";
// Numbers with the digits json_object allows (kMaxJsonDigits in the integer part and the
// fraction, kMaxJsonExponentDigits in the exponent): a model cannot write zeros forever.
inline constexpr char kJsonInteger[] = "-?(?:0|[1-9][0-9]{0,18})";
inline constexpr char kJsonNonNegative[] = "(?:0|[1-9][0-9]{0,18})";
inline constexpr char kJsonFraction[] = R"((?:\.[0-9]{1,19})?(?:[eE][+-]?[0-9]{1,3})?)";
static_assert(kMaxJsonDigits == 19 && kMaxJsonExponentDigits == 3);

// The formats a string may have (RFC 3339's date, full-time; RFC 4122's uuid). Days as each
// month has them, 29 February only in leap years (the Gregorian rule: years divisible by 4,
// centuries only when divisible by 400); T and Z in either case, and a leap second.
inline constexpr char kJsonDate[] =
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-"
    "(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|"
    "[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)";
inline constexpr char kJsonTime[] =
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]{1,9})?"
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
inline constexpr char kJsonUuid[] =
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";

// `text` matched as it is: letters, digits and multibyte characters as themselves, every other
// byte as \xHH.
std::string RegexLiteral(std::string_view text);
// (?:alternatives)
std::string RegexGroup(const std::string& alternatives);
// The decimal integers from `lo` to `hi` (none: no end on that side; at most kMaxJsonDigits
// digits there), without leading zeros or "-0". lo <= hi when both are given.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);
// The pattern has a '|' outside its groups and classes.
bool HasTopLevelBar(std::string_view pattern);
// How deep a JSON text's arrays and objects nest (its strings skipped).
int JsonNesting(std::string_view text);

}  // namespace thetaserve::scheduler
