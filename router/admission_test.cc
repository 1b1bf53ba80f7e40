#include "router/admission.h"

#include <utility>

#include "gtest/gtest.h"

namespace estuary::router {
namespace {

// Streams bound every call; the queue bounds the calls before their first token; a ticket gives
// its queue place back at LeaveQueue (once) and its stream at its end, moved or not.
TEST(AdmissionTest, BothCapsRefuseNamingTheirFlagAndTicketsGiveTheirPlacesBack) {
  Admission admission(/*max_streams=*/3, /*max_queued=*/2);
  absl::StatusOr<Admission::Ticket> a = admission.Admit();
  absl::StatusOr<Admission::Ticket> b = admission.Admit();
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<Admission::Ticket> c = admission.Admit();
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-queued-requests"), absl::string_view::npos);
  EXPECT_TRUE(a->LeaveQueue());
  EXPECT_FALSE(a->LeaveQueue());
  EXPECT_EQ(admission.queued(), 1);
  c = admission.Admit();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(admission.streams(), 3);
  ASSERT_TRUE(b->LeaveQueue() && c->LeaveQueue());
  const absl::StatusOr<Admission::Ticket> d = admission.Admit();
  ASSERT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(d.status().message().find("--max-concurrent-streams"), absl::string_view::npos);
  EXPECT_EQ(admission.queued(), 0);
  {
    Admission::Ticket moved = std::move(*a);
  }
  EXPECT_EQ(admission.streams(), 2);
  *b = Admission::Ticket();
  EXPECT_EQ(admission.streams(), 1);
}

}  // namespace
}  // namespace estuary::router
