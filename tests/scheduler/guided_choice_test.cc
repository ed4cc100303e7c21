#include "scheduler/guided_choice.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"
#include "scheduler/sequence.h"
#include "tests/scheduler/collecting_sink.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {
namespace {

// A toy vocabulary: whole words, pieces, single bytes, and a special token (no bytes).
const std::vector<std::string> kVocab = {"yes", "y", "e", "s", "no", "n", "o", " please",
                                         " ", "please", "", "ye", "yess", "noo"};

std::vector<int32_t> Next(const ChoiceGuide& g, const std::string& so_far) {
  const TokenBytesIndex vocab(kVocab);
  std::vector<int32_t> out;
  g.Allowed(so_far, vocab, &out);
  return out;
}

// A token may come next when it continues the output toward some choice: a whole rest, a piece
// of one, never past its end nor off every choice, and never a special token.
TEST(ChoiceGuideTest, NextTokensContinueTowardAChoice) {
  const ChoiceGuide g({"yes", "no", "yes please", "no"});
  EXPECT_EQ(Next(g, ""), std::vector<int32_t>({0, 1, 4, 5, 11}));  // yes y no n ye
  EXPECT_EQ(Next(g, "y"), std::vector<int32_t>({2}));                // e
  EXPECT_EQ(Next(g, "ye"), std::vector<int32_t>({3}));               // s ("yess" overshoots)
  EXPECT_EQ(Next(g, "yes"), std::vector<int32_t>({7, 8}));           // " please", " "
  EXPECT_EQ(Next(g, "yes "), std::vector<int32_t>({9}));             // please
  EXPECT_EQ(Next(g, "no"), std::vector<int32_t>({}));                // done ("noo" overshoots)
  EXPECT_EQ(Next(g, "x"), std::vector<int32_t>({}));                 // off every choice
}

// The output is done once it is a choice no other extends; a choice another extends is a
// choice (EOS may end it there) but not complete.
TEST(ChoiceGuideTest, CompleteOnlyWhenNoLongerChoiceExtendsIt) {
  const ChoiceGuide g({"yes", "yes please", "no"});
  EXPECT_TRUE(g.Accepts("yes"));
  EXPECT_FALSE(g.Complete("yes"));
  EXPECT_TRUE(g.Complete("yes please"));
  EXPECT_TRUE(g.Complete("no"));
  EXPECT_FALSE(g.Accepts("ye"));
  EXPECT_FALSE(g.Complete("ye"));
  EXPECT_FALSE(g.Complete(""));
}

// Choices of several bytes per character (UTF-8) are matched byte by byte: a token that ends
// inside a character may come when the rest of the character follows.
TEST(ChoiceGuideTest, MatchesBytesNotCharacters) {
  const TokenBytesIndex vocab({"\xc3", "\xa9", "caf", "caf\xc3\xa9", "\xc3\xa8"});
  const ChoiceGuide g({"caf\xc3\xa9"});  // café
  std::vector<int32_t> out;
  g.Allowed("", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({2, 3}));
  g.Allowed("caf", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({0}));  // not è
  g.Allowed("caf\xc3", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({1}));
}

// The index finds every token that is a prefix of a string, duplicates (two ids with the same
// bytes) included, none past the string's end, and no empty (special) token.
TEST(TokenBytesIndexTest, PrefixesOfAStringAreEveryTokenThatBeginsIt) {
  const TokenBytesIndex vocab({"a", "ab", "abc", "b", "", "ab", "abcd", "abd"});
  std::vector<int32_t> ids;
  vocab.PrefixesOf("abcx", &ids);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, std::vector<int32_t>({0, 1, 2, 5}));
  ids.clear();
  vocab.PrefixesOf("b", &ids);
  EXPECT_EQ(ids, std::vector<int32_t>({3}));
  ids.clear();
  vocab.PrefixesOf("zz", &ids);
  EXPECT_TRUE(ids.empty());
  vocab.PrefixesOf("", &ids);
  EXPECT_TRUE(ids.empty());
}

// Allowed over the index equals the definition checked token by token: a token may come when
// the output's bytes followed by its own begin a choice (random vocabulary and choices).
TEST(ChoiceGuideTest, AllowedIsEveryTokenThatContinuesTowardAChoice) {
  std::mt19937 rng(11);
  std::vector<std::string> bytes(3000);
  for (std::string& b : bytes) {
    for (int n = 1 + int(rng() % 4); n > 0; --n) b += char('a' + rng() % 4);
  }
  bytes[17].clear();  // a special token
  std::vector<std::string> choices;
  for (int i = 0; i < 40; ++i) {
    std::string c;
    for (int n = 1 + int(rng() % 5); n > 0; --n) c += bytes[rng() % bytes.size()];
    choices.push_back(c);
  }
  const ChoiceGuide guide(choices);
  const TokenBytesIndex vocab(bytes);
  for (const std::string& so_far : {std::string(), choices[0].substr(0, 1),
                                    choices[1].substr(0, choices[1].size() / 2), choices[2],
                                    std::string("zz")}) {
    std::vector<int32_t> want;
    for (size_t id = 0; id < bytes.size(); ++id) {
      if (bytes[id].empty()) continue;
      const std::string next = so_far + bytes[id];
      for (const std::string& c : choices) {
        if (c.starts_with(next)) {
          want.push_back(int32_t(id));
          break;
        }
      }
    }
    std::vector<int32_t> got;
    guide.Allowed(so_far, vocab, &got);
    EXPECT_EQ(got, want) << "after '" << so_far << "'";
  }
}

