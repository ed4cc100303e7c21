// Helpers shared by the tests: where data lives, and element-wise float comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"

namespace thetaserve::testing {

// The repository root (tests run from there, but the path is absolute for clarity).
std::string SourceDir();
// tests/data/<relative>
std::string TestDataPath(const std::string& relative);
// models/SmolLM2-135M-Instruct.Q4_1.gguf; the test fails (does not skip) when it is missing,
// with a message to run scripts/fetch-model.sh. Outside a test (a suite's SetUpTestSuite) the
// message goes to stderr only: see LoadSuiteModel.
std::string DefaultModelPath();
// The default model for a suite's SetUpTestSuite, where nothing may fail: gtest skips every test
// of a suite whose SetUpTestSuite failed, and ctest counts those skips as passes (a missing
// model made ~110 tests pass). Null when it cannot be loaded, with the reason in *error, for
// each test's SetUp to fail on: ASSERT_NE(model, nullptr) << error.
model::Model* LoadSuiteModel(std::string* error);
std::string ReadFileOrDie(const std::string& path);

// A fresh directory <gtest's TempDir>/<prefix>.XXXXXX, removed with all it holds when the object
// goes, so that test runs leave nothing in /tmp and two runs on one machine never share a file.
// When the running test (or, for an object that outlives its tests, the suite) has failed the
// directory stays, and its path is printed.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix);
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  bool owned_ = false;  // made here (else mkdtemp failed: the test failed and path_ is TempDir)
};

// |a-b| <= atol + rtol*|b| on every element; NaN never passes. Reports the worst element.
::testing::AssertionResult AllClose(const float* a, const float* b, size_t n, float atol,
                                    float rtol);
inline ::testing::AssertionResult AllClose(const std::vector<float>& a,
                                           const std::vector<float>& b, float atol,
                                           float rtol) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << "size mismatch: " << a.size() << " vs " << b.size();
  }
  return AllClose(a.data(), b.data(), a.size(), atol, rtol);
}

}  // namespace thetaserve::testing
