// End to end over loopback TCP with the real model: what a request can ask for beyond text —
// /metrics (checked by promtool), the prefix cache, n completions, prompt logprobs — and the
// `thetaserve client` command that sends them.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/e2e_util.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

TEST_F(ServerE2ETest, MetricsPassPromtoolAndMoveWithRequests) {
  std::string before = server_->ScrapeMetrics();
  ASSERT_FALSE(before.empty());
  const double gen_before = MetricValue(before, "thetaserve_generation_tokens_total");
  const double done_before = MetricValue(before, "thetaserve_requests_total{outcome=\"length\"}");
  // Scrape while requests run (seen running: an empty scrape passes promtool too).
  constexpr int kTokens = 128;  // long enough that the four surely run together
  std::vector<std::thread> load;
  std::vector<grpc::Status> statuses(4);
  for (int i = 0; i < 4; ++i) {
    load.emplace_back([&, i] {
      auto s = server_->stub();
      auto req = Prompt("The weather today", kTokens);
      req.mutable_stopping()->set_ignore_eos(true);
      statuses[i] = Generate(*s, req).status;
    });
  }
  auto stub = server_->stub();
  const bool running = WaitForRunning(*stub, 4, 60);
  std::string during = server_->ScrapeMetrics();
  for (auto& t : load) t.join();
  std::string after = server_->ScrapeMetrics();
  ASSERT_TRUE(running) << "the four requests were never running together";
  for (const grpc::Status& st : statuses) EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_FALSE(during.empty()) << "no scrape while the requests ran";
  EXPECT_GT(MetricValue(during, "thetaserve_requests_running"), 0) << during;

  const ScopedTempDir tmp("server_e2e_test");
  for (const std::string* text : {&during, &after}) {
    const std::string path = tmp.File("metrics.txt");
    std::ofstream(path) << *text;
    int rc = 0;
    const std::string out = RunCommand("promtool check metrics < " + path + " 2>&1", &rc);
    EXPECT_EQ(rc, 0) << "promtool check metrics failed:\n" << out;
  }
  EXPECT_GE(MetricValue(after, "thetaserve_generation_tokens_total"), gen_before + 4 * kTokens);
  EXPECT_GE(MetricValue(after, "thetaserve_requests_total{outcome=\"length\"}"), done_before + 4);
  EXPECT_GT(MetricValue(after, "thetaserve_time_to_first_token_seconds_count"), 0);
  EXPECT_GT(MetricValue(after, "thetaserve_kv_pages_capacity"), 0);
  EXPECT_GT(MetricValue(after, "thetaserve_v_rows_read_total"), 0);
}

// The default scheduling policy is first come, first served: it says so, takes priority 0 (as
// unset) and refuses another, naming the flag that would allow it.
TEST_F(ServerE2ETest, FirstComeFirstServedRefusesAPriority) {
  auto stub = server_->stub();
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.scheduling_policy(), "fcfs");
  auto req = Prompt("Hello", 2);
  req.set_priority(0);
  EXPECT_TRUE(Generate(*stub, req).status.ok());
  req.set_priority(-1);
  StreamResult refused = Generate(*stub, req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("--scheduling-policy priority"), std::string::npos)
      << refused.status.error_message();
}

