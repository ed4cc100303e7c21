// Host-side sampling cost on this machine, measured in one run:
//  1. the cut to what a step may choose from (top-k, min-p, top-p) per row: the reference that
//     sorts the whole vocabulary (TruncateDistributionBySorting) against TruncateDistribution,
//     which sorts only the head top-p keeps; ratio = reference ÷ ours;
//  2. Sampler::Sample for a batch of rows on the engine thread alone and on a pool of sampling
//     threads (EngineConfig::sampling_threads), as a step samples them;
//  3. what narrowing a row costs (allowed_token_ids, bad_words, a guided choice's, regex's,
//     JSON object's, JSON schema's or GBNF grammar's next tokens found by Guide::Allowed in the vocabulary
//     indexed by bytes, plus the masked Sample), per row, against the same Sample without it;
//     ratio = with ÷ without; a schema's compile time;
//     "next": the tokens the guide lets through; "cold": a new guide's Allowed alone (its walk
//     through the vocabulary), "warm": Allowed for a state it has walked before.
// Two kinds of rows: "peaked" (a few dozen likely tokens over a N(0, 2.5) background, like a
// language model's) and "flat" (N(0, 1): top-p keeps most of the vocabulary, the worst case).
//
//   build/thetaserve_sampler_bench [--vocab 49152] [--batch 64] [--threads 0 (all cores)]
//       [--repeats 15]
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/thread_pool.h"
#include "scheduler/guided_choice.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_regex.h"
#include "scheduler/guided_schema.h"
#include "scheduler/sampler.h"

namespace ts = thetaserve;
using ts::bench::IntFlag;
using ts::bench::ParseFlags;
using ts::scheduler::SamplingParams;

namespace {

std::vector<float> Row(bool peaked, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, peaked ? 2.5f : 1.0f);
  std::vector<float> x(vocab);
  for (float& v : x) v = normal(rng);
  if (peaked) {
    for (int i = 0; i < 40; ++i) x[rng() % vocab] += 6.0f + 0.15f * i;
  }
  return x;
}

// Milliseconds per call of f, over `iters` calls.
template <typename F>
double TimeMs(F&& f, int iters) {
  const double t0 = ts::bench::Now();
  for (int i = 0; i < iters; ++i) f();
  return (ts::bench::Now() - t0) * 1e3 / iters;
}

struct Case {
  const char* name;
  SamplingParams p;
};

std::vector<Case> Cases() {
  std::vector<Case> cs;
  auto add = [&](const char* name, float t, float top_p, int top_k, float min_p) {
    SamplingParams p;
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = min_p;
    p.seed = 1;
    cs.push_back({name, p});
  };
  add("T 1", 1.0f, 1.0f, 0, 0.0f);
  add("T 0.7, top-p 0.9", 0.7f, 0.9f, 0, 0.0f);
  add("T 0.7, top-p 0.95, min-p 0.05", 0.7f, 0.95f, 0, 0.05f);
  add("T 0.7, top-k 50", 0.7f, 1.0f, 50, 0.0f);
  return cs;
}

constexpr char kUsage[] =
    "usage: thetaserve_sampler_bench [--vocab 49152] [--batch 64] [--threads N] [--repeats 15]\n";

}  // namespace

