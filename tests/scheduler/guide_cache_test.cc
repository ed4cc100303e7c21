// The next tokens a guide remembers per state are the ones a token-by-token check finds, read
// by many threads at once; what guides hold is bounded and given back.
#include "scheduler/guide_cache.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_regex.h"

namespace thetaserve::scheduler {
namespace {

std::vector<std::string> RandomTokens(std::mt19937& rng, int count, const std::string& alphabet,
                                      int max_len) {
  std::vector<std::string> tokens(count);
  for (std::string& t : tokens) {
    for (int k = 1 + int(rng() % max_len); k > 0; --k) t += alphabet[rng() % alphabet.size()];
  }
  return tokens;
}

// Token by token, with the guide's own step.
std::vector<int32_t> RegexWant(const RegexGuide& g, std::string_view so_far,
                               const std::vector<std::string>& tokens) {
  std::vector<int32_t> want;
  const int32_t state = g.Step(RegexGuide::kStart, so_far);
  if (state == RegexGuide::kDead) return want;
  for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
    if (!tokens[id].empty() && g.Step(state, tokens[id]) != RegexGuide::kDead) want.push_back(id);
  }
  return want;
}

std::vector<int32_t> JsonWant(std::string_view so_far, const std::vector<std::string>& tokens) {
  std::vector<int32_t> want;
  JsonObjectGuide::State state, next;
  if (!JsonObjectGuide::Step({}, so_far, &state)) return want;
  for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
    if (!tokens[id].empty() && JsonObjectGuide::Step(state, tokens[id], &next)) {
      want.push_back(id);
    }
  }
  return want;
}

// Outputs the guide leads to, byte by byte at random, with every prefix along the way.
template <typename LeadsOn>
std::vector<std::string> Prefixes(std::mt19937& rng, const LeadsOn& leads_on, int count,
                                  int max_len) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int len = 0; len < max_len; ++len) {
      out.push_back(s);
      std::vector<char> next;
      for (int b = 1; b < 128; ++b) {
        if (leads_on(s + char(b))) next.push_back(char(b));
      }
      if (next.empty()) break;
      s += next[rng() % next.size()];
    }
  }
  return out;
}

TEST(GuideCacheTest, RememberedTokensAreThoseATokenByTokenCheckFinds) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  // Short and long sets both (ids and bitmaps): small alphabets, many tokens.
  const auto tokens = RandomTokens(rng, 3000, "ab1 \"{}:,", 4);
  const TokenBytesIndex vocab(tokens);
  auto regex = RegexGuide::Compile(R"((ab|a1)+ ?[ab1 ]*"?)");
  ASSERT_TRUE(regex.ok());
  const auto regex_prefixes = Prefixes(
      rng, [&](const std::string& s) { return (*regex)->Step(RegexGuide::kStart, s) !=
                                              RegexGuide::kDead; }, 20, 12);
  std::vector<int32_t> got;
  for (int pass = 0; pass < 2; ++pass) {  // the second from memory
    for (const std::string& so_far : regex_prefixes) {
      (*regex)->Allowed(so_far, vocab, &got);
      ASSERT_EQ(got, RegexWant(**regex, so_far, tokens)) << so_far << " seed " << seed;
    }
  }
  const JsonObjectGuide json;
  const auto json_prefixes = Prefixes(
      rng, [](const std::string& s) {
        JsonObjectGuide::State out;
        return JsonObjectGuide::Step({}, s, &out);
      }, 20, 16);
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::string& so_far : json_prefixes) {
      json.Allowed(so_far, vocab, &got);
      ASSERT_EQ(got, JsonWant(so_far, tokens)) << so_far << " seed " << seed;
    }
  }
}

TEST(GuideCacheTest, ManyThreadsReadOneGuide) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  const auto tokens = RandomTokens(rng, 4000, "ab1 ", 5);
  const TokenBytesIndex vocab(tokens);
  auto regex = RegexGuide::Compile("(ab|a1| b)+1?");
  ASSERT_TRUE(regex.ok());
  const auto prefixes = Prefixes(
      rng, [&](const std::string& s) { return (*regex)->Step(RegexGuide::kStart, s) !=
                                              RegexGuide::kDead; }, 10, 10);
  std::vector<std::vector<int32_t>> want;
  for (const std::string& p : prefixes) want.push_back(RegexWant(**regex, p, tokens));
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int32_t> got;
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < prefixes.size(); ++i) {
          const size_t k = (i * 7 + size_t(t) * 13) % prefixes.size();
          (*regex)->Allowed(prefixes[k], vocab, &got);
          wrong[t] += got != want[k];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0)) << "seed " << seed;
}

TEST(GuideCacheTest, MemoryIsBoundedAndGivenBack) {
  std::mt19937 rng(7);
  const auto tokens = RandomTokens(rng, 49152, "abcdefghijklmnopqrstuvwxyz ", 8);
  const TokenBytesIndex vocab(tokens);
  const int64_t before = GuideCacheBytesHeld().load();
  {
    // 400 states, each passing most of the vocabulary: a 6 KiB bitmap each, past one guide's
    // bound; answers stay right past it.
    auto regex = RegexGuide::Compile("[a-z ]{1,400}");
    ASSERT_TRUE(regex.ok());
    std::vector<int32_t> got;
    std::string so_far;
    for (int i = 0; i < 400; ++i, so_far += 'a') (*regex)->Allowed(so_far, vocab, &got);
    const int64_t held = GuideCacheBytesHeld().load() - before;
    EXPECT_LE(held, kMaxGuideCacheBytes);
    EXPECT_GT(held, kMaxGuideCacheBytes / 2);
    for (const std::string& s : {std::string(390, 'a'), std::string(3, 'a')}) {
      (*regex)->Allowed(s, vocab, &got);
      EXPECT_EQ(got, RegexWant(**regex, s, tokens)) << s.size();
    }
  }
  EXPECT_EQ(GuideCacheBytesHeld().load(), before);
}

// A grammar's keys (its parse's stacks, up to 4 KiB) count against the bound as the answers do.
TEST(GuideCacheTest, LongKeysCountAgainstTheBound) {
  const TokenBytesIndex vocab({"a", "b"});
  const int64_t before = GuideCacheBytesHeld().load();
  {
    GuideCache<std::string> cache;
    std::vector<int32_t> got;
    for (int i = 0; i < 1000; ++i) {
      const std::string key = std::string(4000, 'k') + std::to_string(i);
      cache.Allowed(vocab, key, [](std::vector<int32_t>* ids) { *ids = {0}; }, &got);
      EXPECT_EQ(got, std::vector<int32_t>{0});
    }
    // About 250 held, not 1000 (4 MB of keys).
    const int64_t held = GuideCacheBytesHeld().load() - before;
    EXPECT_LE(held, kMaxGuideCacheBytes);
    EXPECT_GT(held, kMaxGuideCacheBytes / 2);
  }
  EXPECT_EQ(GuideCacheBytesHeld().load(), before);
}

}  // namespace
}  // namespace thetaserve::scheduler