// Prefix caching (on by default): a second request that begins with the same preamble finds
// its blocks cached, gets the text `generate` (no cache) gets, and the status RPC and the
// metrics say so; cached pages count as free once nothing runs.
TEST_F(ServerE2ETest, PrefixCacheServesASharedPreambleAndReportsIt) {
  auto stub = server_->stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_TRUE(info.prefix_caching());
  }
  auto status = [&] { return Status(*stub); };
  std::string preamble = "The following is a conversation with a patient librarian. ";
  for (int i = 0; i < 12; ++i) preamble += "She knows every shelf, every author and every date. ";
  const std::string first = preamble + "Visitor: where are the atlases? Librarian:";
  const std::string second = preamble + "Visitor: do you have poetry? Librarian:";
  ASSERT_TRUE(Generate(*stub, Prompt(first, 8)).status.ok());
  const v1::ServerStatus before = status();
  const double hits_before =
      MetricValue(server_->ScrapeMetrics(), "thetaserve_prefix_cache_hit_tokens_total");
  StreamResult r = Generate(*stub, Prompt(second, 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::ServerStatus after = status();
  const std::string m = server_->ScrapeMetrics();

  // The preamble is well over 100 tokens: at least 6 blocks of 16 come from the cache.
  EXPECT_GE(after.prefix_cache_hit_tokens() - before.prefix_cache_hit_tokens(), 96u);
  EXPECT_GT(after.prefix_cache_query_tokens(), before.prefix_cache_query_tokens());
  EXPECT_GE(MetricValue(m, "thetaserve_prefix_cache_hit_tokens_total") - hits_before, 96);
  EXPECT_GT(after.prefix_cache_blocks(), 0u);
  EXPECT_GT(after.pages().cached(), 0u);
  EXPECT_EQ(MetricValue(m, "thetaserve_kv_pages_cached"), double(after.pages().cached()));
  EXPECT_EQ(after.running(), 0u);
  EXPECT_EQ(after.pages().used_k() + after.pages().used_v(), 0u);
  EXPECT_EQ(after.pages().free(), after.pages().total());
  // The same text as without any cache.
  EXPECT_EQ(r.text + "\n", RunGenerateBinary("--prompt '" + second + "' --max-tokens 8 --temperature 0"));

  // Another salt shares nothing with the unsalted requests, then finds its own blocks.
  auto salted = Prompt(second, 8);
  salted.set_cache_salt("tenant-b");
  for (int round = 0; round < 2; ++round) {
    const v1::ServerStatus st0 = status();
    StreamResult s = Generate(*stub, salted);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.text, r.text);
    const uint64_t found = status().prefix_cache_hit_tokens() - st0.prefix_cache_hit_tokens();
    if (round == 0) {
      EXPECT_EQ(found, 0u) << "a salted request found unsalted blocks";
    } else {
      EXPECT_GE(found, 96u);
    }
  }
  salted.set_cache_salt(std::string(257, 'x'));
  StreamResult too_long = Generate(*stub, salted);
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_long.status.error_message().find("cache_salt has 257 bytes"), std::string::npos)
      << too_long.status.error_message();
}