// A sequence under a guide, with the engine's two vocabularies (bytes in decoded text, and as
// the output's first token).
struct Guided {
  Guided(const model::Tokenizer& tok, std::vector<std::string> choices, bool ignore_eos = false)
      : tok(tok), vocab(Bytes(tok, false)), first(Bytes(tok, true)) {
    Request r;
    r.id = "g";
    r.prompt = {1, 2};
    r.stopping.max_tokens = 20;
    r.stopping.ignore_eos = ignore_eos;
    r.guide = std::make_shared<const ChoiceGuide>(std::move(choices));
    seq = std::make_unique<Sequence>(r, sink, tok, cache::KvShape{2, 1, 16, 8});
  }
  static std::vector<std::string> Bytes(const model::Tokenizer& tok, bool first) {
    std::vector<std::string> b(tok.vocab_size());
    for (int32_t id = 0; id < int32_t(b.size()); ++id) {
      if (!tok.IsSpecial(id)) b[id] = tok.TextBytes(id, first);
    }
    return b;
  }
  std::vector<int32_t> Next() {
    auto next = seq->GuidedTokens(vocab, &first, tok);
    return std::vector<int32_t>(next.begin(), next.end());
  }
  bool Append(int32_t token) {
    SampleResult r;
    r.token = token;
    return seq->AppendToken(r, tok);
  }
  const model::Tokenizer& tok;
  TokenBytesIndex vocab, first;
  std::shared_ptr<CollectingSink> sink = std::make_shared<CollectingSink>();
  std::unique_ptr<Sequence> seq;
};

bool Has(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// An SPM model's first token of the output drops its leading space in the text the client
// gets: "▁no" is the choice "no", and the output is "no", not " no".
TEST(GuidedSequenceTest, TheFirstTokenIsMatchedAsTheClientWillReadIt) {
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const model::Tokenizer& tok = (*tiny)->tokenizer();
  const int32_t no = tok.PieceToId("\xe2\x96\x81no");  // ▁no
  ASSERT_GE(no, 0);
  Guided g(tok, {"no", "yes"});
  const std::vector<int32_t> next = g.Next();
  EXPECT_TRUE(Has(next, no));
  EXPECT_TRUE(g.Append(no));
  EXPECT_EQ(g.seq->finish_reason(), FinishReason::kStop);
  EXPECT_EQ(g.sink->text, "no");
  // After the first token, "▁no" is " no" again: not a way to finish "yes".
  Guided later(tok, {"yes", "y no"});
  const int32_t y = tok.PieceToId("y");
  ASSERT_GE(y, 0);
  ASSERT_TRUE(Has(later.Next(), y));
  EXPECT_FALSE(later.Append(y));
  EXPECT_TRUE(Has(later.Next(), no));
}

// A choice that another extends may end by EOS (not under ignore_eos) or go on; the output
// ends with the longer one complete; the EOS's reason is kEos.
TEST(GuidedSequenceTest, AChoiceThatAnotherExtendsEndsByEosOrGoesOn) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const model::Tokenizer& tok = (*model)->tokenizer();
  const std::vector<int32_t> yes = tok.Encode("yes", false);
  const std::vector<int32_t> please = tok.Encode(" please", false);
  ASSERT_EQ(yes.size(), 1u);
  ASSERT_EQ(please.size(), 1u);
  const int32_t eos = tok.stop_ids().at(0);
  {
    Guided g(tok, {"yes", "yes please"});
    EXPECT_FALSE(Has(g.Next(), eos));
    EXPECT_FALSE(g.Append(yes[0]));
    const std::vector<int32_t> next = g.Next();
    EXPECT_TRUE(Has(next, eos));
    EXPECT_TRUE(Has(next, please[0]));
    EXPECT_TRUE(g.Append(eos));
    EXPECT_EQ(g.seq->finish_reason(), FinishReason::kEos);
    EXPECT_EQ(g.sink->text, "yes");
  }
  {
    Guided g(tok, {"yes", "yes please"}, /*ignore_eos=*/true);
    EXPECT_FALSE(g.Append(yes[0]));
    EXPECT_FALSE(Has(g.Next(), eos));
    EXPECT_TRUE(g.Append(please[0]));
    EXPECT_EQ(g.seq->finish_reason(), FinishReason::kStop);
    EXPECT_EQ(g.sink->text, "yes please");
  }
}

// With nothing that leads toward a choice (here, a vocabulary index without the bytes), the
// guide offers nothing and whatever is sampled next ends the output, its text unsent.
TEST(GuidedSequenceTest, AGuideWithNothingToOfferEndsTheOutput) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const model::Tokenizer& tok = (*model)->tokenizer();
  Guided g(tok, {"yes"});
  const TokenBytesIndex nothing(std::vector<std::string>(tok.vocab_size()));
  EXPECT_TRUE(g.seq->GuidedTokens(nothing, nullptr, tok).empty());
  EXPECT_TRUE(g.Append(tok.Encode("hello", false).at(0)));
  EXPECT_EQ(g.seq->finish_reason(), FinishReason::kStop);
  EXPECT_EQ(g.sink->text, "");
}

}  // namespace
}  // namespace thetaserve::scheduler
