// 64 MiB collectives (the size the benchmarks target) on 2 and 4 thread ranks over tcp,
// checked element by element. Labelled `slow`: run with ctest -L slow.
#include <gtest/gtest.h>

#include <vector>

#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/hash_store.h"
#include "tests/fabric/comm/comm_test_util.h"
#include "tests/support/thread_ranks.h"

namespace cofab::comm {
namespace {

constexpr size_t kCount = (size_t{64} << 20) / sizeof(float);

class Slow64MiB : public ::testing::TestWithParam<int> {};

TEST_P(Slow64MiB, AllreduceRingAndAllgatherAreExact) {
  const int n = GetParam();
  HashStore store;
  auto comms = testing::makeComms(n, &store, "tcp");
  ASSERT_TRUE(comms.ok()) << comms.status();
  auto st = cofab::testing::runThreadRanks(n, [&](int r) -> Status {
    Communicator& c = *(*comms)[r];
    std::vector<float> v(kCount);
    for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>(testing::inputValue(0, r, i));
    AllreduceOptions o;
    o.algorithm = AllreduceAlgorithm::kRing;
    o.timeout = Millis(120000);
    COFAB_RETURN_IF_ERROR(allreduce(c, TensorView(v.data(), kCount, DType::kF32), o));
    std::string bad = testing::checkReduced(DType::kF32, ReduceOp::kSum, 0, n, v.data(), kCount);
    if (!bad.empty()) return Internal(bad);
    const size_t per = kCount / n;
    std::vector<float> mine(per, static_cast<float>(r)), all(per * n);
    COFAB_RETURN_IF_ERROR(allgather(c, TensorView(mine.data(), per, DType::kF32),
                                    TensorView(all.data(), all.size(), DType::kF32)));
    for (int q = 0; q < n; ++q) {
      if (all[q * per] != q || all[q * per + per - 1] != q) return Internal("allgather block");
    }
    return OkStatus();
  });
  EXPECT_TRUE(cofab::testing::allOk(st).ok()) << cofab::testing::allOk(st);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Slow64MiB, ::testing::Values(2, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace cofab::comm
