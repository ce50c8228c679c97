// The coded task service with real worker processes (forked, meeting the master through a
// FileStore over tcp): distributed results equal the local CodedMatmul's for several (n, k) and
// the uncoded / replicated modes; a SIGSTOPped worker does not hold up a coded request (it
// completes while the worker is still stopped) but makes an uncoded one fail at its deadline
// naming the worker; a cancelled slow worker reports that it stopped mid-product; killed
// workers are permanent stragglers, and fewer than k live ones is an error naming them. The
// master's device option: device=cpu gives the same results, device=gpu equals them within the
// code's fp32 accuracy where a GPU exists and is a clear Unavailable where none does.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coding/matmul/coded_matmul.h"
#include "core/param.h"
#include "fabric/coded/coded_master.h"
#include "fabric/coded/coded_worker.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/transport/registry.h"
#include "gpu/device.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab::coded {
namespace {

using coding::ConstMatrixView;
using coding::MatrixView;
using cofab::testing::childFail;
using cofab::testing::processState;
using cofab::testing::ProcessGroup;
using cofab::testing::TempDir;

std::vector<float> randomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& x : m) x = u(rng);
  return m;
}

bool stopAndWait(ProcessGroup& procs, int rank) {
  return cofab::testing::stopAndWait(procs.pid(rank), Deadline::afterMs(10000));
}

// n worker processes and a master in this process.
class Service {
 public:
  explicit Service(CodedServiceOptions o) : options_(std::move(o)) {
    options_.name = "coded-test";
    if (options_.setupTimeout == Duration{0}) options_.setupTimeout = Millis(20000);
    const std::string dir = dir_.path();
    const std::string name = options_.name;
    // Fork before the master creates any thread.
    procs_.start(options_.n, [dir, name](int w) {
      auto store = FileStore::open(dir);
      if (!store.ok()) return childFail(w, store.status().toString());
      Status s = runCodedWorker({.store = store->get(), .name = name, .index = w});
      // A worker whose master vanished or killed it is not a test failure by itself; the
      // master-side assertions decide. Report errors for the log.
      if (!s.ok()) return childFail(w, s.toString());
      return 0;
    });
    auto store = FileStore::open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto m = CodedMaster::create(store_.get(), options_);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) master_ = std::move(*m);
  }
  ~Service() {
    master_.reset();  // shuts the workers down
    const auto exits = procs_.waitAll(Deadline::afterMs(10000));
    // Workers that were not killed on purpose must leave cleanly when told to.
    if (!killedOnPurpose_) {
      EXPECT_EQ(cofab::testing::failures(exits), "");
    }
  }
  void kill(int worker) {
    killedOnPurpose_ = true;
    procs_.signal(worker, SIGKILL);
  }
  CodedMaster& master() { return *master_; }
  void stopMaster() { master_.reset(); }  // shuts the workers down
  std::string storeDir() const { return dir_.path(); }
  const std::string& name() const { return options_.name; }
  ProcessGroup& procs() { return procs_; }
  bool ok() const { return master_ != nullptr; }

 private:
  CodedServiceOptions options_;
  TempDir dir_;
  ProcessGroup procs_;
  std::unique_ptr<FileStore> store_;
  std::unique_ptr<CodedMaster> master_;
  bool killedOnPurpose_ = false;
};

// block (blockRows x cols) x b, row block by row block as a worker computes it. BLAS libraries
// pick kernels, and so summation orders, by matrix shape (OpenBLAS's Haswell sgemm does), so a
// bit-exact reference must make the same calls, not one GEMM over all of A.
void blockProduct(const float* block, int64_t blockRows, int64_t cols, const std::vector<float>& b,
                  int64_t bCols, int64_t rowBlock, float* out) {
  for (int64_t first = 0; first < blockRows; first += rowBlock) {
    const int64_t rows = std::min(rowBlock, blockRows - first);
    EXPECT_TRUE(coding::gemmF32({block + first * cols, rows, cols, 0}, {b.data(), cols, bCols, 0},
                                {out + first * bCols, rows, bCols, 0})
                    .ok());
  }
}

