// An HTTP call's output between the engine's sinks and the handler (openai_http_output.h), on
// its own: what Take hands over and when a finish is news, and a prompt's scores passed to each
// of its choices, held until they come.
#include "server/openai_http_output.h"

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace thetaserve::server {
namespace {

using std::chrono::milliseconds;

scheduler::TokenDelta Tokens(std::vector<int32_t> ids, std::string text) {
  scheduler::TokenDelta d;
  d.token_ids = std::move(ids);
  d.text = std::move(text);
  return d;
}

scheduler::FinishInfo Finished(absl::Status status = absl::OkStatus()) {
  scheduler::FinishInfo info;
  info.status = std::move(status);
  return info;
}

// Deltas of one choice merge until taken; a finish is "now" once, and stays set after.
TEST(HttpOutputTest, TakeMergesDeltasAndReportsAFinishOnce) {
  HttpOutput out(2);
  out.Deliver(0, Tokens({1, 2}, "ab"));
  out.Deliver(0, Tokens({3}, "c"));
  out.Finish(1, Finished());
  std::vector<HttpOutput::Taken> taken;
  out.Take(milliseconds(0), &taken);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].delta.token_ids, std::vector<int32_t>({1, 2, 3}));
  EXPECT_EQ(taken[0].delta.text, "abc");
  EXPECT_FALSE(taken[0].finish.has_value());
  EXPECT_TRUE(taken[1].finished_now);
  ASSERT_TRUE(taken[1].finish.has_value());

  out.Take(milliseconds(0), &taken);
  EXPECT_TRUE(taken[0].delta.token_ids.empty()) << "taken once";
  EXPECT_FALSE(taken[1].finished_now) << "news only the first time";
  EXPECT_TRUE(taken[1].finish.has_value()) << "and set after";
}

// Take waits for news up to its timeout, and wakes as soon as a delivery comes.
TEST(HttpOutputTest, TakeWaitsForNewsUpToItsTimeout) {
  HttpOutput out(1);
  std::vector<HttpOutput::Taken> taken;
  auto start = std::chrono::steady_clock::now();
  out.Take(milliseconds(50), &taken);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(45));
  EXPECT_TRUE(taken[0].delta.token_ids.empty());

  std::thread engine([&] {
    std::this_thread::sleep_for(milliseconds(20));
    out.Deliver(0, Tokens({7}, "x"));
  });
  start = std::chrono::steady_clock::now();
  out.Take(milliseconds(10'000), &taken);
  engine.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
  EXPECT_EQ(taken[0].delta.token_ids, std::vector<int32_t>({7}));
}

// Two prompts with two choices each: choice 1 (prompt 0's second) is held, tokens and finish,
// until choice 0 brings the prompt's scores, then goes on with them and what it held. Choice 3
// goes on without scores once choice 2 has ended without any (cancelled before its first
// delta). A failure is never held.
TEST(SharedPromptScoresTest, OtherChoicesWaitForTheFirstChoicesScores) {
  SharedPromptScores shared(4, 2);
  std::vector<HttpOutput::Taken> taken(4);
  taken[1].delta = Tokens({5}, "e");
  taken[1].finish = Finished();
  taken[1].finished_now = true;
  taken[3].delta = Tokens({9}, "i");
  shared.Share(taken);
  EXPECT_TRUE(taken[1].delta.token_ids.empty()) << "held until the scores come";
  EXPECT_FALSE(taken[1].finish.has_value());
  EXPECT_FALSE(taken[1].finished_now);
  EXPECT_TRUE(taken[3].delta.token_ids.empty());

  auto scores = std::make_shared<scheduler::PromptScores>();
  scores->token_ids = {1, 2};
  std::vector<HttpOutput::Taken> next(4);
  next[0].delta = Tokens({4}, "d");
  next[0].delta.prompt = scores;
  next[1].finish = Finished();  // Take reports it again while it is hidden
  next[1].finished_now = true;
  next[2].finish = Finished(absl::CancelledError("aborted"));  // no scores came
  next[3].delta = Tokens({10}, "j");
  shared.Share(next);
  EXPECT_EQ(next[1].delta.token_ids, std::vector<int32_t>({5}));
  EXPECT_EQ(next[1].delta.prompt, scores);
  EXPECT_TRUE(next[1].finish.has_value());
  EXPECT_EQ(next[3].delta.token_ids, std::vector<int32_t>({9, 10}));
  EXPECT_EQ(next[3].delta.prompt, nullptr);

  SharedPromptScores failing(2, 2);
  std::vector<HttpOutput::Taken> failed(2);
  failed[1].delta = Tokens({6}, "f");
  failed[1].finish = Finished(absl::InternalError("boom"));
  failed[1].finished_now = true;
  failing.Share(failed);
  EXPECT_EQ(failed[1].delta.token_ids, std::vector<int32_t>({6}));
  EXPECT_TRUE(failed[1].finished_now);
  ASSERT_NE(FirstFailure(failed), nullptr);
  EXPECT_EQ(FirstFailure(failed)->status.message(), "boom");
}

}  // namespace
}  // namespace thetaserve::server
