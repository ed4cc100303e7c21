#include "tests/test_util.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace thetaserve::testing {

// THETASERVE_SOURCE_DIR in the environment wins: test binaries carried to another machine
// (scripts/gpu-check.sh --prebuilt) find the checkout there.
std::string SourceDir() {
  if (const char* dir = std::getenv("THETASERVE_SOURCE_DIR"); dir && *dir) return dir;
  return THETASERVE_SOURCE_DIR;
}

std::string TestDataPath(const std::string& relative) {
  return SourceDir() + "/tests/data/" + relative;
}

std::string DefaultModelPath() {
  std::string path = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr) {
      ADD_FAILURE() << "missing " << path << ": run scripts/fetch-model.sh first";
    } else {
      std::fprintf(stderr, "missing %s: run scripts/fetch-model.sh first\n", path.c_str());
    }
  }
  return path;
}

model::Model* LoadSuiteModel(std::string* error) {
  auto m = model::Model::Load(DefaultModelPath());
  if (!m.ok()) {
    *error = absl::StrCat("the suite's model did not load: ", m.status().ToString(),
                          " (run scripts/fetch-model.sh first)");
    return nullptr;
  }
  return std::move(*m).release();
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ScopedTempDir::ScopedTempDir(const std::string& prefix) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() == '/') base.pop_back();
  std::string tmpl = base + "/" + prefix + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << tmpl << ": " << std::strerror(errno);
    path_ = base;  // the test still writes somewhere harmless; nothing is removed
    return;
  }
  path_ = buf.data();
  owned_ = true;
}

ScopedTempDir::~ScopedTempDir() {
  if (!owned_) return;
  // A suite-wide object (a server shared by a suite) goes after the suite's last test: keep it
  // when any test of the suite failed.
  const auto* unit = ::testing::UnitTest::GetInstance();
  const bool failed = ::testing::Test::HasFailure() ||
                      (unit->current_test_info() == nullptr && unit->current_test_suite() &&
                       unit->current_test_suite()->Failed());
  if (failed) {
    std::fprintf(stderr, "kept %s (a test failed)\n", path_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) std::fprintf(stderr, "cannot remove %s: %s\n", path_.c_str(), ec.message().c_str());
}

::testing::AssertionResult AllClose(const float* a, const float* b, size_t n, float atol,
                                    float rtol) {
  size_t bad = 0;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < n; ++i) {
    double diff = std::fabs(double(a[i]) - double(b[i]));
    double allowed = atol + rtol * std::fabs(double(b[i]));
    bool ok = diff <= allowed;  // false for NaN
    if (!ok) {
      ++bad;
      double excess = std::isnan(diff) ? 1e300 : diff - allowed;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements differ beyond atol=" << atol << " rtol=" << rtol
         << "; worst at [" << worst << "]: " << a[worst] << " vs " << b[worst];
}

}  // namespace thetaserve::testing
