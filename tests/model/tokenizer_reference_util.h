// Shared by the tokenizer reference tests: checks a Tokenizer against a
// tests/data/reference/tokenization_<name>.json file written by scripts/make_reference.py
// from Hugging Face tokenizers (schema "thetaserve-tokenization-v1", see the README there).
#pragma once

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace thetaserve::model {

inline std::string Escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// Compares every case: ids (special tokens parsed), ids with BOS, ids with special tokens as
// text (tricky cases), decode, and the streamed decode. Returns the number of cases.
inline size_t ExpectMatchesReference(const Tokenizer& tok, const std::string& reference_file) {
  const nlohmann::json ref = nlohmann::json::parse(
      thetaserve::testing::ReadFileOrDie(thetaserve::testing::TestDataPath(reference_file)));
  EXPECT_EQ(ref.value("schema", ""), "thetaserve-tokenization-v1");
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.add_bos(), ref["add_bos"].get<bool>());
  if (!ref["bos_id"].is_null()) {
    EXPECT_EQ(tok.bos_id(), ref["bos_id"].get<int32_t>());
  }
  if (!ref["eos_id"].is_null()) {
    EXPECT_EQ(tok.eos_id(), ref["eos_id"].get<int32_t>());
  }
  size_t mismatches = 0;
  const auto& cases = ref["cases"];
  for (size_t i = 0; i < cases.size() && mismatches < 10; ++i) {
    const auto& c = cases[i];
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const std::string where = "case " + std::to_string(i) + " (" +
                              c["kind"].get<std::string>() + "): '" + Escaped(text) + "'";
    const std::vector<int32_t> got = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/true);
    if (got != want) ++mismatches;
    EXPECT_EQ(got, want) << where;
    EXPECT_EQ(tok.Encode(text, /*add_bos=*/true, /*parse_special=*/true),
              c["ids_with_special"].get<std::vector<int32_t>>())
        << where;
    if (c.contains("ids_special_as_text")) {
      EXPECT_EQ(tok.Encode(text, /*add_bos=*/false, /*parse_special=*/false),
                c["ids_special_as_text"].get<std::vector<int32_t>>())
          << where;
    }
    const std::string decoded = c["decoded"].get<std::string>();
    EXPECT_EQ(tok.Decode(want, /*skip_special=*/false), decoded) << where;
    // Streaming the ids gives the same text, apart from how ill-formed UTF-8 is replaced.
    if (decoded.find("\xEF\xBF\xBD") == std::string::npos) {
      StreamDecoder stream(tok, /*skip_special=*/false);
      std::string streamed;
      for (int32_t id : want) streamed += stream.Push(id);
      streamed += stream.Flush();
      EXPECT_EQ(streamed, decoded) << where;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "stopped after 10 mismatching cases";
  return cases.size();
}

}  // namespace thetaserve::model
