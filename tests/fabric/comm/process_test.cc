// Forked processes as ranks meeting through a FileStore over tcp: collectives on 2 and 4
// processes against the serial reference, and a rank killed mid-job named by every survivor.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/file_store.h"
#include "tests/fabric/comm/comm_test_util.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab::comm {
namespace {

using cofab::testing::childFail;
using cofab::testing::failures;
using cofab::testing::ProcessGroup;
using cofab::testing::TempDir;

StatusOr<std::unique_ptr<Communicator>> join(const std::string& dir, int rank, int n,
                                             std::unique_ptr<FileStore>* store) {
  COFAB_ASSIGN_OR_RETURN(*store, FileStore::open(dir));
  CommOptions o;
  o.setupTimeout = Millis(20000);
  return Communicator::create(rank, n, store->get(), o);
}

int collectivesChild(const std::string& dir, int rank, int n) {
  std::unique_ptr<FileStore> store;
  auto comm = join(dir, rank, n, &store);
  if (!comm.ok()) return childFail(rank, comm.status().toString());
  Communicator& c = **comm;
  for (DType dtype : testing::kReduceDTypes) {
    for (ReduceOp op : testing::kReduceOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{100003}}) {
        auto buf = testing::makeBuffer(dtype, count);
        for (size_t i = 0; i < count; ++i) {
          testing::setElement(dtype, buf.data(), i, testing::inputValue(0, rank, i));
        }
        AllreduceOptions o;
        o.op = op;
        o.timeout = Millis(20000);
        Status s = allreduce(c, TensorView(buf.data(), count, dtype), o);
        if (!s.ok()) return childFail(rank, s.toString());
        std::string bad = testing::checkReduced(dtype, op, 0, n, buf.data(), count);
        if (!bad.empty()) return childFail(rank, bad);
      }
    }
  }
  std::vector<int64_t> mine(1000, rank), all(1000 * n);
  Status s = allgather(c, TensorView(mine.data(), 1000, DType::kI64),
                       TensorView(all.data(), all.size(), DType::kI64));
  if (!s.ok()) return childFail(rank, s.toString());
  for (int q = 0; q < n; ++q) {
    if (all[q * 1000 + 999] != q) return childFail(rank, "allgather block " + std::to_string(q));
  }
  std::vector<float> b(300000, rank == 1 ? 5.0f : 0.0f);
  BroadcastOptions bo;
  bo.root = 1;
  s = broadcast(c, TensorView(b.data(), b.size(), DType::kF32), bo);
  if (!s.ok()) return childFail(rank, s.toString());
  if (b[299999] != 5.0f) return childFail(rank, "broadcast");
  s = barrier(c);
  if (!s.ok()) return childFail(rank, s.toString());
  return 0;
}

class CommProcesses : public ::testing::TestWithParam<int> {};

