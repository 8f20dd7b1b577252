// P2pInbox: the matching rule both point-to-point transports use. A frame
// goes into the posted Recv only with its tag and size and nothing of that
// tag queued ahead of it; queued messages come out oldest first, per tag.
#include "collectives/core/p2p_inbox.h"

#include <vector>

#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

P2pMessage Msg(uint64_t size, uint8_t fill) {
  P2pMessage m;
  m.size = size;
  m.bytes.reset(new uint8_t[size]);
  for (uint64_t i = 0; i < size; ++i) m.bytes[i] = fill;
  return m;
}

TEST(P2pInboxTest, PostedRecvIsClaimedOnlyByItsTagAndSizeWithNothingQueuedAhead) {
  P2pInbox inbox;
  std::vector<uint8_t> buf(8);
  P2pPosted posted;
  posted.tag = 3;
  posted.data = absl::MakeSpan(buf);
  EXPECT_EQ(inbox.ClaimPosted(3, 8), nullptr);  // nothing posted
  inbox.posted = &posted;
  EXPECT_EQ(inbox.ClaimPosted(4, 8), nullptr);  // other tag
  EXPECT_EQ(inbox.ClaimPosted(3, 7), nullptr);  // other size
  inbox.queues[3].push_back(Msg(8, 1));         // a message of its tag arrived first
  EXPECT_EQ(inbox.ClaimPosted(3, 8), nullptr);  // ... so the next one queues behind it
  EXPECT_EQ(posted.state, P2pPosted::kWaiting);
  inbox.queues[5].push_back(Msg(2, 9));         // other tags do not matter
  ASSERT_TRUE(inbox.TakeQueued(3).has_value());
  EXPECT_EQ(inbox.ClaimPosted(3, 8), &posted);
  EXPECT_EQ(posted.state, P2pPosted::kFilling);
  EXPECT_EQ(inbox.ClaimPosted(3, 8), nullptr);  // claimed once
}

TEST(P2pInboxTest, TakeQueuedIsOldestFirstPerTag) {
  P2pInbox inbox;
  EXPECT_FALSE(inbox.TakeQueued(1).has_value());
  inbox.queues[1].push_back(Msg(1, 10));
  inbox.queues[2].push_back(Msg(1, 20));
  inbox.queues[1].push_back(Msg(0, 0));
  std::optional<P2pMessage> a = inbox.TakeQueued(1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->bytes[0], 10);
  std::optional<P2pMessage> b = inbox.TakeQueued(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->size, 0u);
  EXPECT_FALSE(inbox.TakeQueued(1).has_value());
  EXPECT_EQ(inbox.TakeQueued(2)->bytes[0], 20);
}

}  // namespace
}  // namespace tpudist::collectives
