// Every collective x dtype x op x size on 1, 2, 3, 4 and 8 ranks run as threads over a HashStore,
// checked against the serial reference (tests/fabric/comm/comm_test_util.h), and every rank's
// result checked bit-identical to rank 0's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/half.h"
#include "core/param.h"
#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/hash_store.h"
#include "tests/fabric/comm/comm_test_util.h"
#include "tests/support/thread_ranks.h"

namespace cofab::comm {
namespace {

using testing::checkReduced;
using testing::getElement;
using testing::inputValue;
using testing::kReduceDTypes;
using testing::kReduceOps;
using testing::makeBuffer;
using testing::setElement;

// 0, 1, odd, and with the chunk size forced to 1 KiB below, sizes that span many chunks per
// block (and blocks of unequal length).
constexpr size_t kSizes[] = {0, 1, 7, 1001, 5003};

struct Group {
  HashStore store;
  std::vector<std::unique_ptr<Communicator>> comms;
};

std::unique_ptr<Group> makeGroup(int n, const std::string& transport = "tcp") {
  auto g = std::make_unique<Group>();
  auto comms = testing::makeComms(n, &g->store, transport);
  EXPECT_TRUE(comms.ok()) << comms.status();
  if (!comms.ok()) return nullptr;
  g->comms = std::move(comms).value();
  return g;
}

class CollectivesByRanks : public ::testing::TestWithParam<int> {
 protected:
  // Small chunks and a small window so that modest sizes exercise pipelining and slot reuse.
  ScopedParamOverride chunk_{"COFAB_RING_CHUNK_BYTES", "1024"};
  ScopedParamOverride window_{"COFAB_RING_WINDOW", "3"};
};

Status runAllreduceCases(Communicator& comm, AllreduceAlgorithm algo) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : kReduceDTypes) {
    for (ReduceOp op : kReduceOps) {
      for (size_t count : kSizes) {
        for (int pattern : {0, 1}) {
          if (pattern == 1 && (dtype == DType::kI32 || dtype == DType::kI64)) continue;
          for (bool inPlace : {false, true}) {
            auto in = makeBuffer(dtype, count);
            auto out = makeBuffer(dtype, count);
            for (size_t i = 0; i < count; ++i) {
              setElement(dtype, in.data(), i, inputValue(pattern, r, i));
            }
            AllreduceOptions o;
            o.op = op;
            o.algorithm = algo;
            o.timeout = Millis(20000);
            TensorView vin(in.data(), count, dtype);
            TensorView vout(inPlace ? in.data() : out.data(), count, dtype);
            const std::string what = std::string(dtypeName(dtype)) + " " +
                                     std::string(reduceOpName(op)) + " count " +
                                     std::to_string(count) + (inPlace ? " in place" : "");
            COFAB_RETURN_IF_ERROR(allreduce(comm, vin, vout, o).withContext(what));
            std::string bad = checkReduced(dtype, op, pattern, n, vout.data, count);
            if (!bad.empty()) return Internal(what + ": " + bad);
            // Bitwise agreement across ranks: allgather everyone's result and compare.
            auto all = makeBuffer(dtype, count * static_cast<size_t>(n));
            COFAB_RETURN_IF_ERROR(allgather(comm, vout, TensorView(all.data(), count * n, dtype)));
            for (int q = 0; q < n; ++q) {
              if (count > 0 && std::memcmp(all.data() + q * vout.bytes(), all.data(),
                                           vout.bytes()) != 0) {
                return Internal(what + ": rank " + std::to_string(q) +
                                "'s result differs from rank 0's");
              }
            }
          }
        }
      }
    }
  }
  return OkStatus();
}

