// What a dpdk receiver spends on checksums per full Data frame (docs/DPDK.md, "Frame format"),
// without the ports, pollers and scheduler noise of dpdk_p2p_bench:
//
//   build/bench/dpdk/frame_checksum_bench [--benchmark_min_time=0.2s]
//
// Each case checks a 1440-byte frame payload's frame CRC32C and hands the payload to the
// application (a copy into the posted receive), with the message's end-to-end payload CRC
// (wire kFlagPayloadCrc) off and on. The frame check is parseFrame's: the header's CRC, then
// continued over the payload.
//   BM_FrameCrcThenCopy            frame check, memcpy                          (payload CRC off)
//   BM_FrameCheckFusedCopy         frame check while copying (checkFrameCrcCopy: what the
//                                  receiver does with an in-order frame)        (payload CRC off)
//   BM_PayloadCrcTwoPasses         frame check, payload CRC, memcpy             (before)
//   BM_PayloadCrcFusedCopy         frame check, payload CRC while copying       (crc32cCopy)
//   BM_PayloadCrcJoined            frame check, the payload's CRC derived from it and joined
//                                  into the message's, memcpy                   (payloadCrcOf)
// Ends with RESULT frame_checksum: ns per frame of each and the joined path's saving.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench/support/result_reporter.h"
#include "fabric/transport/dpdk/frame.h"
#include "fabric/wire/crc32c.h"

namespace cofab::bench {
namespace {

constexpr size_t kHeader = 32;     // the cofab frame header (kFrameHeaderSize) the CRC covers
constexpr size_t kPayload = 1440;  // a full Data frame's payload at MTU 1500
constexpr size_t kFrames = 1024;   // a window's worth, so the data is not all in L1

struct Frames {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kFrames * (kHeader + kPayload));
  std::vector<uint8_t> dest = std::vector<uint8_t>(kFrames * kPayload);
  Frames() {
    std::mt19937_64 rng(3);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  }
  const uint8_t* header(size_t i) const { return bytes.data() + i * (kHeader + kPayload); }
  const uint8_t* payload(size_t i) const { return header(i) + kHeader; }
  uint8_t* out(size_t i) { return dest.data() + i * kPayload; }
};

// The receiver's frame check (parseFrame): the header's CRC, continued over the payload.
uint32_t frameCheck(const Frames& f, size_t i, uint32_t* headerCrc) {
  *headerCrc = wire::crc32c(0, f.header(i), kHeader);
  return wire::crc32c(*headerCrc, f.payload(i), kPayload);
}

// Per iteration: one frame's check, then `deliver(f, i, frameCrc, headerCrc, message)`, the
// case's way of handing the payload over and keeping the message's running payload CRC.
template <typename Deliver>
void run(benchmark::State& state, Deliver deliver) {
  Frames f;
  uint32_t message = 0;
  size_t i = 0;
  for (auto _ : state) {
    uint32_t header = 0;
    const uint32_t frame = frameCheck(f, i, &header);
    benchmark::DoNotOptimize(frame);
    deliver(f, i, frame, header, message);
    i = (i + 1) % kFrames;
  }
  benchmark::DoNotOptimize(message);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kPayload));
}

void BM_FrameCrcThenCopy(benchmark::State& state) {
  run(state, [](Frames& f, size_t i, uint32_t, uint32_t, uint32_t&) {
    std::memcpy(f.out(i), f.payload(i), kPayload);
  });
}
BENCHMARK(BM_FrameCrcThenCopy);

void BM_FrameCheckFusedCopy(benchmark::State& state) {
  Frames f;
  size_t i = 0;
  for (auto _ : state) {
    const uint32_t h = wire::crc32c(0, f.header(i), kHeader);
    benchmark::DoNotOptimize(wire::crc32cCopy(h, f.out(i), f.payload(i), kPayload));
    i = (i + 1) % kFrames;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kPayload));
}
BENCHMARK(BM_FrameCheckFusedCopy);

void BM_PayloadCrcTwoPasses(benchmark::State& state) {
  run(state, [](Frames& f, size_t i, uint32_t, uint32_t, uint32_t& message) {
    message = wire::crc32c(message, f.payload(i), kPayload);
    std::memcpy(f.out(i), f.payload(i), kPayload);
  });
}
BENCHMARK(BM_PayloadCrcTwoPasses);

void BM_PayloadCrcFusedCopy(benchmark::State& state) {
  run(state, [](Frames& f, size_t i, uint32_t, uint32_t, uint32_t& message) {
    message = wire::crc32cCopy(message, f.out(i), f.payload(i), kPayload);
  });
}
BENCHMARK(BM_PayloadCrcFusedCopy);

void BM_PayloadCrcJoined(benchmark::State& state) {
  run(state, [](Frames& f, size_t i, uint32_t frame, uint32_t header, uint32_t& message) {
    const uint32_t payload = transport::dpdk::payloadCrcOf(frame, header, kPayload);
    message = wire::crc32cCombine(message, payload, kPayload);
    std::memcpy(f.out(i), f.payload(i), kPayload);
  });
}
BENCHMARK(BM_PayloadCrcJoined);

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  const auto cases = runBenchmarks(&argc, argv);
  auto ns = [&](const char* name) {
    const CaseResult* c = findCase(cases, name);
    return c == nullptr ? 0.0 : c->realTimeNs;
  };
  const double off = ns("BM_FrameCrcThenCopy");
  const double checkCopy = ns("BM_FrameCheckFusedCopy");
  const double two = ns("BM_PayloadCrcTwoPasses");
  const double fused = ns("BM_PayloadCrcFusedCopy");
  const double joined = ns("BM_PayloadCrcJoined");
  printResult("frame_checksum", {{"payload_bytes", std::to_string(kPayload)},
                                 {"crc_off_ns", num(off)},
                                 {"check_while_copying_ns", num(checkCopy)},
                                 {"two_passes_ns", num(two)},
                                 {"fused_copy_ns", num(fused)},
                                 {"joined_ns", num(joined)},
                                 {"joined_vs_two_passes", two > 0 ? num(joined / two) : "nan"},
                                 {"joined_vs_crc_off", off > 0 ? num(joined / off) : "nan"}});
  return 0;
}
