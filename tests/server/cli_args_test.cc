// The subcommands' flag parser: values, unknown flags, and integers held to a range.
#include "server/cli_args.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace thetaserve::server {
namespace {

CliArgs ParseOrDie(const std::vector<std::string>& args) {
  auto parsed = CliArgs::Parse(args, {{"n", true}, {"rate", true}, {"verbose", false}});
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

TEST(CliArgsTest, TakesBothSpellingsAndBooleanFlags) {
  CliArgs a = ParseOrDie({"--n", "7", "--rate=0.5", "--verbose"});
  EXPECT_EQ(*a.GetInt("n", 0), 7);
  EXPECT_EQ(*a.GetDouble("rate", 0), 0.5);
  EXPECT_TRUE(a.Has("verbose"));
  EXPECT_EQ(*a.GetInt("missing", 42), 42);
}

TEST(CliArgsTest, UnknownFlagsAndStrayValuesAreErrors) {
  auto unknown = CliArgs::Parse({"--nope", "1"}, {{"n", true}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("nope"), std::string::npos) << unknown.status();
  // A boolean flag takes no value: "--verbose 3" leaves "3" unexpected.
  auto stray = CliArgs::Parse({"--verbose", "3"}, {{"verbose", false}});
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.status().message().find("'3'"), std::string::npos) << stray.status();
}

TEST(CliArgsTest, RangedIntegersNameTheirRange) {
  CliArgs a = ParseOrDie({"--n", "70000"});
  auto out = a.GetInt("n", 1, 1, 65535);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "--n must be in [1, 65535], got 70000");
  EXPECT_EQ(*a.GetInt("n", 1, 1, 70000), 70000) << "the bounds are inclusive";
  EXPECT_EQ(*a.GetInt("n", 1, 70000, 80000), 70000);

  // Values past int32 are refused, not wrapped, where the range says so.
  CliArgs big = ParseOrDie({"--n", "5000000000"});
  auto wrapped = big.GetInt("n", 0, 0, std::numeric_limits<int32_t>::max());
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().message(), "--n must be in [0, 2147483647], got 5000000000");

  // An absent flag gives the default, which is held to the range too (a wrong default shows
  // at once rather than reaching the code the range protects).
  EXPECT_EQ(*ParseOrDie({}).GetInt("n", 4, 1, 8), 4);
  EXPECT_FALSE(ParseOrDie({}).GetInt("n", 16, 1, 8).ok());

  // Not an integer: the parse error, not a range error.
  auto text = ParseOrDie({"--n", "ten"}).GetInt("n", 0, 0, 10);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "--n wants an integer, got 'ten'");
}

// A seed is the API's uint64: all of it is taken (values past 2^63 − 1 were refused), and a
// negative one is refused (--seed -5 read as no seed, silently).
TEST(CliArgsTest, Uint64FlagsTakeTheWholeRangeAndRefuseNegatives) {
  EXPECT_EQ(*ParseOrDie({}).GetUint64("n"), std::nullopt);
  EXPECT_EQ(*ParseOrDie({"--n", "0"}).GetUint64("n"), 0u);
  EXPECT_EQ(*ParseOrDie({"--n", "18446744073709551615"}).GetUint64("n"),
            std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"-5", "-0", "18446744073709551616", "seven", ""}) {
    auto out = ParseOrDie({"--n", bad}).GetUint64("n");
    ASSERT_FALSE(out.ok()) << bad;
    EXPECT_EQ(out.status().message(),
              absl::StrCat("--n must be an integer in [0, 18446744073709551615], got '", bad, "'"));
  }
}

TEST(CliArgsTest, RangedNumbersRefuseNaNAndNameTheValueAsGiven) {
  CliArgs a = ParseOrDie({"--rate", "nan"});
  auto nan = a.GetDouble("rate", 1, 0, 60);
  ASSERT_FALSE(nan.ok()) << "NaN compares false with both bounds, and was let through";
  EXPECT_EQ(nan.status().message(), "--rate must be in [0, 60], got nan");
  auto negative = ParseOrDie({"--rate", "-5"}).GetDouble("rate", 1, 0, 60);
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().message(), "--rate must be in [0, 60], got -5");
  EXPECT_FALSE(ParseOrDie({"--rate", "inf"}).GetDouble("rate", 1, 0, 60).ok());
  EXPECT_EQ(*ParseOrDie({"--rate", "2.5"}).GetDouble("rate", 1, 0, 60), 2.5);
  EXPECT_EQ(*ParseOrDie({}).GetDouble("rate", 1, 0, 60), 1);
}

// --ignore-eos=false was taken as the switch given: Has() saw the name, whatever the value.
TEST(CliArgsTest, SwitchesTakeTrueOrFalseInline) {
  EXPECT_TRUE(ParseOrDie({"--verbose=true"}).Has("verbose"));
  EXPECT_FALSE(ParseOrDie({"--verbose=false"}).Has("verbose"));
  EXPECT_FALSE(ParseOrDie({"--verbose", "--verbose=false"}).Has("verbose")) << "the last wins";
  auto maybe = CliArgs::Parse({"--verbose=maybe"}, {{"verbose", false}});
  ASSERT_FALSE(maybe.ok());
  EXPECT_EQ(maybe.status().message(),
            "flag --verbose is a switch: --verbose or --verbose=true|false, not 'maybe'");
}

// gRPC took "host:99999" as port 34463 (the value modulo 2^16) and called whatever was there,
// and "host" as port 443.
TEST(CliArgsTest, AddressesNeedAPortInRange) {
  for (const char* ok : {"localhost:50051", "10.0.0.1:1", "[::1]:65535", "dns:///svc:50051",
                         "unix:/tmp/thetaserve.sock", "ipv4:127.0.0.1:80"}) {
    EXPECT_TRUE(CheckAddressFlag(ok).ok()) << ok;
  }
  for (const char* bad : {"localhost:99999", "localhost:0", "localhost:", "localhost:5x",
                          "[::1]:70000", "[::1]:", "host:-1", "", "localhost", "[::1]"}) {
    const absl::Status st = CheckAddressFlag(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.message(), absl::StrCat("--addr '", bad,
                                         "' is not HOST:PORT with a port in [1, 65535]"));
  }
}

}  // namespace
}  // namespace thetaserve::server
