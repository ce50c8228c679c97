// Collectives over the rdma transport bound to the verbs emulation (rdma_emulated_registry.cc):
// threads as ranks meet through a HashStore, connect with "rdma" and run ring and direct
// allreduce, checked against the serial reference (tests/fabric/comm/comm_test_util.h).
#include <gtest/gtest.h>

#include <thread>

#include "core/param.h"
#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/hash_store.h"
#include "tests/fabric/comm/comm_test_util.h"
#include "tests/support/verbs_emulation.h"

namespace cofab::comm {
namespace {

class RdmaAllreduceTest : public ::testing::TestWithParam<int> {
 protected:
  // Small ring chunks so a modest buffer is pipelined through many rdma messages.
  ScopedParamOverride chunk_{"COFAB_RING_CHUNK_BYTES", "4096"};
};

TEST_P(RdmaAllreduceTest, RingAndDirectMatchTheReference) {
  const int n = GetParam();
  const uint64_t wrBefore = cofab::testing::emulatedWorkRequests();
  HashStore store;
  auto comms = testing::makeComms(n, &store, "rdma", "rdma-allreduce");
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = *(*comms)[r];
      for (AllreduceAlgorithm algo : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kDirect}) {
        for (size_t count : {size_t{1}, size_t{1001}, size_t{100003}}) {
          for (DType dtype : {DType::kF32, DType::kI64}) {
            auto buf = testing::makeBuffer(dtype, count);
            for (size_t i = 0; i < count; ++i) {
              testing::setElement(dtype, buf.data(), i, testing::inputValue(0, r, i));
            }
            AllreduceOptions o;
            o.op = ReduceOp::kSum;
            o.algorithm = algo;
            o.timeout = Millis(20000);
            TensorView v(buf.data(), count, dtype);
            const std::string what = std::string(dtypeName(dtype)) + " count " +
                                     std::to_string(count);
            Status s = allreduce(comm, v, o).withContext(what);
            if (s.ok()) {
              const std::string bad =
                  testing::checkReduced(dtype, ReduceOp::kSum, 0, n, buf.data(), count);
              if (!bad.empty()) s = Internal(what + ": " + bad);
            }
            if (!s.ok()) {
              results[r] = s;
              return;
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  // The traffic really went through the (emulated) verbs.
  EXPECT_GT(cofab::testing::emulatedWorkRequests(), wrBefore);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RdmaAllreduceTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

}  // namespace
}  // namespace cofab::comm