TEST_P(CommProcesses, CollectivesMatchTheReference) {
  TempDir dir;
  ProcessGroup procs;
  const int n = GetParam();
  procs.start(n, [&](int rank) { return collectivesChild(dir.path(), rank, n); });
  EXPECT_EQ(failures(procs.waitAll(Deadline::afterMs(50000))), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommProcesses, ::testing::Values(2, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Rank 2 of 3 dies (SIGKILL) instead of joining the second allreduce: the survivors fail with
// RemoteError (or, had the kernel not told them, DeadlineExceeded) naming rank 2.
TEST(CommProcessFailure, AKilledRankIsNamedBySurvivors) {
  TempDir dir;
  ProcessGroup procs;
  procs.start(3, [&](int rank) {
    std::unique_ptr<FileStore> store;
    auto comm = join(dir.path(), rank, 3, &store);
    if (!comm.ok()) return childFail(rank, comm.status().toString());
    std::vector<float> v(1 << 16, 1.0f);
    AllreduceOptions o;
    o.timeout = Millis(15000);
    Status s = allreduce(**comm, TensorView(v.data(), v.size(), DType::kF32), o);
    if (!s.ok()) return childFail(rank, "first allreduce: " + s.toString());
    if (rank == 2) raise(SIGKILL);
    s = allreduce(**comm, TensorView(v.data(), v.size(), DType::kF32), o);
    if (s.ok()) return childFail(rank, "the allreduce with a dead rank succeeded");
    if (s.code() != StatusCode::kRemoteError && s.code() != StatusCode::kDeadlineExceeded) {
      return childFail(rank, "unexpected code: " + s.toString());
    }
    if (s.message().find("rank 2") == std::string::npos) {
      return childFail(rank, "rank 2 not named: " + s.toString());
    }
    return 0;
  });
  auto exits = procs.waitAll(Deadline::afterMs(40000));
  ASSERT_EQ(exits.size(), 3u);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << exits[r].describe();
  EXPECT_FALSE(exits[2].exited);
  EXPECT_EQ(exits[2].signal, SIGKILL);
}

// Ranks that cut the ring into chunks of different sizes (COFAB_RING_CHUNK_BYTES 1024 on rank 0,
// 2048 on rank 1) fail with the chunking mismatch and the variable to look at. The first message
// already has another size than the receive posted for it, and the transport's size error was
// reported as it was ("payload ... bytes"), the hint never reached.
TEST(CommProcessFailure, DifferentRingChunkSizesAreNamedAsSuch) {
  TempDir dir;
  ProcessGroup procs;
  procs.start(2, [&](int rank) {
    ::setenv("COFAB_RING_CHUNK_BYTES", rank == 0 ? "1024" : "2048", 1);
    std::unique_ptr<FileStore> store;
    auto comm = join(dir.path(), rank, 2, &store);
    if (!comm.ok()) return childFail(rank, comm.status().toString());
    std::vector<float> v(5003, 1.0f);
    AllreduceOptions o;
    o.algorithm = AllreduceAlgorithm::kRing;
    o.timeout = Millis(10000);
    Status s = allreduce(**comm, TensorView(v.data(), v.size(), DType::kF32), o);
    if (s.ok()) return childFail(rank, "different chunk sizes went unnoticed");
    if (s.message().find("COFAB_RING_CHUNK_BYTES") == std::string::npos) {
      return childFail(rank, "no chunking hint: " + s.toString());
    }
    return 0;
  });
  EXPECT_EQ(failures(procs.waitAll(Deadline::afterMs(30000))), "");
}

// A rank that sent its first messages and then stopped (SIGSTOP: its kernel still acks, so no
// connection breaks) counts as arrived; the survivors, timing out together, name it as the one
// that published no timeout report. Before, they said "every rank arrived" and named no one.
TEST(CommProcessFailure, AStoppedRankIsNamedBySurvivors) {
  TempDir dir;
  ProcessGroup procs;
  procs.start(3, [&](int rank) {
    ::setenv("COFAB_RING_CHUNK_BYTES", "1024", 1);  // a ring of many small steps: still running
    ::setenv("COFAB_COMM_DIAG_GRACE_MS", "3000", 1);  // room for the survivors' skew
    std::unique_ptr<FileStore> store;
    auto comm = join(dir.path(), rank, 3, &store);
    if (!comm.ok()) return childFail(rank, comm.status().toString());
    std::vector<float> v(16 << 20, 1.0f);  // before the barrier: the deadlines start together
    Status s = barrier(**comm);
    if (!s.ok()) return childFail(rank, "barrier: " + s.toString());
    AllreduceOptions o;
    o.algorithm = AllreduceAlgorithm::kRing;
    o.timeout = Millis(2000);
    CollectiveHandle h = allreduceAsync(**comm, TensorView(v.data(), v.size(), DType::kF32),
                                        TensorView(v.data(), v.size(), DType::kF32), o);
    if (rank == 2) {
      ::usleep(20000);  // its first chunks are out
      raise(SIGSTOP);
      return childFail(rank, "resumed");
    }
    s = h.wait(Deadline::afterMs(30000));
    if (s.code() != StatusCode::kDeadlineExceeded) {
      return childFail(rank, "expected DeadlineExceeded: " + s.toString());
    }
    // "did not report timing out"; "did not arrive" if its first chunks never left.
    if (s.message().find("rank(s) 2 did not") == std::string::npos) {
      return childFail(rank, "rank 2 not named: " + s.toString());
    }
    return 0;
  });
  for (int r = 0; r < 2; ++r) {
    const auto e = procs.wait(r, Deadline::afterMs(40000));
    EXPECT_TRUE(e.exited && e.code == 0) << e.describe();
  }
  // Rank 2 is still stopped: the group's destructor kills it.
}

}  // namespace
}  // namespace cofab::comm
