// The `thetaserve` subcommands as a user runs them: flags checked before anything slow, with the
// flag named and the exit status telling a bad command line (2) from a failed run (1); and
// `calibrate` on the real model.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "model/theta_table.h"
#include "tests/server/e2e_util.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

// The exit status a shell sees (pclose's status decoded); -1 for a signal.
int ExitStatus(int rc) { return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1; }

// Every subcommand answers a bad command line the same way: exit 2, "thetaserve CMD: <why>" and
// a pointer to its --help (a parse error printed "INVALID_ARGUMENT: ..."; bad values exited 1 in
// some commands and 2 in others), and --help is the usage on stdout with exit 0. A run that
// fails (no server there) exits 1.
TEST(CliCommandTest, EveryCommandTellsABadCommandLineFromAFailedRun) {
  const std::string bin = BinaryPath();
  int rc = 0;
  for (const std::string command :
       {"generate", "serve", "client", "status", "health", "calibrate", "eval"}) {
    std::string out = RunCommand(bin + " " + command + " --bogus 1 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 2) << command << "\n" << out;
    EXPECT_EQ(out, "thetaserve " + command + ": unknown flag --bogus\nrun 'thetaserve " +
                       command + " --help' for its flags\n");
    for (const char* help : {" --help", " -h"}) {  // -h alone was an unexpected argument
      out = RunCommand(bin + " " + command + help + " 2>/dev/null", &rc);
      EXPECT_EQ(ExitStatus(rc), 0) << command << help;
      EXPECT_EQ(out.rfind("usage: thetaserve " + command, 0), 0u) << command << "\n" << out;
    }
  }
  // Values out of range or of the wrong kind, before anything starts.
  // A grammar past the 64 KiB bound, in a file (70,009 bytes).
  const std::string big_grammar = ::testing::TempDir() + "/big.gbnf";
  {
    std::ofstream out(big_grammar);
    out << "root ::= \"" << std::string(69998, 'a') << "\"";
  }
  const std::pair<std::string, std::string> usage_errors[] = {
      {"client --prompt hi --addr localhost:99999",
       "thetaserve client: --addr 'localhost:99999' is not HOST:PORT with a port in [1, 65535]"},
      {"health --addr localhost:0", "thetaserve health: --addr 'localhost:0' is not HOST:PORT"},
      {"status --addr :x", "thetaserve status: --addr ':x' is not HOST:PORT"},
      {"status --addr :50051",
       "thetaserve status: --addr ':50051' is not HOST:PORT: the host is missing (localhost?)"},
      {"client --addr localhost:1", "thetaserve client: --prompt is required"},
      {"client --prompt hi --addr localhost", "thetaserve client: --addr 'localhost' is not"},
      {"client --prompt hi --max-tokens 0",
       "thetaserve client: --max-tokens must be in [1, 4294967295], got 0"},
      {"client --prompt hi --n 0", "thetaserve client: --n must be in [1, 128], got 0"},
      // The server's sampling checks (they reached the server, for exit 1 and UNAVAILABLE
      // when none listened).
      {"client --prompt hi --addr localhost:1 --logit-bias 5:200",
       "thetaserve client: --logit-bias[5] = 200; it must be in [-100, 100]"},
      {"client --prompt hi --addr localhost:1 --temperature -1",
       "thetaserve client: --temperature = -1; it must be >= 0 (0 = greedy)"},
      {"client --prompt hi --addr localhost:1 --top-p 7",
       "thetaserve client: --top-p = 7; it must be in (0, 1]"},
      // The guides, checked as the server checks them.
      {"client --prompt hi --addr localhost:1 --guided-grammar 'root ::= x'",
       "thetaserve client: --guided-grammar: line 1, column 10: rule 'x' is used but not "
       "defined"},
      {"client --prompt hi --addr localhost:1 --guided-regex '(a'",
       "thetaserve client: --guided-regex: missing ), unterminated subpattern"},
      {"client --prompt hi --addr localhost:1 --guided-json '{\"type\": \"object\", "
       "\"minProperties\": 1}'",
       "thetaserve client: --guided-json: #: keyword minProperties is not supported"},
      {"client --prompt hi --addr localhost:1 --guided-regex a --json-object",
       "thetaserve client: --guided-regex, --guided-json, --json-object and --guided-grammar: "
       "give one"},
      {"client --prompt hi --addr localhost:1 --guided-grammar @" + big_grammar,
       "thetaserve client: --guided-grammar has 70009 bytes; at most 65536"},
      {"health --timeout 0", "thetaserve health: --timeout must be in [0.01, 3600], got 0"},
      {"generate --prompt hi --ignore-eos=maybe",
       "thetaserve generate: flag --ignore-eos is a switch: --ignore-eos or "
       "--ignore-eos=true|false, not 'maybe'"},
      {"generate --prompt hi", "thetaserve generate: --model is required"},
      {"generate --model m.gguf --prompt hi --system terse",
       "thetaserve generate: --system goes with --chat (a chat's system message)"},
      {"eval --model m.gguf", "thetaserve eval: --text is required"},
      {"eval --model m.gguf --text t.txt --context 64 --max-tokens 10",
       "thetaserve eval: --max-tokens 10 is less than one --context window of 64"},
      {"calibrate --model m.gguf --corpus c.txt",
       "thetaserve calibrate: --corpus and --out are required"},
      {"calibrate --model m.gguf --corpus c.txt --out t.json --context 512 --max-tokens 100",
       "thetaserve calibrate: --max-tokens 100 is less than one --context window of 512"},
      // A third field was dropped: 64:8:9 ran as 64:8.
      {"calibrate --model m.gguf --corpus c.txt --out t.json --k-schedule 64:8:9",
       "thetaserve calibrate: --k-schedule: '64:8:9' is not LENGTH:K (e.g. 2048:64,8192:128)"},
      {"serve --model m.gguf --theta=", "thetaserve serve: --theta needs a file"},
      {"serve --model m.gguf --tls-cert c.pem",
       "thetaserve serve: --tls-cert and --tls-key go together"},
  };
  for (const auto& [args, message] : usage_errors) {
    const std::string out = RunCommand(bin + " " + args + " 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 2) << args << "\n" << out;
    EXPECT_EQ(out.rfind(message, 0), 0u) << args << "\n" << out;
    EXPECT_EQ(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  }
  // Failures while running: nothing listens on a free port; a CA file that is not there (gRPC
  // trusted the system's roots instead).
  const std::string nobody = "127.0.0.1:" + std::to_string(FreePort());
  const std::pair<std::string, std::string> failures[] = {
      {"status --addr " + nobody, "thetaserve status: UNAVAILABLE: "},
      {"health --addr " + nobody + " --timeout 2", "thetaserve health: "},
      {"client --prompt hi --timeout 5 --addr " + nobody, "thetaserve client: UNAVAILABLE: "},
      {"client --prompt hi --tls-ca /nonexistent.pem --addr " + nobody,
       "thetaserve client: cannot read --tls-ca /nonexistent.pem"},
      {"client --prompt hi --guided-grammar @/nonexistent.gbnf --addr " + nobody,
       "thetaserve client: cannot read --guided-grammar @/nonexistent.gbnf: not a file"},
      {"client --prompt hi --guided-json @/tmp --addr " + nobody,
       "thetaserve client: cannot read --guided-json @/tmp: not a file"},
      // A pattern is taken as it is ('@' begins many): it reached for the server.
      {"client --prompt hi --timeout 5 --guided-regex '@[a-z]+' --addr " + nobody,
       "thetaserve client: UNAVAILABLE: "},
  };
  for (const auto& [args, message] : failures) {
    const std::string out = RunCommand(bin + " " + args + " 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 1) << args << "\n" << out;
    EXPECT_NE(out.find(message), std::string::npos) << args << "\n" << out;
  }
  // A client that reached no server prints nothing on stdout (it printed an empty line).
  EXPECT_EQ(RunCommand(bin + " client --prompt hi --timeout 5 --addr " + nobody + " 2>/dev/null",
                       &rc),
            "");
  EXPECT_EQ(ExitStatus(rc), 1);
  std::string out = RunCommand(bin + " 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 2);
  EXPECT_EQ(out.rfind("usage: thetaserve <command>", 0), 0u) << out;
  out = RunCommand(bin + " --version 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 0);
  EXPECT_EQ(out.rfind("thetaserve 0.", 0), 0u) << out;
  EXPECT_NE(out.find("\nbackends: cpu"), std::string::npos) << out;
}

TEST(CliCommandTest, OutOfRangeFlagsAreRefusedByName) {
  // Each was accepted before: the log said it served on port 70000, the thread count crashed
  // the pool, the block size wrapped to negative pages. The Top-θ flags were read only after
  // the model loaded (they are now checked first; the θ file is held to the model after).
  const std::pair<std::string, std::string> cases[] = {
      {"--port 70000", "--port must be in [0, 65535], got 70000"},
      {"--metrics-port -5", "--metrics-port must be in [0, 65535], got -5"},
      {"--http-port 65536", "--http-port must be in [0, 65535], got 65536"},
      {"--threads 5000000000", "--threads must be in [0, 1024], got 5000000000"},
      {"--block-size 3000000000", "--block-size must be in [1, 65536], got 3000000000"},
      {"--block-size 0", "--block-size must be in [1, 65536], got 0"},
      {"--drain-timeout nan", "--drain-timeout must be in [0, 86400], got nan"},
      {"--scheduling-policy priority --priority-aging -1",
       "--priority-aging must be in [0, 1e+06], got -1"},
      {"--scheduling-policy priority --priority-aging inf",
       "--priority-aging must be in [0, 1e+06], got inf"},
      {"--priority-aging 0.5",
       "--priority-aging ages request priorities, which only --scheduling-policy priority has"},
      // A stats line every 10 ms would have the logger's thread spin on the engine's lock.
      {"--log-stats-interval 0.01", "--log-stats-interval is 0.01; it must be 0 (off) or at least 0.1"},
      {"--local-window 0", "--local-window must be in [1, 2147483647], got 0"},
      {"--policy bogus", "--policy must be full, sparse or offload, got 'bogus'"},
      {"--policy sparse", "--policy sparse needs --theta"},
      {"--sdc maybe", "--sdc must be exact, exp-threshold, offline or none, got 'maybe'"},
      // The V store's flags without a policy that has one did nothing, silently.
      {"--keep-fraction 0.5",
       "--keep-fraction applies to --policy sparse or offload (the V store); the policy is "
       "full"},
      {"--policy full --obs-window 8", "--obs-window applies to --policy sparse or offload"},
      {"--retain-factor 2", "--retain-factor applies to --policy sparse or offload"},
      {"--fixed-compaction",
       "--fixed-compaction applies to --policy sparse or offload (the V store); the policy is "
       "full"},
  };
  for (const auto& [flags, message] : cases) {
    int rc = 0;
    const std::string out = RunCommand(
        BinaryPath() + " serve --model " + DefaultModelPath() + " " + flags + " 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 2) << flags << "\n" << out;
    EXPECT_NE(out.find("thetaserve serve: " + message), std::string::npos) << flags << "\n" << out;
    EXPECT_EQ(out.find("loading"), std::string::npos) << flags << ": refused before loading";
  }
}

// generate --exact-matmul takes the CPU backend's f32 path (the log's model line says so;
// without the flag it says nothing of activations) and answers this near-tie as that path does
// (OpenAiHttpLifecycleTest.ExactMatmulServesTheF32Path; docs/results.md).
TEST(CliCommandTest, GenerateExactMatmulTakesTheF32Path) {
  int rc = 0;
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath() +
                               " --device cpu --chat --prompt 'What is the capital of France?'"
                               " --max-tokens 16 --temperature 0";
  std::string out = RunCommand(generate + " --exact-matmul 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("backend cpu (KV cache in f16; f32 activations)"), std::string::npos) << out;
  EXPECT_NE(out.find("\nThe capital of France is Paris.\n"), std::string::npos) << out;
  out = RunCommand(generate + " --max-tokens 1 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("backend cpu (KV cache in f16)"), std::string::npos) << out;
}

TEST(CliCommandTest, GenerateTakesSamplingTopKAndTheApisChecks) {
  // --top-k is the sampling flag (the attention baseline is --exact-top-k): it was refused as
  // "unexpected argument '40'" while the usage offered it.
  int rc = 0;
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath();
  std::string out = RunCommand(generate + " --prompt 'Once upon a time' --max-tokens 4 --ignore-eos"
                                          " --temperature 0.8 --top-k 40 --seed 7 2>&1",
                               &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("generated 4 tokens"), std::string::npos) << out;
  // A seed takes the API's whole uint64 (past 2^63 − 1 was refused).
  out = RunCommand(generate + " --prompt 'Once upon a time' --max-tokens 2 --ignore-eos"
                              " --temperature 0.8 --seed 18446744073709551615 2>&1",
                   &rc);
  EXPECT_EQ(rc, 0) << out;
  // The same sampling checks as the API, before the model loads, naming the flag (the API's
  // messages name its fields: sampling.top_p).
  const std::pair<std::string, std::string> cases[] = {
      {"--temperature -1", "--temperature = -1; it must be >= 0 (0 = greedy)"},
      {"--top-p 7", "--top-p = 7; it must be in (0, 1]"},
      {"--top-k -4", "--top-k must be in [0, 2147483647], got -4"},
      {"--min-p 2", "--min-p = 2; it must be in [0, 1]"},
      {"--repetition-penalty 0", "--repetition-penalty = 0; it must be > 0 (1 = off)"},
      {"--max-tokens 0", "--max-tokens must be in [1, 2147483647], got 0"},
      // It read as no seed.
      {"--seed -5", "--seed must be an integer in [0, 18446744073709551615], got '-5'"},
  };
  for (const auto& [flags, message] : cases) {
    out = RunCommand(generate + " --prompt hi " + flags + " 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 2) << flags;
    EXPECT_NE(out.find("thetaserve generate: " + message), std::string::npos)
        << flags << "\n" << out;
    EXPECT_EQ(out.find("loading"), std::string::npos) << flags << ": refused before loading";
  }
}

// generate --special-tokens writes the special tokens it generates (a chat reply's <|im_end|>,
// gone past with --ignore-eos) into the text; without it they are left out, as the server does.
TEST(CliCommandTest, GenerateSpecialTokensWritesThemOut) {
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath() +
                               " --chat --prompt 'Say hi.' --max-tokens 80 --ignore-eos";
  int rc = 0;
  const std::string written = RunCommand(generate + " --special-tokens 2>/dev/null", &rc);
  EXPECT_EQ(rc, 0) << written;
  EXPECT_NE(written.find("<|im_end|>"), std::string::npos) << written;
  const std::string skipped = RunCommand(generate + " 2>/dev/null", &rc);
  EXPECT_EQ(rc, 0) << skipped;
  EXPECT_EQ(skipped.find("<|im_"), std::string::npos) << skipped;
  EXPECT_LT(skipped.size(), written.size());
}

// eval and calibrate refuse work whose result could not be kept or used: an --out that cannot
// be written (eval wrote nothing and exited 0; calibrate found out after the whole run), or a θ
// file that is not there, before the model loads; after it, --dense-layers covering every layer
// (calibrate wrote a file of no thresholds), a context past the model's, or a text too short for
// one window, each said as such (all three were "fewer tokens than one --context window").
TEST(CliCommandTest, EvalAndCalibrateRefuseUselessRunsUpFront) {
  const std::string model = " --model " + DefaultModelPath();
  const std::string eval = BinaryPath() + " eval" + model;
  const std::string calibrate = BinaryPath() + " calibrate" + model;
  const ScopedTempDir tmp("cli_commands_test");
  const std::string tiny = tmp.File("tiny.txt");
  { std::ofstream(tiny) << "In the beginning God created the heaven and the earth.\n"; }
  const std::string kjv = absl::StrCat(" ", SourceDir(), "/data/kjv.txt");
  const struct {
    std::string command, message;
    bool loads;  // the model loads before the refusal
  } cases[] = {
      {eval + " --text" + kjv + " --out /nonexistent/dir/x.jsonl",
       "thetaserve eval: cannot write --out /nonexistent/dir/x.jsonl", false},
      {calibrate + " --corpus" + kjv + " --out /nonexistent/dir/t.json",
       "thetaserve calibrate: cannot write --out /nonexistent/dir/t.json", false},
      // An empty path passed as the working directory's, and failed after the whole run.
      {calibrate + " --corpus" + kjv + " --out ''",
       "thetaserve calibrate: cannot write --out: the path is empty", false},
      {eval + " --text " + SourceDir() + "/data",
       absl::StrCat("thetaserve eval: --text '", SourceDir(),
                    "/data' is not a file (a directory?)"),
       false},
      {eval + " --text" + kjv + " --theta /nonexistent/theta.json",
       "thetaserve eval: cannot open θ file /nonexistent/theta.json", false},
      {calibrate + " --corpus" + kjv + " --context 64 --max-tokens 64 --k 8 --dense-layers 30"
                   " --out " + tmp.File("t.json"),
       "thetaserve calibrate: --dense-layers 30 leaves none of the model's 30 layers", true},
      {calibrate + " --corpus" + kjv + " --context 9000 --max-tokens 9000 --out " +
           tmp.File("t.json"),
       "thetaserve calibrate: --context 9000 is longer than the model's context of 8192 tokens",
       true},
      {eval + " --text" + kjv + " --context 9000",
       "thetaserve eval: --context 9000 is longer than the model's context of 8192 tokens", true},
      {eval + " --text " + tiny + " --context 64",
       "thetaserve eval: " + tiny + " holds 12 tokens, fewer than one --context window of 64",
       true},
  };
  for (const auto& c : cases) {
    int rc = 0;
    const std::string out = RunCommand(c.command + " 2>&1", &rc);
    EXPECT_EQ(ExitStatus(rc), 1) << c.command << "\n" << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.command << "\n" << out;
    EXPECT_EQ(out.find("loading") != std::string::npos, c.loads) << c.command << "\n" << out;
  }
  EXPECT_FALSE(std::ifstream(tmp.File("t.json")).good())
      << "a calibration that failed left a file behind";
}

// A θ file in which no bucket was calibrated loads (a legal table) and runs attention dense:
// that is said, since it was silent. (This one is also the wrong shape, refused after.)
TEST(CliCommandTest, AThetaFileWithNothingCalibratedIsSaidToRunDense) {
  const ScopedTempDir tmp("cli_commands_test");
  model::ThetaTable t(2, 1, {16, 32});
  t.k_per_layer = {8, 8};
  t.Finalize();
  const std::string path = tmp.File("null_theta.json");
  ASSERT_TRUE(t.Save(path).ok());
  int rc = 0;
  const std::string out =
      RunCommand(BinaryPath() + " eval --model " + DefaultModelPath() + " --text " + SourceDir() +
                     "/data/kjv.txt --context 64 --max-tokens 64 --theta " + path + " 2>&1",
                 &rc);
  EXPECT_NE(out.find("warning: " + path +
                     " has no calibrated θ (every bucket is null): attention runs dense"),
            std::string::npos)
      << out;
}

// --sdc and --no-vmc compensate for rows Top-θ drops: without --theta they do nothing, which
// is said (they were taken silently). Not refused: a deployment may set them once and turn
// Top-θ on and off by the θ file alone. Given with a θ file, nothing is said.
TEST(CliCommandTest, CompensationFlagsWithoutAThetaFileAreSaidToDoNothing) {
  const std::string generate =
      BinaryPath() + " generate --model " + DefaultModelPath() + " --prompt 'Once' --max-tokens 1";
  int rc = 0;
  std::string out = RunCommand(generate + " --sdc none --no-vmc 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 0) << out;
  for (const char* flag : {"--sdc", "--no-vmc"}) {
    EXPECT_NE(out.find(absl::StrCat("warning: ", flag,
                                    " applies to Top-θ (--theta); without a θ file attention is "
                                    "dense and it does nothing")),
              std::string::npos)
        << out;
  }
  out = RunCommand(generate + " 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 0) << out;
  EXPECT_EQ(out.find("warning:"), std::string::npos) << out;

  const ScopedTempDir tmp("cli_commands_test");
  model::ThetaTable t(2, 1, {16, 32});  // refused later for its shape: the flags come first
  t.k_per_layer = {8, 8};
  t.Finalize();
  const std::string path = tmp.File("theta.json");
  ASSERT_TRUE(t.Save(path).ok());
  out = RunCommand(generate + " --theta " + path + " --sdc none --no-vmc 2>&1", &rc);
  EXPECT_NE(out.find("2 layers × 1 heads"), std::string::npos) << out;
  EXPECT_EQ(out.find("applies to Top-θ"), std::string::npos) << out;
}

// eval's result line is JSON whatever the paths hold: a text file named with a quote and a
// backslash came out as "text":"q"x\y.txt", which no reader could parse.
TEST(CliCommandTest, EvalResultIsJsonWhateverThePathsHold) {
  const ScopedTempDir tmp("cli_commands_test");
  const std::string text = tmp.File("q\"x\\y.txt");
  {
    std::ifstream in(SourceDir() + "/data/kjv.txt");
    std::string head(3000, '\0');
    in.read(head.data(), head.size());
    std::ofstream(text) << head;
  }
  const std::string out_path = tmp.File("eval.jsonl");
  int rc = 0;
  const std::string out = RunCommand(BinaryPath() + " eval --model " + DefaultModelPath() +
                                         " --text '" + text + "' --context 64 --max-tokens 128"
                                         " --out " + out_path + " 2>&1",
                                     &rc);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(out_path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << line;
  EXPECT_EQ(j["text"], text);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
}

// A command whose standard output could not be written fails (generate, eval and calibrate
// exited 0 with their output lost, as under `> file` on a full disk).
TEST(CliCommandTest, OutputThatCannotBeWrittenFailsTheCommand) {
  if (!std::ifstream("/dev/full").good()) GTEST_SKIP() << "no /dev/full here";
  int rc = 0;
  const std::string out = RunCommand(BinaryPath() + " generate --model " + DefaultModelPath() +
                                         " --prompt 'Once upon a time' --max-tokens 2"
                                         " 2>&1 >/dev/full",
                                     &rc);
  EXPECT_EQ(ExitStatus(rc), 1) << out;
  EXPECT_NE(out.find("thetaserve generate: cannot write standard output"), std::string::npos)
      << out;
}

// The benchmarks' command lines: --help prints the usage (it started a whole run: 1 GiB copy
// buffers on every core), a number that does not parse exits 2 naming the flag (std::stoi's
// exception aborted), and an unknown flag is refused (the attention benchmark ignored it).
TEST(CliCommandTest, BenchmarksTakeHelpAndRefuseBadFlags) {
  const std::string dir = BinaryPath().substr(0, BinaryPath().rfind('/'));
  const std::string bench = dir + "/thetaserve_bench", attention = dir + "/thetaserve_attention_bench";
  if (!std::ifstream(bench).good() || !std::ifstream(attention).good()) {
    GTEST_SKIP() << "the benchmarks are not built beside " << BinaryPath();
  }
  int rc = 0;
  std::string out = RunCommand(bench + " --help 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 0) << out;
  EXPECT_EQ(out.rfind("usage: thetaserve_bench ", 0), 0u) << out;
  out = RunCommand(bench + " --repeats abc 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 2) << out;
  EXPECT_NE(out.find("--repeats wants an integer, got 'abc'"), std::string::npos) << out;
  out = RunCommand(attention + " --contexts 64 --bogus 1 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 2) << out;
  EXPECT_NE(out.find("unknown flag --bogus"), std::string::npos) << out;
  out = RunCommand(attention + " --repeats 2>&1", &rc);
  EXPECT_EQ(ExitStatus(rc), 2) << out;
  EXPECT_NE(out.find("--repeats needs a value"), std::string::npos) << out;
}

// `thetaserve calibrate` on the real model and the KJV corpus with `args`: its stdout and stderr.
std::string RunCalibrate(const std::string& args, int* rc) {
  return RunCommand(BinaryPath() + " calibrate --model " + DefaultModelPath() + " --corpus " +
                        SourceDir() + "/data/kjv.txt " + args + " 2>&1",
                    rc);
}

// Two θ files of the same model side by side at L = 480, over the calibrated layers (2 on:
// layers 0-1 are dense, k = 512) and every head: both positive and within a factor
// e^max_log_ratio of each other. Counts the heads whose θ differ, and all heads.
void CompareThetaAt480(const model::ThetaTable& a, const model::ThetaTable& b,
                       float max_log_ratio, int* differ, int* heads) {
  for (int32_t l = 2; l < a.num_layers(); ++l) {
    for (int32_t h = 0; h < a.num_heads(); ++h) {
      const float x = a.Theta(l, h, 480), y = b.Theta(l, h, 480);
      ASSERT_GT(x, 0.0f);
      ASSERT_GT(y, 0.0f);
      EXPECT_LT(std::fabs(std::log(y / x)), max_log_ratio)
          << "layer " << l << " head " << h << ": " << x << " vs " << y;
      *differ += x != y;
      ++*heads;
    }
  }
}

// `calibrate --k-schedule` on the real model: the file records the schedule, θ is unchanged
// where k is (rows up to the first point see the same k, and attention is causal) and lower
// past it (post-softmax, the (k+1)-th largest probability falls as k grows); a schedule that
// reaches past --context is refused.
TEST(CalibrateCommandTest, KScheduleRaisesKWithTheRowLength) {
  const auto& run = RunCalibrate;
  const ScopedTempDir tmp("server_e2e_test");
  const std::string fixed = tmp.File("theta_k16.json");
  const std::string scheduled = tmp.File("theta_k16_64.json");
  int rc = 0;
  std::string out = run("--context 512 --max-tokens 512 --k 16 --out " + fixed, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = run("--context 512 --max-tokens 512 --k-schedule 128:16,512:64 --out " + scheduled, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = run("--context 256 --max-tokens 512 --k-schedule 128:16,512:64 --out " + scheduled + ".x",
            &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("shorter than the k schedule's last length 512"), std::string::npos) << out;

  auto a = model::ThetaTable::Load(fixed);
  auto b = model::ThetaTable::Load(scheduled);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->k_schedule.empty());
  ASSERT_EQ(b->k_schedule.size(), 2u);
  EXPECT_EQ(b->k_schedule[1], std::make_pair(int64_t(512), 64));
  EXPECT_NE(a->fingerprint, b->fingerprint);
  int lower = 0, heads = 0;
  for (int32_t l = 2; l < a->num_layers(); ++l) {  // layers 0-1 are dense (k = 512)
    for (int32_t h = 0; h < a->num_heads(); ++h) {
      // Equal up to the order in which threads summed the rows.
      EXPECT_NEAR(a->Theta(l, h, 100), b->Theta(l, h, 100),
                  1e-5f * std::fabs(a->Theta(l, h, 100)))
          << l << " " << h;
      lower += b->Theta(l, h, 480) < a->Theta(l, h, 480);
      ++heads;
    }
  }
  ASSERT_GT(heads, 0);
  EXPECT_EQ(lower, heads)
      << "k = 60 at L = 480 must give a lower probability threshold than k = 16";
}

// `calibrate --kv-cache-dtype`: the scores θ is calibrated on are computed over pages of that
// type, so fp8 pages give other thresholds than f32 pages, near them (K moves by at most 2^-4
// of itself, so a score by a fraction of a nat, and a post-softmax θ by a factor near 1);
// a bad type is refused.
TEST(CalibrateCommandTest, ScoresAreComputedOverTheGivenKvCacheDtype) {
  auto run = [](const std::string& args, int* rc) {
    return RunCalibrate("--context 512 --max-tokens 512 --k 16 " + args, rc);
  };
  const ScopedTempDir tmp("server_e2e_test");
  const std::string f32 = tmp.File("theta_f32.json");
  const std::string fp8 = tmp.File("theta_fp8.json");
  int rc = 0;
  std::string out = run("--kv-cache-dtype f32 --out " + f32, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(KV cache in f32)"), std::string::npos) << out;
  out = run("--kv-cache-dtype fp8 --out " + fp8, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(KV cache in fp8_e4m3)"), std::string::npos) << out;
  out = run("--kv-cache-dtype int4 --out " + fp8 + ".x", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--kv-cache-dtype must be auto, f32, f16, bf16, fp8"), std::string::npos)
      << out;

  auto a = model::ThetaTable::Load(f32);
  auto b = model::ThetaTable::Load(fp8);
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0, heads = 0;
  ASSERT_NO_FATAL_FAILURE(CompareThetaAt480(*a, *b, 0.5f, &differ, &heads));
  EXPECT_GT(differ, heads / 2) << "fp8 pages gave f32's thresholds: were they used?";
}

// `calibrate --exact-matmul`: the scores come from f32 activations, as `serve --exact-matmul`
// computes them (the log says so), so θ moves, by little: the int8 activations' rounding moves
// a score by far less than a nat (measured at k 64, context 2048, 8192 tokens: a median θ
// 0.6% apart, no bias; docs/results.md).
TEST(CalibrateCommandTest, ExactMatmulCalibratesOnF32Activations) {
  auto run = [](const std::string& args, int* rc) {
    return RunCalibrate("--context 512 --max-tokens 512 --k 16 " + args, rc);
  };
  const ScopedTempDir tmp("server_e2e_test");
  const std::string int8 = tmp.File("theta_int8.json");
  const std::string f32 = tmp.File("theta_f32.json");
  int rc = 0;
  std::string out = run("--out " + int8, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("backend cpu (KV cache in f16)"), std::string::npos) << out;
  out = run("--exact-matmul --out " + f32, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("backend cpu (KV cache in f16; f32 activations)"), std::string::npos) << out;

  auto a = model::ThetaTable::Load(int8);
  auto b = model::ThetaTable::Load(f32);
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0, heads = 0;
  ASSERT_NO_FATAL_FAILURE(CompareThetaAt480(*a, *b, 0.25f, &differ, &heads));
  EXPECT_GT(differ, heads / 2) << "--exact-matmul gave int8's thresholds: was it used?";
}

}  // namespace
}  // namespace thetaserve::testing
