// Attention without Top-θ reads every V row, so every backend refuses a sequence whose V store
// is sparse (rows below v_tail_start dropped; Backend::CheckDenseV) instead of reading V pages
// from before its table, and runs the same batch once the V tail starts at position 0. Shared
// by the CPU test and the GPU one.
#pragma once

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {

inline void ExpectDenseAttentionRefusesASparseVStore(Device device) {
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto backend = CreateBackend(**tiny, device, 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  constexpr int32_t kBlock = 16;
  ASSERT_TRUE((*backend)->AllocateKvPool(64, kBlock).ok());
  const model::ModelConfig& c = (*tiny)->config();
  const int64_t tables = int64_t(c.num_layers) * c.num_kv_heads;
  // Two pages of K and of V per table: positions 0..31.
  std::vector<int32_t> k_table(2 * tables), v_table(2 * tables);
  for (int64_t i = 0; i < 2 * tables; ++i) {
    k_table[i] = static_cast<int32_t>(2 * i);
    v_table[i] = static_cast<int32_t>(2 * i + 1);
  }
  SeqChunk chunk;
  chunk.start_pos = kBlock;  // the 17th token
  chunk.num_tokens = 1;
  chunk.pages = SeqPageTables{k_table.data(), v_table.data(), 2, /*v_tail_start=*/kBlock};
  std::vector<SeqChunk> seqs = {chunk};
  const std::vector<int32_t> tokens = {1};
  std::vector<float> logits(c.vocab_size, -1.0f);
  const ForwardBatch sparse{tokens, seqs};
  const absl::Status st = (*backend)->Forward(sparse, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(std::string(st.message()).find("from position 16 on (a sparse V store)"),
            std::string::npos)
      << st;
  EXPECT_EQ(logits[0], -1.0f);  // nothing ran

  seqs[0].pages.v_tail_start = 0;
  const ForwardBatch dense{tokens, seqs};
  EXPECT_TRUE((*backend)->Forward(dense, logits.data()).ok());
}

}  // namespace thetaserve::kernels
