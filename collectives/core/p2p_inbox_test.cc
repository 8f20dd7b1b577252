// P2pInbox: the matching rule both point-to-point transports use. A frame
// goes into the posted Recv only with its tag and size and nothing of that
// tag queued ahead of it; queued messages come out oldest first, per tag.
#include "collectives/core/p2p_inbox.h"

#include <string>
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

// Look: abort first, then a queued message, then a closed peer, then the
// deadline; otherwise wait on.
TEST(P2pInboxTest, LookTakesQueuedBeforeClosedAndDeadline) {
  P2pInbox inbox;
  P2pMessage m;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(inbox.Look(1, absl::OkStatus(), start, start + absl::Hours(1), "recv", "", &m));
  std::optional<absl::Status> r =
      inbox.Look(1, absl::OkStatus(), start, start - absl::Seconds(1), "recv x", "(none)", &m);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(absl::IsDeadlineExceeded(*r));
  EXPECT_NE(r->message().find("recv x timed out after"), std::string::npos) << *r;
  EXPECT_NE(r->message().find("(none)"), std::string::npos) << *r;
  inbox.closed = absl::UnavailableError("peer gone");
  inbox.queues[1].push_back(Msg(3, 7));
  r = inbox.Look(1, absl::OkStatus(), start, start - absl::Seconds(1), "recv", "", &m);
  ASSERT_TRUE(r.has_value() && r->ok());
  EXPECT_EQ(m.size, 3u);
  r = inbox.Look(1, absl::OkStatus(), start, start + absl::Hours(1), "recv y", "", &m);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*r));
  EXPECT_EQ(r->message(), "recv y: peer gone");
  inbox.queues[1].push_back(Msg(1, 1));
  r = inbox.Look(1, absl::CancelledError("aborted"), start, start + absl::Hours(1), "recv", "", &m);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(absl::IsCancelled(*r));
}

}  // namespace
}  // namespace tpudist::collectives
