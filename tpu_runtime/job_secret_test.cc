#include "tpu_runtime/job_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string MacHex(const Mac& mac) { return ToHex(mac); }

TEST(HmacTest, MatchesAnIndependentImplementationWithLengthPrefixes) {
  // Oracle: Python's hmac over b''.join(len(p).to_bytes(8,'little') + p).
  EXPECT_EQ(MacHex(HmacSha256("Jefe", {"what do ya want ", "for nothing?"})),
            "7147a8852f1bae7b07dfc583dad589c20583e025440bfc4c6431d8d0d901880b");
  // The length prefixes keep part boundaries: {"ab","c"} != {"a","bc"}.
  EXPECT_NE(HmacSha256("k", {"ab", "c"}), HmacSha256("k", {"a", "bc"}));
  EXPECT_NE(HmacSha256("k1", {"x"}), HmacSha256("k2", {"x"}));
}

TEST(HmacTest, MacEqualComparesContentAndSize) {
  const Mac a = HmacSha256("k", {"x"});
  Mac b = a;
  EXPECT_TRUE(MacEqual(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(MacEqual(a, b));
  EXPECT_FALSE(MacEqual(a, absl::MakeConstSpan(b.data(), 31)));
}

TEST(HmacTest, RandomBytesDiffer) {
  auto a = SecureRandomBytes(32);
  auto b = SecureRandomBytes(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
}

TEST(JobSecretTest, HexOfAtLeast32DigitsIsDecoded) {
  auto s = ParseJobSecret("00112233445566778899AABBCCDDEEFF", "X");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size(), 16u);
  EXPECT_EQ(JobSecretHex(*s), "00112233445566778899aabbccddeeff");
}

TEST(JobSecretTest, OtherTextOfAtLeast16BytesIsUsedRaw) {
  auto s = ParseJobSecret("correct horse battery", "X");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "correct horse battery");
  // Odd number of hex digits: raw, not decoded.
  auto odd = ParseJobSecret("0123456789abcdef0", "X");
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->size(), 17u);
}

TEST(JobSecretTest, ShortOrEmptySecretsAreRefusedWithoutPrintingThem) {
  auto s = ParseJobSecret("hunter2", "TPU_DIST_JOB_SECRET");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("TPU_DIST_JOB_SECRET is 7 bytes"));
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("hunter2")));
  auto e = ParseJobSecret("", "TPU_DIST_JOB_SECRET");
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("set but empty"));
}

TEST(JobSecretTest, FromEnvNoneOneOrBoth) {
  auto none = JobSecretFromEnv({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto one = JobSecretFromEnv({{kJobSecretEnv, std::string(32, 'a')}});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 16u);
  auto both = JobSecretFromEnv({{kJobSecretEnv, std::string(32, 'a')}, {kJobSecretFileEnv, "/x"}});
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(std::string(both.status().message()), HasSubstr("set only one"));
}

TEST(JobSecretTest, FileIsReadTrailingNewlineIgnored) {
  char path[] = "/tmp/job_secret_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = std::string(64, 'b') + "\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  auto s = JobSecretFromEnv({{kJobSecretFileEnv, path}});
  unlink(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(JobSecretHex(*s), std::string(64, 'b'));

  auto missing = JobSecretFromEnv({{kJobSecretFileEnv, "/nonexistent/secret"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("/nonexistent/secret (TPU_DIST_JOB_SECRET_FILE)"));
}

// As ssh refuses a private key others can read: 0644 (what `openssl rand
// -hex 32 > job.key` gives under umask 022) is refused naming the file, its
// mode and the fix; 0600 and 0400 are accepted.
TEST(JobSecretTest, FileReadableByOthersIsRefused) {
  char path[] = "/tmp/job_secret_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = std::string(64, 'c') + "\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  std::map<mode_t, bool> accepted;
  for (mode_t mode : {0600, 0400, 0644, 0640, 0604, 0660}) {
    ASSERT_EQ(chmod(path, mode), 0);
    auto s = JobSecretFromEnv({{kJobSecretFileEnv, path}});
    accepted[mode] = s.ok();
    if (mode == 0644) {
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(std::string(s.status().message()),
                absl::StrCat("permissions 0644 for the file ", path,
                             " (TPU_DIST_JOB_SECRET_FILE) are too open: a job secret file must "
                             "be readable only by its owner; run `chmod 600 ",
                             path, "`"));
    }
  }
  auto flag = ReadJobSecretFile(path, "--job-secret-file");  // still 0660
  unlink(path);
  EXPECT_TRUE(accepted[0600]);
  EXPECT_TRUE(accepted[0400]);
  EXPECT_FALSE(accepted[0644]);
  EXPECT_FALSE(accepted[0640]);
  EXPECT_FALSE(accepted[0604]);
  EXPECT_FALSE(accepted[0660]);
  ASSERT_FALSE(flag.ok());
  EXPECT_THAT(std::string(flag.status().message()), HasSubstr("(--job-secret-file) are too open"));
}

TEST(JobSecretTest, GeneratedSecretsRoundTripThroughHex) {
  auto a = GenerateJobSecret();
  auto b = GenerateJobSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kGeneratedJobSecretBytes);
  EXPECT_NE(*a, *b);
  auto back = ParseJobSecret(JobSecretHex(*a), "X");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *a);
}

}  // namespace
}  // namespace tpudist::tpu_runtime