// What the local library computes from the same workers' blocks: CodedMatmul's decode (coded), or
// the blocks' products put in place. `groups` is the number of distinct row blocks.
std::vector<float> localReference(const CodedServiceOptions& o, const std::vector<float>& a,
                                  int64_t rows, int64_t cols, const std::vector<float>& b,
                                  int64_t bCols, const std::vector<int>& used, int groups) {
  std::vector<float> c(static_cast<size_t>(rows * bCols));
  if (o.mode != CodedMode::kCoded) {
    const int64_t blockRows = (rows + groups - 1) / groups;
    std::vector<float> split(static_cast<size_t>(blockRows * groups * cols), 0.0f);  // 0 padding
    std::copy(a.begin(), a.end(), split.begin());
    std::vector<float> all(static_cast<size_t>(blockRows * groups * bCols));
    for (int g = 0; g < groups; ++g) {
      blockProduct(split.data() + g * blockRows * cols, blockRows, cols, b, bCols, o.rowBlock,
                   all.data() + g * blockRows * bCols);
    }
    std::copy(all.begin(), all.begin() + rows * bCols, c.begin());
    return c;
  }
  auto cm =
      coding::CodedMatmul::create({.n = o.n, .k = o.k, .family = o.family, .seed = o.codeSeed});
  EXPECT_TRUE(cm.ok()) << cm.status();
  auto enc = cm->encode({a.data(), rows, cols, 0});
  EXPECT_TRUE(enc.ok()) << enc.status();
  std::vector<std::vector<float>> outs;
  std::vector<coding::TaskResult> results;
  outs.reserve(used.size());
  for (int w : used) {
    outs.emplace_back(static_cast<size_t>(enc->blockRows() * bCols));
    blockProduct(enc->block(w).data, enc->blockRows(), cols, b, bCols, o.rowBlock,
                 outs.back().data());
    results.push_back({w, outs.back().data()});
  }
  auto d = cm->decode(*enc, results, bCols, {c.data(), rows, bCols, 0});
  EXPECT_TRUE(d.ok()) << d.status();
  return c;
}

// Matches within the accuracy docs/CODING.md promises for decoded blocks (exact otherwise).
void expectNear(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
  }
}

struct Case {
  CodedMode mode;
  int n, k, replicas;
};

// Runs every case on the master's `device` and compares C with the local CodedMatmul's (CPU)
// result from the same workers: max |difference| <= relTol x max |C| (0: bit for bit).
void expectDistributedEqualsLocal(const std::vector<Case>& cases, const std::string& device,
                                  double relTol) {
  const int64_t rows = 50, cols = 24;  // 50 rows: padding for every k tried
  const std::vector<float> a = randomMatrix(rows, cols, 7);
  for (const Case& tc : cases) {
    SCOPED_TRACE(std::string(codedModeName(tc.mode)) + " n=" + std::to_string(tc.n) +
                 " k=" + std::to_string(tc.k) + " device=" + device);
    CodedServiceOptions o{.mode = tc.mode, .n = tc.n, .k = tc.k, .replicas = tc.replicas};
    o.device = device;
    // Worker 0 slowed on every row block: the coded requests decode from parity results (a
    // systematic block is missing) instead of only reassembling the systematic ones.
    o.rowBlock = 4;
    if (tc.mode == CodedMode::kCoded) o.rowBlockDelayMs[0] = 200;
    Service svc(o);
    ASSERT_TRUE(svc.ok());
    ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
    for (int64_t bCols : {int64_t{1}, int64_t{9}}) {  // a vector x, then a matrix
      const std::vector<float> b = randomMatrix(cols, bCols, 100 + bCols);
      std::vector<float> c(static_cast<size_t>(rows * bCols), -1.0f);
      auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(static_cast<int>(r->used.size()), svc.master().needed());
      const std::vector<float> want =
          localReference(o, a, rows, cols, b, bCols, r->used, svc.master().needed());
      if (tc.mode == CodedMode::kCoded) {
        EXPECT_TRUE(std::find(r->used.begin(), r->used.end(), 0) == r->used.end());
        EXPECT_TRUE(r->decoded);
      }
      double scale = 0;
      for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
      expectNear(c, want, relTol * scale);
    }
  }
}