// n completions in one stream: chunks and Completes name their completion, completion i is
// what a request of its own with seed + i gives, the prompt is computed once (the others
// find it in the prefix cache), and one Abort of the request id ends them all.
TEST_F(ServerE2ETest, NCompletionsShareThePromptAndAbortTogether) {
  auto stub = server_->stub();
  auto status = [&] { return Status(*stub); };
  std::string prompt = "Write the next line of the poem. ";
  for (int i = 0; i < 8; ++i) prompt += "The river runs past the mill and the mill wheel turns. ";
  auto req = Prompt(prompt, 12, 0.9f);
  req.set_request_id("four-ways");
  req.set_cache_salt("n-completions");  // nothing cached before: every hit is the group's own
  req.set_n(4);
  req.mutable_sampling()->set_seed(500);
  req.mutable_stopping()->set_ignore_eos(true);
  const v1::ServerStatus before = status();
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  std::vector<std::string> texts(4);
  std::vector<int> completes(4, 0);
  std::vector<v1::Complete> complete(4);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      ASSERT_LT(resp.chunk().index(), 4u);
      EXPECT_EQ(completes[resp.chunk().index()], 0) << "a chunk after its Complete";
      texts[resp.chunk().index()] += resp.chunk().text();
    } else {
      ASSERT_LT(resp.complete().index(), 4u);
      ++completes[resp.complete().index()];
      complete[resp.complete().index()] = resp.complete();
    }
  }
  grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  const v1::ServerStatus after_group = status();
  const uint32_t prompt_tokens = complete[0].usage().prompt_tokens();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(completes[i], 1) << i;
    EXPECT_EQ(complete[i].request_id(), "four-ways");
    EXPECT_EQ(complete[i].finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(complete[i].usage().completion_tokens(), 12u);
    EXPECT_EQ(complete[i].usage().prompt_tokens(), prompt_tokens);
    auto alone = req;
    alone.clear_n();
    alone.clear_request_id();
    alone.mutable_sampling()->set_seed(500 + i);
    StreamResult r = Generate(*stub, alone);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(texts[i], r.text) << "completion " << i;
  }
  EXPECT_NE(texts[0], texts[1]);
  // The later three found all of the prompt but the last token's block (of 16) in the cache.
  const uint64_t shared = (prompt_tokens - 1) / 16 * 16;
  ASSERT_GE(shared, 96u);
  EXPECT_GE(after_group.prefix_cache_hit_tokens() - before.prefix_cache_hit_tokens(), 3 * shared);

  // Abort by the request id: every completion ends CANCELLED, and the pages come back.
  auto long_req = Prompt("Count from one to a thousand:", 1000, 0.9f);
  long_req.set_request_id("abort-all");
  long_req.set_n(3);
  long_req.mutable_stopping()->set_ignore_eos(true);
  std::vector<v1::Complete> ends;
  grpc::Status long_status;
  std::thread t([&] {
    auto s = server_->stub();
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto rd = s->Generate(&c, long_req);
    v1::GenerateResponse m;
    while (rd->Read(&m)) {
      if (m.has_complete()) ends.push_back(m.complete());
    }
    long_status = rd->Finish();
  });
  bool found = false;
  for (int i = 0; i < 500 && !found; ++i) {
    // Abort only once tokens flow (a found-but-queued group would pass as well, but later).
    if (status().running() < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    grpc::ClientContext c;
    v1::AbortRequest a;
    a.set_request_id("abort-all");
    v1::AbortResponse resp2;
    ASSERT_TRUE(stub->Abort(&c, a, &resp2).ok());
    found = resp2.found();
  }
  t.join();
  EXPECT_TRUE(found);
  EXPECT_TRUE(long_status.ok()) << long_status.error_message();
  ASSERT_EQ(ends.size(), 3u);
  for (const auto& e : ends) {
    EXPECT_EQ(e.finish_reason(), v1::FINISH_REASON_CANCELLED);
    EXPECT_LT(e.usage().completion_tokens(), 1000u);
  }
  EXPECT_TRUE(WaitForRunning(*stub, 0, /*timeout_s=*/5)) << "running, or pages held, after Abort";

  // A deadline ends every completion (the client hears DEADLINE_EXCEEDED from its own clock;
  // the server cancels all three at its next step).
  auto late = Prompt("Count from one to a thousand:", 1000, 0.9f);
  late.set_n(3);
  late.mutable_stopping()->set_ignore_eos(true);
  StreamResult expired = Generate(*stub, late, /*timeout_s=*/1.0);
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << expired.status.error_message();
  EXPECT_TRUE(WaitForRunning(*stub, 0, /*timeout_s=*/5))
      << "running, or pages held, after the deadline";

  // Out of range: INVALID_ARGUMENT, and the server goes on.
  auto many = Prompt("x", 4);
  many.set_n(129);
  StreamResult refused = Generate(*stub, many);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(), "n = 129; it must be in [1, 128] (0 means 1)");
  EXPECT_TRUE(Generate(*stub, Prompt("The capital of France is", 4)).status.ok());
}

