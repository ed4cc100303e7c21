// Invariant checks that abort with file, line and a message. For broken invariants only:
// anything a user or a file can cause returns an absl::Status instead. (Abseil 20220623, the
// Debian version, predates absl/log, so the project carries this small header.)
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace thetaserve::base {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr) {
    stream_ << file << ":" << line << ": check failed: " << expr << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::string s = stream_.str();
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << "more"` compile to a void expression.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace thetaserve::base

#define CHECK(cond)                                            \
  (cond) ? (void)0                                             \
         : ::thetaserve::base::Voidify() &                     \
               ::thetaserve::base::CheckFailure(__FILE__, __LINE__, #cond).stream()
#define TS_CHECK_OP(a, b, op) CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_EQ(a, b) TS_CHECK_OP(a, b, ==)
#define CHECK_NE(a, b) TS_CHECK_OP(a, b, !=)
#define CHECK_LE(a, b) TS_CHECK_OP(a, b, <=)
#define CHECK_LT(a, b) TS_CHECK_OP(a, b, <)
#define CHECK_GE(a, b) TS_CHECK_OP(a, b, >=)
#define CHECK_GT(a, b) TS_CHECK_OP(a, b, >)