TEST(CodedService, DistributedResultsEqualLocalOnes) {
  // device=cpu named explicitly: the service's device option on its CPU path.
  expectDistributedEqualsLocal(
      {Case{CodedMode::kCoded, 3, 2, 0}, Case{CodedMode::kCoded, 5, 3, 0},
       Case{CodedMode::kCoded, 8, 6, 0}, Case{CodedMode::kUncoded, 4, 4, 0},
       Case{CodedMode::kReplicated, 4, 0, 2}},
      "cpu", 0);
}

// rowBlock = INT64_MAX ("never stop between row blocks"): ceil(rows / rowBlock) overflowed in
// the worker, which then computed no block and sent a zero-filled result the master accepted.
TEST(CodedService, AHugeRowBlockIsOneBlockNotNone) {
  const int64_t rows = 8, cols = 4;
  const std::vector<float> a = randomMatrix(rows, cols, 11);
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 2, .k = 2};
  o.rowBlock = INT64_MAX;
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  const std::vector<float> b = randomMatrix(cols, 3, 12);
  std::vector<float> c(static_cast<size_t>(rows * 3), -1.0f);
  auto r = svc.master().multiply({b.data(), cols, 3, 0}, {c.data(), rows, 3, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  expectNear(c, localReference(o, a, rows, cols, b, 3, r->used, svc.master().needed()), 0);
}

// On a GPU the parity is encoded by cuBLAS and the decode combined there, so the decoded blocks
// differ from the CPU's by rounding: within the fp32 accuracy docs/CODING.md gives for these
// codes (<= 2e-5 relative; 1e-4 leaves room for the two BLAS libraries' summation orders).
TEST(CodedService, GpuMasterResultsEqualTheCpuPath) {
  StatusOr<int> gpus = gpu::deviceCount();
  if (!gpus.ok()) GTEST_SKIP() << "no GPU to encode and decode on: " << gpus.status().message();
  expectDistributedEqualsLocal({Case{CodedMode::kCoded, 8, 6, 0}, Case{CodedMode::kCoded, 5, 3, 0}},
                               "gpu", 1e-4);
}

TEST(CodedService, GpuMasterWithoutAGpuFailsSayingWhy) {
  StatusOr<int> gpus = gpu::deviceCount();
  if (gpus.ok()) GTEST_SKIP() << "a GPU is usable here (" << *gpus << "): no error to provoke";
  TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 3, .k = 2};
  o.name = "coded-gpu-test";
  o.setupTimeout = Millis(200);  // not reached: the device is checked before any worker
  auto expectUnavailable = [&](const CodedServiceOptions& opts) {
    auto m = CodedMaster::create(store->get(), opts);
    ASSERT_FALSE(m.ok()) << "a master with device=gpu started without a GPU";
    EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status();
    EXPECT_NE(m.status().message().find("device=gpu"), std::string::npos) << m.status();
    // The reason is gpu::deviceCount()'s (cudaGetDeviceCount's error, or no CUDA build).
    EXPECT_NE(m.status().message().find(gpus.status().message()), std::string::npos) << m.status();
  };
  o.device = "gpu";
  expectUnavailable(o);
  {
    o.device = "";  // from the environment
    ScopedParamOverride env("COFAB_CODED_DEVICE", "gpu");
    expectUnavailable(o);
  }
  o.device = "tpu";
  auto bad = CodedMaster::create(store->get(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
}

// A code the conditioning check refuses is a configuration error create() reports at once,
// before any worker is gathered (the code used to be built by every load(): the master waited
// for its workers first, here until the setup deadline, and then rebuilt the code per load).
TEST(CodedService, ACodeTooIllConditionedIsRefusedByCreate) {
  TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 24, .k = 16};
  o.family = coding::MdsFamily::kVandermondeEquispaced;
  o.name = "coded-ill-conditioned";
  o.setupTimeout = Millis(20000);  // no worker will come
  auto m = CodedMaster::create(store->get(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find("maxCondition"), std::string::npos) << m.status();
}

// A worker stopped before load(): k of n acknowledgements suffice for a coded request, so
// load() returns without it (it used to wait for every live worker until the setup deadline and
// fail), the requests decode around it, and once resumed it serves from its block again.
TEST(CodedService, AStoppedWorkerDoesNotHoldUpLoad) {
  const int64_t rows = 40, cols = 16, bCols = 5;
  const std::vector<float> a = randomMatrix(rows, cols, 1);
  const std::vector<float> b = randomMatrix(cols, bCols, 2);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 5, .k = 3};
  o.setupTimeout = Millis(20000);
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  const int stopped = 0;
  ASSERT_TRUE(stopAndWait(svc.procs(), stopped));
  const Status loaded = svc.master().load({a.data(), rows, cols, 0});
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(processState(svc.procs().pid(stopped)), 'T');
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::find(r->used.begin(), r->used.end(), stopped) == r->used.end());
  expectNear(c, localReference(o, a, rows, cols, b, bCols, r->used, svc.master().needed()), 1e-5);
  svc.procs().signal(stopped, SIGCONT);
  auto reports = svc.master().waitCancelReports(r->request, {stopped}, Deadline::afterMs(15000));
  ASSERT_TRUE(reports.ok()) << reports.status();
}