int main(int argc, char** argv) {
  int vocab = 49152, batch = 64, threads = 0, repeats = 15;
  ParseFlags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    if (k == "--vocab") vocab = IntFlag(k, v);
    else if (k == "--batch") batch = IntFlag(k, v);
    else if (k == "--threads") threads = IntFlag(k, v);
    else if (k == "--repeats") repeats = IntFlag(k, v);
    else return false;
    return true;
  });
  if (threads <= 0) threads = int(std::thread::hardware_concurrency());
  std::printf("# sampling on the host: vocabulary %d, medians of %d runs, %u hardware threads\n", vocab,
              repeats, std::thread::hardware_concurrency());

  std::printf("\n## the cut per row (top-k, min-p, top-p), µs\n");
  std::printf("%-7s %-32s %-11s %-11s %-7s %-7s\n", "rows", "params", "sort all", "ours", "ratio", "kept");
  for (bool peaked : {true, false}) {
    const std::vector<float> row = Row(peaked, vocab, 3);
    for (const Case& c : Cases()) {
      std::vector<float> scaled(row);
      for (float& v : scaled) v /= c.p.temperature;
      std::vector<std::pair<float, int32_t>> scratch;
      std::vector<std::pair<int32_t, double>> kept;
      std::vector<double> t_ref, t_ours;
      for (int r = 0; r < repeats; ++r) {  // alternate: noise hits both alike
        t_ref.push_back(TimeMs([&] { ts::scheduler::TruncateDistributionBySorting(scaled, c.p, kept); }, 3));
        t_ours.push_back(TimeMs([&] { ts::scheduler::TruncateDistribution(scaled, c.p, scratch, kept); }, 3));
      }
      const double ref = ts::bench::Median(t_ref) * 1e3, ours = ts::bench::Median(t_ours) * 1e3;
      std::printf("%-7s %-32s %-11.1f %-11.1f %-7.1f %-7zu\n", peaked ? "peaked" : "flat", c.name, ref, ours,
                  ref / ours, kept.size());
      std::fflush(stdout);
    }
  }

  std::printf("\n## a step's %d rows through Sampler::Sample, ms (peaked rows)\n", batch);
  std::printf("%-32s %-11s %-11s %-7s\n", "params", "1 thread", "pool", "ratio");
  std::vector<std::vector<float>> rows;
  for (int b = 0; b < batch; ++b) rows.push_back(Row(true, vocab, 100 + b));
  ts::kernels::cpu::ThreadPool pool(threads);
  for (const Case& c : Cases()) {
    std::vector<ts::scheduler::Sampler> samplers(batch, ts::scheduler::Sampler(c.p));
    std::vector<std::vector<float>> work(rows);
    auto step = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        std::memcpy(work[b].data(), rows[b].data(), size_t(vocab) * 4);  // Sample scales in place
        samplers[b].Sample(work[b], {}, {});
      }
    };
    std::vector<double> t1, tn;
    for (int r = 0; r < repeats; ++r) {
      t1.push_back(TimeMs([&] { step(0, batch); }, 1));
      tn.push_back(TimeMs([&] { pool.ParallelFor(batch, 1, step); }, 1));
    }
    const double a = ts::bench::Median(t1), b = ts::bench::Median(tn);
    std::printf("%-32s %-11.2f %-11.2f %-7.2f (%d threads)\n", c.name, a, b, a / b, pool.num_threads());
    std::fflush(stdout);
  }

  // A vocabulary of distinct byte strings like a BPE one's (1 to 8 letters, half with a
  // leading space), and choices made of its entries, so each is reachable.
  std::mt19937 rng(7);
  std::vector<std::string> vocab_bytes;
  std::set<std::string> taken;
  while (int(vocab_bytes.size()) < vocab) {
    std::string b = rng() % 2 ? " " : "";
    for (int n = 1 + int(rng() % 8); n > 0; --n) b += char('a' + rng() % 26);
    if (taken.insert(b).second) vocab_bytes.push_back(b);
  }
  auto choices = [&](int count) {
    std::vector<std::string> out;
    for (int i = 0; i < count; ++i) {
      std::string c;
      for (int n = 2 + int(rng() % 4); n > 0; --n) c += vocab_bytes[rng() % vocab];
      out.push_back(c);
    }
    return out;
  };
  const ts::scheduler::TokenBytesIndex vocab_index(vocab_bytes);
  SamplingParams base = Cases()[1].p;  // T 0.7, top-p 0.9
  std::printf("\n## narrowing a row, µs per row (peaked rows, %s)\n", Cases()[1].name);
  std::printf("%-44s %-9s %-9s %-6s %-6s %-9s %-9s\n", "narrowing", "without", "with", "ratio",
              "next", "cold", "warm");
  const std::vector<float> row = Row(true, vocab, 5);
  // make(): a new guide, or null. "cold": a new guide's first Allowed (its walk through the
  // vocabulary); "warm": the same state asked again (regex and JSON guides remember it);
  // "with": a warm Allowed and the masked Sample.
  using GuidePtr = std::shared_ptr<const ts::scheduler::Guide>;
  auto run = [&](const std::string& name, SamplingParams with,
                 const std::function<GuidePtr()>& make, std::string_view so_far = "") {
    ts::scheduler::Sampler plain(base), narrowed(with);
    std::vector<float> work(row);
    std::vector<int32_t> next;
    std::vector<int32_t> output = {1, 2, 3};
    std::vector<double> t0, t1, cold, warm;
    GuidePtr guide = make();
    for (int r = 0; r < repeats; ++r) {
      if (guide) {
        GuidePtr fresh = make();
        cold.push_back(TimeMs([&] { fresh->Allowed(so_far, vocab_index, &next); }, 1));
        warm.push_back(TimeMs([&] { guide->Allowed(so_far, vocab_index, &next); }, 5));
      }
      t0.push_back(TimeMs([&] {
        work = row;
        plain.Sample(work, {}, output);
      }, 5));
      t1.push_back(TimeMs([&] {
        work = row;
        if (guide) guide->Allowed(so_far, vocab_index, &next);
        narrowed.Sample(work, {}, output, {}, next);
      }, 5));
    }
    const double a = ts::bench::Median(t0) * 1e3, b = ts::bench::Median(t1) * 1e3;
    std::printf("%-44s %-9.1f %-9.1f %-6.2f %-6zu %-9.1f %-9.1f\n", name.c_str(), a, b, b / a,
                guide ? next.size() : size_t(0), guide ? ts::bench::Median(cold) * 1e3 : 0.0,
                guide ? ts::bench::Median(warm) * 1e3 : 0.0);
    std::fflush(stdout);
  };
  auto none = [] { return GuidePtr(); };
  {
    SamplingParams p = base;
    std::vector<int32_t> ids;
    for (int i = 0; i < 1000; ++i) ids.push_back(i * (vocab / 1000));
    p.allowed_tokens = std::make_shared<const std::vector<int32_t>>(ids);
    run("allowed_token_ids: 1000 ids", p, none);
  }
  {
    SamplingParams p = base;
    std::vector<std::vector<int32_t>> words;
    for (int i = 0; i < 1024; ++i) {  // 4096 tokens, the bound; each compared every step
      words.push_back({int32_t(rng() % vocab), int32_t(rng() % vocab), i % 2 ? 2 : 1,
                       int32_t(3 + i % 7)});
    }
    p.bad_words = std::make_shared<const std::vector<std::vector<int32_t>>>(words);
    run("bad_words: 1024 words, 4096 tokens", p, none);
  }
  for (int count : {4, 64, 1024}) {
    const std::vector<std::string> picked = choices(count);
    const std::string name = "guided choice: " + std::to_string(count) + " choices, all open";
    run(name, base, [&] { return std::make_shared<const ts::scheduler::ChoiceGuide>(picked); });
  }
  // Patterns over this vocabulary's letters: nearly every token open, about half, a few.
  for (const char* pattern : {"[a-z ]{1,200}", " ?[a-m]+( [a-m]+)*", "(yes|no), because [a-z ]+"}) {
    auto guide = ts::scheduler::RegexGuide::Compile(pattern);
    if (!guide.ok()) {
      std::fprintf(stderr, "%s: %s\n", pattern, guide.status().ToString().c_str());
      return 1;
    }
    run(std::string("guided regex: ") + pattern, base,
        [&] { return GuidePtr(*ts::scheduler::RegexGuide::Compile(pattern)); });
  }
  // A JSON object's next tokens where few and where most of the vocabulary may come.
  auto json = [] { return std::make_shared<const ts::scheduler::JsonObjectGuide>(); };
  run("json_object: after {\"a\":", base, json, "{\"a\":");
  run("json_object: inside a string", base, json, "{\"a\": \"x");
  // A JSON schema (OpenAI's structured-outputs example: steps of an explanation and an output,
  // and a final answer), compiled once per request, then walked like a regex (this vocabulary
  // has no quotes, so inside a string is where its tokens go).
  const char* kSteps = R"({"type": "object", "properties": {
      "steps": {"type": "array", "items": {"type": "object", "properties": {
          "explanation": {"type": "string"}, "output": {"type": "string"}},
          "required": ["explanation", "output"], "additionalProperties": false}},
      "final_answer": {"type": "string"}},
      "required": ["steps", "final_answer"], "additionalProperties": false})";
  // The median ms to compile `json_schema`, its guide into *guide (null where it did not).
  auto compile_ms = [&](const char* json_schema, GuidePtr* guide) {
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      ms.push_back(TimeMs([&] {
        auto compiled = ts::scheduler::CompileJsonSchema(json_schema);
        *guide = compiled.ok() ? *compiled : nullptr;
      }, 1));
    }
    return ts::bench::Median(ms);
  };
  GuidePtr steps;
  const double steps_ms = compile_ms(kSteps, &steps);
  auto schema = std::dynamic_pointer_cast<const ts::scheduler::RegexGuide>(steps);
  if (!schema) {
    std::fprintf(stderr, "the steps schema did not compile\n");
    return 1;
  }
  run("json_schema: inside a string", base,
      [&] { return GuidePtr(*ts::scheduler::CompileJsonSchema(kSteps)); },
      "{\"steps\": [{\"explanation\": \"x");
  std::printf("json_schema (steps, final_answer): %d states, compiled in %.2f ms (median)\n",
              schema->num_states(), steps_ms);
  // A recursive schema (a tree, as pydantic writes a model holding itself) is guided by its
  // grammar: the same strings, three levels down.
  const char* kTree = R"({"$defs": {"Node": {"type": "object", "properties": {
      "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["name", "children"]}}, "$ref": "#/$defs/Node"})";
  GuidePtr tree;
  const double tree_ms = compile_ms(kTree, &tree);
  if (!tree) {
    std::fprintf(stderr, "the tree schema did not compile\n");
    return 1;
  }
  run("json_schema, recursive: in a string", base,
      [&] { return GuidePtr(*ts::scheduler::CompileJsonSchema(kTree)); },
      "{\"name\": \"a\", \"children\": [{\"name\": \"b\", \"children\": [{\"name\": \"x");
  std::printf("json_schema (a tree, recursive): its grammar compiled in %.2f ms (median)\n",
              tree_ms);
  // GBNF grammars: JSON (recursive, as llama.cpp's json.gbnf), where few and where most of the
  // vocabulary may come; the parse is rebuilt from the output's bytes at every Allowed, so a
  // long output costs its length (2 KiB of JSON before the string).
  const char* kJsonGbnf = R"g(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}" ws
array ::= "[" ws (value ("," ws value)*)? "]" ws
string ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)g";
  auto gbnf = [&] { return GuidePtr(*ts::scheduler::GrammarGuide::Compile(kJsonGbnf)); };
  if (!ts::scheduler::GrammarGuide::Compile(kJsonGbnf).ok()) {
    std::fprintf(stderr, "the JSON grammar did not compile\n");
    return 1;
  }
  run("guided_grammar JSON: after {\"a\":", base, gbnf, "{\"a\":");
  run("guided_grammar JSON: inside a string", base, gbnf, "{\"a\": \"x");
  std::string long_json = "{\"a\": [";
  while (long_json.size() < 2048) long_json += "{\"k\": [1, 2.5, true], \"s\": \"text\"}, ";
  long_json += "\"x";
  run("guided_grammar JSON: in a string after 2 KiB", base, gbnf, long_json);
  return 0;
}
