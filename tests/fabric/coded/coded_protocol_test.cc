// The coded service's message records: what a worker or master accepts from its peer, and the
// clear errors for what it must not (short records, shape/length mismatches, bad parameters).
#include <gtest/gtest.h>

#include <vector>

#include "fabric/coded/coded_protocol.h"

namespace cofab::coded {
namespace {

TEST(CodedProtocol, LoadRoundTripsAndChecksTheBlockLength) {
  const std::vector<float> block = {1, 2, 3, 4, 5, 6};
  LoadRecord rec{.rows = 2, .cols = 3, .tasks = 4, .rowBlock = 1, .load = 0.5, .shiftMs = 1};
  std::vector<uint8_t> p = packRecord(rec, block);
  const float* data = nullptr;
  auto r = parseLoad(p, &data);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rows, 2);
  EXPECT_EQ(r->tasks, 4);
  EXPECT_EQ(data[5], 6.0f);
  p.pop_back();
  auto bad = parseLoad(p, &data);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("2x3 f32 needs 24 data bytes"), std::string::npos)
      << bad.status();
}

TEST(CodedProtocol, RejectsShortRecordsAndBadParameters) {
  const float* data = nullptr;
  std::vector<uint8_t> tiny(3);
  EXPECT_EQ(parseCompute(tiny, &data).status().code(), StatusCode::kInvalidArgument);
  LoadRecord rec{.rows = 1, .cols = 1, .tasks = 1, .rowBlock = 1, .load = 2.0};  // load > 1
  const std::vector<float> one = {1};
  EXPECT_EQ(parseLoad(packRecord(rec, one), &data).status().code(), StatusCode::kInvalidArgument);
  ComputeRecord neg{-1, 4};
  EXPECT_NE(parseCompute(packRecord(neg), &data).status().message().find("bad shape -1x4"),
            std::string::npos);
  CancelRecord over{2, 5, 4};  // more row blocks done than exist
  EXPECT_FALSE(parseCancel(packRecord(over)).ok());
  CancelRecord fine{2, 3, 4};
  auto ok = parseCancel(packRecord(fine));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(static_cast<CancelStage>(ok->stage), CancelStage::kComputing);
}

}  // namespace
}  // namespace cofab::coded