// The service's bound on decode conditioning is the caller's: one below the code's worst case
// is refused by create(), before any worker is gathered.
TEST(CodedService, MaxConditionBelowTheCodesWorstCaseIsRefused) {
  TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 5, .k = 3};
  o.maxCondition = 1.0;  // only the identity is that well conditioned
  o.name = "coded-max-condition";
  o.setupTimeout = Millis(20000);
  auto m = CodedMaster::create(store->get(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find("above maxCondition 1."), std::string::npos) << m.status();
}

TEST(CodedService, StoppedWorkerDoesNotDelayCodedRequest) {
  const int64_t rows = 40, cols = 16, bCols = 5;
  const std::vector<float> a = randomMatrix(rows, cols, 1);
  const std::vector<float> b = randomMatrix(cols, bCols, 2);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 5, .k = 3};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  const int stopped = 1;  // a systematic worker: the request must decode around it
  ASSERT_TRUE(stopAndWait(svc.procs(), stopped));
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  // The request completed while the worker is still stopped: it did not wait for it.
  EXPECT_EQ(processState(svc.procs().pid(stopped)), 'T');
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::find(r->used.begin(), r->used.end(), stopped) == r->used.end());
  EXPECT_TRUE(r->decoded);
  // The system solved is reported: at least 1, within the service's bound.
  EXPECT_GE(r->condition, 1.0);
  EXPECT_LE(r->condition, o.maxCondition);
  expectNear(c, localReference(o, a, rows, cols, b, bCols, r->used, svc.master().needed()), 1e-5);
  svc.procs().signal(stopped, SIGCONT);
  // Once resumed, the worker finds the cancel and says so; the service keeps serving.
  auto reports = svc.master().waitCancelReports(r->request, {stopped}, Deadline::afterMs(15000));
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 1u);
  auto r2 = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(r2.ok()) << r2.status();
}

size_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// How much this process's resident size grew over `times` calls of `op`, each of which must
// succeed (a failure is recorded, naming the call, and ends the loop).
size_t residentGrowthOver(int times, const std::function<Status()>& op) {
  const size_t before = residentBytes();
  for (int i = 0; i < times; ++i) {
    const Status st = op();
    if (!st.ok()) {
      ADD_FAILURE() << "call " << i << ": " << st;
      break;
    }
  }
  const size_t after = residentBytes();
  return after - std::min(before, after);
}

// A stopped worker reads nothing, and every request queued another copy of B for it on the
// master's connection (the kernel's buffers full): the master grew by one B per request for as
// long as the worker stayed stopped (30 requests of an 8 MiB B: ~240 MiB). A worker with
// requests still queued unsent is not sent more, and the requests complete without it.
TEST(CodedService, AStoppedWorkerDoesNotMakeTheMasterHoldACopyOfBPerRequest) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan keeps freed memory in its quarantine: the resident size says nothing here";
#endif
  const int64_t rows = 6, cols = 2048, bCols = 1024;  // B: 8 MiB
  const std::vector<float> a = randomMatrix(rows, cols, 1);
  const std::vector<float> b = randomMatrix(cols, bCols, 2);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 3, .k = 2};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  const int stopped = 2;
  ASSERT_TRUE(stopAndWait(svc.procs(), stopped));
  std::vector<float> c(rows * bCols);
  auto first = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(first.ok()) << first.status();
  const size_t grown = residentGrowthOver(30, [&] {
    return svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0}).status();
  });
  EXPECT_LT(grown, size_t{100} << 20) << "the master grew by " << (grown >> 20) << " MiB";
  svc.procs().signal(stopped, SIGCONT);
}

