// Where the job token comes from (transport.token_file or TROUPE_JOB_TOKEN)
// and which tokens are refused as too weak.
#include "transport/node_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/check.h"
#include "tests/common/temp_dir.h"

namespace troupe::transport {
namespace {

using troupe::testing::TempDir;

TEST(JobToken, WeakTokensAreNamedAndStrongOnesPass) {
  EXPECT_EQ(tokenWeakness(""), "it is empty");
  EXPECT_EQ(tokenWeakness(std::string(31, 'a').replace(0, 10, "0123456789")),
            "31 characters of hex digits hold at most 124 bits; at least 128 are needed");
  EXPECT_EQ(tokenWeakness("0123456789abcdef0123456789abcdef"), "");  // 32 hex digits: 128 bits
  EXPECT_EQ(tokenWeakness("0123456789ABCDEF0123456789abcdef"), "");
  EXPECT_EQ(tokenWeakness("Zq3xY7bN2mK9pL4wR8tV1s"), "");       // 22 of 62: 131 bits
  EXPECT_EQ(tokenWeakness("Zq3xY7bN2mK9pL4wR8tV1"),
            "21 characters of digits, lower-case letters, upper-case letters hold at most 125 bits; at least 128 are "
            "needed");
  EXPECT_EQ(tokenWeakness("cluster-test-token-0123456789abcdef"), "");  // 35 of 68: 213 bits
  EXPECT_EQ(tokenWeakness("aB3$eF6&iJ9*mN2@qR5!"), "");         // 20 of all 94: 131 bits
  EXPECT_EQ(tokenWeakness("!@#$%^&*()!@#$%^&*()"),
            "20 characters of symbols hold at most 100 bits; at least 128 are needed");
  EXPECT_EQ(tokenWeakness("correcthorsebatterystaple"),
            "25 characters of lower-case letters hold at most 118 bits; at least 128 are needed");
  EXPECT_EQ(tokenWeakness("12345678901234567890123456789012345678"),  // digits are not hex
            "38 characters of digits hold at most 126 bits; at least 128 are needed");
  EXPECT_EQ(tokenWeakness(std::string(64, '0')), "it has only 1 distinct characters");
  EXPECT_EQ(tokenWeakness("abababababababababababababababab"), "it has only 2 distinct characters");
  EXPECT_EQ(tokenWeakness("0123456789abcdef 0123456789abcdef"),
            "it holds a character that is not printable ASCII (or a space)");
  // Every token troupe makes passes.
  for (int i = 0; i < 100; ++i) {
    const std::string t = newJobToken();
    EXPECT_EQ(t.size(), 64u);
    EXPECT_EQ(tokenWeakness(t), "") << t;
  }
}

std::string errorOf(const Config& config) {
  try {
    jobToken(config);
  } catch (const SetupError& e) {
    return e.what();
  }
  return "";
}

TEST(JobToken, TheFileMustBeThisUsersAndPrivate) {
  TempDir dir;
  const std::string strong = "0123456789abcdef0123456789abcdef";
  const std::string path = dir.file("token");
  std::ofstream(path) << strong << "\n\n";
  Config config(troupeConfigSchema());
  config.set("transport.token_file=" + path);
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_EQ(errorOf(config), "transport.token_file '" + path + "': mode 0644: others may read or write it; chmod 600 " +
                                 path);
  ASSERT_EQ(::chmod(path.c_str(), 0620), 0);
  EXPECT_EQ(errorOf(config), "transport.token_file '" + path + "': mode 0620: others may read or write it; chmod 600 " +
                                 path);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(jobToken(config), strong);  // trailing white space is not the token's
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_EQ(jobToken(config), strong);
  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    EXPECT_EQ(errorOf(config),
              "transport.token_file '" + path + "': owned by uid 65534, not by this user (uid 0)");
  }
  // A weak token in a private file.
  const std::string weak = dir.file("weak");
  std::ofstream(weak) << "password123";
  ASSERT_EQ(::chmod(weak.c_str(), 0600), 0);
  config.set("transport.token_file=" + weak);
  EXPECT_EQ(errorOf(config), "transport.token_file '" + weak +
                                 "' is too weak to guard the job: 11 characters of digits, lower-case letters hold at "
                                 "most 57 bits; at least 128 are needed; make one with `troupe token --out FILE` (or `troupe "
                                 "token`)");
  // Not a file, no file, a file too large to be a token.
  config.set("transport.token_file=" + dir.path());
  EXPECT_EQ(errorOf(config), "transport.token_file '" + dir.path() + "': not a regular file");
  config.set("transport.token_file=" + dir.file("missing"));
  EXPECT_EQ(errorOf(config), "transport.token_file '" + dir.file("missing") + "': No such file or directory");
  const std::string big = dir.file("big");
  std::ofstream(big) << std::string(5000, 'a');
  ASSERT_EQ(::chmod(big.c_str(), 0600), 0);
  config.set("transport.token_file=" + big);
  EXPECT_EQ(errorOf(config), "transport.token_file '" + big +
                                 "': 5000 bytes: a token file holds one token (at most 4096 bytes)");
}

TEST(JobToken, WithoutAFileTheVariableIsUsedAndChecked) {
  Config config(troupeConfigSchema());
  const char* saved = std::getenv(kJobTokenVariable);
  const std::string keep = saved ? saved : "";
  ::unsetenv(kJobTokenVariable);
  EXPECT_EQ(errorOf(config),
            "TROUPE_JOB_TOKEN must hold the job's secret token (or set transport.token_file); make one with `troupe "
            "token --out FILE` (or `troupe token`)");
  ::setenv(kJobTokenVariable, "short-token-1234", 1);
  EXPECT_EQ(errorOf(config),
            "TROUPE_JOB_TOKEN is too weak to guard the job: 16 characters of digits, lower-case letters, symbols hold "
            "at most 97 bits; at least 128 are needed; make one with `troupe token --out FILE` (or `troupe token`)");
  ::setenv(kJobTokenVariable, "0123456789abcdef0123456789abcdef", 1);
  EXPECT_EQ(jobToken(config), "0123456789abcdef0123456789abcdef");
  if (saved) {
    ::setenv(kJobTokenVariable, keep.c_str(), 1);
  } else {
    ::unsetenv(kJobTokenVariable);
  }
}

}  // namespace
}  // namespace troupe::transport
