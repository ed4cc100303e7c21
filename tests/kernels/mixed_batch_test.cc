// A batch that mixes prefill chunks and decode tokens of several sequences gives each
// sequence the logits it gets alone.
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "scheduler/sequence_runner.h"
#include "model/model.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

TEST(MixedBatchTest, MixedBatchLogitsEqualSingleSequenceLogits) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  auto batched = CreateBackend(**model, Device::kCpu, 0);
  auto alone = CreateBackend(**model, Device::kCpu, 0);
  ASSERT_TRUE(batched.ok() && alone.ok());

  const auto& tok = (*model)->tokenizer();
  std::vector<std::vector<int32_t>> prompts = {
      tok.Encode("The quick brown fox jumps over the lazy dog because", false),
      tok.Encode("In the beginning God created", false),
      tok.Encode("It is a truth universally acknowledged, that a single man in possession", false),
  };
  // Reference: each sequence alone, prompt then two decode tokens.
  std::vector<std::vector<float>> want;  // logits after the prompt's first 5 tokens + rest
  const int32_t block = 4;  // small pages: every sequence crosses page boundaries
  const int64_t tables = c.num_layers * c.num_kv_heads;
  const int32_t stride = 32;  // pages per table per sequence (128 tokens)
  ASSERT_TRUE((*batched)->AllocateKvPool(2 * tables * stride * 3, block).ok());
  std::vector<std::vector<int32_t>> k_tables(3), v_tables(3);
  for (int s = 0; s < 3; ++s) {
    k_tables[s].resize(tables * stride);
    v_tables[s].resize(tables * stride);
    // Interleave the sequences' pages so a wrong table would read another sequence's rows.
    for (int64_t i = 0; i < tables * stride; ++i) {
      k_tables[s][i] = static_cast<int32_t>((2 * i) * 3 + s);
      v_tables[s][i] = static_cast<int32_t>((2 * i + 1) * 3 + s);
    }
  }
  // Step 1: sequence 0 prefills 5 tokens; step 2: seq 0 prefills the rest while seq 1
  // prefills all and seq 2 its first 3; step 3: seq 0 and 1 decode one token each, seq 2
  // finishes its prompt.
  std::vector<int32_t> done(3, 0);
  std::vector<std::vector<float>> got(3);
  auto step = [&](std::vector<std::pair<int, int>> parts) {
    std::vector<int32_t> tokens;
    std::vector<SeqChunk> seqs;
    for (auto [s, n] : parts) {
      SeqChunk ch;
      ch.token_offset = static_cast<int32_t>(tokens.size());
      ch.num_tokens = n;
      ch.start_pos = done[s];
      ch.want_logits = true;
      ch.pages = SeqPageTables{k_tables[s].data(), v_tables[s].data(), stride};
      for (int i = 0; i < n; ++i) tokens.push_back(prompts[s][done[s] + i]);
      seqs.push_back(ch);
    }
    ForwardBatch batch{tokens, seqs, false};
    std::vector<float> logits(NumLogitRows(batch) * c.vocab_size);
    ASSERT_TRUE((*batched)->Forward(batch, logits.data()).ok());
    for (size_t i = 0; i < parts.size(); ++i) {
      auto [s, n] = parts[i];
      done[s] += n;
      got[s].assign(logits.begin() + i * c.vocab_size, logits.begin() + (i + 1) * c.vocab_size);
    }
  };
  // Give every sequence two extra tokens to "decode" (taken from a fixed continuation).
  for (auto& p : prompts) {
    p.push_back(tok.Encode(" and", false)[0]);
    p.push_back(tok.Encode(" then", false)[0]);
  }
  const int n0 = static_cast<int>(prompts[0].size()) - 2, n1 = static_cast<int>(prompts[1].size()) - 2,
            n2 = static_cast<int>(prompts[2].size()) - 2;
  step({{0, 5}});
  step({{0, n0 - 5}, {1, n1}, {2, 3}});
  step({{0, 1}, {1, 1}, {2, n2 - 3}});
  step({{2, 1}, {0, 1}, {1, 1}});
  step({{2, 1}});

  for (int s = 0; s < 3; ++s) {
    auto runner = scheduler::SequenceRunner::Create(**alone, 128, 16);
    ASSERT_TRUE(runner.ok());
    auto ref = runner->Append(prompts[s]);
    ASSERT_TRUE(ref.ok());
    EXPECT_TRUE(testing::AllClose(got[s], *ref, 1e-4f, 1e-4f)) << "sequence " << s;
  }
}

}  // namespace
}  // namespace thetaserve::kernels