// The same for load(): a block for a worker that reads nothing used to be queued at every
// load(), so a service reloaded every step grew by a block per step while one worker was
// stopped. A worker whose previous block is still queued here is passed over (at most one
// block per worker waits), and gets no request until a load reaches it: its block is stale.
TEST(CodedService, AStoppedWorkerDoesNotMakeTheMasterHoldACopyOfAPerLoad) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan keeps freed memory in its quarantine: the resident size says nothing here";
#endif
  const int64_t rows = 4, cols = 1 << 20, bCols = 1;  // a block: 2 rows, 8 MiB
  const std::vector<float> a = randomMatrix(rows, cols, 1);
  const std::vector<float> b = randomMatrix(cols, bCols, 2);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 3, .k = 2};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  const int stopped = 2;
  ASSERT_TRUE(stopAndWait(svc.procs(), stopped));
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  const size_t grown = residentGrowthOver(20, [&] {
    return svc.master().load({a.data(), rows, cols, 0});
  });
  EXPECT_LT(grown, size_t{100} << 20) << "the master grew by " << (grown >> 20) << " MiB";
  // The others still answer; the stopped one, woken, gets the next load before any request.
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  svc.procs().signal(stopped, SIGCONT);
}

TEST(CodedService, UncodedFailsAtDeadlineNamingStoppedWorker) {
  const int64_t rows = 16, cols = 8, bCols = 2;
  const std::vector<float> a = randomMatrix(rows, cols, 3);
  const std::vector<float> b = randomMatrix(cols, bCols, 4);
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 3};
  o.requestTimeout = Millis(1500);
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  ASSERT_TRUE(stopAndWait(svc.procs(), 2));
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  svc.procs().signal(2, SIGCONT);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("from workers 2"), std::string::npos) << r.status();
}

TEST(CodedService, CancelledWorkerReportsItStoppedMidProduct) {
  const int64_t rows = 192, cols = 16, bCols = 4;  // (4, 3): 64 rows a block = 16 row blocks
  const std::vector<float> a = randomMatrix(rows, cols, 5);
  const std::vector<float> b = randomMatrix(cols, bCols, 6);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 4, .k = 3};
  o.rowBlock = 4;
  o.rowBlockDelayMs[3] = 500;  // 8 s for the whole block: far longer than the others take
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cancelled, std::vector<int>{3});
  auto reports = svc.master().waitCancelReports(r->request, {3}, Deadline::afterMs(15000));
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 1u);
  const CancelReport& rep = (*reports)[0];
  EXPECT_NE(rep.stage, CancelStage::kFinished) << cancelStageName(rep.stage);
  EXPECT_EQ(rep.rowBlocksTotal, 16);
  EXPECT_LT(rep.rowBlocksDone, rep.rowBlocksTotal);
  // The worker dropped the task and serves again (and is cancelled again, not stuck).
  auto r2 = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_TRUE(svc.master().waitCancelReports(r2->request, {3}, Deadline::afterMs(15000)).ok());
}

TEST(CodedService, InjectedDelayRunsOnTheWorkersAndCancelInterruptsIt) {
  const int64_t rows = 8, cols = 4, bCols = 2;
  const std::vector<float> a = randomMatrix(rows, cols, 12);
  const std::vector<float> b = randomMatrix(cols, bCols, 13);
  // Every task waits load x 60 s (load 1/2) before computing: far past the request deadline.
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 3, .k = 2};
  o.shiftMs = 60000;
  o.requestTimeout = Millis(300);
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("from workers 0, 1, 2"), std::string::npos) << r.status();
  // All three were cancelled inside their 30 s delay (request 1: this master's first); the
  // reports arrive long before the delay would have ended.
  auto reports = svc.master().waitCancelReports(1, {0, 1, 2}, Deadline::afterMs(15000));
  ASSERT_TRUE(reports.ok()) << reports.status();
  for (const CancelReport& rep : *reports) {
    EXPECT_EQ(rep.stage, CancelStage::kDelaying)
        << "worker " << rep.worker << ": " << cancelStageName(rep.stage);
    EXPECT_EQ(rep.rowBlocksDone, 0);
  }
}

