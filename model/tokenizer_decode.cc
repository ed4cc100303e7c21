// BpeTokenizer's decoding side: HF decoder steps (ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Metaspace) over whole sequences, and per token for TokenBytes / streaming.
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "model/bpe_tokenizer.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

// The byte of a "<0xXX>" piece, or -1.
int ByteFallbackValue(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

// HF Strip: removes up to `start` leading and `stop` trailing copies of `ch`.
std::string Strip(std::string_view t, std::string_view ch, int start, int stop) {
  if (ch.empty()) return std::string(t);
  for (int k = 0; k < start && t.starts_with(ch); ++k) t.remove_prefix(ch.size());
  for (int k = 0; k < stop && t.ends_with(ch); ++k) t.remove_suffix(ch.size());
  return std::string(t);
}

std::string MetaspaceText(std::string_view t, const DecoderStep& step, bool first) {
  const bool drop = first && step.prepend_scheme != PrependScheme::kNever;
  return absl::StrReplaceAll(AsAbsl(t), {{step.pattern, drop ? "" : " "}});
}

}  // namespace

std::string BpeTokenizer::DecoderInput(int32_t id) const {
  const std::string& piece = pieces_[id];
  // A plain-text piece in a byte-level vocabulary is re-mapped so the ByteLevel step
  // gives its text back unchanged.
  if (spec_.byte_level && !spec_.raw_pieces.empty() && spec_.raw_pieces[id]) {
    return BytesToByteLevel(piece);
  }
  return piece;
}

std::string BpeTokenizer::RunDecoder(std::vector<std::string> tokens) const {
  if (spec_.decoder.empty()) return absl::StrJoin(tokens, " ");  // HF without a decoder
  std::string bytes;
  for (const DecoderStep& step : spec_.decoder) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string all;
        for (const std::string& t : tokens) {
          if (ByteLevelToBytes(t, &bytes)) {
            all += bytes;
          } else {
            all += t;
          }
        }
        tokens.assign(1, Utf8Lossy(all));
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) t = absl::StrReplaceAll(t, {{step.pattern, step.content}});
        break;
      case DecoderStep::Kind::kByteFallback: {
        // A run of byte pieces becomes its text when valid UTF-8, else U+FFFD per byte.
        std::vector<std::string> out;
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
          if (run_len == 0) return;
          if (IsValidUtf8(run)) {
            out.push_back(run);
          } else {
            for (size_t k = 0; k < run_len; ++k) out.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_len = 0;
        };
        for (std::string& t : tokens) {
          const int b = ByteFallbackValue(t);
          if (b >= 0) {
            run.push_back(static_cast<char>(b));
            ++run_len;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kFuse:
        tokens.assign(1, absl::StrJoin(tokens, ""));
        break;
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) t = Strip(t, step.pattern, step.start, step.stop);
        break;
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = MetaspaceText(tokens[i], step, i == 0);
        }
        break;
    }
  }
  return absl::StrJoin(tokens, "");
}

std::string BpeTokenizer::DecodeIds(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) tokens.push_back(DecoderInput(id));
  return RunDecoder(std::move(tokens));
}

std::string BpeTokenizer::TokenBytes(int32_t id) const { return StreamBytes(id, false); }

std::string BpeTokenizer::StreamBytes(int32_t id, bool first) const {
  if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) return {};
  std::string t = DecoderInput(id);
  if (spec_.decoder.empty()) return t;
  std::string bytes;
  bool fused = false;  // steps after Fuse/ByteLevel see the whole text, not this token
  for (const DecoderStep& step : spec_.decoder) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel:
        if (ByteLevelToBytes(t, &bytes)) t = bytes;  // raw bytes: the stream heals UTF-8
        fused = true;
        break;
      case DecoderStep::Kind::kReplace:
        t = absl::StrReplaceAll(t, {{step.pattern, step.content}});
        break;
      case DecoderStep::Kind::kByteFallback:
        if (const int b = ByteFallbackValue(t); b >= 0) t.assign(1, static_cast<char>(b));
        break;
      case DecoderStep::Kind::kFuse:
        fused = true;
        break;
      case DecoderStep::Kind::kStrip:
        // After Fuse only the start of the whole text is stripped.
        if (!fused) {
          t = Strip(t, step.pattern, step.start, step.stop);
        } else if (first) {
          t = Strip(t, step.pattern, step.start, 0);
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        t = MetaspaceText(t, step, first && !fused);
        break;
    }
  }
  return t;
}

}  // namespace thetaserve::model
