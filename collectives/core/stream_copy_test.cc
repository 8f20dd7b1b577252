#include "collectives/core/stream_copy.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

// Every head / body / tail split: sizes around the 16- and 64-byte steps at
// every destination and source misalignment; bytes outside stay untouched.
TEST(StreamCopyTest, CopiesLikeMemcpyAtEveryAlignment) {
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4096}) {
    for (size_t doff = 0; doff < 20; ++doff) {
      for (size_t soff : {0, 1, 8, 17}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        StreamCopy(dst.data() + doff, src.data() + soff, bytes);
        ASSERT_EQ(std::memcmp(dst.data() + doff, src.data() + soff, bytes), 0)
            << bytes << " bytes, dst +" << doff << ", src +" << soff;
        for (size_t k = 0; k < doff; ++k) ASSERT_EQ(dst[k], 0xee) << "before, " << bytes;
        for (size_t k = doff + bytes; k < dst.size(); ++k) ASSERT_EQ(dst[k], 0xee) << "after";
      }
    }
  }
}

TEST(StreamCopyTest, OnlyLargeMessagesStream) {
  EXPECT_FALSE(UseStreamCopy(8));
  EXPECT_FALSE(UseStreamCopy(kStreamCopyMinBytes - 1));
  EXPECT_TRUE(UseStreamCopy(kStreamCopyMinBytes));
  EXPECT_TRUE(UseStreamCopy(int64_t{16} << 20));
}

}  // namespace
}  // namespace tpudist::collectives