TEST_P(CollectivesByRanks, AllreduceRing) {
  auto g = makeGroup(GetParam());
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(GetParam(), [&](int r) {
    return runAllreduceCases(*g->comms[r], AllreduceAlgorithm::kRing);
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

TEST_P(CollectivesByRanks, AllreduceDirect) {
  auto g = makeGroup(GetParam());
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(GetParam(), [&](int r) {
    return runAllreduceCases(*g->comms[r], AllreduceAlgorithm::kDirect);
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

Status runReduceScatterCases(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : kReduceDTypes) {
    for (ReduceOp op : kReduceOps) {
      for (size_t count : kSizes) {
        for (bool inPlace : {false, true}) {
          const size_t total = count * static_cast<size_t>(n);
          auto in = makeBuffer(dtype, total);
          auto out = makeBuffer(dtype, count);
          for (size_t i = 0; i < total; ++i) setElement(dtype, in.data(), i, inputValue(0, r, i));
          ReduceScatterOptions o;
          o.op = op;
          o.timeout = Millis(20000);
          TensorView vin(in.data(), total, dtype);
          TensorView vout = inPlace ? vin.slice(count * static_cast<size_t>(r), count)
                                    : TensorView(out.data(), count, dtype);
          const std::string what = "reduce_scatter " + std::string(dtypeName(dtype)) + " " +
                                   std::string(reduceOpName(op)) + " count " +
                                   std::to_string(count) + (inPlace ? " in place" : "");
          COFAB_RETURN_IF_ERROR(reduceScatter(comm, vin, vout, o).withContext(what));
          std::string bad = checkReduced(dtype, op, 0, n, vout.data, count,
                                         count * static_cast<size_t>(r));
          if (!bad.empty()) return Internal(what + ": " + bad);
        }
      }
    }
  }
  return OkStatus();
}

TEST_P(CollectivesByRanks, ReduceScatter) {
  auto g = makeGroup(GetParam());
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(
      GetParam(), [&](int r) { return runReduceScatterCases(*g->comms[r]); });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

Status runAllgatherAndBroadcastCases(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : kAllDTypes) {
    // 20000 bytes of output and more crosses COFAB_ALLGATHER_SMALL_BYTES (set below): both
    // algorithms run.
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{30011}}) {
      for (bool inPlace : {false, true}) {
        const size_t total = count * static_cast<size_t>(n);
        auto in = makeBuffer(dtype, count);
        auto out = makeBuffer(dtype, total);
        TensorView vout(out.data(), total, dtype);
        TensorView vin = inPlace ? vout.slice(count * static_cast<size_t>(r), count)
                                 : TensorView(in.data(), count, dtype);
        for (size_t i = 0; i < count; ++i) setElement(dtype, vin.data, i, inputValue(0, r, i));
        const std::string what = "allgather " + std::string(dtypeName(dtype)) + " count " +
                                 std::to_string(count) + (inPlace ? " in place" : "");
        COFAB_RETURN_IF_ERROR(allgather(comm, vin, vout).withContext(what));
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            const double want = testing::roundTo(dtype, inputValue(0, q, i));
            const double got = getElement(dtype, out.data(), q * count + i);
            if (got != want) {
              return Internal(what + ": block " + std::to_string(q) + " element " +
                              std::to_string(i) + " is " + std::to_string(got) + ", expected " +
                              std::to_string(want));
            }
          }
        }
      }
      for (int root = 0; root < n; ++root) {
        auto data = makeBuffer(dtype, count);
        for (size_t i = 0; i < count; ++i) {
          setElement(dtype, data.data(), i, inputValue(0, r == root ? root : 100 + r, i));
        }
        BroadcastOptions o;
        o.root = root;
        const std::string what = "broadcast " + std::string(dtypeName(dtype)) + " count " +
                                 std::to_string(count) + " root " + std::to_string(root);
        COFAB_RETURN_IF_ERROR(broadcast(comm, TensorView(data.data(), count, dtype), o)
                                  .withContext(what));
        for (size_t i = 0; i < count; ++i) {
          const double want = testing::roundTo(dtype, inputValue(0, root, i));
          if (getElement(dtype, data.data(), i) != want) {
            return Internal(what + ": element " + std::to_string(i) + " differs from the root's");
          }
        }
      }
    }
  }
  return OkStatus();
}

TEST_P(CollectivesByRanks, AllgatherAndBroadcast) {
  ScopedParamOverride smallAg("COFAB_ALLGATHER_SMALL_BYTES", "20000");
  ScopedParamOverride smallBc("COFAB_BROADCAST_SMALL_BYTES", "5000");
  auto g = makeGroup(GetParam());
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(
      GetParam(), [&](int r) { return runAllgatherAndBroadcastCases(*g->comms[r]); });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

TEST_P(CollectivesByRanks, BarrierSendRecvAndAsyncHandles) {
  const int n = GetParam();
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    for (int i = 0; i < 3; ++i) COFAB_RETURN_IF_ERROR(barrier(c));
    if (n > 1) {
      // A ring shift, every rank posting its send before its receive.
      for (size_t count : {size_t{0}, size_t{3}, size_t{100000}}) {
        std::vector<int32_t> out(count), in(count);
        for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(r * 1000 + i);
        const int right = (r + 1) % n, left = (r + n - 1) % n;
        TensorView vout(out.data(), count, DType::kI32), vin(in.data(), count, DType::kI32);
        auto hs = sendAsync(c, vout, right);
        auto hr = recvAsync(c, vin, left);
        COFAB_RETURN_IF_ERROR(hs.wait(Deadline::afterMs(20000)));
        COFAB_RETURN_IF_ERROR(hr.wait(Deadline::afterMs(20000)));
        for (size_t i = 0; i < count; ++i) {
          if (in[i] != static_cast<int32_t>(left * 1000 + i)) {
            return Internal("recv from rank " + std::to_string(left) + ": element " +
                            std::to_string(i) + " is " + std::to_string(in[i]));
          }
        }
      }
    }
    // Several asynchronous allreduces in flight; they complete in issue order.
    constexpr int kOps = 4;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(3000));
    std::vector<CollectiveHandle> handles;
    for (int k = 0; k < kOps; ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(r + k + i % 5);
      AllreduceOptions o;
      o.algorithm = k % 2 ? AllreduceAlgorithm::kRing : AllreduceAlgorithm::kDirect;
      handles.push_back(allreduceAsync(c, TensorView(bufs[k].data(), bufs[k].size(), DType::kF32),
                                       TensorView(bufs[k].data(), bufs[k].size(), DType::kF32),
                                       o));
    }
    for (int k = kOps - 1; k >= 0; --k) {
      COFAB_RETURN_IF_ERROR(handles[k].wait(Deadline::afterMs(20000)));
      if (!handles[k].test() || !handles[k].status().ok()) return Internal("handle state");
      for (size_t i = 0; i < bufs[k].size(); ++i) {
        const float want = static_cast<float>(n * (k + static_cast<int>(i % 5)) + n * (n - 1) / 2);
        if (bufs[k][i] != want) return Internal("async allreduce " + std::to_string(k) + " wrong");
      }
    }
    return c.asyncError();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesByRanks, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// The loopback transport runs the same engine without sockets.
// Every rank posts its send to the right and then its receive from the left, with messages far
// larger than the socket buffers (the send's bytes leave only as the peer reads them). While a
// send held the communicator's queue until its bytes were out, each rank's receive waited
// behind its own send, which waited on the peer's queued receive: both ran into the deadline,
// each blaming the other. Then an allreduce behind the point-to-point ops still matches.
TEST(CollectivesPointToPoint, ARingShiftOfLargeMessagesPostedSendFirstCompletes) {
  constexpr int n = 3;
  constexpr size_t kCount = size_t{24} << 20;  // 96 MiB of i32 per message
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<int32_t> out(kCount), in(kCount, -1);
    for (size_t i = 0; i < kCount; ++i) out[i] = static_cast<int32_t>(i * 7 + r);
    CollectiveOptions o;
    o.timeout = Millis(30000);
    auto hs = sendAsync(c, TensorView(out.data(), kCount, DType::kI32), right, o);
    auto hr = recvAsync(c, TensorView(in.data(), kCount, DType::kI32), left, o);
    float one = 1.0f, sum = 0.0f;
    AllreduceOptions a;
    a.timeout = Millis(30000);
    auto ha =
        allreduceAsync(c, TensorView(&one, 1, DType::kF32), TensorView(&sum, 1, DType::kF32), a);
    COFAB_RETURN_IF_ERROR(hs.wait(Deadline::afterMs(40000)));
    COFAB_RETURN_IF_ERROR(hr.wait(Deadline::afterMs(40000)));
    COFAB_RETURN_IF_ERROR(ha.wait(Deadline::afterMs(40000)));
    for (size_t i = 0; i < kCount; ++i) {
      if (in[i] != static_cast<int32_t>(i * 7 + left)) {
        return Internal("recv from rank " + std::to_string(left) + ": element " +
                        std::to_string(i) + " is " + std::to_string(in[i]));
      }
    }
    if (sum != static_cast<float>(n)) return Internal("allreduce gave " + std::to_string(sum));
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

// A NaN held by one rank reaches every rank's max and min, whichever rank holds it and
// whichever block of the ring the element falls in (before, it survived only where it was the
// first operand: on rank 0 for the direct algorithm, on the rank finishing its ring block).
TEST(CollectivesReduce, MinAndMaxCarryANanFromAnyRank) {
  constexpr int n = 3;
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    for (AllreduceAlgorithm algo : {AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kRing}) {
      for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
        for (int holder = 0; holder < n; ++holder) {
          const size_t count = 30001;  // elements in each of the ring's three blocks
          std::vector<float> v(count, static_cast<float>(r));
          for (size_t i : {size_t{0}, size_t{15000}, count - 1}) {
            if (r == holder) v[i] = std::numeric_limits<float>::quiet_NaN();
          }
          AllreduceOptions o;
          o.op = op;
          o.algorithm = algo;
          COFAB_RETURN_IF_ERROR(allreduce(c, TensorView(v.data(), count, DType::kF32), o));
          for (size_t i : {size_t{0}, size_t{15000}, count - 1}) {
            if (!std::isnan(v[i])) {
              return Internal(std::string(reduceOpName(op)) + " with a NaN on rank " +
                              std::to_string(holder) + ": element " + std::to_string(i) +
                              " is " + std::to_string(v[i]));
            }
          }
          const float want = op == ReduceOp::kMax ? static_cast<float>(n - 1) : 0.0f;
          if (v[1] != want) return Internal("element 1 is " + std::to_string(v[1]));
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

// An f16 average of values near the top of f16's range: the partial sums of the raw values
// (80000 after one combine) overflowed f16 (65504) and the average came back inf, with both
// algorithms and in reduce_scatter. Each contribution now enters scaled by 1/n, so no partial
// sum exceeds the largest input; every rank still gets the same bits.
TEST(CollectivesReduce, AnF16AverageOfLargeValuesDoesNotOverflow) {
  constexpr int n = 3;
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  std::vector<std::vector<uint16_t>> results(n);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    const size_t count = 3000;  // 1000 elements in each of the ring's blocks
    for (AllreduceAlgorithm algo : {AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kRing}) {
      std::vector<uint16_t> v(count, floatToHalf(40000.0f + 16.0f * static_cast<float>(r)));
      AllreduceOptions o;
      o.op = ReduceOp::kAvg;
      o.algorithm = algo;
      COFAB_RETURN_IF_ERROR(allreduce(c, TensorView(v.data(), count, DType::kF16), o));
      for (size_t i = 0; i < count; i += 999) {
        const float got = halfToFloat(v[i]);
        if (!(std::fabs(got - 40016.0f) <= 64.0f)) {
          return Internal("allreduce avg element " + std::to_string(i) + " is " +
                          std::to_string(got) + ", expected about 40016");
        }
      }
      if (algo == AllreduceAlgorithm::kRing) results[static_cast<size_t>(r)] = v;
    }
    std::vector<uint16_t> in(count, floatToHalf(60000.0f)), out(count / n);
    ReduceScatterOptions ro;
    ro.op = ReduceOp::kAvg;
    COFAB_RETURN_IF_ERROR(reduceScatter(c, TensorView(in.data(), count, DType::kF16),
                                        TensorView(out.data(), count / n, DType::kF16), ro));
    const float got = halfToFloat(out[0]);
    if (!(std::fabs(got - 60000.0f) <= 64.0f)) {
      return Internal("reduce_scatter avg is " + std::to_string(got) + ", expected about 60000");
    }
    return OkStatus();
  });
  ASSERT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[0], results[static_cast<size_t>(r)]) << r;
}

// Four threads of each rank issue barriers at once (a stress test: the race it guards against
// is a few instructions wide). An op took its sequence number before it
// took its place in the queue, so a rank could queue #6 ahead of #5 while its peer ran them in
// order, and both failed with a sequence mismatch; numbering happens in the queue now.
TEST(CollectivesThreads, OpsIssuedFromFourThreadsAtOnceKeepOneOrder) {
  constexpr int n = 2;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    std::vector<CollectiveHandle> handles[kThreads];
    std::vector<std::thread> issuers;
    for (int t = 0; t < kThreads; ++t) {
      issuers.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) handles[t].push_back(barrierAsync(c));
      });
    }
    for (auto& t : issuers) t.join();
    for (auto& hs : handles) {
      for (auto& h : hs) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(60000)));
    }
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