// Waits (bounded) until the master has noticed `worker`'s death.
bool waitDead(CodedMaster& m, int worker) {
  const Deadline d = Deadline::afterMs(10000);
  while (!d.expired()) {
    if (m.deadWorkers().count(worker) != 0) return true;
    usleep(10000);
  }
  return false;
}

TEST(CodedService, KilledWorkersArePermanentStragglersUntilFewerThanKLive) {
  const int64_t rows = 30, cols = 8, bCols = 3;
  const std::vector<float> a = randomMatrix(rows, cols, 8);
  const std::vector<float> b = randomMatrix(cols, bCols, 9);
  CodedServiceOptions o{.mode = CodedMode::kCoded, .n = 4, .k = 3};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  svc.kill(0);
  ASSERT_TRUE(waitDead(svc.master(), 0));
  std::vector<float> c(rows * bCols);
  for (int i = 0; i < 2; ++i) {  // dead for good: every later request goes around it
    auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->used.size(), 3u);
    EXPECT_TRUE(std::find(r->used.begin(), r->used.end(), 0) == r->used.end());
    expectNear(c, localReference(o, a, rows, cols, b, bCols, r->used, svc.master().needed()), 1e-5);
  }
  svc.kill(2);
  ASSERT_TRUE(waitDead(svc.master(), 2));
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("dead workers: 0, 2"), std::string::npos) << r.status();
}

