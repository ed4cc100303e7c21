// The server under Top-θ with a θ file for the real model: the sparse and offload V policies
// report themselves, serve the full policy's text, and account for the rows they move.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "tests/server/e2e_util.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

// A θ file for the real model: constant post-softmax θ = 2% beyond k = 16 (layers 0-1
// dense), saved at `path`.
model::ThetaTable ConstantTheta(const std::string& path) {
  auto model = model::Model::Load(DefaultModelPath());
  EXPECT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  model::ThetaTable table(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(8192));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    table.k_per_layer[l] = l < 2 ? 512 : 16;
    for (int32_t h = 0; h < c.num_heads; ++h) {
      for (size_t b = 0; b < table.buckets().size(); ++b) table.theta_at(l, h, b) = 0.02f;
    }
  }
  table.model_fingerprint = (*model)->fingerprint();
  table.model_name = c.name;
  table.Finalize();
  EXPECT_TRUE(table.Save(path).ok());
  return table;
}

TEST(ServerTopThetaTest, SparsePolicyReportsItselfAndItsSavingsMove) {
  const ScopedTempDir tmp("server_e2e_test");
  const std::string path = tmp.File("theta_const.json");
  model::ThetaTable table = ConstantTheta(path);
  ASSERT_FALSE(::testing::Test::HasFailure());

  ServerProcess server({"--theta", path, "--policy", "sparse", "--local-window", "32"});
  ASSERT_TRUE(server.started());
  auto stub = server.stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.theta_mode(), "top-theta-post");
    EXPECT_EQ(info.kv_policy(), "sparse");
    EXPECT_FALSE(info.prefix_caching()) << "the sparse policy rewrites V pages in place";
    EXPECT_EQ(info.calibration_fingerprint(), table.fingerprint);
  }
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "It is a truth universally acknowledged, that a single man. ";
  auto req = Prompt(prompt, 24);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult r = Generate(*stub, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.complete.usage().completion_tokens(), 24u);
  const std::string m = server.ScrapeMetrics();
  const double read = MetricValue(m, "thetaserve_v_rows_read_total");
  const double dense = MetricValue(m, "thetaserve_v_rows_read_dense_total");
  EXPECT_GT(read, 0);
  EXPECT_LT(read, 0.8 * dense) << "Top-θ should read well under the dense rows";
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_evicted_total"), 0) << "the sparse policy dropped nothing";
  const double kept = MetricValue(m, "thetaserve_attention_elements_kept_total");
  EXPECT_GT(kept, 0);  // (MetricValue is -1 for a missing series)
  EXPECT_LT(kept, MetricValue(m, "thetaserve_attention_elements_dense_total"));
  EXPECT_NE(m.find("theta_mode=\"top-theta-post\""), std::string::npos);
  // Every page comes back after the request.
  grpc::ClientContext ctx;
  v1::ServerStatus st;
  ASSERT_TRUE(stub->GetServerStatus(&ctx, {}, &st).ok());
  EXPECT_EQ(st.pages().free(), st.pages().total());

  // A θ file from another model is refused with a message naming both.
  table.model_fingerprint = "0123456789abcdef";
  table.Finalize();
  const std::string wrong = tmp.File("theta_wrong.json");
  ASSERT_TRUE(table.Save(wrong).ok());
  int rc = 0;
  const std::string out = RunCommand(BinaryPath() + " generate --model " + DefaultModelPath() +
                                     " --prompt hi --theta " + wrong + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("was calibrated for model"), std::string::npos) << out;
  EXPECT_NE(out.find("0123456789abcdef"), std::string::npos) << out;

  // A θ file of another shape names the shapes (it named two equal fingerprints).
  model::ThetaTable short_table(20, table.num_heads(), table.buckets());
  short_table.model_fingerprint = table.model_fingerprint;
  short_table.model_name = table.model_name;
  short_table.k_per_layer.assign(20, 16);
  short_table.Finalize();
  const std::string shorter = tmp.File("theta_20_layers.json");
  ASSERT_TRUE(short_table.Save(shorter).ok());
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath();
  std::string msg = RunCommand(generate + " --prompt hi --theta " + shorter + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(msg.find("holds 20 layers × 9 heads; this model has 30 × 9"), std::string::npos)
      << msg;
  // --exact-top-k takes its k from a θ file: without one it was silently dense.
  msg = RunCommand(generate + " --prompt hi --exact-top-k 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(msg.find("--exact-top-k needs --theta"), std::string::npos) << msg;
}

// The offload policy over gRPC: it reports itself, a greedy request gets the text the full
// policy gives (`generate` with the same θ file), rows move to host memory and some are read
// back, nothing is dropped, and every page of both pools comes back. --offload-memory without
// the policy, as a share, or below one page is refused at startup.
TEST(ServerTopThetaTest, OffloadPolicyServesTheFullPolicysTextAndReportsHostMemory) {
  const ScopedTempDir tmp("server_e2e_test");
  const std::string path = tmp.File("theta_const_offload.json");
  ConstantTheta(path);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // (With --fixed-compaction, which the offload policy takes as the sparse one does.)
  ServerProcess server({"--theta", path, "--policy", "offload", "--local-window", "32",
                        "--keep-fraction", "0.05", "--offload-memory", "64M",
                        "--fixed-compaction"});
  ASSERT_TRUE(server.started());
  const std::string log = ReadFileOrDie(server.log_path());
  EXPECT_NE(log.find("V store: compacted at every 512 prompt tokens and after decode steps"),
            std::string::npos) << log;
  auto stub = server.stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.kv_policy(), "offload");
    EXPECT_FALSE(info.prefix_caching()) << "the offload policy rewrites V pages in place";
  }
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "It is a truth universally acknowledged, that a single man. ";
  StreamResult r = Generate(*stub, Prompt(prompt, 24));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string full = RunGenerateBinary("--prompt '" + prompt + "' --max-tokens 24 --temperature 0 "
                                             "--theta " + path);
  EXPECT_EQ(r.text + "\n", full) << "the offload policy changed the output";

  grpc::ClientContext ctx;
  v1::ServerStatus st;
  ASSERT_TRUE(stub->GetServerStatus(&ctx, {}, &st).ok());
  EXPECT_EQ(st.pages().free(), st.pages().total());
  // Host pages have the KV pool's shape: 16 rows of 64 f16 elements.
  EXPECT_EQ(st.pages().page_bytes(), 2048u);
  EXPECT_EQ(st.host_pages_total(), uint64_t(64 << 20) / 2048);
  EXPECT_EQ(st.host_pages_used(), 0u);

  const std::string m = server.ScrapeMetrics();
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_offloaded_total"), 0);
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_read_host_total"), 0) << "no offloaded row was needed";
  EXPECT_EQ(MetricValue(m, "thetaserve_v_rows_evicted_total"), 0);
  EXPECT_EQ(MetricValue(m, "thetaserve_v_rows_retained_but_evicted_total"), 0);
  EXPECT_EQ(MetricValue(m, "thetaserve_host_pages_capacity"), double(64 << 20) / 2048);
  EXPECT_EQ(MetricValue(m, "thetaserve_host_pages_used"), 0);
  EXPECT_NE(m.find("kv_policy=\"offload\""), std::string::npos);

  // Each with its exit status (2: the command line; 1: what only the loaded model can check)
  // and its message: a server that wrongly started would be killed by `timeout` (124).
  const std::tuple<std::string, int, std::string> cases[] = {
      {"--offload-memory 1G", 2, "thetaserve serve: --offload-memory needs --policy offload"},
      {"--theta " + path + " --policy offload --offload-memory 10%", 2,
       "thetaserve serve: --offload-memory must be a size such as 512M or 8G, got '10%'"},
      {"--theta " + path + " --policy offload --offload-memory 1K", 1, "--offload-memory"},
  };
  for (const auto& [bad, status, message] : cases) {
    int rc = 0;
    const std::string out = RunCommand("timeout 120 " + BinaryPath() + " serve --model " +
                                           DefaultModelPath() + " --port 0 --metrics-port 0 " +
                                           bad + " 2>&1",
                                       &rc);
    EXPECT_TRUE(WIFEXITED(rc)) << bad;
    EXPECT_EQ(WEXITSTATUS(rc), status) << bad << "\n" << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace thetaserve::testing
