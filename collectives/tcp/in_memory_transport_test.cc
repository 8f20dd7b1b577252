#include "collectives/tcp/in_memory_transport.h"

#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

TEST(InMemoryTransportTest, DeliversInOrderAndChecksSizes) {
  InMemoryHub hub(2);
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  std::vector<uint8_t> a = {1, 2, 3}, b = {4};
  ASSERT_TRUE(hub.transport(0).Send(1, a, deadline).ok());
  ASSERT_TRUE(hub.transport(0).Send(1, b, deadline).ok());
  std::vector<uint8_t> got(3);
  ASSERT_TRUE(hub.transport(1).Recv(0, absl::MakeSpan(got), deadline).ok());
  EXPECT_EQ(got, a);
  std::vector<uint8_t> wrong(2);
  absl::Status s = hub.transport(1).Recv(0, absl::MakeSpan(wrong), deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Poisoned afterwards.
  EXPECT_EQ(hub.transport(1).Recv(0, absl::MakeSpan(got), deadline).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(InMemoryTransportTest, RecvTimesOutAndRejectsSelf) {
  InMemoryHub hub(2);
  std::vector<uint8_t> buf(1);
  absl::Time start = absl::Now();
  absl::Status s = hub.transport(0).Recv(1, absl::MakeSpan(buf), start + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  EXPECT_EQ(hub.transport(1).Send(1, buf, absl::Now()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpudist::collectives::tcp