// Many point-to-point ops queued behind a collective start one after the other once it ends.
// Each one leaves the queue as soon as it is posted, and that used to start the next from inside
// its own start: one nested call per queued op, on the I/O thread that finished the collective,
// until its stack overflowed.
TEST(CollectivesPointToPoint, AQueueOfManySmallOpsDoesNotRecursePerOp) {
  constexpr int n = 2;
  constexpr int kOps = 70000;  // the old nesting overflowed: 40000 did not, 70000 did
  auto g = makeGroup(n);
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *g->comms[r];
    std::vector<int32_t> vals(kOps);
    float one = 1.0f;
    std::vector<CollectiveHandle> hs;
    hs.reserve(kOps + 1);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    hs.push_back(
        allreduceAsync(c, TensorView(&one, 1, DType::kF32), TensorView(&one, 1, DType::kF32), {}));
    for (int i = 0; i < kOps; ++i) {
      vals[i] = r == 0 ? i : -1;
      TensorView v(&vals[i], 1, DType::kI32);
      hs.push_back(r == 0 ? sendAsync(c, v, 1) : recvAsync(c, v, 0));
    }
    for (auto& h : hs) COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(60000)));
    for (int i = 0; i < kOps; ++i) {
      if (vals[i] != i) {
        return Internal("message " + std::to_string(i) + " is " + std::to_string(vals[i]));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

TEST(CollectivesLoopback, AllreduceAllgatherOnThreeRanks) {
  ScopedParamOverride chunk("COFAB_RING_CHUNK_BYTES", "1024");
  auto g = makeGroup(3, "loopback");
  ASSERT_TRUE(g);
  auto st = cofab::testing::runThreadRanks(3, [&](int r) -> Status {
    COFAB_RETURN_IF_ERROR(runAllreduceCases(*g->comms[r], AllreduceAlgorithm::kRing));
    return runAllgatherAndBroadcastCases(*g->comms[r]);
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

}  // namespace
}  // namespace cofab::comm