// A block of A past the protocol's bounds used to be sent anyway: the worker refused it and
// quit, so load() failed with "dead workers" and the service had lost them for good. Now it is
// InvalidArgument before anything is sent, and the same workers take the next load.
TEST(CodedService, ABlockTooBigForAMessageIsRefusedAndCostsNoWorker) {
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 2};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  {
    const int64_t tallRows = (int64_t{1} << 25) + 2;  // two blocks of 2^24 + 1 rows: 128 MiB
    const std::vector<float> tall(static_cast<size_t>(tallRows), 1.0f);
    Status st = svc.master().load({tall.data(), tallRows, 1, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("a block of A"), std::string::npos) << st;
  }
  {
    // Rows near INT64_MAX: the shape checks and the block size must not overflow on the way to
    // saying so (signed overflow is undefined; the UBSan build of this suite checks).
    const float one = 1.0f;
    Status st = svc.master().load({&one, INT64_MAX, 2, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("larger than any memory"), std::string::npos) << st;
  }
  EXPECT_TRUE(svc.master().deadWorkers().empty());
  const int64_t rows = 6, cols = 3;
  const std::vector<float> a = randomMatrix(rows, cols, 21);
  const std::vector<float> b = randomMatrix(cols, 2, 22);
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  std::vector<float> c(static_cast<size_t>(rows * 2));
  auto r = svc.master().multiply({b.data(), cols, 2, 0}, {c.data(), rows, 2, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  expectNear(c, localReference(o, a, rows, cols, b, 2, r->used, svc.master().needed()), 0);
}

// A connection that registers badly before the workers arrive (a port probe, a crashed worker's
// retry) used to take one of the n accepts: a real worker was never accepted and create() ran
// into its setup deadline. The workers here wait until the master has refused the intruder.
// Workers that start before a new master and find an earlier run's address in the store (a
// restarted master, a second run on one store) reach the new master once it publishes: they
// read the address again while connecting fails. They used to dial the dead address until
// their setup deadline, and the master's create() failed naming them all.
TEST(CodedService, WorkersFindANewMasterPastAStaleAddress) {
  TempDir dir;
  const std::string path = dir.path(), name = "coded-stale";
  {
    auto store = FileStore::open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto ctx = transport::Registry::create("tcp", {.localId = "old master"});
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    auto old = (*ctx)->listen({"127.0.0.1:0"});
    ASSERT_TRUE(old.ok()) << old.status();
    ASSERT_TRUE((*store)->set(name + "/master", toBytes((*old)->address())).ok());
    (*ctx)->close();  // nobody serves that address any more
    (*ctx)->join();
  }
  ProcessGroup procs;
  procs.start(2, [path, name](int w) {
    auto store = FileStore::open(path);
    if (!store.ok()) return childFail(w, store.status().toString());
    Status s = runCodedWorker(
        {.store = store->get(), .name = name, .index = w, .setupTimeout = Millis(20000)});
    return s.ok() ? 0 : childFail(w, s.toString());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the workers read the old one
  auto store = FileStore::open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 2};
  o.name = name;
  o.setupTimeout = Millis(20000);
  auto master = CodedMaster::create(store->get(), o);
  ASSERT_TRUE(master.ok()) << master.status();
  std::vector<float> a(4, 1.0f);
  EXPECT_TRUE((*master)->load({a.data(), 2, 2, 0}).ok());
  master->reset();  // tells the workers to leave
  EXPECT_EQ(cofab::testing::failures(procs.waitAll(Deadline::afterMs(20000))), "");
}

TEST(CodedService, ABadRegistrationDoesNotTakeAWorkersPlace) {
  TempDir dir;
  const std::string path = dir.path(), name = "coded-badreg";
  ProcessGroup procs;
  procs.start(2, [path, name](int w) {
    auto store = FileStore::open(path);
    if (!store.ok()) return childFail(w, store.status().toString());
    auto go = (*store)->get("go", Deadline::afterMs(60000));
    if (!go.ok()) return childFail(w, go.status().toString());
    Status s = runCodedWorker({.store = store->get(), .name = name, .index = w});
    return s.ok() ? 0 : childFail(w, s.toString());
  });
  auto store = FileStore::open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 2};
  o.name = name;
  o.setupTimeout = Millis(30000);
  StatusOr<std::unique_ptr<CodedMaster>> master = Unavailable("not created");
  // A jthread: an ASSERT that returns early still joins it (after create() gives up at the setup
  // timeout) instead of destroying a joinable thread, which would abort the whole binary.
  std::jthread creator([&] { master = CodedMaster::create(store->get(), o); });
  auto addr = (*store)->get(name + "/master", Deadline::afterMs(30000));
  ASSERT_TRUE(addr.ok()) << addr.status();
  auto ctx = transport::Registry::create("tcp", {.localId = "intruder"});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto conn = (*ctx)->connect(toString(*addr), {.localId = "intruder"}, Deadline::afterMs(30000));
  ASSERT_TRUE(conn.ok()) << conn.status();
  // Registers as nobody (a kLoaded where kRegister belongs); the master closes the connection.
  (*conn)->send(codedHeader(CodedOp::kLoaded, 0, 0), nullptr, 0, [](const Status&) {});
  std::promise<Status> closed;
  (*conn)->recvOwned([&closed](const Status& st, const wire::Header&, std::vector<uint8_t>&&) {
    closed.set_value(st);
  });
  auto refused = closed.get_future();
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_FALSE(refused.get().ok()) << "the master must close a bad registration";
  ASSERT_TRUE((*store)->set("go", toBytes("1")).ok());
  creator.join();
  ASSERT_TRUE(master.ok()) << master.status();
  master->reset();  // tells the workers to leave
  EXPECT_EQ(cofab::testing::failures(procs.waitAll(Deadline::afterMs(20000))), "");
  (*ctx)->join();
}

// A worker started after the master's create() returned (a restarted one, or one with an index
// already taken) fails within its setup timeout, saying why. The master kept its listener open:
// the worker's connect succeeded, it registered, nobody accepted it, and it waited for a block
// for as long as the master lived.
TEST(CodedService, AWorkerStartedAfterTheMasterWasCreatedFailsInsteadOfWaitingForever) {
  Service svc({.mode = CodedMode::kCoded, .n = 2, .k = 1});
  ASSERT_TRUE(svc.ok());
  auto store = FileStore::open(svc.storeDir());
  ASSERT_TRUE(store.ok()) << store.status();
  auto late = std::async(std::launch::async, [&] {
    return runCodedWorker(
        {.store = store->get(), .name = svc.name(), .index = 1, .setupTimeout = Millis(2000)});
  });
  if (late.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    svc.stopMaster();  // lets it return, so the future can be destroyed
    FAIL() << "the late worker still waits for the master";
  }
  const Status s = late.get();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("while it is being created"), std::string::npos) << s;
}

// A worker's acknowledgement of an earlier load that timed out does not count for the next
// load: the master's load(A2) used to return OK on a late ack for A1 (both carried no load
// number), before the worker had A2. The worker here is driven by hand: it acknowledges the
// first load only after the master sent the second, and never the second.
TEST(CodedService, ALateAckForAnEarlierLoadDoesNotCompleteTheNextOne) {
  TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 1};
  o.name = "coded-lateack";
  o.setupTimeout = Millis(2000);
  StatusOr<std::unique_ptr<CodedMaster>> master = Unavailable("not created");
  std::jthread creator([&] { master = CodedMaster::create(store->get(), o); });
  auto addr = (*store)->get(o.name + "/master", Deadline::afterMs(30000));
  ASSERT_TRUE(addr.ok()) << addr.status();
  auto ctx = transport::Registry::create("tcp", {.localId = "hand worker"});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto conn =
      (*ctx)->connect(toString(*addr), {.localId = "hand worker"}, Deadline::afterMs(30000));
  ASSERT_TRUE(conn.ok()) << conn.status();
  (*conn)->send(codedHeader(CodedOp::kRegister, 0, 0), nullptr, 0, [](const Status&) {});
  creator.join();
  ASSERT_TRUE(master.ok()) << master.status();
  // The loads' headers as the worker receives them, in order.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<wire::Header> loads;
  std::function<void()> post = [&] {
    (*conn)->recvOwned([&](const Status& st, const wire::Header& h, std::vector<uint8_t>&&) {
      if (!st.ok()) return;
      std::lock_guard<std::mutex> lock(mu);
      if (h.opcode == static_cast<uint8_t>(CodedOp::kLoad)) loads.push_back(h);
      cv.notify_all();
      post();
    });
  };
  post();
  auto loadsSeen = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return loads.size() >= n; });
  };
  std::vector<float> a(4, 1.0f);
  EXPECT_EQ((*master)->load({a.data(), 2, 2, 0}).code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(loadsSeen(1));
  Status second = Unavailable("not run");
  std::jthread loader([&] { second = (*master)->load({a.data(), 2, 2, 0}); });
  ASSERT_TRUE(loadsSeen(2)) << "the second load never reached the worker";
  wire::Header first;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = loads[0];
  }
  // What a worker that was slow with the first load sends: its ack, echoing that load.
  (*conn)->send(codedHeader(CodedOp::kLoaded, 0, first.sequence), nullptr, 0, [](const Status&) {});
  loader.join();
  EXPECT_EQ(second.code(), StatusCode::kDeadlineExceeded) << second;
  EXPECT_NE(second.message().find("workers 0"), std::string::npos) << second;
  master->reset();
  (*conn)->close();
  (*ctx)->join();
}

