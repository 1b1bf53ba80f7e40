#include "estuary/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

// The public API's names are a contract (issue: clients written from the text must work).
TEST(InferenceProtoTest, GenerateRequestRoundTripsWithItsOneofs) {
  v1::GenerateRequest request;
  request.set_request_id("r1");
  request.mutable_tokens()->add_ids(7);
  request.mutable_sampling()->set_max_tokens(16);
  request.mutable_sampling()->add_stop("\n\n");
  request.mutable_exit()->set_threshold(0.9f);
  std::string wire;
  ASSERT_TRUE(request.SerializeToString(&wire));
  v1::GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.input_case(), v1::GenerateRequest::kTokens);
  EXPECT_EQ(parsed.tokens().ids(0), 7);
  EXPECT_EQ(parsed.sampling().stop(0), "\n\n");
  parsed.set_text("hello");
  EXPECT_EQ(parsed.input_case(), v1::GenerateRequest::kText);

  v1::GenerateResponse response;
  response.mutable_complete()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(response.kind_case(), v1::GenerateResponse::kComplete);
  EXPECT_STREQ(v1::Inference::service_full_name(), "estuary.v1.Inference");
}

}  // namespace
}  // namespace estuary
