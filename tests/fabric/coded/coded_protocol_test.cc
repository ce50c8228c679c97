// The coded service's message records: what a worker or master accepts from its peer, and the
// clear errors for what it must not (short records, shape/length mismatches, bad parameters,
// delays that are NaN or infinite, on the worker's side of the wire and in the master's options).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fabric/coded/coded_master.h"
#include "fabric/coded/coded_protocol.h"
#include "fabric/rendezvous/hash_store.h"

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

TEST(CodedProtocol, MatrixMessagesMustFitTheShapeBoundsAndThePayloadLimit) {
  const uint64_t limit = wire::kDefaultMaxPayload;
  // 2^14 x 2^14 f32 is exactly 1 GiB: fits without a record, not with one.
  EXPECT_TRUE(checkMatrixMessage("result", 1 << 14, 1 << 14, 0).ok());
  Status over = checkMatrixMessage("B", 1 << 14, 1 << 14, sizeof(ComputeRecord));
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("B: 16384x16384 f32 is a " + std::to_string(limit + 16) +
                                "-byte message, over the transports' limit of " +
                                std::to_string(limit)),
            std::string::npos)
      << over;
  // Sides past 2^24 are refused before any product (2^24 x 2^24 x 4 would not overflow; the
  // bound keeps that true for what peers send).
  EXPECT_EQ(checkMatrixMessage("A block", (int64_t{1} << 24) + 1, 1, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(checkMatrixMessage("A block", 1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(checkMatrixMessage("result", int64_t{1} << 24, int64_t{1} << 24, 0).code(),
            StatusCode::kInvalidArgument);
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

// Delays a worker would duration_cast: NaN passed `ms < 0` before, +inf is out of every
// duration's range. Each must be refused, as a negative one is.
std::vector<double> badDelays() {
  return {std::nan(""), std::numeric_limits<double>::infinity(), -1.0};
}

TEST(CodedProtocol, LoadRefusesNanAndInfiniteDelays) {
  const std::vector<float> one = {1};
  const float* data = nullptr;
  for (double bad : badDelays()) {
    LoadRecord rec{.rows = 1, .cols = 1, .tasks = 1, .rowBlock = 1, .load = 1.0};
    rec.rowBlockDelayMs = bad;
    auto r = parseLoad(packRecord(rec, one), &data);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "rowBlockDelayMs " << bad;
    rec.rowBlockDelayMs = 0;
    rec.shiftMs = bad;
    r = parseLoad(packRecord(rec, one), &data);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "shiftMs " << bad;
    rec.shiftMs = 0;
    rec.tailMeanMs = bad;
    r = parseLoad(packRecord(rec, one), &data);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "tailMeanMs " << bad;
  }
  LoadRecord fine{.rows = 1, .cols = 1, .tasks = 1, .rowBlock = 1, .load = 1.0};
  fine.rowBlockDelayMs = 2.5;
  auto ok = parseLoad(packRecord(fine, one), &data);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// Refused by create() before it gathers any worker (setupTimeout bounds the wait had it not).
TEST(CodedMasterOptions, NanAndInfiniteDelaysAreInvalidArguments) {
  HashStore store;
  for (double bad : badDelays()) {
    CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 3, .k = 2};
    o.name = "coded-bad-delay";
    o.setupTimeout = Millis(200);
    o.rowBlockDelayMs[1] = bad;
    auto m = CodedMaster::create(&store, o);
    ASSERT_FALSE(m.ok()) << "rowBlockDelayMs " << bad << " was accepted";
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
    EXPECT_NE(m.status().message().find("rowBlockDelayMs"), std::string::npos) << m.status();
    o.rowBlockDelayMs.clear();
    o.shiftMs = bad;
    auto shifted = CodedMaster::create(&store, o);
    ASSERT_FALSE(shifted.ok()) << "shiftMs " << bad << " was accepted";
    EXPECT_EQ(shifted.status().code(), StatusCode::kInvalidArgument) << shifted.status();
  }
}

}  // namespace
}  // namespace cofab::coded