TEST(CodedService, UncodedFailsNamingKilledWorker) {
  const int64_t rows = 12, cols = 4, bCols = 2;
  const std::vector<float> a = randomMatrix(rows, cols, 10);
  const std::vector<float> b = randomMatrix(cols, bCols, 11);
  CodedServiceOptions o{.mode = CodedMode::kUncoded, .n = 3};
  Service svc(o);
  ASSERT_TRUE(svc.ok());
  ASSERT_TRUE(svc.master().load({a.data(), rows, cols, 0}).ok());
  svc.kill(1);
  ASSERT_TRUE(waitDead(svc.master(), 1));
  std::vector<float> c(rows * bCols);
  auto r = svc.master().multiply({b.data(), cols, bCols, 0}, {c.data(), rows, bCols, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dead workers: 1"), std::string::npos) << r.status();
  // A dead worker sends no cancel report: the wait ends at once when every worker still missing
  // is dead, naming them and why (it used to run out the caller's deadline, DeadlineExceeded).
  auto reports = svc.master().waitCancelReports(1, {1}, Deadline::afterMs(20000));
  ASSERT_FALSE(reports.ok());
  EXPECT_EQ(reports.status().code(), StatusCode::kUnavailable) << reports.status();
  EXPECT_NE(reports.status().message().find("worker 1"), std::string::npos) << reports.status();
  // A worker index the master does not have is a caller's mistake, not a wait.
  for (const int w : {-1, 3}) {
    EXPECT_EQ(svc.master().waitCancelReports(1, {w}, Deadline::afterMs(20000)).status().code(),
              StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace cofab::coded