// SamplingParams.prompt_logprobs: one PromptLogprobs message before the tokens, scoring every
// prompt token but the first; a prompt that continues with generated tokens scores them as
// the generation did; max_tokens = 0 scores without generating.
TEST_F(ServerE2ETest, PromptLogprobsScoreThePromptAsGenerationScoredItsTokens) {
  auto stub = server_->stub();
  auto read = [&](const v1::GenerateRequest& req, v1::PromptLogprobs* prompt, StreamResult* r,
                  std::vector<float>* logprobs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    int prompts = 0;
    while (reader->Read(&resp)) {
      if (resp.has_prompt_logprobs()) {
        EXPECT_EQ(r->ids.size(), 0u) << "prompt scores after tokens";
        *prompt = resp.prompt_logprobs();
        ++prompts;
      } else if (resp.has_chunk()) {
        r->text += resp.chunk().text();
        r->ids.insert(r->ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
        for (const auto& lp : resp.chunk().logprobs()) logprobs->push_back(lp.logprob());
      } else {
        r->complete = resp.complete();
      }
    }
    r->status = reader->Finish();
    return prompts;
  };
  auto gen = Prompt("The capital of France is", 6);
  gen.mutable_sampling()->set_logprobs(1);
  gen.mutable_sampling()->set_prompt_logprobs(0);
  gen.mutable_stopping()->set_ignore_eos(true);
  v1::PromptLogprobs prompt;
  StreamResult generated;
  std::vector<float> gen_logprobs;
  ASSERT_EQ(read(gen, &prompt, &generated, &gen_logprobs), 1);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  ASSERT_EQ(generated.ids.size(), 6u);
  const int P = prompt.token_ids_size();
  ASSERT_GE(P, 4);
  EXPECT_EQ(uint32_t(P), generated.complete.usage().prompt_tokens());
  ASSERT_EQ(prompt.logprobs_size(), P - 1);
  for (const auto& lp : prompt.logprobs()) {
    EXPECT_LE(lp.logprob(), 0.0f);
    EXPECT_EQ(lp.top_size(), 0);
  }

  // The prompt and the generated tokens as one prompt, scored without generating.
  v1::GenerateRequest score;
  for (uint32_t id : prompt.token_ids()) score.mutable_prompt_token_ids()->add_ids(id);
  for (uint32_t id : generated.ids) score.mutable_prompt_token_ids()->add_ids(id);
  score.mutable_sampling()->set_prompt_logprobs(2);
  score.mutable_stopping()->set_max_tokens(0);
  v1::PromptLogprobs scored;
  StreamResult none;
  std::vector<float> no_logprobs;
  ASSERT_EQ(read(score, &scored, &none, &no_logprobs), 1);
  ASSERT_TRUE(none.status.ok()) << none.status.error_message();
  EXPECT_TRUE(none.ids.empty());
  EXPECT_EQ(none.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(none.complete.usage().completion_tokens(), 0u);
  // No token, so no time to first token (it was 0, read as an instant one); a request that
  // generated has one.
  EXPECT_FALSE(none.complete.timings().has_time_to_first_token_seconds());
  StreamResult answered = Generate(*stub, Prompt("Hello", 2));
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_TRUE(answered.complete.timings().has_time_to_first_token_seconds());
  EXPECT_GT(answered.complete.timings().time_to_first_token_seconds(), 0);
  EXPECT_GT(none.complete.timings().total_seconds(), 0);
  ASSERT_EQ(scored.logprobs_size(), P + 6 - 1);
  for (int i = 0; i < P - 1; ++i) {
    EXPECT_NEAR(scored.logprobs(i).logprob(), prompt.logprobs(i).logprob(), 1e-3) << i;
  }
  for (int i = 0; i < 6; ++i) {
    const auto& lp = scored.logprobs(P - 1 + i);
    EXPECT_NEAR(lp.logprob(), gen_logprobs[i], 1e-3) << "generated token " << i;
    ASSERT_EQ(lp.top_size(), 2);
    EXPECT_EQ(lp.top(0).token_id(), generated.ids[i]) << "greedy: the most likely";
  }

  // Refused: scores past 20, and max_tokens = 0 without scores.
  score.mutable_sampling()->set_prompt_logprobs(21);
  StreamResult too_many = Generate(*stub, score);
  EXPECT_EQ(too_many.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(too_many.status.error_message(), "sampling.prompt_logprobs = 21; it must be in [0, 20]");
  score.mutable_sampling()->clear_prompt_logprobs();
  StreamResult zero = Generate(*stub, score);
  EXPECT_EQ(zero.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// `thetaserve client` sends n, logit_bias, min_tokens and ignore_eos, and prints each
// completion; its text is what the gRPC stream gives for the same request.
TEST_F(ServerE2ETest, ClientCommandSendsNLogitBiasAndMinTokens) {
  auto stub = server_->stub();
  const std::string base = BinaryPath() + " client --addr " + server_->address() + " --timeout 60";
  // Two sampled completions with the greedy first token banned.
  StreamResult greedy = Generate(*stub, Prompt("Once upon a time", 6));
  ASSERT_TRUE(greedy.status.ok() && !greedy.ids.empty());
  const uint32_t first = greedy.ids[0];
  int rc = 0;
  const std::string two = RunCommand(
      absl::StrCat(base, " --prompt 'Once upon a time' --max-tokens 6 --n 2 --temperature 0.8 "
                   "--seed 3 --ignore-eos --logit-bias ", first, ":-100,13:2.5 2>/dev/null"), &rc);
  EXPECT_EQ(rc, 0) << two;
  auto req = Prompt("Once upon a time", 6, 0.8f);
  req.mutable_stopping()->set_ignore_eos(true);
  (*req.mutable_sampling()->mutable_logit_bias())[first] = -100;
  (*req.mutable_sampling()->mutable_logit_bias())[13] = 2.5f;
  std::string want;
  for (int i = 0; i < 2; ++i) {
    req.mutable_sampling()->set_seed(3 + i);
    StreamResult r = Generate(*stub, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(std::count(r.ids.begin(), r.ids.end(), first), 0);
    want += absl::StrCat("--- completion ", i, " ---\n", r.text, "\n");
  }
  EXPECT_EQ(two, want);
  // A chat reply that ends with EOS, held open for 8 more tokens by min_tokens.
  v1::GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Say hi.");
  chat.mutable_sampling()->set_temperature(0);
  chat.mutable_stopping()->set_max_tokens(80);
  StreamResult natural = Generate(*stub, chat);
  ASSERT_TRUE(natural.status.ok());
  ASSERT_EQ(natural.complete.finish_reason(), v1::FINISH_REASON_EOS);
  const size_t min_tokens = natural.ids.size() + 8;
  ASSERT_LE(min_tokens, 80u);
  chat.mutable_stopping()->set_min_tokens(min_tokens);
  StreamResult longer = Generate(*stub, chat);
  ASSERT_TRUE(longer.status.ok());
  EXPECT_GE(longer.ids.size(), min_tokens);
  const std::string held = RunCommand(
      absl::StrCat(base, " --chat --prompt 'Say hi.' --max-tokens 80 --min-tokens ", min_tokens,
                   " 2>/dev/null"), &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(held, longer.text + "\n");
  // --special-tokens: skip_special_tokens false (<|im_end|>, forced by its bias, written out).
  const std::vector<uint32_t> im_end = TokenIds(*stub, "<|im_end|>", false);
  ASSERT_EQ(im_end.size(), 1u);
  const std::string forced = absl::StrCat(base, " --prompt Hello --max-tokens 2 --ignore-eos"
                                                " --logit-bias ", im_end[0], ":100");
  EXPECT_EQ(RunCommand(forced + " --special-tokens 2>/dev/null", &rc), "<|im_end|><|im_end|>\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(RunCommand(forced + " 2>/dev/null", &rc), "");  // nothing on stdout: no text came
  // Bad flags: the client's own message, or the server's.
  const std::string bad = RunCommand(base + " --prompt x --logit-bias 13 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("--logit-bias takes TOKEN_ID:BIAS pairs"), std::string::npos) << bad;
  // The range is the client's to check (a bad command line, exit 2: it reached the server and
  // exited 1); the ids are the server's, which knows the vocabulary.
  const std::string out_of_range = RunCommand(base + " --prompt x --logit-bias 13:500 2>&1", &rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out_of_range;
  EXPECT_NE(out_of_range.find("thetaserve client: --logit-bias[13] = 500; it must be in [-100, 100]"),
            std::string::npos) << out_of_range;
  const std::string refused = RunCommand(base + " --prompt x --logit-bias 4000000:5 2>&1", &rc);
  EXPECT_EQ(WEXITSTATUS(rc), 1) << refused;
  EXPECT_NE(refused.find("INVALID_ARGUMENT: sampling.logit_bias has token id 4000000, outside the "
                         "vocabulary"),
            std::string::npos) << refused;
  // --guided-grammar, given or read from a file: the text the grammar guides gRPC to.
  const std::string grammar = R"g(root ::= " " ("yes" | "no") ", because " [a-z ]{5,40} ".")g";
  auto guided = Prompt("Is the sea salty? Answer:", 40);
  guided.mutable_sampling()->set_guided_grammar(grammar);
  StreamResult answer = Generate(*stub, guided);
  ASSERT_TRUE(answer.status.ok()) << answer.status.error_message();
  EXPECT_EQ(answer.complete.finish_reason(), v1::FINISH_REASON_STOP) << answer.text;
  const std::string file = ::testing::TempDir() + "/client_grammar.gbnf";
  {
    std::ofstream out(file);
    out << grammar;
  }
  const std::string ask = base + " --prompt 'Is the sea salty? Answer:' --max-tokens 40";
  EXPECT_EQ(RunCommand(ask + " --guided-grammar @" + file + " 2>/dev/null", &rc),
            answer.text + "\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(RunCommand(ask + " --guided-grammar '" + grammar + "' 2>/dev/null", &rc),
            answer.text + "\n");
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace thetaserve::testing
